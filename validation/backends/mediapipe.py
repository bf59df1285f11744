"""MediaPipe backends: BlazeFace detection scores and blendshape-derived action units.

Both are offline defaults: BlazeFace short-range ships in ``assets/models/`` and is the same
detector the Face Landmarker bundle runs first; the blendshapes come with every landmarker
observation, so the AU mapping costs no extra model call.

References: Bazarevsky et al., "BlazeFace: Sub-millisecond Neural Face Detection on Mobile
GPUs" (2019); Ekman & Friesen, "Facial Action Coding System" (1978); Apple ARKit
``ARFaceAnchor.BlendShapeLocation`` (the 52 blendshapes MediaPipe predicts, each documented by
the facial movement it describes).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from counterfactory.assets import FACE_DETECTOR
from counterfactory.validation.backends.base import DetectedFace
from counterfactory.validation.faces import FaceObservation
from counterfactory.validation.mediapipe_task import MediaPipeTask


class BlazeFaceDetector:
    """MediaPipe Tasks ``FaceDetector`` with the BlazeFace short-range model.

    Args:
        model_path: a ``face_detection_short_range.tflite`` (the bundled copy by default).
        min_score: MediaPipe's detection threshold; faces below it are not reported. Kept
            low so that weak faces are seen and judged by the gate, not hidden by the model.
    """

    name = "mediapipe"

    def __init__(self, model_path: str | Path = FACE_DETECTOR, *, min_score: float = 0.3) -> None:
        def create(vision, base_options):
            options = vision.FaceDetectorOptions(
                base_options=base_options,
                running_mode=vision.RunningMode.IMAGE,
                min_detection_confidence=min_score,
            )
            return vision.FaceDetector.create_from_options(options)

        self._task = MediaPipeTask(
            model_path,
            create=create,
            missing=f"BlazeFace model not found at {Path(model_path)}; pass the path of "
            "face_detection_short_range.tflite (the package ships one in assets/models/)",
            name="BlazeFaceDetector",
        )

    def close(self) -> None:
        self._task.close()

    def detect(self, image: np.ndarray) -> list[DetectedFace]:
        """Faces in ``(H, W, 3)`` uint8 RGB, highest score first; no keypoints (BlazeFace's
        six points have no mouth corners)."""
        result = self._task.run("detect", image)
        faces = []
        for d in result.detections:
            b = d.bounding_box
            score = float(d.categories[0].score) if d.categories else 0.0
            box = (float(b.origin_x), float(b.origin_y), float(b.origin_x + b.width), float(b.origin_y + b.height))
            faces.append(DetectedFace(box=box, score=score))
        faces.sort(key=lambda f: f.score, reverse=True)
        return faces


#: FACS action unit -> the MediaPipe (ARKit) blendshapes that perform it. Left/right pairs are
#: averaged, so a mirrored face gives the same AUs. The pairing follows each blendshape's ARKit
#: definition (e.g. ``mouthSmileLeft``: "upward movement of the left corner of the mouth" =
#: AU12 lip corner puller). AU25 (lips part) is the jaw opening not cancelled by lip closure:
#: ARKit's ``mouthClose`` is defined relative to ``jawOpen``, so ``max(jawOpen - mouthClose, 0)``.
BLENDSHAPE_AUS: dict[str, tuple[str, ...]] = {
    "AU01": ("browInnerUp",),  # inner brow raiser
    "AU02": ("browOuterUpLeft", "browOuterUpRight"),  # outer brow raiser
    "AU04": ("browDownLeft", "browDownRight"),  # brow lowerer
    "AU05": ("eyeWideLeft", "eyeWideRight"),  # upper lid raiser
    "AU06": ("cheekSquintLeft", "cheekSquintRight"),  # cheek raiser
    "AU07": ("eyeSquintLeft", "eyeSquintRight"),  # lid tightener
    "AU09": ("noseSneerLeft", "noseSneerRight"),  # nose wrinkler
    "AU10": ("mouthUpperUpLeft", "mouthUpperUpRight"),  # upper lip raiser
    "AU12": ("mouthSmileLeft", "mouthSmileRight"),  # lip corner puller
    "AU14": ("mouthDimpleLeft", "mouthDimpleRight"),  # dimpler
    "AU15": ("mouthFrownLeft", "mouthFrownRight"),  # lip corner depressor
    "AU17": ("mouthShrugLower",),  # chin raiser
    "AU18": ("mouthPucker",),  # lip pucker
    "AU20": ("mouthStretchLeft", "mouthStretchRight"),  # lip stretcher
    "AU24": ("mouthPressLeft", "mouthPressRight"),  # lip pressor
    "AU26": ("jawOpen",),  # jaw drop
    "AU28": ("mouthRollLower", "mouthRollUpper"),  # lip suck
    "AU45": ("eyeBlinkLeft", "eyeBlinkRight"),  # blink / eyes closed
}
#: AUs computed from more than a mean (see :data:`BLENDSHAPE_AUS`).
DERIVED_AUS = ("AU25",)


def blendshapes_to_aus(blendshapes: Mapping[str, float]) -> dict[str, float]:
    """FACS AU intensities in [0, 1] from MediaPipe's 52 blendshape scores.

    Args:
        blendshapes: ``{category_name: score}`` as in :attr:`FaceObservation.blendshapes`.

    Returns:
        ``{"AU01": ..., ..., "AU45": ...}`` in the order of :data:`BLENDSHAPE_AUS` then
        ``AU25``; NaN for an AU whose blendshapes are missing.
    """
    aus: dict[str, float] = {}
    for au, names in BLENDSHAPE_AUS.items():
        values = [blendshapes.get(n) for n in names]
        aus[au] = float(np.mean(values)) if all(v is not None for v in values) else float("nan")
    jaw, close = blendshapes.get("jawOpen"), blendshapes.get("mouthClose")
    aus["AU25"] = float(max(jaw - close, 0.0)) if jaw is not None and close is not None else float("nan")
    return aus


class BlendshapeAUs:
    """AU intensities from the landmarker's blendshapes (:func:`blendshapes_to_aus`)."""

    name = "mediapipe"
    aus = tuple(BLENDSHAPE_AUS) + DERIVED_AUS

    def estimate(self, image: np.ndarray, face: FaceObservation) -> dict[str, float]:
        del image  # the blendshapes were computed with the landmarks
        return blendshapes_to_aus(face.blendshapes)
