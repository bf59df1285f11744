"""``disability_context`` (the NP/DP disability audit, 3.3): per image one neutral prompt and
one per disability category, sharing a ``pair_id``; with ``mitigation`` also the bank's
mitigation prompt per category (C.4)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from counterfactory.manifests.answers import text_spec
from counterfactory.manifests.trials import (
    TRIAL_PROTOCOLS,
    TrialContext,
    TrialError,
    TrialProtocol,
    item_group,
    key_hash,
)


class DisabilityOptions(BaseModel):
    """``trials.options.disability_context``: ``mitigation`` also asks the bank's mitigation
    prompt (NP/DP C.4) per category (``variant`` ``mitigation``), for the paper's Table 3."""

    model_config = ConfigDict(extra="forbid")

    mitigation: bool = False


class DisabilityContext(TrialProtocol):
    """The NP/DP audit: per image one neutral prompt and one per disability category, sharing a ``pair_id``."""

    paper = "npdp"
    unit = "per image 1 neutral + 9 disability-context prompts, sharing a pair_id"

    def build(self, ctx: TrialContext) -> None:
        spec = ctx.bank["disability_context"]
        mitigation = bool(getattr(self.options, "mitigation", False))
        if mitigation and "mitigation" not in spec:
            raise TrialError(
                f"trials.options.disability_context.mitigation: the bank {ctx.config.prompts} has no mitigation "
                "prompt; use trial_prompts_v3 or later"
            )
        for row in ctx.rows:
            unit = key_hash("disability_context", row["item_id"])
            prompts = [("neutral", None, spec["neutral"])] + [
                ("context", category, spec["context"].format(disability=disability))
                for category, disability in spec["categories"].items()
            ]
            if mitigation:
                prompts += [
                    ("mitigation", category, spec["mitigation"].format(disability=disability))
                    for category, disability in spec["categories"].items()
                ]
            for variant, category, text in prompts:
                ctx.add(
                    "disability_context",
                    "describe",
                    [row["item_id"]],
                    text,
                    spec["answer_format"],
                    spec["parser_hint"],
                    variant=variant,
                    category=category,
                    pair_id=unit,
                    group=item_group(row),
                    gender_match=row.get("gender_match"),
                    answer_spec=text_spec(short=False),
                    decoding=spec.get("decoding"),
                )

    def prompts(self, bank: dict[str, Any]) -> list[str]:
        spec = bank["disability_context"]
        return [spec["neutral"], spec["context"]] + ([spec["mitigation"]] if "mitigation" in spec else [])


TRIAL_PROTOCOLS.register("disability_context", DisabilityOptions, DisabilityContext)
