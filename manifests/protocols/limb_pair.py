"""``limb_pair`` (InclusiveCFImageBias): each original photo and each counterfactual (removed,
same-cue control) queried alone with the ability-neutral bank, the original once per prompt
plus the noise-baseline repeats."""

from __future__ import annotations

from typing import Any

from counterfactory.manifests.answers import YES_NO_UNCERTAIN, integer_spec, text_spec
from counterfactory.manifests.trials import (
    SOURCE_PREFIX,
    TRIAL_PROTOCOLS,
    NoOptions,
    TrialContext,
    TrialProtocol,
    item_group,
    key_hash,
)


def _limb_queries(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The limb bank's queries as ``{"id", "format", "domain", "prompt", "answer_format",
    "parser_hint"}``, from either bank shape: ``prompts`` (a list, version 2 on) or
    ``control`` + ``domains`` x ``formats`` (version 1)."""
    formats = spec.get("formats") or {}
    if "prompts" in spec:
        out = []
        for q in spec["prompts"]:
            fmt = formats.get(q["format"], {})
            out.append(
                {
                    "id": q["id"],
                    "format": q["format"],
                    "domain": q.get("domain"),
                    "prompt": q["prompt"],
                    "answer_format": q.get("answer_format", fmt.get("answer_format")),
                    "parser_hint": q.get("parser_hint", fmt.get("parser_hint")),
                }
            )
        return out
    out = [
        {"id": f"control_{i}", "format": "control", "domain": None, **q} for i, q in enumerate(spec["control"], start=1)
    ]
    for domain, by_format in spec["domains"].items():
        for fmt, text in by_format.items():
            out.append({"id": f"{domain}_{fmt}", "format": fmt, "domain": domain, "prompt": text, **formats[fmt]})
    return out


#: a limb condition's ``cue`` value -> the trial's ``variant`` (the original photo is ``original``)
LIMB_VARIANTS = {"removed": "removed", "kept": "same_cue_control"}


def _limb_variant(row: dict[str, Any]) -> str:
    cue = (row.get("condition") or {}).get("cue")
    return LIMB_VARIANTS.get(cue, f"cue_{cue}" if cue else "counterfactual")


def _limb_answer(fmt: str) -> dict[str, Any]:
    if fmt == "yes_no_uncertain":
        return YES_NO_UNCERTAIN
    if fmt == "rating_1_5":
        return integer_spec(1, 5)
    return text_spec(short=fmt == "control")


class LimbPair(TrialProtocol):
    """InclusiveCFImageBias: each original and each counterfactual queried alone, with noise repeats."""

    paper = "inclusivecf"
    unit = "each original once per prompt (plus noise repeats) and each counterfactual once per prompt, alone"

    def build(self, ctx: TrialContext) -> None:
        spec = ctx.bank["limb_pair"]
        queries = _limb_queries(spec)
        seen_originals: set[str] = set()
        for row in ctx.rows:
            sha = row["source"]["sha256"]
            original = f"{SOURCE_PREFIX}{sha}"
            # the original is queried once per prompt, however many counterfactuals pair with it,
            # and carries no condition of theirs
            images = [("original", original, None)] if original not in seen_originals else []
            seen_originals.add(original)
            images.append((_limb_variant(row), row["item_id"], row))
            for variant, image, own in images:
                group = item_group(row) | {"condition": None} if own is None else item_group(row)
                # the noise baseline: the original asked the same prompt again (InclusiveCF Table 2)
                repeats = [None, *range(1, int(spec.get("noise_repeats", 0)) + 1)] if own is None else [None]
                for q in queries:
                    for repeat in repeats:
                        ctx.add(
                            "limb_pair",
                            q["id"],
                            [image],
                            q["prompt"],
                            q["answer_format"],
                            q["parser_hint"],
                            variant=variant,
                            format=q["format"],
                            domain=q["domain"],
                            pair_id=key_hash("limb_pair", sha, q["id"]),
                            repeat=repeat,
                            group=group,
                            gender_match=None if own is None else own.get("gender_match"),
                            answer_spec=_limb_answer(q["format"]),
                            decoding=spec.get("decoding"),
                        )

    def prompts(self, bank: dict[str, Any]) -> list[str]:
        return [q["prompt"] for q in _limb_queries(bank["limb_pair"])]


TRIAL_PROTOCOLS.register("limb_pair", NoOptions, LimbPair)
