"""Differential attrition: Wilson intervals against a textbook table, grouping, the chart."""

from __future__ import annotations

import itertools
import json

import pytest

from counterfactory.validation.attrition import attrition_table, plot_attrition, wilson_interval


@pytest.mark.parametrize(
    "passed, n, low, high",
    [
        # Newcombe (1998), Statistics in Medicine 17:857, Table II, method 3 (Wilson score)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0000, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_matches_newcombe_1998(passed, n, low, high):
    lo, hi = wilson_interval(passed, n)
    assert lo == pytest.approx(low, abs=5e-5)
    assert hi == pytest.approx(high, abs=5e-5)


def test_wilson_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(10, 10)[1] == 1.0
    # closed form at 0 successes: upper = z^2 / (n + z^2)
    z2 = 1.959963984540054**2
    assert wilson_interval(0, 50)[1] == pytest.approx(z2 / (50 + z2))
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def _rows():
    races = ["Black", "White", "East Asian"]
    genders = ["female", "male"]
    rows = []
    for race, gender in itertools.product(races, genders):
        for i in range(10):
            # the identity gate rejects 6 of 10 Black candidates, 1 of 10 otherwise
            identity_ok = i >= (6 if race == "Black" else 1)
            face_ok = True
            verdict = "accepted" if identity_ok and face_ok else "rejected"
            if race == "White" and gender == "male" and i == 9:
                verdict = "needs_review"
            rows.append(
                {
                    "condition": {"race": race, "gender": gender},
                    "verdict": verdict,
                    "gates": {"face": face_ok, "identity": identity_ok},
                }
            )
    rows.append({"condition": {"cue": "removed"}, "verdict": "failed", "gates": {"input": False}})
    return rows


def test_table_counts_every_group_and_gate():
    table = attrition_table(_rows())
    json.dumps(table, allow_nan=False)
    assert table["axes"] == ["race", "gender", "cue"]
    assert table["gates"] == ["face", "identity", "input", "overall"]
    assert table["rows"] == 61
    groups = {g["label"]: g for g in table["groups"]}
    black = groups["race=Black"]
    assert black["n"] == 20 and black["axis"] == "race"
    assert black["gates"]["identity"]["passed"] == 8
    assert black["gates"]["identity"]["rate"] == pytest.approx(0.4)
    lo, hi = wilson_interval(8, 20)
    assert (black["gates"]["identity"]["ci_low"], black["gates"]["identity"]["ci_high"]) == (lo, hi)
    # the cross of both axes, and single-axis cue group without a cross
    wm = groups["race=White x gender=male"]
    assert wm["axis"] == "race x gender" and wm["n"] == 10
    assert wm["gates"]["overall"]["passed"] == 8  # one rejected, one sent to review
    assert groups["cue=removed"]["gates"] == {
        "input": {"n": 1, "passed": 0, "rate": 0.0, "ci_low": 0.0, "ci_high": pytest.approx(0.7935, abs=1e-4)},
        "overall": {"n": 1, "passed": 0, "rate": 0.0, "ci_low": 0.0, "ci_high": pytest.approx(0.7935, abs=1e-4)},
    }
    assert not any(g["axis"].startswith("cue x") for g in table["groups"])
    assert table["all"]["identity"]["n"] == 60 and table["all"]["input"]["n"] == 1
    assert len([g for g in table["groups"] if g["axis"] == "race x gender"]) == 6


def test_disparity_flags_a_gate_that_rejects_one_group_more():
    table = attrition_table(_rows())
    identity_race = next(d for d in table["disparity"] if d["gate"] == "identity" and d["axis"] == "race")
    assert identity_race["lowest"] == "race=Black"
    assert identity_race["gap"] == pytest.approx(0.9 - 0.4)
    assert identity_race["separated"]  # Wilson intervals of 8/20 and 18/20 do not overlap
    face_race = next(d for d in table["disparity"] if d["gate"] == "face" and d["axis"] == "race")
    assert face_race["gap"] == 0.0 and not face_race["separated"]


@pytest.mark.slow
def test_empty_and_plot(tmp_path):
    empty = attrition_table([])
    assert empty["groups"] == [] and empty["rows"] == 0
    path = plot_attrition(attrition_table(_rows()), tmp_path / "attrition.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plot_attrition(empty, tmp_path / "empty.png")


def test_wilson_bounds_are_statsmodels_to_the_last_bit():
    """The interval is statsmodels' formula written out (its import cost every release command
    1.5 s): the same floats, not nearly the same, or every release's stats would change bytes."""
    import math

    from statsmodels.stats.proportion import proportion_confint

    from counterfactory.validation.attrition import Z95, wilson_bounds

    differ = []
    for alpha in (0.05, math.erfc(Z95 / math.sqrt(2)), 0.1, 0.01):
        for n in [*range(1, 50), 1000, 4321, 123457]:
            for k in range(0, n + 1, max(1, n // 50)):
                theirs = tuple(float(x) for x in proportion_confint(k, n, alpha=alpha, method="wilson"))
                if wilson_bounds(k, n, alpha=alpha) != theirs:
                    differ.append((alpha, k, n))
    assert differ == []
