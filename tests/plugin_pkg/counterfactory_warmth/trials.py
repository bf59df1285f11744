"""The ``warmth_rating`` trial protocol: each accepted image once, rated for warmth on a scale.

Its options (``trials.options.warmth_rating``) set the question and the scale's top.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from counterfactory.manifests.trials import TRIAL_PROTOCOLS, TrialContext, TrialProtocol


class WarmthRatingOptions(BaseModel):
    """``trials.options.warmth_rating`` in a spec."""

    model_config = ConfigDict(extra="forbid")

    question: str = "How warm does this person's skin tone look?"
    scale: int = Field(7, ge=2, le=10)


class WarmthRating(TrialProtocol):
    """One rating per accepted image."""

    paper = None
    unit = "each image once, rated 1 to scale"

    def build(self, ctx: TrialContext) -> None:
        options = self.options
        for row in ctx.rows:
            ctx.add(
                "warmth_rating",
                "warmth",
                [row["item_id"]],
                f"{options.question} Answer with a number from 1 to {options.scale}.",
                f"integer 1-{options.scale}",
                "first integer",
                group={"template_id": row["template_id"], "condition": dict(row["condition"])},
                gender_match=row.get("gender_match"),
            )

    def prompts(self, bank: dict) -> list[str]:
        return [self.options.question]


TRIAL_PROTOCOLS.register("warmth_rating", WarmthRatingOptions, WarmthRating)
