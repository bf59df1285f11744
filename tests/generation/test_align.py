"""Alignment known-answer tests on real photos.

The ground truth is the transform the test itself applies with OpenCV (a second
implementation of the warp); alignment must recover it to within 0.5 px everywhere in the image.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from counterfactory.generation.align import AlignConfig, align_candidate, composite, composite_alpha, similarity_params
from tests.conftest import read_rgb

TOLERANCE_PX = 0.5


def _apply(image: np.ndarray, *, dx=0.0, dy=0.0, scale=1.0, rot_deg=0.0) -> tuple[np.ndarray, np.ndarray]:
    """Warp ``image`` so that candidate(M @ x) = source(x); returns (candidate, M)."""
    h, w = image.shape[:2]
    m = cv2.getRotationMatrix2D((w / 2, h / 2), rot_deg, scale)
    m[:, 2] += (dx, dy)
    return cv2.warpAffine(image, m, (w, h), flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REFLECT), m


def _max_error(estimate: np.ndarray, truth: np.ndarray, shape) -> float:
    """Largest displacement difference over a grid covering the whole image, in pixels."""
    h, w = shape[:2]
    ys, xs = np.mgrid[0:h:16, 0:w:16]
    points = np.stack([xs.ravel(), ys.ravel()], axis=1).astype(np.float64)
    a = points @ estimate[:, :2].T + estimate[:, 2]
    b = points @ truth[:, :2].T + truth[:, 2]
    return float(np.abs(a - b).max())


@pytest.mark.parametrize("photo", ["grace_hopper.jpg", "obama_portrait.jpg"])
@pytest.mark.parametrize(
    "motion",
    [
        {"dx": 3.3, "dy": -2.1},
        {"dx": -7.6, "dy": 5.2},
        {"scale": 1.04},
        {"scale": 0.96},
        {"rot_deg": 2.0},
        {"rot_deg": -3.5},
        {"dx": -4.0, "dy": 3.0, "scale": 0.97, "rot_deg": -1.5},
    ],
)
def test_recovers_shift_scale_rotation(photo, motion):
    source = read_rgb(photo)
    candidate, truth = _apply(source, **motion)
    result = align_candidate(source, candidate, kind="face")
    assert result.ok, result.reason
    assert _max_error(result.transform, truth, source.shape) < TOLERANCE_PX
    assert result.residual_px is not None and result.residual_px < 1.0


@pytest.mark.parametrize(
    "size",
    [
        "multiple16",  # diffusers' VAE-friendly resize
        "multiple32",
        (1024, 1024),  # fixed output size, aspect changed
        (1184, 896),  # a Nano Banana / Qwen ~1 MP bucket
    ],
)
def test_undoes_editor_resizes(size):
    source = read_rgb("grace_hopper.jpg")  # 512 x 600: not a multiple of 32
    h, w = source.shape[:2]
    if size == "multiple16":
        size = (round(w / 16) * 16 + 16, round(h / 16) * 16)
    elif size == "multiple32":
        size = (round(w / 32) * 32, round(h / 32) * 32 + 32)
    candidate = cv2.resize(source, size, interpolation=cv2.INTER_AREA)
    result = align_candidate(source, candidate, kind="face")
    assert result.ok, result.reason
    assert result.resize_from == tuple(size)
    assert result.image.shape == source.shape
    assert _max_error(result.transform, np.eye(2, 3), source.shape) < TOLERANCE_PX


def test_resize_and_shift_together():
    source = read_rgb("biden_portrait.jpg")
    shifted, truth = _apply(source, dx=6.0, dy=-3.0, scale=1.02)
    candidate = cv2.resize(shifted, (1024, 1024), interpolation=cv2.INTER_AREA)
    result = align_candidate(source, candidate, kind="face")
    assert result.ok, result.reason
    assert _max_error(result.transform, truth, source.shape) < TOLERANCE_PX
    scale, rotation = similarity_params(result.transform)
    assert scale == pytest.approx(1.02, abs=2e-3) and rotation == pytest.approx(0.0, abs=0.1)


def test_limb_composite_is_bit_identical_outside_mask():
    source = read_rgb("biden_blue_room.jpg")
    h, w = source.shape[:2]
    mask = np.zeros((h, w), np.uint8)
    cv2.fillPoly(mask, [np.array([[287, 937], [595, 948], [617, 1102], [331, 1119]], np.int32)], 255)
    # an "edit" that changes the inside, drifts by a sub-pixel shift and is resized like diffusers
    edited = source.copy()
    edited[mask > 0] = (255, 0, 0)
    drifted, _ = _apply(edited, dx=1.7, dy=-0.8)
    candidate = cv2.resize(drifted, (976, 2208), interpolation=cv2.INTER_AREA)
    result = align_candidate(source, candidate, mask=mask, kind="limb", config=AlignConfig(feather_px=3))
    assert result.ok and result.composited
    outside = mask == 0
    assert np.array_equal(result.image[outside], source[outside])
    # and inside, the edit survived
    core = cv2.erode(mask, np.ones((9, 9), np.uint8)) > 0
    assert np.abs(result.image[core].astype(int) - [255, 0, 0]).mean() < 30


def test_face_composite_by_choice_keeps_source_outside_grown_mask(grace):
    mask = np.zeros(grace.shape[:2], np.uint8)
    cv2.circle(mask, (260, 230), 80, 255, -1)
    candidate = np.clip(grace.astype(int) + 40, 0, 255).astype(np.uint8)
    config = AlignConfig(composite="mask", method="none", face_composite_grow_frac=0.1)
    result = align_candidate(grace, candidate, mask=mask, kind="face", config=config)
    alpha = composite_alpha(mask, feather_px=config.feather_px, grow_px=round(0.1 * np.sqrt((mask > 0).sum())))
    assert np.array_equal(result.image[alpha == 0], grace[alpha == 0])
    assert (result.image[mask > 0].astype(int) - grace[mask > 0]).mean() > 30


def test_composite_weights_are_exactly_zero_outside_and_one_in_core():
    mask = np.zeros((64, 64), np.uint8)
    mask[16:48, 16:48] = 255
    alpha = composite_alpha(mask, feather_px=4)
    assert alpha[mask == 0].max() == 0.0
    assert alpha[24:40, 24:40].min() == 1.0
    src = np.zeros((64, 64, 3), np.uint8)
    out = composite(src, np.full_like(src, 200), alpha)
    assert out[mask == 0].max() == 0 and out[32, 32].tolist() == [200, 200, 200]


@pytest.mark.parametrize(
    "candidate, code",
    [
        (np.zeros((600, 512, 3), np.uint8), "align_candidate_blank"),
        (np.full((300, 256, 3), 128, np.uint8), "align_candidate_blank"),
        (np.zeros((600, 512), np.uint8), "align_bad_candidate"),
        (np.zeros((600, 512, 3), np.float32), "align_bad_candidate"),
    ],
)
def test_unusable_candidates_are_reasons_not_crashes(grace, candidate, code):
    result = align_candidate(grace, candidate)
    assert not result.ok and result.reason.startswith(code)


def test_a_different_photo_fails_registration(grace, astronaut):
    result = align_candidate(grace, astronaut)
    assert not result.ok
    assert result.reason.split(":")[0] in {
        "align_registration_failed",
        "align_transform_out_of_bounds",
        "align_residual_above_max",
    }
