"""The edit region follows the prompt: one definition (``generation.regions``) that the prompt
templates name and the mask builder draws, and the gates measure body skin outside it."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from counterfactory.assets import PHOTOS_DIR
from counterfactory.generation.prompts import PromptConfig, face_region, render_prompt
from counterfactory.generation.regions import REGIONS, get_region, template_region
from counterfactory.validation.calibration.base import load_rgb
from counterfactory.validation.faces import face_mask, get_face_landmarker, region_mask
from counterfactory.validation.gate_stack import GateStack, KindGatesConfig
from counterfactory.validation.gates.locality import LocalityGate
from counterfactory.validation.gates.skin import SkinGate
from counterfactory.validation.skin import source_edit_region

EDIT = {
    "condition": {"race": "Black", "gender": "female"},
    "source": {"presented_gender": "female", "extra": {"race": "White"}},
}


def test_the_bundled_face_prompt_names_face_neck_and_ears():
    # face_only_v1 asks to change "the facial features, skin tone of the face and neck, and facial hair"
    text = (PHOTOS_DIR.parent / "prompts" / "face_only_v1.txt").read_text()
    assert "face and neck" in text and "facial hair" in text
    assert template_region("face_only_v1") == "face_neck_ears"
    assert get_region("face_neck_ears").neck and get_region("face_neck_ears").ears
    assert face_region(PromptConfig()) == "face_neck_ears"
    rendered = render_prompt(PromptConfig(), kind="face", condition={"race": "Black", "gender": "female"})
    assert rendered.region == "face_neck_ears"
    # the region decides measurement, not the editor's output: not in the lineage
    assert "region" not in rendered.lineage()
    assert (
        render_prompt(
            PromptConfig(face="face_all_skin_v1"), kind="face", condition={"race": "Black", "gender": "male"}
        ).region
        == "all_visible_skin"
    )
    assert template_region("no_such_template") == "face"
    with pytest.raises(ValueError, match="known regions"):
        get_region("elbows")
    assert set(REGIONS) >= {"face", "face_neck_ears", "all_visible_skin"}


def test_a_caller_cannot_change_the_cached_region_map(tmp_path):
    """``regions.yaml`` is read once per folder and the cached mapping is shared: what one caller
    is handed must not be writable, or its change would be every later caller's answer."""
    from counterfactory.generation.regions import _region_map

    (tmp_path / "regions.yaml").write_text("mine_v1: face\n")
    handed = _region_map(str(tmp_path.resolve()))
    with pytest.raises(TypeError):
        handed["mine_v1"] = "face_neck_ears"  # type: ignore[index]
    assert template_region("mine_v1", tmp_path) == "face"
    assert dict(_region_map(str(tmp_path.resolve()))) == {"mine_v1": "face"}


def _landmarks_of(image):
    return get_face_landmarker().detect(image)[0]


def _shift_l(image: np.ndarray, mask: np.ndarray, delta_l: float) -> np.ndarray:
    lab = cv2.cvtColor(image.astype(np.float32) / 255.0, cv2.COLOR_RGB2Lab)
    inside = mask > 0
    lab[..., 0][inside] = np.clip(lab[..., 0][inside] + delta_l, 0, 100)
    return np.clip(np.round(cv2.cvtColor(lab, cv2.COLOR_Lab2RGB) * 255), 0, 255).astype(np.uint8)


@pytest.mark.slow
def test_region_masks_nest_and_the_neck_lies_below_the_chin():
    image = load_rgb(PHOTOS_DIR / "grace_hopper.jpg")
    face = _landmarks_of(image)
    shape = image.shape[:2]
    oval = region_mask(face.landmarks, shape, "face")
    assert np.array_equal(oval, face_mask(face.landmarks, shape, mode="oval"))
    wide = region_mask(face.landmarks, shape, "face_neck_ears")
    everything = region_mask(face.landmarks, shape, "all_visible_skin")
    assert np.all(wide[oval > 0] > 0) and np.all(everything[oval > 0] > 0)
    neck = (wide > 0) & (oval == 0)
    chin_y = face.landmarks[152, 1]
    ys = np.nonzero(neck)[0]
    # most of what the region adds is below the chin (the neck), a little is beside the face (ears)
    assert np.mean(ys > chin_y) > 0.6
    assert wide.sum() > 1.3 * oval.sum()


@pytest.mark.slow
def test_a_neck_tone_change_under_face_only_v1_is_inside_the_region():
    image = load_rgb(PHOTOS_DIR / "grace_hopper.jpg")
    face = _landmarks_of(image)
    shape = image.shape[:2]
    neck_ears = region_mask(face.landmarks, shape, "face_neck_ears")
    oval = face_mask(face.landmarks, shape, mode="oval")
    # darken the face and, as the prompt asks, the neck: 12 L* units
    edited = _shift_l(image, neck_ears, -12.0)
    assert np.abs(edited.astype(int) - image)[(neck_ears > 0) & (oval == 0)].mean() > 5
    config = KindGatesConfig(kind="face")
    gates = [LocalityGate(config.locality), SkinGate(config.skin)]

    def judge(region: str):
        stack = GateStack(list(gates), kind="face", region=region)
        return {r.gate: r for r in stack.evaluate(image, edited, extras=EDIT).results}

    inside = judge(template_region("face_only_v1"))
    assert "locality_body_skin_above_max" not in inside["locality"].reasons
    assert "locality_changed_share_above_max" not in inside["locality"].reasons
    assert "skin_body_tone_shift" not in inside["skin"].reasons
    # the same pixels judged as if the prompt named the face oval only: the neck is body skin
    outside = judge("face")
    assert outside["locality"].metrics["body_skin_delta_e"] > config.locality.max_body_skin_delta_e
    assert "locality_body_skin_above_max" in outside["locality"].reasons


@pytest.mark.slow
def test_a_hands_visible_template_is_flagged_and_its_good_edit_goes_to_review_only_when_required():
    image = load_rgb(PHOTOS_DIR / "obama_portrait.jpg")  # arms crossed, both hands show
    face = _landmarks_of(image)
    region, flags = source_edit_region(image, face.landmarks, "face_neck_ears")
    assert flags["source_body_skin_visible"] is True and flags["source_body_skin_px"] > 500
    # a portrait cropped above the shoulders shows none
    cropped = load_rgb(PHOTOS_DIR / "biden_portrait.jpg")
    _, portrait = source_edit_region(cropped, _landmarks_of(cropped).landmarks, "face_neck_ears")
    assert portrait["source_body_skin_visible"] is False
    # a good face-only edit: face and neck 15 L* lighter, hands untouched
    edited = _shift_l(image, region, 15.0)
    skin = KindGatesConfig(kind="face").skin
    extras = {
        "condition": {"race": "White", "gender": "male"},
        "source": {"presented_gender": "male", "extra": {"race": "Black"}},
    }
    by_default = GateStack([SkinGate(skin)], kind="face", region="face_neck_ears").evaluate(
        image, edited, extras=extras
    )
    result = by_default.results[-1]
    assert result.metrics["body_skin_visible"] is True
    assert result.metrics["face_body_incongruent"] is True
    assert by_default.verdict == "accepted", by_default.reasons
    strict = SkinGate(skin.model_copy(update={"require_congruent": True}))
    required = GateStack([strict], kind="face", region="face_neck_ears").evaluate(image, edited, extras=extras)
    assert required.verdict == "needs_review" and required.reasons == ("skin_face_body_mismatch",)
