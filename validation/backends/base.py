"""The three small interfaces the gates' models sit behind, and what they share.

- :class:`FaceDetector`: faces with a detection score (face gate).
- :class:`FaceEmbedder`: an L2-normalised identity embedding of one face (identity gate).
- :class:`AUEstimator`: facial action-unit intensities of one face (expression gate).

Each backend is one module under ``validation/backends/`` that imports its heavy dependency
inside and loads its model once per worker process (:mod:`counterfactory.validation.backends` keeps the
cache). A backend that cannot run here raises :class:`~counterfactory.manifests.errors.SetupError` with the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import cv2
import numpy as np

from counterfactory.validation.faces import FaceObservation

#: ArcFace's 112 x 112 five-point template (insightface ``face_align.arcface_dst``; OpenCV's
#: ``FaceRecognizerSF::alignCrop`` uses the same numbers). Order: image-left eye, image-right
#: eye, nose tip, image-left mouth corner, image-right mouth corner.
ARCFACE_TEMPLATE_112 = np.array(
    [
        [38.2946, 51.6963],
        [73.5318, 51.5014],
        [56.0252, 71.7366],
        [41.5493, 92.3655],
        [70.7299, 92.2041],
    ],
    dtype=np.float32,
)


@dataclass(frozen=True)
class DetectedFace:
    """One face from a detector.

    Attributes:
        box: ``(x0, y0, x1, y1)`` in pixels of the analysed image.
        score: the detector's confidence in [0, 1].
        keypoints: ``(5, 2)`` float32 pixels in ArcFace template order, or None when the
            detector does not give all five.
    """

    box: tuple[float, float, float, float]
    score: float
    keypoints: np.ndarray | None = None

    @property
    def area_px(self) -> float:
        x0, y0, x1, y1 = self.box
        return max(x1 - x0, 0.0) * max(y1 - y0, 0.0)


@runtime_checkable
class FaceDetector(Protocol):
    """Finds faces. ``detect`` takes ``(H, W, 3)`` uint8 RGB and returns faces, best first."""

    name: str

    def detect(self, image: np.ndarray) -> list[DetectedFace]: ...


@runtime_checkable
class FaceEmbedder(Protocol):
    """Identity embedding of the face at ``keypoints`` (``(5, 2)``, ArcFace order).

    ``embed`` returns a ``(dim,)`` float32 vector of unit L2 norm, or a vector of NaNs when the
    crop carries no signal (the caller turns that into a reason code, not an exception).
    """

    name: str
    dim: int

    def embed(self, image: np.ndarray, keypoints: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class AUEstimator(Protocol):
    """Action-unit intensities of one face, each scaled to [0, 1] (1 = the scale's maximum).

    ``estimate`` gets the image and the MediaPipe observation of the face (landmarks for
    alignment, blendshapes for the MediaPipe mapping) and returns ``{"AU12": 0.4, ...}``
    over the backend's fixed ``aus``.
    """

    name: str
    aus: tuple[str, ...]

    def estimate(self, image: np.ndarray, face: FaceObservation) -> Mapping[str, float]: ...


def similarity_transform(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Least-squares similarity (rotation, uniform scale, translation) taking ``src`` to ``dst``.

    Umeyama, "Least-squares estimation of transformation parameters between two point
    patterns", IEEE TPAMI 13(4), 1991 (what insightface's ``estimate_norm`` and OpenCV's
    ``alignCrop`` solve). Returns the ``(2, 3)`` float64 matrix for ``cv2.warpAffine``.
    """
    src = np.asarray(src, dtype=np.float64)
    dst = np.asarray(dst, dtype=np.float64)
    mu_s, mu_d = src.mean(axis=0), dst.mean(axis=0)
    s_c, d_c = src - mu_s, dst - mu_d
    cov = d_c.T @ s_c / len(src)
    u, sing, vt = np.linalg.svd(cov)
    sign = np.eye(2)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        sign[1, 1] = -1.0
    rot = u @ sign @ vt
    var_s = (s_c**2).sum() / len(src)
    scale = float(np.trace(np.diag(sing) @ sign) / var_s) if var_s > 0 else 1.0
    m = np.zeros((2, 3))
    m[:, :2] = scale * rot
    m[:, 2] = mu_d - scale * rot @ mu_s
    return m


def align_face_112(image: np.ndarray, keypoints: np.ndarray, size: int = 112) -> np.ndarray:
    """The ArcFace-template crop of one face: ``(size, size, 3)`` uint8 in ``image``'s channels.

    Args:
        image: ``(H, W, 3)`` uint8.
        keypoints: ``(5, 2)`` pixels in template order (:meth:`FaceObservation.keypoints5`).
        size: output side; the template is scaled by ``size / 112``.
    """
    m = similarity_transform(keypoints, ARCFACE_TEMPLATE_112 * (size / 112.0))
    return cv2.warpAffine(image, m, (size, size), flags=cv2.INTER_LINEAR, borderValue=0)


def l2_normalise(vector: np.ndarray) -> np.ndarray:
    """``vector / ||vector||`` as float32; all NaN when the norm is zero or not finite."""
    v = np.asarray(vector, dtype=np.float64).ravel()
    norm = float(np.linalg.norm(v))
    if not np.isfinite(norm) or norm <= 1e-12:
        return np.full(v.shape, np.nan, dtype=np.float32)
    return (v / norm).astype(np.float32)
