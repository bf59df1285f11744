"""``salary`` (FOCUS Task 3): images x the biographies of the image's occupation
(``trials.biographies``)."""

from __future__ import annotations

from typing import Any

from counterfactory.manifests.answers import integer_spec
from counterfactory.manifests.trials import (
    TRIAL_PROTOCOLS,
    NoOptions,
    TrialContext,
    TrialError,
    TrialProtocol,
    item_group,
    left_out_group,
    with_article,
)


class FocusSalary(TrialProtocol):
    """FOCUS Task 3: each image x the biographies of its occupation (``trials.biographies``)."""

    paper = "focus"
    unit = "each image x each biography of its occupation"
    needs_biographies = True

    def build(self, ctx: TrialContext) -> None:
        if ctx.biographies is None:
            raise TrialError("the salary protocol needs trials.biographies (a file of biographies per occupation)")
        spec = ctx.bank["salary"]
        for row in ctx.rows:
            occupation = (row.get("source") or {}).get("occupation")
            for bio in ctx.biographies.get(occupation or "", []):
                ctx.add(
                    "salary",
                    "salary_recommendation",
                    [row["item_id"]],
                    spec["prompt"].format(
                        occupation=occupation, a_occupation=with_article(str(occupation)), biography=bio["text"]
                    ),
                    spec["answer_format"],
                    spec["parser_hint"],
                    biography_id=bio["id"],
                    group=item_group(row),
                    gender_match=row.get("gender_match"),
                    answer_spec=integer_spec(0, 100_000_000, usd=True),
                    decoding=spec.get("decoding"),
                )

    def left_out(self, row: dict[str, Any], ctx: TrialContext) -> list[dict[str, Any]]:
        occupation = (row.get("source") or {}).get("occupation")
        if ctx.biographies is None or ctx.biographies.get(occupation or ""):
            return []
        return [
            {
                "what": "trial",
                "id": row["item_id"],
                "status": "no_biographies",
                "reason": f"salary: the biographies file has none for occupation {occupation!r}; the item has no "
                "salary trials",
                "group": left_out_group(row),
            }
        ]

    def prompts(self, bank: dict[str, Any]) -> list[str]:
        return [bank["salary"]["prompt"]]


TRIAL_PROTOCOLS.register("salary", NoOptions, FocusSalary)
