"""Known answers for the measures that catch what editors get wrong (issue 9).

Each measure is checked on a constructed case whose answer follows from the construction:
a pasted square of known area, a constant colour offset, a contrast scale about the mean, a
CIELAB lightness shift of skin, a mouth corner lifted by k pixels, a face moved by d pixels.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from counterfactory.validation.faces import LEFT_BROW, RIGHT_BROW, FaceObservation, face_mask
from counterfactory.validation.gates.base import PairContext
from counterfactory.validation.gates.expression import (
    brow_shifts,
    expression_geometry,
    geometry_changes,
    mouth_corner_shifts,
)
from counterfactory.validation.gates.face import face_placement_change
from counterfactory.validation.gates.locality import locality_gate
from counterfactory.validation.metrics.body_skin import body_skin_drift
from counterfactory.validation.metrics.pixels import (
    LOCAL_CHANGE_LEVEL,
    away_from_face,
    changed_share,
    global_change,
    to_lab,
)


def _texture(h=400, w=400, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(60, 150, size=(h, w, 3), dtype=np.uint8)


def test_pasted_square_gives_its_area_as_changed_share():
    source = _texture()
    candidate = source.copy()
    level = int(round(2 * LOCAL_CHANGE_LEVEL * 255))  # twice the level: it is crossed at the square's edge
    a = 60
    candidate[100 : 100 + a, 200 : 200 + a] += np.uint8(level)
    region = np.full(source.shape[:2], 255, np.uint8)
    share = changed_share(source, candidate, region)
    assert share == pytest.approx(a * a / region.size, rel=0.04)
    # the same square inside an excluded (face) region is not counted
    region[90:170, 190:270] = 0
    assert changed_share(source, candidate, region) == 0.0


def test_noise_and_re_encoding_change_no_area(photo):
    source = photo("grace_hopper.jpg")
    ok, buf = cv2.imencode(".jpg", source[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 85])
    candidate = cv2.imdecode(buf, cv2.IMREAD_COLOR)[:, :, ::-1]
    region = away_from_face(None, source.shape[:2], 0.0)
    assert changed_share(source, candidate, region) < 1e-3


def test_colour_offset_and_contrast_give_shift_and_gain():
    source = _texture()
    region = np.full(source.shape[:2], 255, np.uint8)
    cast = source.copy()
    cast[..., 0] += 10
    shift, gain = global_change(source, cast, region)
    assert shift == pytest.approx(10 / 255, abs=1e-12)
    assert gain == pytest.approx(0.0, abs=1e-6)
    x = source.astype(np.float64)
    mean = x.reshape(-1, 3).mean(axis=0)
    flat = np.rint((x - mean) * 0.9 + mean).astype(np.uint8)
    shift, gain = global_change(source, flat, region)
    assert gain == pytest.approx(0.1, abs=0.01)  # rounding to whole grey levels only
    # the whole region's median stays put, its dark and light thirds move oppositely
    assert 1 / 255 < shift < 10 / 255


def test_body_skin_lightness_shift_gives_its_delta_e():
    h, w = 300, 300
    skin_rgb = np.array([200, 150, 120], np.uint8)
    source = np.full((h, w, 3), 40, np.uint8)  # dark background, not skin
    fmask = np.zeros((h, w), np.uint8)
    cv2.circle(fmask, (150, 80), 40, 255, -1)
    source[fmask > 0] = skin_rgb
    source[180:260, 100:200] = skin_rgb  # "neck and hands": skin-coloured, outside the head
    person = np.zeros((h, w), np.uint8)
    person[30:280, 80:220] = 255
    lab = to_lab(source)
    lab[180:260, 100:200, 0] += 10.0  # L* + 10 on the body skin only
    rgb = cv2.cvtColor(lab, cv2.COLOR_Lab2RGB)
    candidate = np.clip(np.rint(rgb * 255), 0, 255).astype(np.uint8)
    delta_e, frac = body_skin_drift(source, candidate, fmask, person, face_size_px=80.0)
    assert frac == pytest.approx(80 * 100 / (h * w), rel=1e-9)
    assert delta_e == pytest.approx(10.0, abs=0.5)  # uint8 rounding of the recoloured pixels
    unchanged, _ = body_skin_drift(source, source.copy(), fmask, person, face_size_px=80.0)
    assert unchanged == 0.0
    # no skin outside the head: not measured
    none, frac = body_skin_drift(source, candidate, fmask, fmask, face_size_px=80.0)
    assert none is None and frac == 0.0


def _upright(face: FaceObservation) -> np.ndarray:
    """Landmarks rotated so that the eye line is horizontal (the face frame is the image frame)."""
    lm = face.landmarks[:, :2].astype(np.float64)
    k = face.keypoints5().astype(np.float64)
    angle = np.arctan2(k[1, 1] - k[0, 1], k[1, 0] - k[0, 0])
    c, s = np.cos(-angle), np.sin(-angle)
    return (lm - k[0]) @ np.array([[c, s], [-s, c]]) + k[0]


@pytest.mark.parametrize("roll_deg", [0.0, 20.0])
def test_mouth_corner_lift_of_k_pixels_is_k_over_iod(photo, landmarker, roll_deg):
    face = landmarker.detect(photo("obama_portrait.jpg"))[0]
    lm = _upright(face)
    iod = float(np.hypot(*(lm[473] - lm[468])))
    k = 6.0
    lifted = lm.copy()
    lifted[[61, 291], 1] -= k  # image y points down: up is minus
    theta = np.radians(roll_deg)  # the same face tilted: the measure lives in the face's frame
    rot = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    src, cand = lm @ rot.T, lifted @ rot.T
    change = geometry_changes(src, cand)
    assert change["mouth_corner_change_iod"] == pytest.approx(k / iod, rel=1e-9)
    assert change["mouth_open_change_iod"] == pytest.approx(0.0, abs=1e-9)
    g0, g1 = expression_geometry(src), expression_geometry(cand)
    assert g1["mouth_corner_right"] - g0["mouth_corner_right"] == pytest.approx(k / iod, rel=1e-9)  # up is positive


def _rotated(image: np.ndarray, landmarks: np.ndarray, deg: float) -> tuple[np.ndarray, np.ndarray]:
    h, w = image.shape[:2]
    m = cv2.getRotationMatrix2D((w / 2, h / 2), deg, 1.0)
    out = cv2.warpAffine(image, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    return out, np.c_[landmarks[:, :2], np.ones(len(landmarks))] @ m.T


@pytest.mark.parametrize("roll_deg", [0.0, 20.0])
@pytest.mark.parametrize("k", [-3, 4, 7])
def test_brow_region_moved_k_pixels_gives_k_over_iod(photo, landmarker, roll_deg, k):
    """The brows and the skin around them moved up (k > 0) or down by k pixels, in the pixels:
    each brow's measured shift is k / iod; the same face tilted gives the same (face frame)."""
    image = photo("obama_portrait.jpg")
    face = landmarker.detect(image)[0]
    image, lm = _rotated(image, face.landmarks, -face.pose_deg()[2])  # upright: brows move along y
    iod = float(np.hypot(*(lm[473] - lm[468])))
    brows = lm[list(RIGHT_BROW + LEFT_BROW)]
    x0, x1 = int(brows[:, 0].min() - 0.3 * iod), int(brows[:, 0].max() + 0.3 * iod)
    y0, y1 = int(brows[:, 1].min() - 0.5 * iod), int(brows[:, 1].max() + 0.5 * iod)
    moved = image.copy()
    moved[y0 - k : y1 - k, x0:x1] = image[y0:y1, x0:x1]  # content at row y now at y - k: up by k
    src, cand = image, moved
    if roll_deg:
        cand, _ = _rotated(moved, lm, roll_deg)
        src, lm = _rotated(image, lm, roll_deg)
    right, left = brow_shifts(src, cand, lm)
    assert right == pytest.approx(k / iod, abs=0.25 / iod)  # a quarter of a pixel
    assert left == pytest.approx(k / iod, abs=0.25 / iod)


def test_brows_of_a_feature_transplant_do_not_move(photo, landmarker):
    """Another person's skin and features blended around unmoved brows: no brow shift, where the
    mesh's brow points (which follow the whole face) rose by 0.067 iod."""
    from counterfactory.generation.masks import feather
    from counterfactory.validation.backends.base import similarity_transform

    source, donor = photo("obama_portrait.jpg"), photo("biden_portrait.jpg")
    face, donor_face = landmarker.detect(source)[0], landmarker.detect(donor)[0]
    m = similarity_transform(donor_face.keypoints5(), face.keypoints5())
    warped = cv2.warpAffine(donor, m, source.shape[1::-1], flags=cv2.INTER_LINEAR)
    alpha = feather(face_mask(face.landmarks, source.shape[:2], mode="skin"), 8)[..., None]
    candidate = np.round(alpha * warped + (1 - alpha) * source).astype(np.uint8)
    assert max(abs(v) for v in brow_shifts(source, candidate, face.landmarks)) < 0.015


@pytest.mark.parametrize("roll_deg", [0.0, 20.0])
@pytest.mark.parametrize("k", [-3, 2, 4])
def test_mouth_corner_region_moved_k_pixels_gives_k_over_iod(photo, landmarker, roll_deg, k):
    """Each mouth corner and the skin around it moved up (k > 0) or down by k pixels in the
    pixels: its measured shift is k / iod, tilted or not; the other corner, left in place,
    reads 0."""
    image = photo("obama_portrait.jpg")
    face = landmarker.detect(image)[0]
    image, lm = _rotated(image, face.landmarks, -face.pose_deg()[2])
    iod = float(np.hypot(*(lm[473] - lm[468])))
    x, y = lm[61]  # the subject's right corner (image left)
    r = int(0.35 * iod)
    x0, x1, y0, y1 = int(x - r), int(x + r), int(y - r), int(y + r)
    moved = image.copy()
    moved[y0 - k : y1 - k, x0:x1] = image[y0:y1, x0:x1]
    src, cand = image, moved
    if roll_deg:
        cand, _ = _rotated(moved, lm, roll_deg)
        src, lm = _rotated(image, lm, roll_deg)
    right, left = mouth_corner_shifts(src, cand, lm)
    assert right == pytest.approx(k / iod, abs=0.3 / iod)
    assert left == pytest.approx(0.0, abs=0.3 / iod)


def test_fuller_lips_and_a_recoloured_face_do_not_move_the_mouth_corners(photo, landmarker):
    """A good edit's lip morph (12 % taller about the lips' centre, as the corpus makes) and a
    face recoloured 20 L* darker leave each corner's patch where it was (under 0.01 iod), where
    the frown the corpus warps in at its smallest (0.07 iod) moves it by 0.05 or more."""
    from counterfactory.generation.masks import feather
    from counterfactory.validation.calibration.corpus_edits import _bump, _scale_about, _warp_field
    from counterfactory.validation.faces import LIPS

    image = photo("obama_portrait.jpg")
    face = landmarker.detect(image)[0]
    lm = face.landmarks[:, :2]
    dx, dy = _scale_about(image.shape[:2], lm[list(LIPS)].mean(axis=0), 0.12 * face.size_px, 1.0, 1.12)
    fuller = _warp_field(image, dx, dy)
    assert np.abs(fuller.astype(int) - image).max() > 40  # the lips did change
    assert max(abs(v) for v in mouth_corner_shifts(image, fuller, face.landmarks)) < 0.01
    lab = to_lab(image)
    alpha = feather(face_mask(face.landmarks, image.shape[:2], mode="oval"), 8)
    lab[..., 0] -= 20.0 * alpha
    darker = np.clip(np.rint(cv2.cvtColor(lab, cv2.COLOR_Lab2RGB) * 255), 0, 255).astype(np.uint8)
    assert max(abs(v) for v in mouth_corner_shifts(image, darker, face.landmarks)) < 0.01
    # the corpus's smallest frown: both corners warped down by 0.07 iod at their centre
    iod = float(np.hypot(*(lm[473] - lm[468])))
    down = np.zeros(image.shape[:2], np.float32)
    for corner in (61, 291):
        # as the corpus draws it: "up" times a negative amount (the face is upright: up is -y)
        down += 0.07 * iod * _bump(image.shape[:2], lm[corner], 0.18 * iod)
    frown = _warp_field(image, np.zeros_like(down), down)
    right, left = mouth_corner_shifts(image, frown, face.landmarks)
    assert right < -0.05 and left < -0.05


def test_face_moved_by_d_pixels_and_scaled(photo, landmarker):
    face = landmarker.detect(photo("grace_hopper.jpg"))[0]
    d = 0.2 * face.size_px
    moved = FaceObservation(landmarks=face.landmarks + np.float32([d * 0.6, d * 0.8, 0]))
    position, scale = face_placement_change(face, moved)
    assert position == pytest.approx(0.2, rel=1e-4)
    assert scale == pytest.approx(0.0, abs=1e-6)
    centre = face.landmarks[:, :2].mean(axis=0)
    grown = face.landmarks.copy()
    grown[:, :2] = (grown[:, :2] - centre) * 1.1 + centre
    position, scale = face_placement_change(face, FaceObservation(landmarks=grown))
    assert scale == pytest.approx(0.1, rel=1e-4)
    assert position == pytest.approx(0.0, abs=1e-4)


def test_skin_mask_mode_keeps_eyes_and_lips_out_of_non_face(photo, landmarker):
    source = np.clip(photo("grace_hopper.jpg"), 20, 235).astype(np.uint8)
    face = landmarker.detect(source)[0]
    oval = face_mask(face.landmarks, source.shape[:2], mode="oval")
    skin = face_mask(face.landmarks, source.shape[:2], mode="skin")
    candidate = source.copy()
    cut = (oval > 0) & (skin == 0)  # eyes, brows, lips, upper forehead
    candidate[cut] += 20
    pair = PairContext(source, candidate, "face", skin, None, [face], [face], face_mask_mode="skin")
    result = locality_gate(pair, max_diff_nonface=0.001)
    assert result.metrics["diff_nonface"] == 0.0  # FOCUS's split: only outside the oval is non-face
    assert result.passed


def test_raw_and_focus_figures_are_reported(photo, landmarker):
    source = photo("grace_hopper.jpg")
    face = landmarker.detect(source)[0]
    oval = face_mask(face.landmarks, source.shape[:2], mode="oval")
    composite = source.copy()
    raw = source.copy()
    raw[:40] = 255 - raw[:40]  # the editor changed the top rows; the composite put them back
    editor_size = cv2.resize(raw, (source.shape[1] // 2 * 2 + 16, source.shape[0] // 2 * 2 + 16))
    pair = PairContext(
        source, composite, "face", oval, None, [face], [face], raw_candidate=raw, unregistered=editor_size
    )
    m = locality_gate(pair).metrics
    assert m["diff_nonface"] == 0.0
    assert m["raw_diff_nonface"] > 0.01 and m["raw_changed_share"] > 0.0
    assert m["focus_diff_nonface"] > 0.01
    assert m["focus_ratio"] is not None
