"""``mcq`` (FOCUS 3.2 Task 2, B.2): one image and its occupation, salary in six brackets and
education in four levels; again on each robustness variant."""

from __future__ import annotations

from typing import Any

from counterfactory.manifests.answers import choice_spec
from counterfactory.manifests.trials import (
    IDENTITY_VARIANTS,
    TRIAL_PROTOCOLS,
    NoOptions,
    TrialContext,
    TrialProtocol,
    item_group,
    with_article,
)


def _derived_variant(row: dict[str, Any]) -> str:
    transform = row.get("transform") or {}
    return "_".join(str(transform[k]) for k in ("kind", "level") if transform.get(k))


class FocusMCQ(TrialProtocol):
    """FOCUS 3.2 Task 2: each image, and each robustness variant, once per question."""

    paper = "focus"
    unit = "each image (and each robustness variant) once per question, its occupation in the prompt"

    def build(self, ctx: TrialContext) -> None:
        for question, spec in ctx.bank["mcq"].items():
            options = dict(spec["options"])
            listing = " ".join(f"{k}) {v}." for k, v in options.items())
            for row in ctx.rows:
                occupation = (row.get("source") or {}).get("occupation") or "unknown"
                prompt = spec["prompt"].replace("{a_occupation}", with_article(occupation))
                text = f"{prompt.replace('{occupation}', occupation)} {listing}"
                images: list[tuple[str | None, str, str | None]] = [(None, row["item_id"], None)]
                images += [
                    (_derived_variant(d), d["item_id"], row["item_id"])
                    for d in ctx.variants_of
                    if d["parent_item_id"] == row["item_id"] and _derived_variant(d) not in IDENTITY_VARIANTS
                ]
                for variant, image, parent in images:
                    ctx.add(
                        "mcq",
                        question,
                        [image],
                        text,
                        spec["answer_format"],
                        spec["parser_hint"],
                        options=options,
                        variant=variant,
                        parent_item_id=parent,
                        group=item_group(row),
                        gender_match=row.get("gender_match"),
                        answer_spec=choice_spec(list(options), ordered=True, labels=options),
                        decoding=spec.get("decoding"),
                    )

    def prompts(self, bank: dict[str, Any]) -> list[str]:
        return [q["prompt"] for q in bank["mcq"].values()]


TRIAL_PROTOCOLS.register("mcq", NoOptions, FocusMCQ)
