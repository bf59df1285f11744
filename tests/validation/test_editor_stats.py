"""Editors compared: the statistics against hand-computed and published values."""

from __future__ import annotations

import math

import pytest

from counterfactory.validation.attrition import Z95
from counterfactory.validation.editor_stats import compare_proportions, editor_stats, fisher_exact_p, proportion


def test_wilson_interval_at_all_and_none_passed_is_the_closed_form():
    # at k = n the Wilson lower bound is n / (n + z^2); at k = 0 the upper bound is z^2 / (n + z^2)
    assert proportion(18, 18)["ci_low"] == pytest.approx(18 / (18 + Z95**2), abs=1e-12)
    assert proportion(0, 18)["ci_high"] == pytest.approx(Z95**2 / (18 + Z95**2), abs=1e-12)
    # 1 of 18, by hand: centre (1/18 + z^2/36) / (1 + z^2/18), half-width z/(1 + z^2/18) sqrt(p q/18 + z^2/1296)
    p, z2 = 1 / 18, Z95**2
    centre = (p + z2 / 36) / (1 + z2 / 18)
    half = Z95 / (1 + z2 / 18) * math.sqrt(p * (1 - p) / 18 + z2 / 1296)
    got = proportion(1, 18)
    assert (got["ci_low"], got["ci_high"]) == pytest.approx((centre - half, centre + half), abs=1e-12)
    assert (round(got["ci_low"], 4), round(got["ci_high"], 4)) == (0.0099, 0.2576)


def test_fisher_exact_matches_published_values():
    # Fisher's lady tasting tea, 3 of 4 right: two-sided p = 17/35 (Agresti, CDA, 3rd ed., 3.5.2)
    assert fisher_exact_p(3, 4, 1, 4) == pytest.approx(17 / 35, abs=1e-12)
    # 3/3 against 0/3: only that table and its mirror are as extreme, 2 / C(6, 3)
    assert fisher_exact_p(3, 3, 0, 3) == pytest.approx(2 / 20, abs=1e-12)
    assert fisher_exact_p(2, 2, 2, 2) == 1.0


def test_two_proportion_z_test_by_hand():
    # 18/18 against 1/18: pooled p = 19/36, se = sqrt(p q (2/18)), z = (17/18) / se = 5.6754
    got = compare_proportions(18, 18, 1, 18)
    assert got["test"] == "z"
    assert got["z"] == pytest.approx(5.67543, abs=1e-5)
    assert got["p_value"] == pytest.approx(1.3834e-08, rel=1e-3)
    assert got["diff"] == pytest.approx(17 / 18)
    # a small side goes to Fisher's test; an empty side has nothing to test
    assert compare_proportions(3, 3, 0, 3)["test"] == "fisher"
    assert compare_proportions(3, 3, 0, 0)["p_value"] is None


def _row(editor: str, race: str, status: str, lightened: bool, reasons=()) -> dict:
    return {
        "editor_name": editor,
        "condition": {"race": race},
        "status": status,
        "reasons": list(reasons),
        "gates": {"skin": {"metrics": {"lightened": lightened, "face_ita_change_deg": 2.0 if lightened else -1.0}}},
        "expression": None,
    }


def test_editor_stats_counts_per_editor_and_group():
    items = [
        _row("a", "Black", "accepted", True),
        _row("a", "White", "accepted", False),
        _row("b", "Black", "rejected", True, ["skin_tone_shift: 9.1 deg"]),
        _row("b", "White", "accepted", False),
    ]
    section = editor_stats(items, floors={"a": {"t1": {"metrics": {"diff_face": 0.02}}}})
    assert section["names"] == ["a", "b"] and section["groups"] == ["all", "race=Black", "race=White"]
    b_black = section["by_editor"]["b"]["groups"]["race=Black"]
    assert (b_black["n"], b_black["accepted"], b_black["reasons"]) == (1, 0, {"skin_tone_shift": 1})
    assert section["by_editor"]["a"]["groups"]["all"]["lightened"]["rate"] == 0.5
    assert section["by_editor"]["a"]["groups"]["all"]["face_ita_change_deg_mean"] == 0.5
    assert section["by_editor"]["a"]["noise_floor"] == {"templates": 1, "means": {"diff_face": 0.02}}
    assert section["by_editor"]["b"]["noise_floor"] == {"templates": 0, "means": {}}
    black = next(c for c in section["comparisons"] if c["group"] == "race=Black")
    assert (black["diff"], black["test"], black["p_value"]) == (1.0, "fisher", 1.0)
