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


# the second photo (larger, slower) runs in the full suite only
@pytest.mark.parametrize("photo", ["grace_hopper.jpg", pytest.param("obama_portrait.jpg", marks=pytest.mark.slow)])
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


@pytest.mark.slow
def test_resize_and_shift_together():
    source = read_rgb("biden_portrait.jpg")
    shifted, truth = _apply(source, dx=6.0, dy=-3.0, scale=1.02)
    candidate = cv2.resize(shifted, (1024, 1024), interpolation=cv2.INTER_AREA)
    result = align_candidate(source, candidate, kind="face")
    assert result.ok, result.reason
    assert _max_error(result.transform, truth, source.shape) < TOLERANCE_PX
    scale, rotation = similarity_params(result.transform)
    assert scale == pytest.approx(1.02, abs=2e-3) and rotation == pytest.approx(0.0, abs=0.1)


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_different_photo_fails_registration(grace, astronaut):
    result = align_candidate(grace, astronaut)
    assert not result.ok
    assert result.reason.split(":")[0] in {
        "align_registration_failed",
        "align_transform_out_of_bounds",
        "align_residual_above_max",
        "align_coverage_below_min",
    }


# Nano Banana's fixed output sizes (w, h) by aspect ratio, as fal serves them
NANO_BANANA_SIZES = [(1024, 1024), (896, 1152), (832, 1248), (768, 1344), (1152, 896), (1248, 832), (1344, 768)]


def _nano_banana_like(source: np.ndarray, face_box, *, shift=(0.0, 0.0)) -> tuple[np.ndarray, np.ndarray]:
    """A face-only change, then crop-to-fill to the nearest fixed size and a small shift.

    Returns ``(output, truth)``, ``truth`` the 2x3 map from source to output pixel coordinates.
    """
    h, w = source.shape[:2]
    edited = source.copy()
    y0, y1, x0, x1 = face_box
    edited[y0:y1, x0:x1] = np.clip(edited[y0:y1, x0:x1].astype(int) * [1.15, 0.9, 0.8], 0, 255).astype(np.uint8)
    ow, oh = min(NANO_BANANA_SIZES, key=lambda s: abs(np.log((s[0] / s[1]) / (w / h))))
    s = max(ow / w, oh / h)  # fill: scale to cover, crop the overflow evenly
    truth = np.array(
        [
            [s, 0.0, 0.5 * s - 0.5 + (ow - s * w) / 2 + shift[0]],
            [0.0, s, 0.5 * s - 0.5 + (oh - s * h) / 2 + shift[1]],
        ]
    )
    out = cv2.warpAffine(edited, truth, (ow, oh), flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REFLECT)
    return out, truth


def _overlap_error(alignment, truth, shape) -> float:
    """Largest difference between estimated and true source -> output maps over the covered
    part of the source, in source pixels."""
    h, w = shape[:2]
    ys, xs = np.mgrid[0:h:8, 0:w:8]
    inside = alignment.covered[ys, xs]
    points = np.stack([xs[inside], ys[inside]], axis=1).astype(np.float64)
    a = points @ alignment.raw_transform[:, :2].T + alignment.raw_transform[:, 2]
    b = points @ truth[:, :2].T + truth[:, 2]
    return float(np.abs(a - b).max() / np.sqrt(abs(np.linalg.det(truth[:, :2]))))


@pytest.mark.parametrize(
    ("photo", "face_box", "shift"),
    [
        ("grace_hopper.jpg", (90, 330, 140, 370), (3.4, -2.6)),  # 512x600 -> 896x1152, 8 % cropped
        pytest.param("biden_portrait.jpg", None, (-5.2, 4.1), marks=pytest.mark.slow),
    ],
)
def test_nano_banana_crop_to_fill_registers_within_half_a_pixel(photo, face_box, shift):
    source = read_rgb(photo)
    h, w = source.shape[:2]
    face_box = face_box or (h // 5, h // 2, w // 3, 2 * w // 3)
    output, truth = _nano_banana_like(source, face_box, shift=shift)
    mask = np.zeros((h, w), np.uint8)
    mask[face_box[0] : face_box[1], face_box[2] : face_box[3]] = 255
    result = align_candidate(source, output, mask=mask, kind="face")
    assert result.ok, result.reason
    assert result.frame == "fill" and result.resize_from == output.shape[1::-1]
    assert _overlap_error(result, truth, source.shape) < TOLERANCE_PX
    # the editor's own motion is the shift, in source pixels; the crop shows as coverage
    scale, rotation = similarity_params(result.transform)
    assert scale == pytest.approx(1.0, abs=2e-3) and rotation == pytest.approx(0.0, abs=0.1)
    assert 0.85 < result.covered_share < 0.999
    # border not composited on face cells: uncovered pixels are black, never stretched edges
    assert not result.image[~result.covered].any()


def test_the_old_stretch_to_source_size_misregisters_the_same_output():
    # a control: stretching the crop-to-fill output to the source size first, as alignment
    # used to, leaves a non-uniform distortion no similarity undoes
    source = read_rgb("grace_hopper.jpg")
    output, truth = _nano_banana_like(source, (90, 330, 140, 370), shift=(3.4, -2.6))
    stretched = cv2.resize(output, source.shape[1::-1], interpolation=cv2.INTER_AREA)
    result = align_candidate(source, stretched, kind="face")
    h, w = source.shape[:2]
    stretch_back = np.array([[w / output.shape[1], 0, 0], [0, h / output.shape[0], 0]])
    true_to_stretched = stretch_back @ np.vstack([truth, [0, 0, 1]])
    assert not result.ok or _max_error(result.transform, true_to_stretched, source.shape) > 2.0


@pytest.mark.parametrize("size", [(560, 600), (512, 680)])
def test_anisotropic_resize_with_a_shift_registers(size):
    source = read_rgb("grace_hopper.jpg")
    shifted, truth = _apply(source, dx=2.5, dy=-1.5)
    candidate = cv2.resize(shifted, size, interpolation=cv2.INTER_AREA)
    result = align_candidate(source, candidate, kind="face")
    assert result.ok, result.reason
    assert result.frame == "stretch"
    assert _max_error(result.transform, truth, source.shape) < TOLERANCE_PX


def test_coverage_below_the_limit_is_a_reason_and_limb_borders_come_from_the_source():
    source = read_rgb("grace_hopper.jpg")
    h, w = source.shape[:2]
    # a 2:1 landscape output of a portrait: filled, most of the height is cropped away
    s = 1344 / w
    truth = np.array([[s, 0, 0.5 * s - 0.5], [0, s, 0.5 * s - 0.5 - (s * h - 672) / 2]])
    output = cv2.warpAffine(source, truth, (1344, 672), flags=cv2.INTER_CUBIC)
    result = align_candidate(source, output, kind="face")
    assert not result.ok and result.reason.startswith("align_coverage_below_min")
    assert result.covered_share == pytest.approx(672 / s / h, abs=0.01)
    limb = np.zeros((h, w), np.uint8)
    limb[250:350, 200:300] = 255
    relaxed = AlignConfig(min_covered_share=0.3)
    composited = align_candidate(source, output, mask=limb, kind="limb", config=relaxed)
    assert composited.ok, composited.reason
    np.testing.assert_array_equal(composited.image[~composited.covered], source[~composited.covered])


@pytest.mark.parametrize(
    ("photo", "zoom", "shift"),
    [
        # the zoom cancels part of the resize's anisotropy, so a uniform frame is nearer the
        # identity than the true axis-wise one: the frame must be chosen by the similarity
        ("obama_portrait.jpg", 1.012, (1.8, -1.1)),
        ("biden_blue_room.jpg", 1.008, (-2.4, 1.3)),
        ("grace_hopper.jpg", 1.02, (2.9, 0.4)),
    ],
)
def test_zoom_then_diffusers_resize_registers_within_half_a_pixel(photo, zoom, shift):
    """A diffusion editor's output: a 1-2 % zoom and a 1-3 px shift, then a resize to about
    1 MP in multiples of 16 (anisotropic by up to ~1 %). Ground truth: the same maps composed."""
    source = read_rgb(photo)
    h, w = source.shape[:2]
    f = min(1.0, 512 / max(h, w))
    source = cv2.resize(source, (round(w * f), round(h * f)), interpolation=cv2.INTER_AREA)
    h, w = source.shape[:2]
    moved, motion = _apply(source, dx=shift[0], dy=shift[1], scale=zoom)
    s = (1024 * 1024 / (h * w)) ** 0.5
    nw, nh = round(w * s / 16) * 16, round(h * s / 16) * 16
    candidate = cv2.resize(moved, (nw, nh), interpolation=cv2.INTER_CUBIC)
    result = align_candidate(source, candidate, kind="face")
    assert result.ok, result.reason
    assert result.frame == "stretch"
    assert _max_error(result.transform, motion, source.shape) < TOLERANCE_PX
    assert result.residual_px < 1.0


@pytest.mark.slow
def test_the_source_keypoints_are_found_once_per_source_and_region(monkeypatch):
    """Every cell of a template registers to one source: SIFT runs on the source once, and
    the cached keypoints give exactly the registration found without them."""
    from counterfactory.generation import align

    src = read_rgb("grace_hopper.jpg")
    cands = [_apply(src, dx=dx, dy=1.0)[0] for dx in (2.0, -1.5)]
    uncached = []
    for cand in cands:
        align._SOURCE_FEATURES.clear()
        align._SOURCE_BANDS.clear()
        uncached.append(align_candidate(src, cand).transform)
    align._SOURCE_FEATURES.clear()
    align._SOURCE_BANDS.clear()
    calls, bands = [], []
    real, real_band = align._detect, align.bandpass
    monkeypatch.setattr(align, "_detect", lambda grey, mask: calls.append(mask is not None) or real(grey, mask))
    source_grey = align._grey(src)

    def band(grey, sigma):
        bands.append(grey.shape == source_grey.shape and np.array_equal(grey, source_grey))
        return real_band(grey, sigma)

    monkeypatch.setattr(align, "bandpass", band)
    cached = [align_candidate(src, cand).transform for cand in cands]
    assert calls.count(True) == 1 and calls.count(False) == 2  # the source once, each output once
    # the source's band-passed grey once (registration and its correlation both read it), each
    # output's at least once
    assert bands.count(True) == 1 and bands.count(False) >= 2, bands
    for a, b in zip(uncached, cached):
        np.testing.assert_array_equal(a, b)
    other = src.copy()
    other[:8, :8] = 255 - other[:8, :8]  # other pixels (and so another grey image): another key
    align_candidate(other, cands[0])
    assert calls.count(True) == 2


@pytest.mark.slow
def test_the_residual_limit_is_in_pixels_of_the_smaller_image():
    """An editor that returns a tall photo at a long side of 512 places its keypoints on its
    own grid: 2 px there is 8.6 px of the 2204 px source, and the limit says so."""
    from counterfactory.generation.align import residual_limit
    from counterfactory.generation.rerender import get_rerenderer

    assert residual_limit(2.0, np.array([[0.25, 0.0, 0.0], [0.0, 0.25, 0.0]])) == pytest.approx(8.0)
    assert residual_limit(2.0, np.array([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0]])) == 2.0
    source = read_rgb("biden_blue_room.jpg")
    assert max(source.shape[:2]) > 2000
    out = get_rerenderer(512)(source)  # the demo editor's output: re-rendered at 512
    assert max(out.shape[:2]) == 512
    result = align_candidate(source, out)
    assert result.ok, result.reason
    # the residual in source pixels is above 2 px, below the same 2 px of the output's grid
    scale = max(out.shape[:2]) / max(source.shape[:2])
    assert result.residual_px < 2.0 / scale
    strict = align_candidate(source, out, config=AlignConfig(max_residual_px=0.05))
    assert not strict.ok and "of the" in strict.reason and "output" in strict.reason
