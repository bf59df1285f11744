"""Expression labels from blendshapes on real photos, modal template labels, drift rates."""

from __future__ import annotations

import pytest

from counterfactory.validation.expression_audit import drift_rates, expression_label, modal_label
from counterfactory.validation.faces import get_face_landmarker
from tests.conftest import read_rgb


@pytest.mark.parametrize(
    "photo, expected",
    [
        # what a person sees in the bundled photos: a broad smile, a closed-mouth neutral
        # studio portrait, and a tight-lipped unsmiling pose with arms crossed
        ("astronaut.png", "SMILE"),
        ("obama_portrait.jpg", "SMILE"),
        ("grace_hopper.jpg", "NEUTRAL"),
        ("biden_blue_room.jpg", "SERIOUS"),
    ],
)
def test_labels_of_real_photos(photo, expected):
    face = get_face_landmarker().detect(read_rgb(photo))[0]
    assert expression_label(face.blendshapes)[0] == expected


def test_a_smile_that_vanishes_in_an_edit_is_drift():
    assert expression_label({"mouthSmileLeft": 0.9, "mouthSmileRight": 0.8})[0] == "SMILE"
    assert expression_label({"mouthSmileLeft": 0.1, "mouthSmileRight": 0.1})[0] == "NEUTRAL"
    assert modal_label(["SMILE", "SMILE", "NEUTRAL"]) == "SMILE"
    assert modal_label(["SMILE", "NEUTRAL"], tie_break="NEUTRAL") == "NEUTRAL"
    rows = [
        {"condition": {"race": "Black"}, "expression": {"label": "NEUTRAL", "consistent": False}},
        {"condition": {"race": "Black"}, "expression": {"label": "SMILE", "consistent": True}},
        {"condition": {"race": "White"}, "expression": {"label": "SMILE", "consistent": True}},
        {"condition": {"race": "White"}, "expression": None},
    ]
    rates = drift_rates(rows)
    assert rates["overall"]["n"] == 3 and rates["overall"]["drifted"] == 1
    by_group = {g["group"]: g for g in rates["per_group"]}
    assert by_group["Black"]["rate"] == 0.5 and by_group["White"]["rate"] == 0.0
