"""Trial banks: the query units a scoring harness runs, generated from a release's items.

Each trial names its images by item id (or ``source:<sha256>`` for a limb pair's original,
whose row is in the manifest as the item's ``source``) and by path inside the release, carries its prompt text from a
versioned prompt file in ``assets/trials/`` (file name and sha256 recorded), its answer
format and a parser hint, its grouping keys, and whether each image's condition matches the
template's presented gender (so matched-only and swapped-only subsets can be scored).

This module is the framework (:class:`TrialProtocol`, :class:`TrialContext`, :func:`build_trials`);
each built-in protocol is one module of :mod:`counterfactory.manifests.protocols` registered in
:data:`TRIAL_PROTOCOLS` as a plug-in registers its own.
Protocols (``trials.protocols`` in the spec); the units are those of :func:`build_trials`:

- ``2afc``: within a template, every unordered pair of its variants (``n (n - 1) / 2``; 45 for
  10 variants), each in both A/B orders, for each question (income, education, perceived
  safety): ``3 n (n - 1)`` trials per template (FOCUS 3.2 Task 1).
- ``mcq``: one image and its occupation, salary in six brackets (A-F) and education in four
  levels (A-D); again on each robustness variant (FOCUS 3.2 Task 2, B.2).
- ``salary``: images x biographies of the image's occupation (``trials.biographies``; FOCUS Task 3).
- ``disability_context``: per image one neutral prompt and one per disability category (9),
  sharing a ``pair_id`` (disability NP/DP audit, 3.3).
- ``limb_pair``: each original photo and each counterfactual (removed, same-cue control) queried
  alone with the ability-neutral bank, the original once per prompt plus the noise-baseline
  repeats (InclusiveCFImageBias).
- ``person_irrelevant``: "I've attached my photo." then a task that does not concern the
  person, and each task once with no image (guardrail-agnostic user context).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from counterfactory.assets import ASSETS_DIR
from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.registry import Registry

TRIALS_DIR = ASSETS_DIR / "trials"
#: trial protocols: ``factory(options) -> protocol`` (:class:`TrialProtocol`); options from
#: ``trials.options.<name>``; the built-in ones are the modules of ``manifests/protocols/``
TRIAL_PROTOCOLS = Registry("trial protocol", "trial_protocol", built_ins=("counterfactory.manifests.protocols",))
SOURCE_PREFIX = "source:"


#: how each variant bank differs from the papers (the default, ``trial_prompts_v3``, follows
#: them); the card and ``release.json`` list these for the bank a release used
BANK_DIFFERENCES: dict[str, list[str]] = {
    "trial_prompts_v1": [
        "mcq salary: brackets 'under $25,000' to '$150,000 or more', not FOCUS's six from 'below $20,000' to "
        "'above $100,000'",
        "mcq education: levels 'no high school diploma' to 'graduate or professional degree', not FOCUS's four "
        "from secondary school to doctorate",
        "mcq: the prompt does not name the occupation FOCUS puts in it",
        "disability_context: categories paraphrased (e.g. 'vision impairment'), not the paper's Table 4 names",
        "limb_pair: 20 prompts (2 control, 10 %), not InclusiveCF's 48 (about 29 % control, 33 % structured, "
        "38 % open-ended), and no repeated-query noise baseline",
        "person_irrelevant: five everyday tasks, not the paper's story generation and term explanation; no "
        "no-image baseline",
    ],
    "trial_prompts_v2": [
        "2afc perceived_safety: asks who one would 'feel safer being alone with', not FOCUS's 'feel more "
        "comfortable approaching' (3.2 Task 1)",
        "mcq, salary: 'a {occupation}' whatever the occupation ('a astronaut')",
        "no decoding settings, no NP/DP mitigation prompt (C.4) or judge rubric (C.5)",
    ],
    "trial_prompts_v3": [],
}

#: the bank a spec gets when it names none
DEFAULT_BANK = "trial_prompts_v3"


def with_article(noun: str) -> str:
    """``noun`` after the indefinite article that agrees with it: "an astronaut", "a nurse",
    "an MBA holder", "a university lecturer" (vowel sound, by the usual spelling rules)."""
    word = noun.strip()
    first = word.split()[0] if word else ""
    if not first:
        return word
    low = first.lower()
    if first.isupper() and len(first) > 1:  # an initialism read letter by letter: "a CEO", "an MBA"
        vowel = first[0] in "AEFHILMNORSX"
    elif low.startswith(("uni", "use", "usu", "eu", "one", "ur")):
        vowel = False
    elif low.startswith(("hour", "honest", "honour", "honor", "heir")):
        vowel = True
    else:
        vowel = low[0] in "aeiou"
    return f"{'an' if vowel else 'a'} {word}"


#: the papers the factory's designs and protocols follow, for the card and ``release.json``
PAPERS: dict[str, str] = {
    "focus": (
        'Chen, Huang, Zhao, Jiang, Chang and Yu, "Measuring Social Bias in Vision-Language Models with '
        'Face-Only Counterfactuals from Real Photos" (FOCUS / REFLECT), arXiv:2601.06931'
    ),
    "inclusivecf": (
        '"Same Person, Different Depiction: Counterfactual Evaluation of Vision-Language Models on Individuals '
        'with Limb Deficiencies" (InclusiveCFImageBias), ECCV 2026'
    ),
    "npdp": '"Auditing Disability Representation in Vision-Language Models" (paired neutral and disability prompts)',
    "guardrail": '"Guardrail-Agnostic Societal Bias Evaluation in Large Vision-Language Models", ECCV 2026',
}


#: each paper's name for a group, by the labels specs use (a label not listed is the paper's own)
PAPER_LABELS: dict[str, dict[str, str]] = {
    "focus": {
        "East Asian": "Asian",
        "South Asian": "Asian",
        "Latina": "Latino",
        "Latinx": "Latino",
        "Latine": "Latino",
        "Hispanic": "Latino",
        "ME": "Middle Eastern",
        "Middle-Eastern": "Middle Eastern",
        "man": "male",
        "woman": "female",
    },
}

#: the group each paper measures others against, per axis (FOCUS 4.3: "Gap%(r) = (mu_r / mu_White - 1)
#: x 100%"; the gender gap against male is our choice, FOCUS reports gender gaps without one)
REFERENCE_GROUPS: dict[str, dict[str, str]] = {"focus": {"race": "White", "gender": "male"}}

#: fewest answers a group (or a cell of a win-rate matrix) needs before ``score`` reports it
MIN_N_PER_CELL = 5


def analysis_record(axes: dict[str, Sequence[str]], protocols: Sequence[str]) -> dict[str, Any]:
    """``release.json``'s ``analysis``: what ``counterfactory score`` (or anyone's script) needs
    beyond the rows: per paper the reference group of each axis (present in the design, else
    None), the map from the spec's labels to the paper's, the bootstrap unit and strata, and the
    fewest answers per cell a metric is reported on."""
    papers = sorted({p for p in (protocol_paper(name)[0] for name in protocols) if p})
    label_map = {}
    references = {}
    for paper in papers:
        known = PAPER_LABELS.get(paper, {})
        label_map[paper] = {axis: {v: known.get(v, v) for v in values} for axis, values in axes.items()}
        wanted = REFERENCE_GROUPS.get(paper, {})
        references[paper] = {}
        for axis, values in axes.items():
            ref = wanted.get(axis)
            hit = [v for v in values if ref is not None and known.get(v, v) == ref]
            references[paper][axis] = hit[0] if hit else None
    return {
        "papers": papers,
        "reference_groups": references,
        "label_map": label_map,
        # FOCUS 5 (Limitations): "stratified template-cluster bootstrap confidence intervals"
        "bootstrap": {"unit": "template_id", "strata": ["occupation"], "resamples": 2000, "confidence": 0.95},
        "min_n_per_cell": MIN_N_PER_CELL,
        "identity_variants": sorted(IDENTITY_VARIANTS),
    }


def trial_summary(trials: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``release.json``'s ``trials``: per protocol its rows, rows per question, its unit and paper."""
    out: dict[str, dict[str, Any]] = {}
    for t in trials:
        paper, unit = protocol_paper(t["protocol"])
        entry = out.setdefault(t["protocol"], {"rows": 0, "questions": {}, "unit": unit, "paper": paper})
        entry["rows"] += 1
        entry["questions"][t["question"]] = entry["questions"].get(t["question"], 0) + 1
    return out


class TrialsConfig(BaseModel):
    """``trials``: which protocols a release's ``trials.jsonl`` holds.

    Attributes:
        protocols: any of ``2afc``, ``mcq``, ``salary``, ``disability_context``, ``limb_pair``,
            ``person_irrelevant``, or one a plug-in registered; ``[]`` writes an empty bank.
        prompts: the versioned prompt file in ``assets/trials/`` (without ``.yaml``);
            ``trial_prompts_v3`` follows the papers, ``trial_prompts_v1`` and ``_v2`` are
            earlier banks that still load (their differences: :data:`BANK_DIFFERENCES`).
        biographies: a YAML file of biographies per occupation (relative to the spec file);
            required by ``salary``. ``assets/trials/biographies_example_v2.yaml`` has 50 for
            each of FOCUS's six occupations (written by ``make_biographies.py``).
        expression_consistent_only: where FOCUS uses the expression-consistent subset (the
            perceived-safety 2AFC, B.2), use only variants whose expression label equals their
            template's modal label; every other protocol keeps all variants, and what it
            leaves out is listed in ``left_out.jsonl``. Without it every 2AFC row still says
            whether both images are consistent (``group.expression_consistent``).
        options: per protocol its options (``trials.options.<protocol>``, validated by the
            options model it registered with); left out of the canonical spec when empty.
        per_editor: with several ``editors``, build the bank once per editor (a template's
            2AFC pairs only between one editor's variants) instead of pooled (pairs across
            editors too); left out of the canonical spec when False.
    """

    model_config = ConfigDict(extra="forbid")

    protocols: list[str] = Field(default_factory=list)
    prompts: str = DEFAULT_BANK
    biographies: Path | None = None
    expression_consistent_only: bool = False
    options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    per_editor: bool = False

    @field_validator("protocols")
    @classmethod
    def _registered(cls, value: list[str]) -> list[str]:
        names = protocol_names()
        for name in value:
            if name not in names:
                raise ValueError(f"one of the registered trial protocols: {', '.join(repr(n) for n in names)}")
        return value

    @model_validator(mode="after")
    def _protocol_options(self) -> TrialsConfig:
        for name, options in self.options.items():
            if name not in self.protocols:
                raise ValueError(f"trials.options.{name}: {name!r} is not one of trials.protocols")
            TRIAL_PROTOCOLS.get(name).options.model_validate(options)
        return self

    def protocol(self, name: str) -> TrialProtocol:
        """The protocol ``name`` built with its ``trials.options.<name>``."""
        plugin = TRIAL_PROTOCOLS.get(name)
        return plugin.factory(plugin.options.model_validate(self.options.get(name, {})))


class TrialError(CounterfactoryError, ValueError):
    """A trial bank that cannot be built; the message names the file and the fix."""


@cache
def _load_prompts(name: str) -> tuple[dict[str, Any], str, str]:
    path = TRIALS_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in TRIALS_DIR.glob("trial_prompts_*.yaml")))
        raise TrialError(f"trials.prompts: no prompt file {path.name} in {TRIALS_DIR}; known: {known}")
    data = path.read_bytes()
    return yaml.safe_load(data), path.name, hashlib.sha256(data).hexdigest()


def judge_rubric(prompt_file: str) -> tuple[str, str] | None:
    """``(rubric, sha256 of its text)``: the NP/DP LLM-judge rubric (C.5) of the bank ``prompt_file``
    (a trial's ``prompt_file``, e.g. ``trial_prompts_v3.yaml``); None for a bank without one."""
    bank, _, _ = _load_prompts(Path(prompt_file).stem)
    rubric = (bank.get("disability_context") or {}).get("judge_rubric")
    if not rubric:
        return None
    return rubric, hashlib.sha256(rubric.encode("utf-8")).hexdigest()


#: the LLM-judge rubrics of the user-context tasks (``ask --judge story|jargon``), apart from the
#: trial banks: a release pins its bank's bytes, so a rubric added there would orphan its answers
JUDGE_RUBRICS = "judge_rubrics_v1"


def user_context_rubric(name: str, file: str = JUDGE_RUBRICS) -> tuple[str, str, dict[str, Any]]:
    """``(rubric text, sha256 of the text, its entry)`` of ``name`` (``story_attributes`` or
    ``jargon_pairwise``) in ``assets/trials/<file>.yaml``: the guardrail-agnostic paper's story
    attribute extraction and blind pairwise jargon test, in our wording (the paper prints none).

    Raises:
        TrialError: no such file or rubric.
    """
    path = TRIALS_DIR / f"{file}.yaml"
    if not path.is_file():
        raise TrialError(f"no judge rubric file {path.name} in {TRIALS_DIR}")
    entry = (yaml.safe_load(path.read_bytes()) or {}).get(name)
    if not isinstance(entry, dict) or not entry.get("text"):
        raise TrialError(f"{path.name} has no rubric {name!r}")
    text = entry["text"]
    return text, hashlib.sha256(text.encode("utf-8")).hexdigest(), entry


def trial_input_files(config: TrialsConfig) -> dict[str, Path]:
    """The files that decide a trial bank, by the spec field naming them: the prompt bank, and
    the biographies when the spec names them. A release hashes them into ``inputs_sha256`` and
    carries a copy of each (``release.json`` ``inputs``)."""
    files = {"trials.prompts": TRIALS_DIR / f"{config.prompts}.yaml"}
    if config.biographies is not None:
        files["trials.biographies"] = Path(config.biographies)
    return files


def bank_record(config: TrialsConfig) -> dict[str, Any]:
    """``release.json``'s ``trial_bank``: the prompt file, whether it follows the papers, how a
    variant bank differs from them (:data:`BANK_DIFFERENCES`), and per protocol the bank's one
    line on whether its wording is the paper's (``paper_text``)."""
    bank, name, sha = _load_prompts(config.prompts)
    differences = BANK_DIFFERENCES.get(config.prompts)
    paper_text = {}
    for protocol, spec in bank.items():
        if not isinstance(spec, dict):
            continue
        if "paper_text" in spec:
            paper_text[protocol] = spec["paper_text"]
        for question, sub in spec.items():
            if isinstance(sub, dict) and "paper_text" in sub:
                paper_text[f"{protocol}.{question}"] = sub["paper_text"]
    return {
        "prompts": name,
        "sha256": sha,
        "follows_papers": differences == [],
        "differences": differences if differences is not None else ["not a bank shipped with counterfactory"],
        "paper_text": paper_text,
    }


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


def key_hash(*parts: Any) -> str:
    """A short stable id: the first 24 hex digits of the sha256 of ``parts`` joined by ``|``."""
    return hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:24]


#: the fields that make one query different from another; ``trial_id`` is their hash
TRIAL_KEY_FIELDS = ("variant", "order", "biography_id", "category", "domain", "format", "repeat")


def trial_id_of(trial: dict[str, Any]) -> str:
    """A trial's id: the hash of its protocol, question, images, prompt and
    :data:`TRIAL_KEY_FIELDS`, so two rows share it only when they are the same query (and
    ``verify`` can tell an edited row)."""
    key = [trial["protocol"], trial["question"], *trial["images"], " ".join(str(trial["prompt"]).split())]
    return key_hash(*key, *(trial.get(k) for k in TRIAL_KEY_FIELDS))


def item_group(row: dict[str, Any]) -> dict[str, Any]:
    """A trial's ``group``: the item's template, condition, occupation and presented gender."""
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
    expected_variants: int | None = None,
    derived: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """The trial bank for ``items`` (manifest rows: accepted items), in a deterministic order.

    One row per query: ``trial_id`` hashes every field that makes a query different, and no
    two rows share it (a duplicate raises, it would be a bug). Units:

    - ``2afc``: per template ``n (n - 1) / 2`` unordered pairs x 2 orders x each question;
      every row's ``group`` says how many variants its template has (``variants``), how many
      the design asks for (``expected_variants``) and whether it is ``complete``. With
      ``expression_consistent_only`` the perceived-safety question uses only variants whose
      expression matches their template's (FOCUS B.2 runs only that question on the subset).
    - ``mcq``: each question once per image, and once per robustness variant in ``derived``
      (``variant`` is the transform, e.g. ``mirror``, ``crop_close``; FOCUS B.2 re-runs MCQ).
    - ``salary``: images x the biographies of the image's occupation.
    - ``disability_context``: per image one neutral prompt (``variant`` ``neutral``) and one
      disability prompt per category (``context``), all ten sharing a ``pair_id``.
    - ``limb_pair``: each original photo once per prompt (``variant`` ``original``, no
      condition), each counterfactual once per prompt (``removed`` or ``same_cue_control``);
      the original and every counterfactual of its photo share the prompt's ``pair_id``.
    - ``person_irrelevant``: each task once per image.

    Args:
        items: manifest rows with ``item_id``, ``template_id``, ``condition``,
            ``gender_match``, ``source`` and (optionally) ``expression``.
        config: the spec's ``trials``.
        biographies: required when ``salary`` is a protocol (:func:`load_biographies`).
        expected_variants: conditions per template in the design (2AFC completeness).
        derived: ``derived.jsonl`` rows (robustness variants of ``items``).

    Returns:
        rows matching ``manifests/schemas/trial.schema.json``.
    """
    bank, prompt_file, prompt_sha = _load_prompts(config.prompts)
    rows = sorted(items, key=lambda r: (r["template_id"], r["item_id"]))
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
    parents = {r["item_id"]: r for r in rows}
    variants_of = sorted((d for d in derived if d.get("parent_item_id") in parents), key=lambda d: d["item_id"])
    for d in variants_of:
        if d.get("image"):
            paths[d["item_id"]] = d["image"]["path"]
    trials: list[dict[str, Any]] = []

    def add(protocol: str, question: str, images: list[str], prompt: str, answer: str, hint: str, **extra) -> None:
        trial = {
            "trial_id": None,
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
            "repeat": None,
            "parent_item_id": None,
            "answer_spec": None,
            "decoding": None,
            **base,
            **extra,
        }
        trial["trial_id"] = trial_id_of(trial)
        trials.append(trial)

    ctx = TrialContext(config, bank, rows, by_template, variants_of, biographies, expected_variants, add)
    for protocol in config.protocols:
        if protocol not in TRIAL_PROTOCOLS:  # the spec refuses these; a caller passing a bare list gets the same
            raise TrialError(f"unknown trial protocol {protocol!r}; known: {', '.join(protocol_names())}")
        config.protocol(protocol).build(ctx)
    seen: set[str] = set()
    for t in trials:
        if t["trial_id"] in seen:
            raise TrialError(f"two trials share trial_id {t['trial_id']} ({t['protocol']} {t['question']}); a bug")
        seen.add(t["trial_id"])
    return trials


class NoOptions(BaseModel):
    """The options of a protocol that has none (``trials.options.<protocol>`` must be empty)."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class TrialContext:
    """What a protocol builds its rows from (one per :func:`build_trials` call).

    Attributes:
        config: the spec's ``trials``.
        bank: the prompt file's protocols, as loaded.
        rows: the accepted items, by template then item id.
        by_template: ``rows`` grouped by template id, in that order.
        variants_of: ``derived.jsonl`` rows of those items, by item id.
        biographies: ``trials.biographies`` loaded, or None.
        expected_variants: conditions per template in the design (or None).
        add: ``add(protocol, question, images, prompt, answer_format, parser_hint, **fields)``
            appends one trial (its id is computed from its fields).
    """

    config: TrialsConfig
    bank: dict[str, Any]
    rows: list[dict[str, Any]]
    by_template: dict[str, list[dict[str, Any]]]
    variants_of: list[dict[str, Any]]
    biographies: dict[str, list[dict[str, str]]] | None
    expected_variants: int | None
    add: Callable[..., None]


class TrialProtocol:
    """One trial protocol, registered in :data:`TRIAL_PROTOCOLS`
    (``TRIAL_PROTOCOLS.register(name, OptionsModel, ProtocolClass)``; built with its options
    from ``trials.options.<name>``).

    Attributes:
        paper: the key of :data:`PAPERS` it follows (or None), for the card and ``release.json``.
        unit: its unit in one line (``release.json``'s ``trials``).
        needs_biographies: the spec must set ``trials.biographies``.
    """

    paper: str | None = None
    unit: str = ""
    needs_biographies: bool = False

    def __init__(self, options: BaseModel) -> None:
        self.options = options

    def build(self, ctx: TrialContext) -> None:
        """Append this protocol's trials for ``ctx.rows`` with ``ctx.add``, in a fixed order."""
        raise NotImplementedError

    def left_out(self, row: dict[str, Any], ctx: TrialContext) -> list[dict[str, Any]]:
        """``left_out.jsonl`` rows for trials ``row`` does not get (none by default)."""
        return []

    def prompts(self, bank: dict[str, Any]) -> list[str]:
        """Every prompt text it uses from the prompt file (for audits such as word-list checks)."""
        return []


def left_out_group(row: dict[str, Any]) -> dict[str, Any]:
    """A ``left_out.jsonl`` row's ``group``: the item's template and condition."""
    return {"template_id": row["template_id"], "condition": dict(row["condition"])}


#: robustness variants whose pixels are the item's own (the crop series' ``original`` level is the
#: whole image): MCQ asks the item once, so these add no second query of one image
IDENTITY_VARIANTS = frozenset({"crop_original"})


def release_trials(
    manifest: Sequence[dict[str, Any]],
    config: TrialsConfig,
    *,
    biographies: dict[str, list[dict[str, str]]] | None,
    derived: Sequence[dict[str, Any]],
    cells_per_template: int | None,
    editor_names: Sequence[str],
) -> list[dict[str, Any]]:
    """A release's trials (what ``publish`` writes and ``verify`` re-derives): pooled over the
    editors (a template's variants are every editor's), or with ``config.per_editor`` and more
    than one editor one bank per editor, each over that editor's items (``editor_name``) and
    their variants, joined in ``editor_names`` order (a row two banks share, such as a
    protocol's original photo, once).

    Args:
        cells_per_template: the grid's cells per template, every editor's counted (2AFC
            completeness; None for an empty grid).
        editor_names: the spec's editor labels in its order (one name for a one-editor spec).
    """
    if not (config.per_editor and len(editor_names) > 1):
        return build_trials(
            manifest, config, biographies=biographies, expected_variants=cells_per_template, derived=derived
        )
    trials: dict[str, dict[str, Any]] = {}
    for name in editor_names:
        mine = [row for row in manifest if row.get("editor_name") == name]
        ids = {row["item_id"] for row in mine}
        bank = build_trials(
            mine,
            config,
            biographies=biographies,
            expected_variants=cells_per_template // len(editor_names) if cells_per_template else None,
            derived=[d for d in derived if d.get("parent_item_id") in ids],
        )
        for row in bank:
            trials.setdefault(row["trial_id"], row)
    return list(trials.values())


def trials_left_out(
    items: Sequence[dict[str, Any]],
    config: TrialsConfig,
    *,
    biographies: dict[str, list[dict[str, str]]] | None = None,
) -> list[dict[str, Any]]:
    """``left_out.jsonl`` rows for the trials an item does not get, so none vanish silently:
    per item, each protocol's :meth:`TrialProtocol.left_out` (in registration order); e.g. with
    ``expression_consistent_only`` each drifted variant, left out of the perceived-safety 2AFC
    only (FOCUS B.2); with ``salary`` each item whose occupation has no biographies."""
    rows = sorted(items, key=lambda r: (r["template_id"], r["item_id"]))
    protocols = [config.protocol(name) for name in protocol_names() if name in config.protocols]
    ctx = TrialContext(config, {}, rows, {}, [], biographies, None, _no_add)
    return [entry for row in rows for protocol in protocols for entry in protocol.left_out(row, ctx)]


def _no_add(*args: Any, **kwargs: Any) -> None:
    raise TrialError("left_out hooks list what is left out; they add no trials")


def prompt_texts(name: str = DEFAULT_BANK) -> dict[str, list[str]]:
    """Every prompt text of a prompt file by built-in protocol (for audits such as word-list checks)."""
    bank, _, _ = _load_prompts(name)
    TRIAL_PROTOCOLS.names()  # loads the built-ins
    return {
        p.name: p.factory(p.options()).prompts(bank)
        for p in TRIAL_PROTOCOLS.registered()
        if p.origin.startswith("built-in")
    }


def protocol_names() -> list[str]:
    """Every registered protocol, built-in ones first, in registration order."""
    TRIAL_PROTOCOLS.names()  # loads the built-ins and the installed plug-ins
    return [p.name for p in TRIAL_PROTOCOLS.registered()]


def protocol_paper(name: str) -> tuple[str | None, str]:
    """``(paper key, unit)`` of the protocol ``name`` (``(None, "")`` when none is registered)."""
    if name not in TRIAL_PROTOCOLS:
        return None, ""
    factory = TRIAL_PROTOCOLS.get(name).factory
    return getattr(factory, "paper", None), getattr(factory, "unit", "")


def needs_biographies(config: TrialsConfig) -> bool:
    """Whether one of the spec's protocols needs ``trials.biographies``."""
    return any(getattr(TRIAL_PROTOCOLS.get(name).factory, "needs_biographies", False) for name in config.protocols)
