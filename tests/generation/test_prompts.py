"""Prompt templates: FOCUS's one-variable face prompt and the limb templates."""

from __future__ import annotations

import hashlib

import pytest

from counterfactory.assets import PROMPTS_DIR
from counterfactory.generation.prompts import PromptConfig, load_template, render_prompt
from counterfactory.manifests.errors import SetupError


def test_face_prompt_has_target_group_as_its_only_variable():
    text, sha = load_template("face_only_v1")
    assert text.count("{") == 1 and "{TARGET_GROUP}" in text
    assert sha == hashlib.sha256((PROMPTS_DIR / "face_only_v1.txt").read_bytes()).hexdigest()
    for held in ("background", "framing", "pose", "clothing", "expression", "age", "style"):
        assert held in text


@pytest.mark.parametrize(
    "condition, group",
    [
        ({"race": "Black", "gender": "female"}, "a Black woman"),
        ({"race": "East Asian", "gender": "male"}, "an East Asian man"),
        ({"race": "Indian", "gender": "female"}, "an Indian woman"),
    ],
)
def test_face_prompts_differ_only_in_the_group(condition, group):
    rendered = render_prompt(PromptConfig(), kind="face", condition=condition)
    template, _ = load_template("face_only_v1")
    assert rendered.text == template.replace("{TARGET_GROUP}", group)


def test_limb_prompts_pick_the_cue_template_and_region():
    removed = render_prompt(
        PromptConfig(), kind="limb", condition={"cue": "removed"}, source_meta={"limb_region": "left forearm"}
    )
    kept = render_prompt(PromptConfig(), kind="limb", condition={"cue": "kept"})
    assert removed.template == "limb_removed_v1" and "left forearm" in removed.text
    assert kept.template == "limb_kept_v1" and "arm and hand" in kept.text


def test_unknown_template_lists_the_bundled_ones():
    with pytest.raises(SetupError, match="face_only_v1"):
        load_template("nope_v9")
