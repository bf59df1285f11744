"""Model backends behind the gates, chosen by name and loaded once per worker process.

``load_detector("mediapipe" | "insightface", ...)``, ``load_embedder("sface" | "insightface",
...)`` and ``load_au_model("mediapipe" | "libreface", ...)`` return the process-wide instance
for those settings, building it on first use. An unknown name raises ``ValueError`` listing
the valid ones; a backend that cannot run here raises :class:`~counterfactory.manifests.errors.SetupError` saying how to
fix it. Call :func:`set_worker_threads` at the start of a worker so that N processes use N
cores rather than N x all of them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from counterfactory.validation.backends.base import (
    ARCFACE_TEMPLATE_112,
    AUEstimator,
    DetectedFace,
    FaceDetector,
    FaceEmbedder,
    align_face_112,
    l2_normalise,
    similarity_transform,
)

DETECTORS = ("mediapipe", "insightface")
EMBEDDERS = ("sface", "insightface")
AU_MODELS = ("mediapipe", "libreface")


class ModelCache:
    """The models a process has loaded, and the intra-op thread count it builds them with.

    One lock guards both: a model is built with the thread count read under the lock, and it
    is cached under that count too, so a model built before :meth:`set_threads` is not handed
    out afterwards as if it had been built with the new count (nor one built for N threads
    rebuilt for N again).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: dict[tuple, Any] = {}
        self._threads: int | None = None  # None: each library's own default

    @property
    def threads(self) -> int | None:
        with self._lock:
            return self._threads

    def set_threads(self, threads: int) -> int:
        """Models built from now on use ``max(threads, 1)`` intra-op threads; returns it."""
        with self._lock:
            self._threads = max(int(threads), 1)
            return self._threads

    def get(self, key: tuple, build: Callable[[int | None], Any]) -> Any:
        """The model cached under ``key`` and the current thread count, built by
        ``build(threads)`` on first use."""
        with self._lock:
            full = (*key, self._threads)
            if full not in self._models:
                self._models[full] = build(self._threads)
            return self._models[full]


#: this process's models (a worker sets its thread count first, :func:`set_worker_threads`)
MODELS = ModelCache()


def set_worker_threads(threads: int) -> None:
    """Intra-op threads for the models this process loads from now on (OpenCV, onnxruntime,
    torch once a torch backend loads). MediaPipe's CPU graphs already run single-threaded."""
    import sys

    import cv2

    count = MODELS.set_threads(threads)
    cv2.setNumThreads(count)
    torch = sys.modules.get("torch")  # torch is heavy: only touch it if something loaded it
    if torch is not None:
        torch.set_num_threads(count)


def _unknown(kind: str, name: str, valid: tuple[str, ...]) -> ValueError:
    return ValueError(f"unknown {kind} backend {name!r}; valid: {', '.join(valid)}")


def _path_key(path: str | Path | None) -> str | None:
    return None if path is None else str(Path(path).expanduser().resolve())


def load_detector(name: str, *, insightface_pack: str | Path | None = None) -> FaceDetector:
    """The face detector ``name`` (``mediapipe``: BlazeFace; ``insightface``: SCRFD det_10g)."""
    if name == "mediapipe":
        from counterfactory.validation.backends.mediapipe import BlazeFaceDetector

        return MODELS.get(("detector", name), lambda _: BlazeFaceDetector())
    if name == "insightface":
        from counterfactory.validation.backends.insightface import SCRFDDetector, resolve_pack

        pack = resolve_pack(insightface_pack)
        return MODELS.get(("detector", name, _path_key(pack)), lambda t: SCRFDDetector(pack, threads=t or 0))
    raise _unknown("face detector", name, DETECTORS)


def load_embedder(name: str, *, insightface_pack: str | Path | None = None) -> FaceEmbedder:
    """The identity embedder ``name`` (``sface``: OpenCV SFace; ``insightface``: ArcFace w600k_r50)."""
    if name == "sface":
        from counterfactory.validation.backends.sface import SFaceEmbedder

        return MODELS.get(("embedder", name), lambda _: SFaceEmbedder())
    if name == "insightface":
        from counterfactory.validation.backends.insightface import ArcFaceEmbedder, resolve_pack

        pack = resolve_pack(insightface_pack)
        return MODELS.get(("embedder", name, _path_key(pack)), lambda t: ArcFaceEmbedder(pack, threads=t or 0))
    raise _unknown("identity embedder", name, EMBEDDERS)


def load_au_model(name: str, *, libreface_weights: str | Path | None = None) -> AUEstimator:
    """The AU estimator ``name`` (``mediapipe``: blendshape mapping; ``libreface``: ResNet-18)."""
    if name == "mediapipe":
        from counterfactory.validation.backends.mediapipe import BlendshapeAUs

        return MODELS.get(("au", name), lambda _: BlendshapeAUs())
    if name == "libreface":
        from counterfactory.validation.backends.libreface import LibreFaceAUs

        return MODELS.get(
            ("au", name, _path_key(libreface_weights)), lambda t: LibreFaceAUs(libreface_weights, threads=t)
        )
    raise _unknown("AU", name, AU_MODELS)


__all__ = [
    "ARCFACE_TEMPLATE_112",
    "AUEstimator",
    "AU_MODELS",
    "DETECTORS",
    "DetectedFace",
    "EMBEDDERS",
    "FaceDetector",
    "FaceEmbedder",
    "MODELS",
    "ModelCache",
    "align_face_112",
    "l2_normalise",
    "load_au_model",
    "load_detector",
    "load_embedder",
    "set_worker_threads",
    "similarity_transform",
]
