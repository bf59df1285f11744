"""The rule evaluator (validation/gates/rules.py): a gate's decision is its table applied in order."""

from __future__ import annotations

import pytest

from counterfactory.validation.gates.rules import Rule, evaluate, rule_rows

TABLE = (
    Rule("mask_ok", "false", None, "g_no_mask"),
    Rule("a", "above", "max_a", "g_a_above_max", unless=("g_no_mask",)),
    Rule("b", "below", "min_b", "g_b_unchanged", outcome="review", unless=("g_no_mask",)),
    Rule("c", "below", "min_c", "g_c_below_min", missing="fire", unless=("g_no_mask", "g_b_unchanged")),
    Rule("d", "abs_above", "max_d", "g_d_above_max", kinds=("face",), when="strict"),
    Rule("e", "above", "max_e", "g_e_above_max", paths=("request",)),
    Rule("e2", "above", "max_e", "g_e_above_max"),
)
LIMITS = {"max_a": 1.0, "min_b": 0.5, "min_c": 2.0, "max_d": 3.0, "max_e": 0.0, "strict": True}


def test_rules_fire_in_table_order_and_each_code_once():
    measures = {"mask_ok": True, "a": 2.0, "b": 0.6, "c": 1.0, "d": -4.0, "e": 1.0, "e2": 1.0}
    assert evaluate(TABLE, measures, LIMITS, path="request", kind="face") == (
        ("g_a_above_max", "g_c_below_min", "g_d_above_max", "g_e_above_max"),
        (),
    )


def test_a_guard_makes_the_rules_after_it_moot_and_an_unset_threshold_is_not_judged():
    measures = {"mask_ok": False, "a": 2.0, "b": 0.1, "c": None}
    assert evaluate(TABLE, measures, LIMITS, kind="face") == (("g_no_mask",), ())
    assert evaluate(TABLE, {"mask_ok": True, "a": 9.0, "c": 5.0}, {**LIMITS, "max_a": None}) == ((), ())


def test_review_elif_missing_kind_path_and_when():
    measures = {"mask_ok": True, "b": 0.1, "c": None, "d": 9.0, "e": 1.0}
    # b below min_b goes to review, which makes c moot though c is missing
    assert evaluate(TABLE, measures, LIMITS, kind="limb", path="none") == ((), ("g_b_unchanged",))
    # without the review, a missing c fires; d is judged on a face only, when the switch is on
    measures["b"] = 0.9
    assert evaluate(TABLE, measures, LIMITS, kind="face", path="none") == (("g_c_below_min", "g_d_above_max"), ())
    assert evaluate(TABLE, measures, {**LIMITS, "strict": False}, kind="face") == (("g_c_below_min",), ())
    # a measure of the same name as the switch wins over the threshold
    assert evaluate(TABLE, {**measures, "strict": False}, LIMITS, kind="face") == (("g_c_below_min",), ())


def test_a_rule_names_a_known_comparison_and_outcome_and_prints_as_a_row():
    with pytest.raises(ValueError, match="comparison"):
        Rule("a", "around", "max_a", "g_a")
    with pytest.raises(ValueError, match="outcome"):
        Rule("a", "above", "max_a", "g_a", outcome="maybe")  # type: ignore[arg-type]
    row = rule_rows(TABLE[3:4])[0]
    assert row == {
        "metric": "c",
        "comparison": "<",
        "threshold": "min_c",
        "reason": "g_c_below_min",
        "outcome": "reject",
        "applies": "unless g_no_mask, g_b_unchanged; missing fires",
    }
