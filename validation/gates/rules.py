"""Gates as declared rules over pure measures: one rule type, one evaluator.

A gate computes its measures (named numbers and facts, no decisions) and hands them, with its
thresholds, to :func:`evaluate`, which applies the gate's rule table (a tuple of :class:`Rule`)
in order and returns the reason codes that reject and the codes that send to review. The table
is the gate's decision: the report and the docs print it (:func:`rule_rows`), and adding a
threshold is one row in it (plus the threshold's field in the gate's config).

A rule applies when its threshold is set (``threshold_field`` names it in the thresholds;
a tuple: any of them set; None: always), the judging path is one of ``paths`` and the edit kind
one of ``kinds`` (None: every one), the measure (or switch) ``when`` (if named) is true, and none of the
codes in ``unless`` was given before it (an ``elif`` chain, or a guard that makes the rules
after it moot). It then fires when the measure compares with the threshold as ``comparison``
says (:data:`COMPARISONS`); a missing measure (None) fires only with ``missing="fire"``. A code
is given once, however many rules fire it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

#: comparison -> (test of value against threshold, how the report prints it)
COMPARISONS: dict[str, tuple[Callable[[Any, Any], bool], str]] = {
    "above": (lambda v, t: v > t, ">"),
    "below": (lambda v, t: v < t, "<"),
    "abs_above": (lambda v, t: abs(v) > t, "abs >"),
    "differs": (lambda v, t: v != t, "!="),
    "false": (lambda v, t: not v, "is false"),
}

Outcome = Literal["reject", "review"]


@dataclass(frozen=True)
class Rule:
    """One declared check of a gate: ``measures[metric] <comparison> thresholds[threshold_field]``
    gives ``reason`` (rejected, or sent to review with ``outcome="review"``)."""

    metric: str
    comparison: str
    threshold_field: str | tuple[str, ...] | None
    reason: str
    paths: tuple[str, ...] | None = None
    kinds: tuple[str, ...] | None = None
    outcome: Outcome = "reject"
    #: a missing measure: "skip" the rule, or "fire" it (a figure that cannot be taken fails)
    missing: Literal["skip", "fire"] = "skip"
    #: a measure that must be true for the rule to apply (a fact such as ``is_control``; a
    #: name not among the measures is read from the thresholds: a switch such as
    #: ``require_congruent``)
    when: str | None = None
    #: codes that, already given by an earlier rule, make this one moot
    unless: tuple[str, ...] = ()
    #: a fixed threshold not in the config (a module constant), printed by name and value
    constant: float | None = None

    def __post_init__(self) -> None:
        if self.comparison not in COMPARISONS:
            raise ValueError(f"rule {self.reason}: unknown comparison {self.comparison!r}")
        if self.outcome not in ("reject", "review"):
            raise ValueError(f"rule {self.reason}: unknown outcome {self.outcome!r}")

    def threshold(self, thresholds: Mapping[str, Any]) -> Any:
        """The value this rule compares with (None: the rule is not judged)."""
        if self.constant is not None:
            return self.constant
        field = self.threshold_field
        if field is None:
            return True
        if isinstance(field, tuple):
            return True if any(thresholds.get(f) is not None for f in field) else None
        return thresholds.get(field)


def evaluate(
    rules: Sequence[Rule],
    measures: Mapping[str, Any],
    thresholds: Mapping[str, Any],
    *,
    path: str | None = None,
    kind: str | None = None,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Apply ``rules`` in order; returns ``(reasons, review)``, each in the order the rules
    gave them and each code once."""
    given: dict[str, list[str]] = {"reject": [], "review": []}
    for rule in rules:
        if rule.paths is not None and path not in rule.paths:
            continue
        if rule.kinds is not None and kind not in rule.kinds:
            continue
        if rule.when is not None and not (measures[rule.when] if rule.when in measures else thresholds.get(rule.when)):
            continue
        if any(code in given["reject"] or code in given["review"] for code in rule.unless):
            continue
        bound = rule.threshold(thresholds)
        if bound is None:
            continue
        value = measures.get(rule.metric)
        if value is None:
            fires = rule.missing == "fire" or rule.comparison == "false"
        else:
            fires = COMPARISONS[rule.comparison][0](value, bound)
        if fires and rule.reason not in given[rule.outcome]:
            given[rule.outcome].append(rule.reason)
    return tuple(given["reject"]), tuple(given["review"])


def _threshold_text(rule: Rule) -> str:
    if rule.constant is not None:
        return f"{rule.threshold_field} = {rule.constant:g}"
    if rule.threshold_field is None:
        return ""
    if isinstance(rule.threshold_field, tuple):
        return "any of " + ", ".join(rule.threshold_field) + " set"
    return rule.threshold_field


def rule_rows(rules: Sequence[Rule]) -> list[dict[str, str]]:
    """The table as printed by the report and the docs: one row per rule with ``metric``,
    ``comparison``, ``threshold``, ``reason``, ``outcome`` and ``applies`` (paths, kinds,
    conditions; empty when always)."""
    rows = []
    for rule in rules:
        applies = []
        if rule.paths is not None:
            applies.append("path " + "/".join(rule.paths))
        if rule.kinds is not None:
            applies.append("kind " + "/".join(rule.kinds))
        if rule.when is not None:
            applies.append(f"when {rule.when}")
        if rule.unless:
            applies.append("unless " + ", ".join(rule.unless))
        if rule.missing == "fire" and rule.comparison != "false":
            applies.append("missing fires")
        rows.append(
            {
                "metric": rule.metric,
                "comparison": COMPARISONS[rule.comparison][1],
                "threshold": _threshold_text(rule),
                "reason": rule.reason,
                "outcome": rule.outcome,
                "applies": "; ".join(applies),
            }
        )
    return rows


def rule_table_markdown(rules: Sequence[Rule]) -> str:
    """:func:`rule_rows` as a Markdown table (the docs' gate pages)."""
    lines = ["| metric | comparison | threshold | reason | outcome | applies |", "|---|---|---|---|---|---|"]
    for row in rule_rows(rules):
        lines.append(
            "| " + " | ".join(f"`{v}`" if v and k in ("metric", "reason") else v for k, v in row.items()) + " |"
        )
    return "\n".join(lines)
