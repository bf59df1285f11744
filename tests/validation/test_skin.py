"""Skin tone (ITA°): known answers from the formula, a face-only tint, and the skin gate on the
bundled photos (no-op, lightened control, face darkened beyond the neck, limb inpainting)."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest

from counterfactory.assets import PHOTOS_DIR
from counterfactory.validation.calibration.base import load_rgb
from counterfactory.validation.faces import get_face_landmarker
from counterfactory.validation.gates.base import PairContext
from counterfactory.validation.gates.skin import SkinGate, SkinGateConfig, is_control
from counterfactory.validation.segment import get_person_segmenter
from counterfactory.validation.skin import (
    face_skin_mask,
    ita_deg,
    measure_pair,
    region_ita,
)

# -- a second, hand-written sRGB -> CIE L*a*b* (D65), independent of OpenCV ---------------

_M = np.array([[0.4124564, 0.3575761, 0.1804375], [0.2126729, 0.7151522, 0.0721750], [0.0193339, 0.1191920, 0.9503041]])
_WHITE = np.array([0.95047, 1.0, 1.08883])


def _srgb_to_lab(rgb: np.ndarray) -> np.ndarray:
    c = np.asarray(rgb, np.float64) / 255.0
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    xyz = lin @ _M.T / _WHITE
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], axis=-1)


def _lab_to_srgb_uint8(lab: np.ndarray) -> np.ndarray:
    out = cv2.cvtColor(np.asarray(lab, np.float32).reshape(-1, 1, 3), cv2.COLOR_Lab2RGB).reshape(np.shape(lab))
    return np.clip(np.round(out * 255), 0, 255).astype(np.uint8)


def _textbook_ita(L: float, b: float) -> float:
    return math.degrees(math.atan((L - 50.0) / b))


@pytest.mark.parametrize(
    ("L", "a", "b"),
    [(75.0, 8.0, 15.0), (62.0, 12.0, 18.0), (50.0, 14.0, 20.0), (38.0, 13.0, 19.0), (25.0, 10.0, 14.0)],
)
def test_ita_of_a_lab_patch_is_the_textbook_angle(L, a, b):
    # e.g. L*=75, b*=15: arctan(25 / 15) = 59.04 deg ("very light"); L*=25, b*=14: -60.75 ("dark")
    expected = _textbook_ita(L, b)
    assert ita_deg(np.array([L, a, b])) == pytest.approx(expected, abs=1e-9)
    patch = np.broadcast_to(_lab_to_srgb_uint8(np.array([[L, a, b]]))[0], (40, 40, 3)).copy()
    # 8-bit quantisation moves L* and b* by a few tenths; the exact formula on the quantised
    # pixel agrees with OpenCV's (which rounds a* and b* to 1/64 on its float path) to 0.6 deg
    measured = region_ita(patch, np.full((40, 40), 255, np.uint8))
    lab_back = _srgb_to_lab(patch[0, 0])
    assert measured == pytest.approx(_textbook_ita(lab_back[0], lab_back[2]), abs=0.6)
    assert measured == pytest.approx(expected, abs=1.0)


def test_region_ita_is_the_median_and_needs_enough_pixels():
    light = _lab_to_srgb_uint8(np.array([[70.0, 8.0, 16.0]]))[0]
    dark = _lab_to_srgb_uint8(np.array([[35.0, 12.0, 20.0]]))[0]
    image = np.zeros((30, 30, 3), np.uint8)
    image[:, :20] = light  # two thirds light: the median is the light tone, a mean would not be
    image[:, 20:] = dark
    lab = _srgb_to_lab(light)
    assert region_ita(image, np.full((30, 30), 255, np.uint8)) == pytest.approx(_textbook_ita(lab[0], lab[2]), abs=0.6)
    small = np.zeros((30, 30), np.uint8)
    small[:5, :5] = 255
    assert region_ita(image, small) is None
    assert region_ita(image, None) is None


# -- bundled photos -----------------------------------------------------------------------

PORTRAIT = "obama_portrait.jpg"


@pytest.fixture(scope="module")
def portrait():
    image = load_rgb(PHOTOS_DIR / PORTRAIT)
    face = get_face_landmarker().detect(image)[0]
    return image, face


def _tint(image: np.ndarray, mask: np.ndarray, delta_l: float) -> np.ndarray:
    """``image`` with L* moved by ``delta_l`` inside ``mask`` (a* and b* kept)."""
    lab = cv2.cvtColor(image.astype(np.float32) / 255.0, cv2.COLOR_RGB2Lab)
    inside = mask > 0
    lab[..., 0][inside] = np.clip(lab[..., 0][inside] + delta_l, 0, 100)
    out = cv2.cvtColor(lab, cv2.COLOR_Lab2RGB)
    return np.clip(np.round(out * 255), 0, 255).astype(np.uint8)


@pytest.mark.slow
def test_face_only_tint_moves_face_ita_by_the_formula_and_not_the_neck(portrait):
    image, face = portrait
    from counterfactory.validation.faces import face_mask

    oval = face_mask(face.landmarks, image.shape[:2], mode="oval")
    delta_l = 5.0
    tinted = _tint(image, oval, delta_l)
    src, cand = measure_pair(
        image, tinted, get_person_segmenter(), source_landmarks=face.landmarks, candidate_landmarks=face.landmarks
    )
    # expected: the textbook ITA at the face skin's median L* + 5 and median b*, by the
    # hand-written Lab conversion above
    skin = face_skin_mask(face.landmarks, image.shape[:2]) > 0
    lab = _srgb_to_lab(image[skin])
    L, b = float(np.median(lab[:, 0])), float(np.median(lab[:, 2]))
    expected_change = _textbook_ita(L + delta_l, b) - _textbook_ita(L, b)
    change = cand.face_ita_deg - src.face_ita_deg
    assert expected_change > 5.0  # a 5-unit L* lift is a large angle at mid lightness
    assert change == pytest.approx(expected_change, rel=0.25)
    assert src.body_ita_deg is not None and cand.body_ita_deg is not None
    assert abs(cand.body_ita_deg - src.body_ita_deg) < 0.3


@pytest.fixture(scope="module")
def gate():
    from counterfactory.validation.gate_stack import KindGatesConfig

    config = KindGatesConfig(kind="face").skin
    assert config is not None  # on by default, thresholds from the shipped calibration
    return SkinGate(config)


def _pair(source, candidate, face, *, kind="face", edit_mask=None, extras=None):
    cand_faces = get_face_landmarker().detect(candidate)
    return PairContext(
        source=source,
        candidate=candidate,
        kind=kind,
        face_mask=None,
        edit_mask=edit_mask,
        source_faces=[face],
        candidate_faces=cand_faces,
        extras=extras or {},
    )


CONTROL = {
    "condition": {"race": "Black", "gender": "male"},
    "source": {"presented_gender": "male", "extra": {"race": "Black"}},
}
EDIT = {
    "condition": {"race": "White", "gender": "male"},
    "source": {"presented_gender": "male", "extra": {"race": "Black"}},
}


@pytest.mark.slow
def test_noop_copy_passes(gate, portrait):
    image, face = portrait
    for extras in (CONTROL, EDIT):
        result = gate(_pair(image, image.copy(), face, extras=extras))
        assert result.passed and not result.review, result
        assert result.metrics["face_ita_change_deg"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.slow
def test_realistic_face_lightening_on_a_control_is_a_skin_tone_shift(gate, portrait):
    image, face = portrait
    from counterfactory.validation.faces import face_mask

    # +4 L* on the face only: about the lift Seo et al. report as editors' typical lightening
    lighter = _tint(image, face_mask(face.landmarks, image.shape[:2], mode="oval"), 4.0)
    control = gate(_pair(image, lighter, face, extras=CONTROL))
    assert not control.passed and control.reasons == ("skin_tone_shift",)
    assert control.metrics["lightened"] is True and control.metrics["control"] is True
    # the same lightening on a change of group is not rejected, only recorded as lightened
    edit = gate(_pair(image, lighter, face, extras=EDIT))
    assert edit.passed and edit.metrics["lightened"] is True and edit.metrics["control"] is False


@pytest.mark.slow
def test_face_darkened_far_beyond_the_neck_is_recorded_and_reviewed_only_when_congruence_is_required(gate, portrait):
    image, face = portrait
    from counterfactory.validation.faces import face_mask

    darker = _tint(image, face_mask(face.landmarks, image.shape[:2], mode="oval"), -25.0)
    result = gate(_pair(image, darker, face, extras=EDIT))
    # congruence is a covariate by default: recorded, not judged
    assert result.passed and result.review == ()
    assert result.metrics["face_body_gap_growth_deg"] > gate.config.max_face_body_gap_growth_deg
    assert result.metrics["face_body_incongruent"] is True
    assert result.metrics["darkened"] is True
    strict = SkinGate(gate.config.model_copy(update={"require_congruent": True}))
    judged = strict(_pair(image, darker, face, extras=EDIT))
    assert judged.passed and judged.review == ("skin_face_body_mismatch",)


@pytest.mark.slow
def test_limb_inpainting_of_another_tone_is_a_mismatch():
    from counterfactory.validation.gate_stack import KindGatesConfig

    image = load_rgb(PHOTOS_DIR / "biden_blue_room.jpg")
    face = get_face_landmarker().detect(image)[0]
    mask = np.zeros(image.shape[:2], np.uint8)
    # the bundled limb metadata's hand-drawn forearm polygons for this photo
    for poly in (
        [[287, 937], [595, 948], [617, 1102], [331, 1119]],
        [[650, 909], [909, 926], [909, 1058], [661, 1075]],
    ):
        cv2.fillPoly(mask, [np.array(poly, np.int32)], 255)
    limb_gate = SkinGate(KindGatesConfig(kind="limb").skin)
    kept = limb_gate(
        _pair(image, image.copy(), face, kind="limb", edit_mask=mask, extras={"condition": {"cue": "kept"}})
    )
    assert kept.passed, kept
    # the inpainted hands painted far darker than the person's skin elsewhere
    darker = _tint(image, mask, -30.0)
    result = limb_gate(
        _pair(image, darker, face, kind="limb", edit_mask=mask, extras={"condition": {"cue": "removed"}})
    )
    assert "skin_inpaint_mismatch" in result.reasons
    assert result.metrics["inpaint_gap_growth_deg"] > limb_gate.config.max_inpaint_gap_deg
    assert abs(result.metrics["source_inpaint_gap_deg"]) < limb_gate.config.max_inpaint_gap_deg  # hands match face


def test_is_control_reads_the_source_record_and_control_conditions():
    fields = {"race": "race", "gender": "presented_gender"}
    controls = [{"cue": "kept"}]
    src = {"presented_gender": "female", "extra": {"race": "East Asian"}}
    assert is_control(
        {"race": "East Asian", "gender": "female"}, src, source_fields=fields, control_conditions=controls
    )
    assert not is_control({"race": "White", "gender": "female"}, src, source_fields=fields, control_conditions=controls)
    assert (
        is_control({"race": "White"}, {"presented_gender": "f"}, source_fields=fields, control_conditions=controls)
        is None
    )
    assert is_control({"cue": "kept"}, None, source_fields=fields, control_conditions=controls)
    assert is_control({}, src, source_fields=fields, control_conditions=controls) is None


def test_config_rejects_unknown_fields_and_non_positive_tolerances():
    with pytest.raises(ValueError, match="max_ita_shift_deg"):
        SkinGateConfig(max_ita_shift_deg=0, max_face_body_gap_growth_deg=9, max_inpaint_gap_deg=9)
    with pytest.raises(ValueError, match="extra"):
        SkinGateConfig(max_ita_shift_deg=3, max_face_body_gap_growth_deg=9, max_inpaint_gap_deg=9, typo=1)


@pytest.mark.slow
def test_stack_passes_condition_through_to_the_skin_gate(face_stack, portrait):
    image, face = portrait
    from counterfactory.validation.faces import face_mask

    lighter = _tint(image, face_mask(face.landmarks, image.shape[:2], mode="oval"), 4.0)
    judgement = face_stack.evaluate(image, lighter, extras=CONTROL)
    assert "skin_tone_shift" in judgement.reasons
    assert judgement.to_dict()["gates"]["skin"]["metrics"]["control"] is True


@pytest.mark.slow
def test_a_same_cue_control_keeps_what_the_mask_showed_and_is_not_judged_as_inpainted_skin():
    """The inpaint-match rule is a treatment's (skin painted where the cue was). A same-cue
    control keeps what the mask showed: the demo's astronaut's mask is her white glove, whose
    ITA (near-neutral colours: b* about 0) swings by tens of degrees under the classical
    editor's re-rendering (-17 to -41). Labelled a treatment, the same pixels are a mismatch."""
    from counterfactory.generation.editors.base import EditRequest
    from counterfactory.generation.editors.classical import ClassicalEditor, ClassicalOptions
    from counterfactory.validation.gate_stack import KindGatesConfig

    image = load_rgb(PHOTOS_DIR / "astronaut.png")
    face = get_face_landmarker().detect(image)[0]
    mask = np.zeros(image.shape[:2], np.uint8)
    # assets/photos/limb-metadata.yaml: the astronaut's limb mask (her gloved hand)
    cv2.fillPoly(mask, [np.array([[118, 456], [182, 456], [186, 512], [116, 512]], np.int32)], 255)
    editor = ClassicalEditor(ClassicalOptions(output_multiple=0))
    request = EditRequest("a", image, "", seed=0, condition={"cue": "kept"}, mask=mask, kind="limb")
    out = editor.edit(request).image
    # the factory composites a limb cell: every pixel outside the mask is the source's
    kept = np.where(mask[..., None] > 0, out, image)
    limb_gate = SkinGate(KindGatesConfig(kind="limb").skin)
    control = limb_gate(_pair(image, kept, face, kind="limb", edit_mask=mask, extras={"condition": {"cue": "kept"}}))
    growth = control.metrics["inpaint_gap_growth_deg"]
    assert growth > limb_gate.config.max_inpaint_gap_deg  # the glove's ITA moved that far
    assert control.metrics["control"] is True
    assert "skin_inpaint_mismatch" not in control.reasons and control.passed, control
    treatment = limb_gate(
        _pair(image, kept, face, kind="limb", edit_mask=mask, extras={"condition": {"cue": "removed"}})
    )
    assert "skin_inpaint_mismatch" in treatment.reasons


def test_a_kept_person_probability_is_not_overwritten_by_later_segmentations():
    """The source's person probability is kept for every candidate of that source (a limb
    cell redraws its body skin from it). MediaPipe's ``numpy_view()`` is a view into a buffer
    it frees and reuses: a 512 px working grid, segmented at its own size with no resize to
    copy it, once came back holding later calls' numbers (the demo-limb astronaut's control
    had 0, 621 or 1851 body-skin pixels, run to run)."""
    import gc

    from counterfactory.validation.segment import SEGMENT_SIDE

    segmenter = get_person_segmenter()
    astronaut = load_rgb(PHOTOS_DIR / "astronaut.png")
    assert max(astronaut.shape[:2]) <= SEGMENT_SIDE  # the path without a resize
    kept = segmenter.segment(astronaut)
    assert kept.flags.owndata or (kept.base is not None and kept.base.flags.owndata)
    first = kept.copy()
    other = np.ascontiguousarray(load_rgb(PHOTOS_DIR / "biden_blue_room.jpg")[:512, :512])
    for _ in range(5):
        segmenter.segment(other)
        segmenter.person_mask(other)
        gc.collect()
    assert np.array_equal(kept, first)
    assert 0.0 <= float(kept.min()) and float(kept.max()) <= 1.0
