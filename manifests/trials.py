"""Trial banks: the query units a scoring harness runs, generated from a release's items.

Each trial names its images by item id (or ``source:<sha256>`` for a limb pair's original,
whose row is in the manifest as the item's ``source``) and by path inside the release, carries its prompt text from a
versioned prompt file in ``assets/trials/`` (file name and sha256 recorded), its answer
format and a parser hint, its grouping keys, and whether each image's condition matches the
template's presented gender (so matched-only and swapped-only subsets can be scored).

Protocols (``trials.protocols`` in the spec):

- ``2afc``: within a template, every unordered pair of its variants (``n (n - 1) / 2``; 45 for
  10 variants), each in both A/B orders, for each question (income, education, perceived
  safety): ``3 n (n - 1)`` trials per template.
- ``mcq``: one image, salary in six brackets (A-F) and education in four levels (A-D).
- ``salary``: images x biographies of the image's occupation (``trials.biographies``).
- ``disability_context``: for each of 9 categories, a neutral description prompt and the same
  prompt "considering they may have a <disability>", paired by ``pair_id``.
- ``limb_pair``: the original and each counterfactual queried alone with an ability-neutral
  bank: control questions about the unchanged background, and per social-judgement domain
  (competence, leadership, teamwork, professionalism, communication, hiring) a yes/no/uncertain,
  a 1-5 rating and an open-ended question.
- ``person_irrelevant``: "I've attached my photo." then a task that does not concern the person.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache
from itertools import combinations
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from counterfactory.assets import ASSETS_DIR

TRIALS_DIR = ASSETS_DIR / "trials"
PROTOCOLS = ("2afc", "mcq", "salary", "disability_context", "limb_pair", "person_irrelevant")
Protocol = Literal["2afc", "mcq", "salary", "disability_context", "limb_pair", "person_irrelevant"]
SOURCE_PREFIX = "source:"


class TrialsConfig(BaseModel):
    """``trials``: which protocols a release's ``trials.jsonl`` holds.

    Attributes:
        protocols: any of ``2afc``, ``mcq``, ``salary``, ``disability_context``, ``limb_pair``,
            ``person_irrelevant``; ``[]`` writes an empty bank.
        prompts: the versioned prompt file in ``assets/trials/`` (without ``.yaml``).
        biographies: a YAML file of biographies per occupation (relative to the spec file);
            required by ``salary``. ``assets/trials/biographies_example_v1.yaml`` shows the shape.
        expression_consistent_only: use only variants whose expression label equals their
            template's modal label (see the expression audit in ``stats.json``).
    """

    model_config = ConfigDict(extra="forbid")

    protocols: list[Protocol] = Field(default_factory=list)
    prompts: str = "trial_prompts_v1"
    biographies: Path | None = None
    expression_consistent_only: bool = False


class TrialError(ValueError):
    """A trial bank that cannot be built; the message names the file and the fix."""


@cache
def _load_prompts(name: str) -> tuple[dict[str, Any], str, str]:
    path = TRIALS_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in TRIALS_DIR.glob("trial_prompts_*.yaml")))
        raise TrialError(f"trials.prompts: no prompt file {path.name} in {TRIALS_DIR}; known: {known}")
    data = path.read_bytes()
    return yaml.safe_load(data), path.name, hashlib.sha256(data).hexdigest()


def load_biographies(path: Path) -> dict[str, list[dict[str, str]]]:
    """``{occupation: [{"id", "text"}, ...]}`` from a biographies file.

    Raises:
        TrialError: the file is missing or not of that shape, naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise TrialError(
            f"{path}: trials.biographies names a file that does not exist; the salary protocol needs "
            "biographies per occupation (see assets/trials/biographies_example_v1.yaml)"
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TrialError(f"{path}: not valid YAML: {exc}") from None
    bios = data.get("biographies") if isinstance(data, dict) else None
    ok = isinstance(bios, dict) and all(
        isinstance(v, list) and all(isinstance(b, dict) and {"id", "text"} <= set(b) for b in v) for v in bios.values()
    )
    if not ok:
        raise TrialError(
            f"{path}: expected `biographies: {{occupation: [{{id, text}}, ...]}}` as in "
            "assets/trials/biographies_example_v1.yaml"
        )
    return {str(k): [{"id": str(b["id"]), "text": str(b["text"])} for b in v] for k, v in bios.items()}


def _tid(*parts: Any) -> str:
    return hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:24]


def _group(row: dict[str, Any]) -> dict[str, Any]:
    source = row.get("source") or {}
    return {
        "template_id": row["template_id"],
        "condition": dict(row["condition"]),
        "occupation": source.get("occupation"),
        "presented_gender": source.get("presented_gender"),
    }


def build_trials(
    items: Sequence[dict[str, Any]],
    config: TrialsConfig,
    *,
    biographies: dict[str, list[dict[str, str]]] | None = None,
) -> list[dict[str, Any]]:
    """The trial bank for ``items`` (manifest rows: accepted items), in a deterministic order.

    Args:
        items: manifest rows with ``item_id``, ``template_id``, ``condition``,
            ``gender_match``, ``source`` and (optionally) ``expression``.
        config: the spec's ``trials``.
        biographies: required when ``salary`` is a protocol (:func:`load_biographies`).

    Returns:
        rows matching ``manifests/schemas/trial.schema.json``.
    """
    bank, prompt_file, prompt_sha = _load_prompts(config.prompts)
    rows = sorted(items, key=lambda r: (r["template_id"], r["item_id"]))
    if config.expression_consistent_only:
        rows = [r for r in rows if (r.get("expression") or {}).get("consistent", True)]
    by_template: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_template.setdefault(row["template_id"], []).append(row)
    base = {"prompt_file": prompt_file, "prompt_sha256": prompt_sha}
    paths: dict[str, str] = {}
    for row in rows:
        if row.get("image"):
            paths[row["item_id"]] = row["image"]["path"]
        if (row.get("source") or {}).get("path"):
            paths[f"{SOURCE_PREFIX}{row['source']['sha256']}"] = row["source"]["path"]
    trials: list[dict[str, Any]] = []

    def add(protocol: str, question: str, images: list[str], prompt: str, answer: str, hint: str, **extra) -> None:
        trial = {
            "trial_id": _tid(protocol, question, *images, prompt, extra.get("variant"), extra.get("order")),
            "protocol": protocol,
            "question": question,
            "images": images,
            "image_paths": [paths[i] for i in images] if all(i in paths for i in images) else None,
            "prompt": " ".join(prompt.split()),
            "answer_format": answer,
            "parser_hint": hint,
            "order": None,
            "options": None,
            "pair_id": None,
            "variant": None,
            "biography_id": None,
            "domain": None,
            "format": None,
            "category": None,
            **base,
            **extra,
        }
        trials.append(trial)

    for protocol in config.protocols:
        if protocol == "2afc":
            spec = bank["2afc"]
            for template_id, variants in by_template.items():
                for a, b in combinations(variants, 2):
                    for question, text in spec["questions"].items():
                        pair = _tid("2afc", question, *sorted((a["item_id"], b["item_id"])))
                        for order, (first, second) in (("AB", (a, b)), ("BA", (b, a))):
                            add(
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
                                },
                                gender_match=[first.get("gender_match"), second.get("gender_match")],
                            )
        elif protocol == "mcq":
            for question, spec in bank["mcq"].items():
                options = dict(spec["options"])
                listing = " ".join(f"{k}) {v}." for k, v in options.items())
                for row in rows:
                    add(
                        "mcq",
                        question,
                        [row["item_id"]],
                        f"{spec['prompt']} {listing}",
                        spec["answer_format"],
                        spec["parser_hint"],
                        options=options,
                        group=_group(row),
                        gender_match=row.get("gender_match"),
                    )
        elif protocol == "salary":
            if biographies is None:
                raise TrialError("the salary protocol needs trials.biographies (a file of biographies per occupation)")
            spec = bank["salary"]
            for row in rows:
                occupation = (row.get("source") or {}).get("occupation")
                for bio in biographies.get(occupation or "", []):
                    add(
                        "salary",
                        "salary_recommendation",
                        [row["item_id"]],
                        spec["prompt"].format(occupation=occupation, biography=bio["text"]),
                        spec["answer_format"],
                        spec["parser_hint"],
                        biography_id=bio["id"],
                        group=_group(row),
                        gender_match=row.get("gender_match"),
                    )
        elif protocol == "disability_context":
            spec = bank["disability_context"]
            for row in rows:
                for category, disability in spec["categories"].items():
                    pair = _tid("disability_context", row["item_id"], category)
                    for variant, text in (
                        ("neutral", spec["neutral"]),
                        ("context", spec["context"].format(disability=disability)),
                    ):
                        add(
                            "disability_context",
                            "describe",
                            [row["item_id"]],
                            text,
                            spec["answer_format"],
                            spec["parser_hint"],
                            variant=variant,
                            category=category,
                            pair_id=pair,
                            group=_group(row),
                            gender_match=row.get("gender_match"),
                        )
        elif protocol == "limb_pair":
            spec = bank["limb_pair"]
            for row in rows:
                original = f"{SOURCE_PREFIX}{row['source']['sha256']}"
                for variant, image in (("original", original), ("counterfactual", row["item_id"])):
                    queries = [
                        ("control", f"control_{i}", q["prompt"], q["answer_format"], q["parser_hint"], None)
                        for i, q in enumerate(spec["control"], start=1)
                    ] + [
                        (fmt, f"{domain}_{fmt}", text, spec["formats"][fmt]["answer_format"],
                         spec["formats"][fmt]["parser_hint"], domain)
                        for domain, by_format in spec["domains"].items()
                        for fmt, text in by_format.items()
                    ]  # fmt: skip
                    for fmt, question, text, answer, hint, domain in queries:
                        add(
                            "limb_pair",
                            question,
                            [image],
                            text,
                            answer,
                            hint,
                            variant=variant,
                            format=fmt,
                            domain=domain,
                            pair_id=_tid("limb_pair", row["item_id"], question),
                            group=_group(row),
                            gender_match=row.get("gender_match"),
                        )
        elif protocol == "person_irrelevant":
            spec = bank["person_irrelevant"]
            for row in rows:
                for task, text in spec["tasks"].items():
                    add(
                        "person_irrelevant",
                        task,
                        [row["item_id"]],
                        f"{spec['preamble']} {text}",
                        spec["answer_format"],
                        spec["parser_hint"],
                        group=_group(row),
                        gender_match=row.get("gender_match"),
                    )
        else:  # the spec's Literal already refuses these; a caller passing a bare list gets the same message
            raise TrialError(f"unknown trial protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
    return trials


def prompt_texts(name: str = "trial_prompts_v1") -> dict[str, list[str]]:
    """Every prompt text of a prompt file by protocol (for audits such as word-list checks)."""
    bank, _, _ = _load_prompts(name)
    limb = bank["limb_pair"]
    return {
        "2afc": list(bank["2afc"]["questions"].values()),
        "mcq": [q["prompt"] for q in bank["mcq"].values()],
        "salary": [bank["salary"]["prompt"]],
        "disability_context": [bank["disability_context"]["neutral"], bank["disability_context"]["context"]],
        "limb_pair": [q["prompt"] for q in limb["control"]] + [t for d in limb["domains"].values() for t in d.values()],
        "person_irrelevant": [
            f"{bank['person_irrelevant']['preamble']} {t}" for t in bank["person_irrelevant"]["tasks"].values()
        ],
    }
