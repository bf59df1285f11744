"""Calibration: the shipped thresholds are reproducible, and spec photos are handled."""

from __future__ import annotations

import json
import shutil

import pytest

from counterfactory.assets import PHOTOS_DIR
from counterfactory.validation.calibration.base import bundled_photo_paths, sig_down, sig_up
from counterfactory.validation.calibration.calibrate import (
    RULES,
    _step_down,
    _step_up,
    run_calibration,
    suggest_thresholds,
)
from counterfactory.validation.calibration.corpus_fit import CORPUS_THRESHOLDS, FOCUS_RAW_THRESHOLDS
from counterfactory.validation.thresholds import CALIBRATION_FILE, load_calibration

BACKENDS = {"face": "mediapipe", "identity": "sface", "expression": "mediapipe"}


def test_rounding_helpers():
    assert sig_up(0.06231) == 0.063
    assert sig_up(7.86) == 7.9
    assert sig_up(0.02) == 0.02
    assert sig_down(0.06231) == 0.062
    assert sig_down(7.86) == 7.8
    assert _step_up(0.2471, 0.01) == 0.25
    assert _step_down(0.8762, 0.01) == 0.87
    assert _step_down(0.7351, 0.05) == 0.7


def _dist(**groups):
    return {g: {m: {"values": v} for m, v in metrics.items()} for g, metrics in groups.items()}


def test_suggestions_follow_the_rules():
    d = _dist(
        noop={
            "identity.cosine": [0.99, 0.913],
            "face.pose_change_deg": [0.5, 1.0],
            "face.detection_score": [0.9],
            "expression.au_change_max": [0.04, 0.16],
            "expression.au_change_mean": [0.01],
            "locality.diff_nonface": [0.01],
            "locality.diff_face": [0.012],
            "locality.ratio": [1.2, 2.01],
        },
        source={"face.detection_score": [0.81, 0.95]},
        different_person={"identity.cosine": [0.1, 0.301]},
        different_photo={
            "face.pose_change_deg": [4.0, 16.0, 9.0],
            "expression.au_change_max": [0.64],
            "expression.au_change_mean": [0.16],
            "locality.diff_nonface": [0.25],
        },
    )
    s = suggest_thresholds(d, backends=BACKENDS)
    assert s["face"]["identity"] == {"backend": "sface", "min_cosine": 0.31, "max_cosine": 0.91}
    assert s["limb"]["identity"] == {"backend": "sface", "min_cosine": 0.91}
    assert s["face"]["face"]["max_pose_change_deg"] == 3.0  # sqrt(1 * 9)
    assert s["face"]["face"]["min_detection_score"] == 0.8
    assert s["face"]["expression"]["max_au_change"] == pytest.approx(0.32)  # sqrt(0.16 * 0.64)
    assert s["face"]["expression"]["max_mean_au_change"] == pytest.approx(0.04)
    assert s["face"]["locality"] == {"max_diff_nonface": 0.05, "min_diff_face": 0.012, "min_ratio": 2.1}
    assert s["limb"]["locality"] == {
        "max_diff_outside_edit": 0.0,
        "max_diff_face_drift": 0.012,
        "min_diff_inside_edit": 0.012,
    }
    with pytest.raises(ValueError, match="different_person"):
        suggest_thresholds({k: v for k, v in d.items() if k != "different_person"}, backends=BACKENDS)


@pytest.mark.slow
def test_shipped_calibration_is_this_commands_output(tmp_path):
    """Re-running the calibration on the bundled photos gives the shipped thresholds.

    Without the failure corpus (too slow here; tests/validation/calibration/test_failures.py re-runs a
    small one twice) every threshold the corpus does not set must come out as shipped."""
    result = run_calibration(bundled_photo_paths(), tmp_path, progress=False)
    shipped = load_calibration()
    assert result["suggested"]["limb"] == shipped["suggested"]["limb"]
    corpus_set = {(gate, name) for gate, name, _, _ in CORPUS_THRESHOLDS} | {("identity", "max_cosine")}
    # FOCUS's raw figures: the corpus step leaves them unjudged (None) on face edits
    corpus_set |= {("locality", name) for name in FOCUS_RAW_THRESHOLDS}
    for gate, values in result["suggested"]["face"].items():
        for name, value in values.items():
            if (gate, name) not in corpus_set:
                assert shipped["suggested"]["face"][gate][name] == value, (gate, name)
    assert set(RULES) <= set(shipped["rules"])
    on_disk = json.loads((tmp_path / "calibration.json").read_text())
    assert on_disk["suggested"] == result["suggested"]
    assert (tmp_path / "calibration.png").read_bytes()[:4] == b"\x89PNG"
    assert CALIBRATION_FILE.with_suffix(".png").is_file()
    d = result["distributions"]
    # the distributions behind them are stored, sample by sample
    assert d["noop"]["identity.cosine"]["summary"]["n"] == len(d["noop"]["identity.cosine"]["labels"]) >= 50
    assert (
        d["different_person"]["identity.cosine"]["summary"]["max"]
        < result["published"]["opencv_sface_same_person_cosine"]
    )
    assert (
        d["same_person"]["identity.cosine"]["summary"]["min"] > result["published"]["opencv_sface_same_person_cosine"]
    )
    assert not result["excluded_pairs"]


@pytest.mark.slow
def test_spec_sources_are_assumed_distinct_and_duplicates_left_out(tmp_path):
    spec = tmp_path / "spec_sources"
    spec.mkdir()
    for i, name in enumerate(["obama_portrait.jpg", "obama_podium.jpg", "grace_hopper.jpg", "astronaut.png"]):
        shutil.copy(PHOTOS_DIR / name, spec / f"src{i}{PHOTOS_DIR.joinpath(name).suffix}")
    result = run_calibration(sorted(spec.iterdir()), tmp_path / "out", progress=False)
    assert {im["labels"] for im in result["images"]} == {"assumed_distinct"}
    # the two photos of one man are not taken for two different people
    assert [p["pair"].split("|") for p in result["excluded_pairs"]] == [["src0.jpg#0", "src1.jpg#0"]]
    assert result["distributions"]["different_person"]["identity.cosine"]["summary"]["n"] == 5


def test_no_photos_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="at least one photo"):
        run_calibration([], tmp_path)
