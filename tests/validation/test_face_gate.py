"""Face gate: face count, detection confidence, head-pose change (real MediaPipe models)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from counterfactory.validation.backends import DetectedFace
from counterfactory.validation.faces import FaceObservation
from counterfactory.validation.gates.face import angle_change_deg, face_gate, pose_change_deg


class FixedDetector:
    """A detector that reports the same faces for any image (for the gate's own logic)."""

    name = "fixed"

    def __init__(self, scores):
        self.scores = scores

    def detect(self, image):
        return [DetectedFace(box=(0, 0, 10, 10), score=s) for s in self.scores]


def test_angle_wrap_known_answers():
    assert angle_change_deg(170.0, -170.0) == pytest.approx(20.0)
    assert angle_change_deg(-170.0, 170.0) == pytest.approx(-20.0)
    assert pose_change_deg((10, 0, 0), (-5, 3, 359)) == pytest.approx((-15, 3, -1))


def test_identical_images_pass(face_stack, photo):
    image = photo("grace_hopper.jpg")
    pair = face_stack.context(image, image.copy())
    detector = face_stack.gates[0].detector
    result = face_gate(pair, detector=detector, min_detection_score=0.7, max_pose_change_deg=7.9)
    assert result.passed, result.reasons
    assert result.metrics["faces"] == 1
    assert result.metrics["pose_change_deg"] == 0.0
    assert result.metrics["detection_score"] == pytest.approx(result.metrics["source_detection_score"])


@pytest.mark.parametrize("angle", [-10.0, 12.0])
def test_in_plane_rotation_is_measured_as_roll(face_stack, photo, angle):
    """Rotating the photo about the face by θ degrees counter-clockwise (OpenCV's positive
    angle) changes roll by +θ (MediaPipe's camera frame has y up) and leaves yaw and pitch;
    the eye-line fallback (no transformation matrix) agrees in sign and size."""
    image = photo("biden_portrait.jpg")
    face = face_stack.landmarker.detect(image)[0]
    centre = tuple(float(v) for v in face.landmarks[:, :2].mean(axis=0))
    matrix = cv2.getRotationMatrix2D(centre, angle, 1.0)  # positive angle: counter-clockwise
    rotated = cv2.warpAffine(image, matrix, image.shape[1::-1], flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    pair = face_stack.context(image, rotated)
    result = face_gate(pair, max_pose_change_deg=7.9)
    assert result.metrics["roll_change_deg"] == pytest.approx(angle, abs=1.5)
    assert abs(result.metrics["yaw_change_deg"]) < 2.0
    assert abs(result.metrics["pitch_change_deg"]) < 2.0
    assert result.reasons == ("face_pose_change_above_max",)
    no_matrix = [FaceObservation(landmarks=f.landmarks) for f in (pair.source_faces[0], pair.candidate_faces[0])]
    fallback = no_matrix[1].pose_deg()[2] - no_matrix[0].pose_deg()[2]
    assert fallback == pytest.approx(angle, abs=1.5)


def _rotation(yaw: float, pitch: float, roll: float) -> np.ndarray:
    """R = Ry(yaw) Rx(pitch) Rz(roll), degrees: the intrinsic y-x-z order pose_deg reads."""
    y, p, r = np.radians([yaw, pitch, roll])
    ry = np.array([[np.cos(y), 0, np.sin(y)], [0, 1, 0], [-np.sin(y), 0, np.cos(y)]])
    rx = np.array([[1, 0, 0], [0, np.cos(p), -np.sin(p)], [0, np.sin(p), np.cos(p)]])
    rz = np.array([[np.cos(r), -np.sin(r), 0], [np.sin(r), np.cos(r), 0], [0, 0, 1]])
    return ry @ rx @ rz


@pytest.mark.parametrize(("yaw", "pitch", "roll"), [(25.0, 0.0, 0.0), (0.0, -15.0, 0.0), (-30.0, 12.0, 8.0)])
def test_yaw_pitch_roll_of_a_known_rotation(photo, landmarker, yaw, pitch, roll):
    """A facial transformation matrix of known angles (with MediaPipe's scale and translation)
    gives those angles back, and the gate reports their change between two faces."""
    face = landmarker.detect(photo("grace_hopper.jpg"))[0]

    def observed(y: float, p: float, r: float) -> FaceObservation:
        m = np.eye(4, dtype=np.float32)
        m[:3, :3] = 1.7 * _rotation(y, p, r)
        m[:3, 3] = (3.0, -2.0, -60.0)
        return FaceObservation(landmarks=face.landmarks, transform=m)

    assert observed(yaw, pitch, roll).pose_deg() == pytest.approx((yaw, pitch, roll), abs=1e-4)
    assert pose_change_deg(observed(0, 0, 0).pose_deg(), observed(yaw, pitch, roll).pose_deg()) == pytest.approx(
        (yaw, pitch, roll), abs=1e-4
    )


def test_a_mirrored_face_turns_the_other_way(face_stack, photo):
    """Mirroring a face that looks aside flips the sign of its yaw and roll and keeps its pitch
    (the real landmarker on a real photo: the angles are the model's, their symmetry is known)."""
    image = photo("biden_blue_room.jpg")
    face = face_stack.landmarker.detect(image)[0]
    mirrored = face_stack.landmarker.detect(np.ascontiguousarray(image[:, ::-1]))[0]
    (y0, p0, r0), (y1, p1, r1) = face.pose_deg(), mirrored.pose_deg()
    assert abs(y0) > 5.0  # the photo looks aside: a real test of yaw's sign
    assert y1 == pytest.approx(-y0, abs=2.0)
    assert r1 == pytest.approx(-r0, abs=2.0)
    assert p1 == pytest.approx(p0, abs=2.0)


def test_two_faces_when_one_is_expected(face_stack, photo):
    image = photo("two_people.jpg")
    pair = face_stack.context(image, image.copy())
    result = face_stack.gates[0](pair)
    assert result.metrics["faces"] == 2
    assert "face_count_mismatch" in result.reasons
    ok = face_gate(pair, detector=face_stack.gates[0].detector, expected_faces=2, max_pose_change_deg=7.9)
    assert ok.passed, ok.reasons


def test_no_face_in_candidate(face_stack, photo):
    image = photo("astronaut.png")
    # the shuttle model and flag, no face, scaled to the source's size
    background = cv2.resize(np.ascontiguousarray(image[:300, 330:]), image.shape[1::-1])
    pair = face_stack.context(image, background)
    result = face_stack.gates[0](pair)
    assert result.metrics["faces"] == 0 and result.metrics["detection_score"] is None
    assert set(result.reasons) == {"face_count_mismatch", "face_pose_unavailable"}


def test_low_confidence_and_threshold(face_stack, photo):
    image = photo("grace_hopper.jpg")
    pair = face_stack.context(image, image)
    weak = face_gate(pair, detector=FixedDetector([0.6]), detection_threshold=0.5, min_detection_score=0.7)
    assert weak.passed and weak.review == ("face_low_confidence",)  # people look; not a rejection
    below = face_gate(pair, detector=FixedDetector([0.4]), detection_threshold=0.5, min_detection_score=0.7)
    assert below.reasons == ("face_count_mismatch",)  # not a face at all


def test_real_detector_scores_bundled_faces(face_stack, photo):
    detector = face_stack.gates[0].detector
    for name in ("astronaut.png", "grace_hopper.jpg", "obama_portrait.jpg", "biden_portrait.jpg"):
        faces = [f for f in detector.detect(photo(name)) if f.score >= 0.5]
        assert len(faces) == 1, name
        assert 0.7 <= faces[0].score <= 1.0


def _glasses(image: np.ndarray, face: FaceObservation, thick: float) -> np.ndarray:
    """A dark glasses frame drawn on ``image`` from the mesh's iris centres: a rim about each eye,
    the bridge and the temples out to the ear-level points of the face oval, ``thick`` iod wide."""
    lm = face.landmarks[:, :2].astype(np.float64)
    right, left = lm[468], lm[473]
    iod = float(np.linalg.norm(left - right))
    ex = (left - right) / iod
    angle = float(np.degrees(np.arctan2(ex[1], ex[0])))
    out, t = image.copy(), max(2, round(thick * iod))

    def pt(p):
        return tuple(int(v) for v in np.round(p))

    for c in (right, left):
        cv2.ellipse(
            out, pt(c + (0, 0.05 * iod)), (round(0.36 * iod), round(0.24 * iod)), angle, 0, 360, (25, 25, 25), t
        )
    cv2.line(out, pt(right + ex * 0.36 * iod), pt(left - ex * 0.36 * iod), (25, 25, 25), t)
    cv2.line(out, pt(right - ex * 0.36 * iod), pt(lm[234]), (25, 25, 25), t)
    cv2.line(out, pt(left + ex * 0.36 * iod), pt(lm[454]), (25, 25, 25), t)
    return out


@pytest.mark.slow
def test_glasses_drawn_on_a_face_are_an_accessory_not_a_brow(photo):
    """Issue 43: a frame added by an editor was read as brows raised (0.169 iod against 0.028).
    biden_portrait.jpg with a dark frame drawn on it, re-rendered through TAEF2, jittered and
    registered as a run registers it: rejected as ``face_accessory_changed`` and not for its
    brows; the same photo's face and neck darkened by 25 L* (a good edit) moves the glasses
    measure by a fraction of its level and gives no accessory reason. On the old code the
    frame was ``expression_brow_change_above_max`` (brow shift 0.15 iod) and no accessory."""
    from counterfactory.generation.align import align_candidate
    from counterfactory.generation.rerender import rerender_like
    from counterfactory.validation.accessories import GLASSES_LEVEL
    from counterfactory.validation.calibration.corpus_edits import editor_jitter
    from counterfactory.validation.faces import get_face_landmarker
    from counterfactory.validation.gate_stack import GatesConfig, GateStack
    from counterfactory.validation.metrics.pixels import to_lab
    from counterfactory.validation.skin import source_edit_region

    image = photo("biden_portrait.jpg")
    h, w = image.shape[:2]
    s = 512 / max(h, w)
    image = cv2.resize(image, (round(w * s) // 8 * 8, round(h * s) // 8 * 8), interpolation=cv2.INTER_AREA)
    face = get_face_landmarker().detect(image)[0]
    region, _ = source_edit_region(image, face.landmarks, "face_neck_ears")
    stack = GateStack.from_config(GatesConfig(), "face", region="face_neck_ears")
    lab = to_lab(image)
    lab[..., 0] = np.clip(lab[..., 0] - 25.0 * cv2.GaussianBlur((region > 0).astype(np.float32), (0, 0), 4.0), 0, 100)
    darker = np.clip(np.rint(cv2.cvtColor(lab, cv2.COLOR_Lab2RGB) * 255), 0, 255).astype(np.uint8)

    def judged(edited):
        returned, _ = editor_jitter(rerender_like(edited, edited.shape), np.random.default_rng(2))
        aligned = align_candidate(image, returned, mask=region, kind="face", face_size_px=face.size_px)
        assert aligned.ok, aligned.reason
        return stack.evaluate(image, aligned.image, covered=aligned.covered)

    framed = judged(_glasses(image, face, 0.06))
    assert "face_accessory_changed" in framed.reasons, (framed.reasons, framed.metrics.get("face.glasses_change"))
    assert not any(r.startswith("expression_brow") for r in framed.reasons), framed.reasons
    assert framed.metrics["expression.brow_under_frame"] is True
    toned = judged(darker)
    assert "face_accessory_changed" not in toned.reasons
    assert abs(toned.metrics["face.glasses_change"]) < 0.5 * GLASSES_LEVEL
