"""Person segmentation (MediaPipe selfie segmenter), for measures outside the face.

The locality gate's body-skin drift and the skin-tone gate's body ITA look at skin *of the
person* outside the head (neck, hands, arms): the bundled selfie segmenter
(``assets/models/selfie_segmentation.tflite``, Apache-2.0, MediaPipe Selfie Segmentation,
256x256 input) gives a per-pixel person probability. One process-wide instance serves both.
"""

from __future__ import annotations

import contextlib
import math
import threading
from pathlib import Path

import cv2
import numpy as np

from counterfactory.assets import SELFIE_SEGMENTER
from counterfactory.manifests.errors import SetupError
from counterfactory.validation.faces import register_close_at_exit
from counterfactory.validation.quiet import native_quiet

#: Person probability at or above which a pixel belongs to the person.
PERSON_THRESHOLD = 0.5
#: Pixel measures that summarise a region (medians and means over skin, changed area after
#: smoothing) run on every k-th pixel of each row and column, k the smallest integer that
#: brings the long side to at most this many pixels: they do not need full resolution, and a
#: strided view costs nothing where a resize of a large photo costs more than the models.
WORK_SIDE = 512


def work_stride(shape: tuple[int, ...]) -> int:
    """The stride k of :data:`WORK_SIDE` for an image of ``shape`` ``(H, W, ...)``."""
    return max(int(math.ceil(max(shape[0], shape[1]) / WORK_SIDE)), 1)


#: :meth:`PersonSegmenter.segment` runs the model on a copy whose long side is at most this
#: (its own input is 256 x 256, so a larger copy only costs time)
SEGMENT_SIDE = 512


class PersonSegmenter:
    """The MediaPipe selfie segmenter, loaded once.

    Args:
        model_path: a ``selfie_segmentation.tflite`` (the bundled copy by default).
    """

    name = "mediapipe_selfie"

    def __init__(self, model_path: str | Path = SELFIE_SEGMENTER) -> None:
        from mediapipe.tasks.python import BaseOptions, vision

        path = Path(model_path)
        if not path.is_file():
            raise SetupError(
                f"selfie segmenter model not found at {path}; pass the path of a "
                "selfie_segmentation.tflite (the package ships one in assets/models/)"
            )
        options = vision.ImageSegmenterOptions(
            base_options=BaseOptions(model_asset_path=str(path)),
            running_mode=vision.RunningMode.IMAGE,
            output_confidence_masks=True,
            output_category_mask=False,
        )
        with native_quiet():  # MediaPipe / TFLite / LiteRT log their set-up to stderr
            self._segmenter = vision.ImageSegmenter.create_from_options(options)
        self._lock = threading.Lock()
        self._cold = True  # the first call logs too (LiteRT's input alignment)
        register_close_at_exit(self.close)

    def close(self) -> None:
        segmenter, self._segmenter = getattr(self, "_segmenter", None), None
        if segmenter is not None:
            with native_quiet():
                segmenter.close()

    def person_mask(self, image: np.ndarray, threshold: float = PERSON_THRESHOLD) -> np.ndarray:
        """``(H, W)`` uint8 {0, 255}: 255 where ``image`` (``(H, W, 3)`` uint8 RGB) shows a person."""
        import mediapipe as mp

        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(f"expected (H, W, 3) uint8 RGB, got {image.shape} {image.dtype}")
        frame = mp.Image(image_format=mp.ImageFormat.SRGB, data=np.ascontiguousarray(image))
        with self._lock:
            if self._segmenter is None:
                raise RuntimeError("PersonSegmenter is closed")
            with native_quiet() if self._cold else contextlib.nullcontext():
                result = self._segmenter.segment(frame)
            self._cold = False
        prob = np.asarray(result.confidence_masks[0].numpy_view(), dtype=np.float32).reshape(image.shape[:2])
        return np.where(prob >= threshold, np.uint8(255), np.uint8(0))

    def segment(self, image: np.ndarray) -> np.ndarray:
        """Person probability ``(H, W)`` float32 in [0, 1] for ``(H, W, 3)`` uint8 RGB.

        The model sees a copy whose long side is at most :data:`SEGMENT_SIDE` (its own input is
        256 x 256); the probability is resized back bilinearly.
        """
        import mediapipe as mp

        h, w = image.shape[:2]
        scale = min(SEGMENT_SIDE / max(h, w), 1.0)
        small = (
            image
            if scale >= 1.0
            else cv2.resize(image, (max(round(w * scale), 1), max(round(h * scale), 1)), interpolation=cv2.INTER_AREA)
        )
        frame = mp.Image(image_format=mp.ImageFormat.SRGB, data=np.ascontiguousarray(small))
        with self._lock:
            if self._segmenter is None:
                raise RuntimeError("PersonSegmenter is closed")
            with native_quiet() if self._cold else contextlib.nullcontext():
                result = self._segmenter.segment(frame)
            self._cold = False
        prob = np.asarray(result.confidence_masks[0].numpy_view(), dtype=np.float32).reshape(small.shape[:2])
        if prob.shape != (h, w):
            prob = cv2.resize(prob, (w, h), interpolation=cv2.INTER_LINEAR)
        return prob


_shared: dict[str, PersonSegmenter] = {}
_shared_lock = threading.Lock()


def get_person_segmenter(model_path: str | Path = SELFIE_SEGMENTER) -> PersonSegmenter:
    """The process-wide segmenter (loaded on first use)."""
    key = str(Path(model_path).resolve())
    with _shared_lock:
        if key not in _shared:
            _shared[key] = PersonSegmenter(model_path)
        return _shared[key]
