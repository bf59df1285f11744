"""Person segmentation (MediaPipe selfie segmenter), for measures outside the face.

The locality gate's body-skin drift and the skin-tone gate's body ITA look at skin *of the
person* outside the head (neck, hands, arms): the bundled selfie segmenter
(``assets/models/selfie_segmentation.tflite``, Apache-2.0, MediaPipe Selfie Segmentation,
256x256 input) gives a per-pixel person probability. One process-wide instance serves both.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import cv2
import numpy as np

from counterfactory.assets import SELFIE_SEGMENTER
from counterfactory.validation.mediapipe_task import MediaPipeTask

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
        def create(vision, base_options):
            options = vision.ImageSegmenterOptions(
                base_options=base_options,
                running_mode=vision.RunningMode.IMAGE,
                output_confidence_masks=True,
                output_category_mask=False,
            )
            return vision.ImageSegmenter.create_from_options(options)

        self._task = MediaPipeTask(
            model_path,
            create=create,
            missing=f"selfie segmenter model not found at {Path(model_path)}; pass the path of a "
            "selfie_segmentation.tflite (the package ships one in assets/models/)",
            name="PersonSegmenter",
        )

    def close(self) -> None:
        self._task.close()

    def person_mask(self, image: np.ndarray, threshold: float = PERSON_THRESHOLD) -> np.ndarray:
        """``(H, W)`` uint8 {0, 255}: 255 where ``image`` (``(H, W, 3)`` uint8 RGB) shows a person."""
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(f"expected (H, W, 3) uint8 RGB, got {image.shape} {image.dtype}")
        result = self._task.run("segment", image)
        prob = _owned(result.confidence_masks[0], image.shape[:2])
        return np.where(prob >= threshold, np.uint8(255), np.uint8(0))

    def segment(self, image: np.ndarray) -> np.ndarray:
        """Person probability ``(H, W)`` float32 in [0, 1] for ``(H, W, 3)`` uint8 RGB.

        The model sees a copy whose long side is at most :data:`SEGMENT_SIDE` (its own input is
        256 x 256); the probability is resized back bilinearly.
        """
        h, w = image.shape[:2]
        scale = min(SEGMENT_SIDE / max(h, w), 1.0)
        small = (
            image
            if scale >= 1.0
            else cv2.resize(image, (max(round(w * scale), 1), max(round(h * scale), 1)), interpolation=cv2.INTER_AREA)
        )
        result = self._task.run("segment", small)
        prob = _owned(result.confidence_masks[0], small.shape[:2])
        if prob.shape != (h, w):
            prob = cv2.resize(prob, (w, h), interpolation=cv2.INTER_LINEAR)
        return prob


def _owned(mask, shape: tuple[int, int]) -> np.ndarray:
    """A MediaPipe confidence mask as a float32 array that owns its pixels. ``numpy_view()`` is
    a view into the task's output buffer, which MediaPipe frees and reuses once the result is
    gone: a kept view (a source's person probability, read again for every candidate) then
    holds whatever the next call wrote there. A source small enough to be segmented at its own
    size (no resize to copy it) got a different body-skin mask per cell, run to run (the
    demo-limb astronaut's control: 0, 621 or 1851 body pixels)."""
    return np.array(mask.numpy_view(), dtype=np.float32, copy=True).reshape(shape)


_shared: dict[str, PersonSegmenter] = {}
_shared_lock = threading.Lock()


def get_person_segmenter(model_path: str | Path = SELFIE_SEGMENTER) -> PersonSegmenter:
    """The process-wide segmenter (loaded on first use)."""
    key = str(Path(model_path).resolve())
    with _shared_lock:
        if key not in _shared:
            _shared[key] = PersonSegmenter(model_path)
        return _shared[key]
