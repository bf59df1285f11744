"""Face gate: the expected number of faces, a confident detection, and the same head pose.

Counting and scoring use the configured detector (MediaPipe BlazeFace by default, InsightFace
SCRFD as the full backend); the pose is read from the MediaPipe mesh of source and candidate
(:meth:`~counterfactory.validation.faces.FaceObservation.pose_deg`: yaw, pitch, roll from the facial
transformation matrix the landmarker fits to the 478 landmarks). FOCUS fixes pose in its edit
prompt; an editor that turns the head has changed more than the face's demographic cues.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from counterfactory.validation.accessories import GLASSES_LEVEL
from counterfactory.validation.backends import FaceDetector, load_detector
from counterfactory.validation.backends.base import DetectedFace
from counterfactory.validation.faces import FaceObservation
from counterfactory.validation.gates.base import REGISTRATION_FAILED, GateResult, PairContext, SourceAnalysis
from counterfactory.validation.gates.registry import GATES
from counterfactory.validation.gates.rules import Rule, evaluate

#: the ``PairContext.extras`` key set when the candidate has no source photo to compare with
NO_SOURCE = "no_source"
#: Thresholds whose calibrated value depends on the detector (a score scale is per model).
BACKEND_THRESHOLDS = ("min_detection_score",)


class FaceGateConfig(BaseModel):
    """Face gate settings (``gates.<kind>.face`` in the spec)."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["mediapipe", "insightface"] = "mediapipe"
    expected_faces: int = Field(1, ge=0, le=1000)
    detection_threshold: float = Field(
        0.5, ge=0.0, le=1.0, description="a detection scoring below this is not counted as a face"
    )
    min_detection_score: float = Field(
        0.5, ge=0.0, le=1.0, description="a candidate face scoring below this is sent to review"
    )
    max_pose_change_deg: float | None = Field(
        None, gt=0.0, description="largest |change| of yaw, pitch or roll, degrees; None: not judged"
    )
    max_position_change: float | None = Field(
        None, gt=0.0, description="largest move of the face centre, fraction of the source face size; None: not judged"
    )
    max_scale_change: float | None = Field(
        None, gt=0.0, description="largest |face size ratio - 1| between candidate and source; None: not judged"
    )
    insightface_pack: str | None = Field(None, description="buffalo_l folder for backend insightface")

    def load(self) -> FaceDetector:
        return load_detector(self.backend, insightface_pack=self.insightface_pack)


def angle_change_deg(a: float, b: float) -> float:
    """``b - a`` wrapped to [-180, 180) degrees."""
    return (b - a + 180.0) % 360.0 - 180.0


def pose_change_deg(
    source: tuple[float, float, float], candidate: tuple[float, float, float]
) -> tuple[float, float, float]:
    """Signed ``(yaw, pitch, roll)`` change from ``source`` to ``candidate``, degrees."""
    return tuple(angle_change_deg(s, c) for s, c in zip(source, candidate))  # type: ignore[return-value]


def face_placement_change(source: FaceObservation, candidate: FaceObservation) -> tuple[float, float]:
    """``(position_change, scale_change)`` of the candidate's face against the source's.

    ``position_change``: distance between the landmark centroids divided by the source face's
    :attr:`~counterfactory.validation.faces.FaceObservation.size_px`; ``scale_change``:
    ``|size_px(candidate) / size_px(source) - 1|``. Both dimensionless; a face moved by a fifth
    of its size gives 0.2. In an aligned pair both are near 0 unless the head moved or grew.
    """
    c_src = source.landmarks[:, :2].astype(np.float64).mean(axis=0)
    c_cand = candidate.landmarks[:, :2].astype(np.float64).mean(axis=0)
    size = max(source.size_px, 1e-6)
    return float(np.hypot(*(c_cand - c_src)) / size), float(abs(candidate.size_px / size - 1.0))


def _counted(faces: Sequence[DetectedFace], threshold: float) -> list[DetectedFace]:
    return [f for f in faces if f.score >= threshold]


def face_gate(
    pair: PairContext,
    *,
    detector: FaceDetector | None = None,
    expected_faces: int = 1,
    detection_threshold: float = 0.5,
    min_detection_score: float = 0.5,
    max_pose_change_deg: float | None = None,
    max_position_change: float | None = None,
    max_scale_change: float | None = None,
    source_detections: Sequence[DetectedFace] | None = None,
) -> GateResult:
    """Judge faces and pose of ``pair.candidate`` against ``pair.source``.

    Args:
        pair: the aligned pair with both images' MediaPipe observations.
        detector: counts and scores faces; None counts the landmarker's faces (no score).
        expected_faces: faces the candidate must show (scores >= ``detection_threshold``).
        detection_threshold: a detection below this score is not a face, in [0, 1].
        min_detection_score: a best candidate face scoring below this goes to review, in [0, 1].
        max_pose_change_deg: bound on the largest absolute change of yaw, pitch and roll
            between the source's largest face and the candidate's face at its place, degrees.
        max_position_change, max_scale_change: bounds on :func:`face_placement_change`.
        source_detections: ``detector``'s faces in ``pair.source`` when already known (the
            source is shared by all its candidates); None: detected here.

    Metrics: ``faces``, ``source_faces`` (counted faces), ``mesh_faces`` (landmarker),
    ``detection_score`` / ``source_detection_score`` (best face, None without a detector or
    face), ``yaw_change_deg``, ``pitch_change_deg``, ``roll_change_deg``, ``pose_change_deg``
    (the largest absolute of the three), ``yaw_deg``, ``pitch_deg``, ``roll_deg`` (candidate).

    With ``pair.extras[NO_SOURCE]`` (an imported set with no source photo, the candidate
    standing as its own source) only the candidate is judged: its face count and detection
    score; the source's counts, the pose, position and scale changes are None and not judged.

    Reasons: ``face_count_mismatch``, ``face_pose_unavailable`` (no mesh on one side),
    ``face_pose_change_above_max``, ``face_position_change_above_max``,
    ``face_scale_change_above_max``; metrics ``position_change``, ``scale_change``;
    ``face_accessory_changed``: glasses added or removed (``glasses_change``,
    :func:`~counterfactory.validation.accessories.glasses_change`, beyond
    :data:`~counterfactory.validation.accessories.GLASSES_LEVEL` either way; measured on a
    registered pair only, None otherwise). Review: ``face_low_confidence`` (the candidate's face
    scores below ``min_detection_score``, the lowest score of any real calibration photo).
    """
    alone = bool(pair.extras.get(NO_SOURCE))
    thresholds = {
        "expected_faces": expected_faces,
        "detection_threshold": detection_threshold,
        "min_detection_score": min_detection_score if detector is not None else None,
        "max_pose_change_deg": None if alone else max_pose_change_deg,
        "max_position_change": None if alone else max_position_change,
        "max_scale_change": None if alone else max_scale_change,
        "glasses_level": None if alone else GLASSES_LEVEL,
        "backend": getattr(detector, "name", "landmarker"),
    }
    metrics = face_measures(pair, detector, detection_threshold, source_detections)
    judged = {
        **metrics,
        "pose_available": alone or (pair.source_face is not None and pair.candidate_face is not None),
        "expects_face": expected_faces > 0,
    }
    reasons, review = evaluate(FACE_RULES, judged, thresholds)
    # a low score is a soft doubt about a face otherwise kept: moot once rejected
    return GateResult("face", not reasons, metrics, reasons, review if not reasons else (), thresholds)


#: The face gate's decision, in order (``pose_available``: the pose could be compared, or
#: there is no source to compare with; ``expects_face``: ``expected_faces`` above 0). A face
#: scoring under ``min_detection_score`` is still a face (it passed ``detection_threshold``)
#: but weaker than in any real photo: people look. Not a rejection: detectors score darker
#: faces lower, so a hard cut would reject some target groups more often than others.
FACE_RULES: tuple[Rule, ...] = (
    Rule("faces", "differs", "expected_faces", "face_count_mismatch"),
    Rule("pose_change_deg", "above", "max_pose_change_deg", "face_pose_change_above_max"),
    Rule("position_change", "above", "max_position_change", "face_position_change_above_max"),
    Rule("scale_change", "above", "max_scale_change", "face_scale_change_above_max"),
    Rule("glasses_change", "abs_above", "glasses_level", "face_accessory_changed"),
    Rule("pose_available", "false", "max_pose_change_deg", "face_pose_unavailable", when="expects_face"),
    Rule(
        "detection_score", "below", "min_detection_score", "face_low_confidence", outcome="review", when="expects_face"
    ),
)


def face_measures(
    pair: PairContext,
    detector: FaceDetector | None,
    detection_threshold: float,
    source_detections: Sequence[DetectedFace] | None,
) -> dict:
    """The face gate's measures of ``pair`` (see :func:`face_gate`); no decision."""
    alone = bool(pair.extras.get(NO_SOURCE))
    metrics: dict = {"mesh_faces": len(pair.candidate_faces)}
    if detector is not None:
        cand = _counted(detector.detect(pair.candidate), detection_threshold)
        if alone:
            found = []
        else:
            found = detector.detect(pair.source) if source_detections is None else source_detections
        src = _counted(found, detection_threshold)
        metrics["faces"] = len(cand)
        metrics["source_faces"] = None if alone else len(src)
        metrics["detection_score"] = max((f.score for f in cand), default=None)
        metrics["source_detection_score"] = None if alone else max((f.score for f in src), default=None)
    else:
        metrics["faces"] = len(pair.candidate_faces)
        metrics["source_faces"] = None if alone else len(pair.source_faces)
        metrics["detection_score"] = None
        metrics["source_detection_score"] = None
    for key in (
        "yaw_change_deg",
        "pitch_change_deg",
        "roll_change_deg",
        "pose_change_deg",
        "yaw_deg",
        "pitch_deg",
        "roll_deg",
        "position_change",
        "scale_change",
        "glasses_change",
    ):
        metrics[key] = None
    src_face, cand_face = pair.source_face, pair.candidate_face
    if alone:
        # no source photo: the candidate's own pose is recorded, nothing is compared
        if cand_face is not None:
            yaw, pitch, roll = cand_face.pose_deg()
            metrics.update(yaw_deg=yaw, pitch_deg=pitch, roll_deg=roll)
    elif src_face is not None and cand_face is not None:
        src_pose = src_face.pose_deg()
        cand_pose = cand_face.pose_deg()
        dyaw, dpitch, droll = pose_change_deg(src_pose, cand_pose)
        metrics.update(
            yaw_change_deg=dyaw,
            pitch_change_deg=dpitch,
            roll_change_deg=droll,
            pose_change_deg=max(abs(dyaw), abs(dpitch), abs(droll)),
            yaw_deg=cand_pose[0],
            pitch_deg=cand_pose[1],
            roll_deg=cand_pose[2],
        )
        position, scale = face_placement_change(src_face, cand_face)
        metrics.update(position_change=position, scale_change=scale)
        if not pair.extras.get(REGISTRATION_FAILED) and src_face.landmarks.shape[0] > 473:
            # an accessory is its own change, not an expression or a pose (the brow a frame
            # crosses is not judged under it: the expression gate reads the same figure)
            metrics["glasses_change"] = pair.glasses_change
    return metrics


class FaceGate:
    """:func:`face_gate` with its configuration and detector bound."""

    name = "face"

    def __init__(self, config: FaceGateConfig, detector: FaceDetector | None = None) -> None:
        self.config = config
        self.detector = detector if detector is not None else config.load()

    def prepare(self, source: np.ndarray, analysis: SourceAnalysis) -> list[DetectedFace] | None:
        """The detector's faces in the source, once per source."""
        del analysis
        return self.detector.detect(source) if self.detector is not None else None

    def __call__(self, pair: PairContext) -> GateResult:
        c = self.config
        return face_gate(
            pair,
            detector=self.detector,
            source_detections=pair.source_data(self.name),
            expected_faces=c.expected_faces,
            detection_threshold=c.detection_threshold,
            min_detection_score=c.min_detection_score,
            max_pose_change_deg=c.max_pose_change_deg,
            max_position_change=c.max_position_change,
            max_scale_change=c.max_scale_change,
        )


GATES.register("face", FaceGateConfig, FaceGate, backend_keys=BACKEND_THRESHOLDS, order=10)
