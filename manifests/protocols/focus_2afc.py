"""``2afc`` (FOCUS 3.2 Task 1): within a template, every unordered pair of its variants, each in
both A/B orders, for each question (income, education, perceived safety): ``3 n (n - 1)`` trials
per template of ``n`` variants."""

from __future__ import annotations

from itertools import combinations
from typing import Any

from counterfactory.manifests.answers import choice_spec
from counterfactory.manifests.trials import (
    TRIAL_PROTOCOLS,
    NoOptions,
    TrialContext,
    TrialProtocol,
    key_hash,
    left_out_group,
)


def _editor(row: dict[str, Any]) -> str | None:
    """The item's editor label (``editor_name``: the spec's label when it compares editors, else
    the backend), or None for rows that do not say."""
    return row.get("editor_name") or (row.get("editor") or {}).get("backend")


def _expression_ok(row: dict[str, Any]) -> bool:
    return bool((row.get("expression") or {}).get("consistent", True))


def _pair_consistent(a: dict[str, Any], b: dict[str, Any]) -> bool | None:
    """Whether both images' expressions match their template's (``None`` when either is unaudited)."""
    known = [(r.get("expression") or {}).get("consistent") for r in (a, b)]
    return None if None in known else all(known)


class Focus2AFC(TrialProtocol):
    """FOCUS 3.2 Task 1: every unordered pair of a template's variants, in both orders, per question."""

    paper = "focus"
    unit = "every unordered pair of a template's variants in both A/B orders, per scenario"

    def build(self, ctx: TrialContext) -> None:
        spec = ctx.bank["2afc"]
        for template_id, variants in ctx.by_template.items():
            complete = None if ctx.expected_variants is None else len(variants) >= ctx.expected_variants
            for question, text in spec["questions"].items():
                pool = variants
                if ctx.config.expression_consistent_only and question == "perceived_safety":
                    pool = [v for v in variants if _expression_ok(v)]
                for a, b in combinations(pool, 2):
                    if dict(a["condition"]) == dict(b["condition"]):
                        continue  # two editors' images of one condition: no comparison between groups
                    pair = key_hash("2afc", question, *sorted((a["item_id"], b["item_id"])))
                    for order, (first, second) in (("AB", (a, b)), ("BA", (b, a))):
                        ctx.add(
                            "2afc",
                            question,
                            [first["item_id"], second["item_id"]],
                            text,
                            spec["answer_format"],
                            spec["parser_hint"],
                            order=order,
                            pair_id=pair,
                            group={
                                "template_id": template_id,
                                "condition_a": dict(first["condition"]),
                                "condition_b": dict(second["condition"]),
                                "occupation": (first.get("source") or {}).get("occupation"),
                                "variants": len(variants),
                                "expected_variants": ctx.expected_variants,
                                "complete": complete,
                                "expression_consistent": _pair_consistent(first, second),
                                "presented_gender": (first.get("source") or {}).get("presented_gender"),
                                "editors": [_editor(first), _editor(second)],
                            },
                            gender_match=[first.get("gender_match"), second.get("gender_match")],
                            answer_spec=choice_spec(["A", "B"], ordered=False),
                            decoding=spec.get("decoding"),
                        )

    def left_out(self, row: dict[str, Any], ctx: TrialContext) -> list[dict[str, Any]]:
        if not (ctx.config.expression_consistent_only and not _expression_ok(row)):
            return []
        return [
            {
                "what": "trial",
                "id": row["item_id"],
                "status": "filtered",
                "reason": "expression_drift: left out of 2afc perceived_safety (trials.expression_consistent_only)",
                "group": left_out_group(row),
            }
        ]

    def prompts(self, bank: dict[str, Any]) -> list[str]:
        return list(bank["2afc"]["questions"].values())


TRIAL_PROTOCOLS.register("2afc", NoOptions, Focus2AFC)
