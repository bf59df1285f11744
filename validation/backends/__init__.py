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

_cache: dict[tuple, Any] = {}
_cache_lock = threading.Lock()
_threads: int | None = None  # None: each library's own default


def set_worker_threads(threads: int) -> None:
    """Intra-op threads for the models this process loads from now on (OpenCV, onnxruntime,
    torch once a torch backend loads). MediaPipe's CPU graphs already run single-threaded."""
    import sys

    import cv2

    global _threads
    _threads = max(int(threads), 1)
    cv2.setNumThreads(_threads)
    torch = sys.modules.get("torch")  # torch is heavy: only touch it if something loaded it
    if torch is not None:
        torch.set_num_threads(_threads)


def _cached(key: tuple, build: Callable[[], Any]) -> Any:
    with _cache_lock:
        if key not in _cache:
            _cache[key] = build()
        return _cache[key]


def _unknown(kind: str, name: str, valid: tuple[str, ...]) -> ValueError:
    return ValueError(f"unknown {kind} backend {name!r}; valid: {', '.join(valid)}")


def _path_key(path: str | Path | None) -> str | None:
    return None if path is None else str(Path(path).expanduser().resolve())


def load_detector(name: str, *, insightface_pack: str | Path | None = None) -> FaceDetector:
    """The face detector ``name`` (``mediapipe``: BlazeFace; ``insightface``: SCRFD det_10g)."""
    if name == "mediapipe":
        from counterfactory.validation.backends.mediapipe import BlazeFaceDetector

        return _cached(("detector", name), BlazeFaceDetector)
    if name == "insightface":
        from counterfactory.validation.backends.insightface import SCRFDDetector, resolve_pack

        pack = resolve_pack(insightface_pack)
        return _cached(("detector", name, _path_key(pack)), lambda: SCRFDDetector(pack, threads=_threads or 0))
    raise _unknown("face detector", name, DETECTORS)


def load_embedder(name: str, *, insightface_pack: str | Path | None = None) -> FaceEmbedder:
    """The identity embedder ``name`` (``sface``: OpenCV SFace; ``insightface``: ArcFace w600k_r50)."""
    if name == "sface":
        from counterfactory.validation.backends.sface import SFaceEmbedder

        return _cached(("embedder", name), SFaceEmbedder)
    if name == "insightface":
        from counterfactory.validation.backends.insightface import ArcFaceEmbedder, resolve_pack

        pack = resolve_pack(insightface_pack)
        return _cached(("embedder", name, _path_key(pack)), lambda: ArcFaceEmbedder(pack, threads=_threads or 0))
    raise _unknown("identity embedder", name, EMBEDDERS)


def load_au_model(name: str, *, libreface_weights: str | Path | None = None) -> AUEstimator:
    """The AU estimator ``name`` (``mediapipe``: blendshape mapping; ``libreface``: ResNet-18)."""
    if name == "mediapipe":
        from counterfactory.validation.backends.mediapipe import BlendshapeAUs

        return _cached(("au", name), BlendshapeAUs)
    if name == "libreface":
        from counterfactory.validation.backends.libreface import LibreFaceAUs

        return _cached(
            ("au", name, _path_key(libreface_weights)),
            lambda: LibreFaceAUs(libreface_weights, threads=_threads),
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
    "align_face_112",
    "l2_normalise",
    "load_au_model",
    "load_detector",
    "load_embedder",
    "set_worker_threads",
    "similarity_transform",
]
