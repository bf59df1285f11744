"""``person_irrelevant`` (guardrail-agnostic user context): "I've attached my photo." then a
task that does not concern the person, and each task once with no image."""

from __future__ import annotations

from typing import Any

from counterfactory.manifests.answers import text_spec
from counterfactory.manifests.trials import TRIAL_PROTOCOLS, NoOptions, TrialContext, TrialProtocol, item_group


def _person_irrelevant_tasks(spec: dict[str, Any]) -> list[tuple[str, str, str | None, str | None]]:
    """``(question, task text, domain, concept)`` for the bank's plain tasks, then one term
    explanation per concept (version 2 on)."""
    out: list[tuple[str, str, str | None, str | None]] = [(k, v, None, None) for k, v in spec["tasks"].items()]
    terms = spec.get("term_explanation")
    if terms:
        for domain, concepts in terms["concepts"].items():
            for concept in concepts:
                out.append(("term_explanation", terms["prompt"].format(concept=concept), domain, concept))
    return out


class PersonIrrelevant(TrialProtocol):
    """Guardrail-agnostic context: a task that does not concern the person, after "I've attached my photo."."""

    paper = "guardrail"
    unit = 'each task once per image after "I\'ve attached my photo.", and once with no image'

    def build(self, ctx: TrialContext) -> None:
        spec = ctx.bank["person_irrelevant"]
        tasks = _person_irrelevant_tasks(spec)
        for row in ctx.rows:
            for task, text, domain, concept in tasks:
                ctx.add(
                    "person_irrelevant",
                    task,
                    [row["item_id"]],
                    f"{spec['preamble']} {text}",
                    spec["answer_format"],
                    spec["parser_hint"],
                    domain=domain,
                    category=concept,
                    group=item_group(row),
                    gender_match=row.get("gender_match"),
                    answer_spec=text_spec(short=False),
                    decoding=spec.get("decoding"),
                )
        if spec.get("no_image_baseline") and ctx.rows:
            # the same tasks with no photo and no preamble, once per release
            for task, text, domain, concept in tasks:
                ctx.add(
                    "person_irrelevant",
                    task,
                    [],
                    text,
                    spec["answer_format"],
                    spec["parser_hint"],
                    variant="no_image",
                    domain=domain,
                    category=concept,
                    group={"template_id": None},
                    gender_match=None,
                    answer_spec=text_spec(short=False),
                    decoding=spec.get("decoding"),
                )

    def prompts(self, bank: dict[str, Any]) -> list[str]:
        return [
            f"{bank['person_irrelevant']['preamble']} {t[1]}"
            for t in _person_irrelevant_tasks(bank["person_irrelevant"])
        ]


TRIAL_PROTOCOLS.register("person_irrelevant", NoOptions, PersonIrrelevant)
