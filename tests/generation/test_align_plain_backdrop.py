"""Registration on a plain backdrop: London Set portraits (grey wall, white shirt, the face and
neck kept out of registration) re-rendered through TAEF2 as an editor's decoder does, then
moved, resized and JPEG-encoded by the test itself, whose warp is the ground truth.

On these photos ECC on raw intensities traded geometry for the decoder's smooth tone change
(7-20 px off at the face for sitters 105, 142 and 172); band-passed, the same outputs register
within half a pixel, and a different sitter in front of the same wall is not registered.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from counterfactory.generation import align
from counterfactory.generation.align import AlignConfig, align_candidate
from tests.flows.import_set import LONDON

needs_london = pytest.mark.skipif(not LONDON.is_dir(), reason=f"{LONDON} (the London set) is not on this machine")

#: sitters whose good edits misregistered by 6-20 px before the band-pass
SITTERS = ("105", "142", "172", "102")


def _portrait(sitter: str) -> np.ndarray:
    image = cv2.imread(str(LONDON / "neutral" / f"{sitter}.jpg"))[:, :, ::-1]
    return np.ascontiguousarray(cv2.resize(image, (384, 384), interpolation=cv2.INTER_AREA))


def _face(image: np.ndarray) -> tuple[np.ndarray, float]:
    from counterfactory.validation.faces import face_mask, get_face_landmarker

    (face,) = get_face_landmarker().detect(image)
    return face_mask(face.landmarks, image.shape[:2], mode="oval"), face.size_px


def _as_an_editor_returns(image: np.ndarray, *, shift, zoom: float) -> tuple[np.ndarray, np.ndarray]:
    """Re-rendered through TAEF2, zoomed about the centre and shifted, resized to 1024x1024,
    JPEG 90: ``(output, truth)``, truth the 2x3 map from source to output pixels."""
    from counterfactory.generation.rerender import rerender_like

    h, w = image.shape[:2]
    m = cv2.getRotationMatrix2D((w / 2, h / 2), 0.0, zoom)
    m[:, 2] += shift
    moved = cv2.warpAffine(
        rerender_like(image, image.shape), m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT
    )
    out = cv2.resize(moved, (1024, 1024), interpolation=cv2.INTER_CUBIC)
    ok, buf = cv2.imencode(".jpg", out[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    s = 1024 / w  # cv2.resize puts pixel centres at (x + 0.5) * s - 0.5
    resize = np.array([[s, 0.0, 0.5 * s - 0.5], [0.0, s, 0.5 * s - 0.5]])
    truth = (np.vstack([resize, [0, 0, 1]]) @ np.vstack([m, [0, 0, 1]]))[:2]
    return cv2.imdecode(buf, cv2.IMREAD_COLOR)[:, :, ::-1].copy(), truth


def _error_at(mask: np.ndarray, estimate: np.ndarray, truth: np.ndarray) -> float:
    """Largest distance between the estimated and true maps over ``mask``, in source pixels."""
    ys, xs = np.nonzero(mask)
    p = np.stack([xs, ys], axis=1).astype(np.float64)
    d = (p @ estimate[:, :2].T + estimate[:, 2]) - (p @ truth[:, :2].T + truth[:, 2])
    return float(np.sqrt((d**2).sum(axis=1)).max() / truth[0, 0])


@needs_london
@pytest.mark.slow
@pytest.mark.parametrize("sitter", SITTERS)
def test_a_rerendered_portrait_on_a_plain_backdrop_registers_within_half_a_pixel(sitter):
    source = _portrait(sitter)
    mask, size = _face(source)
    for shift, zoom in (((2.1, -1.4), 1.012), ((-1.3, 2.6), 1.018)):
        output, truth = _as_an_editor_returns(source, shift=shift, zoom=zoom)
        result = align_candidate(source, output, mask=mask, kind="face", face_size_px=size)
        assert result.ok, result.reason
        # at the face, where the gates measure position and expression
        assert _error_at(mask, result.raw_transform, truth) < 0.5
        assert result.correlation > 0.9


@needs_london
@pytest.mark.slow
def test_raw_intensity_ecc_misregisters_the_same_output(monkeypatch):
    """The control: with the band-pass switched off, ECC drifts on the same output."""
    source = _portrait("105")
    mask, size = _face(source)
    output, truth = _as_an_editor_returns(source, shift=(2.1, -1.4), zoom=1.012)
    monkeypatch.setattr(align, "BANDPASS_SIGMA_FRAC", 0.0)
    align._SOURCE_FEATURES.clear()
    align._SOURCE_BANDS.clear()
    result = align_candidate(source, output, mask=mask, kind="face", face_size_px=size)
    assert not result.ok or _error_at(mask, result.raw_transform, truth) > 2.0


@needs_london
@pytest.mark.slow
@pytest.mark.parametrize(("sitter", "other"), [("027", "003"), ("105", "172")])
def test_another_sitter_in_front_of_the_same_wall_is_not_registered(sitter, other):
    source = _portrait(sitter)
    mask, size = _face(source)
    output, _ = _as_an_editor_returns(_portrait(other), shift=(1.0, 1.0), zoom=1.01)
    result = align_candidate(source, output, mask=mask, kind="face", face_size_px=size)
    assert not result.ok
    assert result.reason.split(":")[0] in {
        "align_correlation_below_min",
        "align_registration_failed",
        "align_transform_out_of_bounds",
        "align_residual_above_max",
    }
    # the correlation floor is what refuses it where the rest would not: with it off, the
    # wall-and-shirt registration of 027 onto 003 passes every other check
    if result.reason.startswith("align_correlation_below_min"):
        loose = align_candidate(
            source, output, mask=mask, kind="face", face_size_px=size, config=AlignConfig(min_correlation=-1.0)
        )
        assert loose.ok and loose.correlation < 0.3


def test_one_stray_keypoint_does_not_fail_a_registration():
    """RMS over the matches the final transform explains: nine matches on a shirt and neck, one
    of them 8 px off, is a 0.3 px registration, not a 2.7 px one."""
    rng = np.random.default_rng(0)
    t = np.array([[2.0, 0.0, 3.0], [0.0, 2.0, -1.0]])
    p_src = rng.uniform(0, 384, (9, 2))
    p_cand = p_src @ t[:, :2].T + t[:, 2] + rng.normal(0, 0.3 * 2.0, (9, 2))
    p_cand[4] += (16.0, 0.0)  # 8 source pixels
    rms, explained, found = align._explained(t, p_src, p_cand)
    assert (explained, found) == (8, 9) and rms < 0.7
    everything = float(np.sqrt(np.mean(np.sum((p_src @ t[:, :2].T + t[:, 2] - p_cand) ** 2, axis=1)))) / 2.0
    assert everything > 2.0  # what the old residual reported, above the 2 px limit
    # keypoints that mostly disagree with the transform are a failure, not a residual of None
    p_cand[:6] += (40.0, 0.0)
    _, explained, found = align._explained(t, p_src, p_cand)
    assert explained < found / 2
