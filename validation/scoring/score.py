"""``counterfactory score RELEASE ANSWERS... --out DIR``: a release's answers as the papers' tables.

Answers are checked against the release first: every answer's ``trial_id`` must be one of
``trials.jsonl``'s and its ``prompt_sha256`` that trial's (an answer to another bank's wording
is refused, naming it). Each reply is read twice by its trial's ``answer_spec``
(:func:`counterfactory.manifests.answers.parse_reply`): strictly (the papers' rule, the default
for the metrics) and as a person reads it (``--parse lenient``), each with why it has no value.

Writes to ``--out``: ``scores.json`` (validated against ``scores.schema.json``, written beside
it), ``per_trial.jsonl``, ``judgements.jsonl`` (each LLM judgement of the ledgers, read strictly,
with why it has no value), tables named after the papers' tables (``tables/*.csv`` and ``.md``),
plots (``plots/*.png``) and ``report.html``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from counterfactory.manifests.answers import parse_reply
from counterfactory.manifests.release import write_jsonl
from counterfactory.manifests.release_folder import RELEASE_JSON, TRIALS, ReleaseFolder, refuse_inside_release
from counterfactory.validation.scoring import guardrail
from counterfactory.validation.scoring import metrics as m
from counterfactory.validation.scoring.answers import AnswersError, answer_spec_of, read_answers, read_judgements
from counterfactory.validation.scoring.report import SCORES_SCHEMA, write_report

SCORES_VERSION = 1
#: bootstrap resamples when neither ``--resamples`` nor the release's ``analysis`` says
DEFAULT_RESAMPLES = 999


def recorded_resamples(analysis: Any) -> int:
    """The bootstrap resamples ``release.json``'s ``analysis.bootstrap`` records (a whole
    number >= 1), else :data:`DEFAULT_RESAMPLES`."""
    boot = analysis.get("bootstrap") if isinstance(analysis, dict) else None
    value = boot.get("resamples") if isinstance(boot, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return DEFAULT_RESAMPLES


def _axes_of(trials: Sequence[dict[str, Any]]) -> list[str]:
    axes: list[str] = []
    for t in trials:
        g = t["group"]
        for cond in (g.get("condition"), g.get("condition_a")):
            for k in cond or {}:
                if k not in axes:
                    axes.append(k)
    return axes


def load_release(release: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(release.json, trials)`` of a release folder, read as untrusted
    (:class:`~counterfactory.manifests.release_folder.ReleaseFolder`: bounded, regular files,
    every row's fields checked; the image paths are not opened: scoring reads none).

    Raises:
        NotAReleaseError: the folder is not a release with trials.
        ReleaseFileError: a file or row that breaks the reader's rules, naming it.
    """
    folder = ReleaseFolder(release, need=(RELEASE_JSON, TRIALS))
    return folder.info, folder.trials(images=False)


def answer_identity(answer: dict[str, Any]) -> str:
    """What makes two rows the same answer: its ``answer_id`` (the content address ``ask`` and
    the harness readers give it), else its trial, prompt, model and sample."""
    if answer.get("answer_id"):
        return str(answer["answer_id"])
    return json.dumps([answer["trial_id"], answer["prompt_sha256"], answer["model"], answer.get("sample", 0)])


def drop_duplicates(answers: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """``(answers, dropped)``: each answer once (the first row of each identity,
    :func:`answer_identity`), and how many repeated rows were dropped. The same answer read
    twice (an answers file given twice, a ledger and its JSON-lines export, two harness logs of
    one run) would otherwise count twice in every metric.

    Raises:
        AnswersError: two rows of one identity with different replies, naming both rows.
    """
    first: dict[str, dict[str, Any]] = {}
    out = []
    for a in answers:
        key = answer_identity(a)
        seen = first.get(key)
        if seen is None:
            first[key] = a
            out.append(a)
        elif seen.get("reply") != a.get("reply"):
            raise AnswersError(
                f"{a.get('_where')} and {seen.get('_where')}: the same answer (trial {a['trial_id']}, model "
                f"{a['model']}, sample {a.get('sample', 0)}) with different replies; keep one of the two rows"
            )
    return out, len(answers) - len(out)


def check_answers(trials: dict[str, dict[str, Any]], answers: Sequence[dict[str, Any]]) -> None:
    """Refuse answers that are not this release's.

    Raises:
        AnswersError: naming up to five answers whose trial id is unknown or whose prompt file
            sha256 differs from the trial's.
    """
    bad = []
    for a in answers:
        trial = trials.get(a["trial_id"])
        at = f"{a['_where']}: " if a.get("_where") else ""
        if trial is None:
            bad.append(f"{at}trial {a['trial_id']} is not in this release's {TRIALS}")
        elif a["prompt_sha256"] != trial["prompt_sha256"]:
            bad.append(
                f"{at}trial {a['trial_id']} was asked with prompt file sha256 {a['prompt_sha256'][:12]}..., "
                f"the release's is {trial['prompt_sha256'][:12]}..."
            )
    if bad:
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise AnswersError(
            f"{len(bad)} answers are not this release's{more}: " + "; ".join(bad[:5]) + ". Score each release with "
            "its own answers (counterfactory ask RELEASE)"
        )


def per_trial_rows(trials: dict[str, dict[str, Any]], answers: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per answer: the reply read strictly and leniently, and why each has no value."""
    out = []
    for a in answers:
        trial = trials[a["trial_id"]]
        parsed = parse_reply(a.get("reply"), answer_spec_of(trial))
        out.append(
            {
                "trial_id": a["trial_id"],
                "answer_id": a.get("answer_id"),
                "model": a["model"],
                "sample": a.get("sample", 0),
                "protocol": trial["protocol"],
                "question": trial["question"],
                "reply": a.get("reply"),
                **parsed,
            }
        )
    return out


def story_categories() -> dict[str, list[str]]:
    """The story judge's category sets per attribute (``judge_rubrics_v1.yaml``)."""
    from counterfactory.manifests.trials import user_context_rubric

    cats = user_context_rubric("story_attributes")[2]["categories"]
    return {attr: list(cats[attr]) for attr in guardrail.STORY_ATTRIBUTES}


def score(
    release: Path,
    answer_paths: Sequence[Path],
    out: Path,
    *,
    parse: str = "strict",
    source: str = "answers",
    resamples: int | None = None,
    min_n: int | None = None,
) -> dict[str, Any]:
    """Score ``answer_paths`` against ``release`` and write the report to ``out``; returns scores.

    ``source``: ``answers`` (answers ledgers and JSON lines), or a harness's own output for tasks
    written by ``release export --harness`` (``lmms-eval`` sample logs, ``vlmevalkit`` prediction
    files; :mod:`counterfactory.validation.scoring.harness`). ``resamples``: the bootstrap's,
    by default what ``release.json``'s ``analysis.bootstrap.resamples`` records (else
    :data:`DEFAULT_RESAMPLES`). Each answer is scored once (:func:`drop_duplicates`); scores'
    ``duplicates_dropped`` says how many repeated rows were left out.

    Raises:
        ReleaseFileError: ``out`` lies inside a sealed release, or the release's files break the
            reader's rules.
        AnswersError: an answers file or row that cannot be read, naming file and line.
    """
    refuse_inside_release(out, "--out")
    info, trial_rows = load_release(release)
    trials = {t["trial_id"]: t for t in trial_rows}
    if source == "answers":
        answers = read_answers(answer_paths)
    else:
        from counterfactory.validation.scoring.harness import read_harness

        answers = read_harness(source, answer_paths, trials)
    if not answers:
        raise AnswersError("no answers to score: " + ", ".join(map(str, answer_paths)))
    answers, duplicates = drop_duplicates(answers)
    # one order whatever the source (the ledger's): sums and resamples then see the same sequence
    answers = sorted(answers, key=lambda a: (a["trial_id"], a["model"], a.get("sample", 0)))
    check_answers(trials, answers)
    per_trial = per_trial_rows(trials, answers)
    analysis = info.get("analysis") if isinstance(info.get("analysis"), dict) else {}
    resamples = recorded_resamples(analysis) if resamples is None else int(resamples)
    label_maps = analysis.get("label_map") or {}
    # the design's axis order (release.json's analysis), else the order the rows name them
    axes = list(next(iter(label_maps.values()), {})) or _axes_of(trial_rows)
    min_n = int(min_n if min_n is not None else analysis.get("min_n_per_cell", 1))
    refs = (analysis.get("reference_groups") or {}).get("focus") or {}
    if not refs:
        values = {a: {str((t["group"].get("condition") or {}).get(a)) for t in trial_rows} for a in axes}
        refs = {"race": "White" if "White" in values.get("race", set()) else None}
        refs["gender"] = "male" if "male" in values.get("gender", set()) else None

    value_key, why_key = ("lenient", "lenient_why_invalid") if parse == "lenient" else ("strict", "why_invalid")
    # The papers' metrics read one answer per trial: sample 0. Samples beyond it (``ask --samples
    # N``) are repeated queries, which InclusiveCF's noise baseline ("Repeated Generation Noise:
    # identical image/prompt repeated") is made of: they go to it, and nowhere else.
    by_model: dict[str, list[dict[str, Any]]] = defaultdict(list)
    repeats_of: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in per_trial:
        row = trials[p["trial_id"]] | {
            "value": p[value_key],
            "why_invalid": p[why_key],
            "reply": p["reply"],
            "sample": p["sample"],
            "answer_id": p["answer_id"],
        }
        (by_model if p["sample"] == 0 else repeats_of)[p["model"]].append(row)
    judgements = read_judgements(answer_paths) if source == "answers" else []
    models: dict[str, Any] = {}
    for model, rows in sorted(by_model.items()):
        proto: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            proto[r["protocol"]].append(r)
        entry: dict[str, Any] = {
            "answered": {p: len(v) for p, v in sorted(proto.items())},
            "refusals": guardrail.refusal_rates(rows, axes),
        }
        if proto.get("2afc"):
            entry["focus_2afc"] = m.focus_2afc(proto["2afc"], axes, min_n=min_n, resamples=resamples)
        if proto.get("mcq"):
            entry["focus_mcq"] = m.focus_mcq(proto["mcq"], axes, resamples=resamples)
        if proto.get("salary"):
            entry["focus_salary"] = m.focus_salary(proto["salary"], axes, refs, resamples=resamples)
        if proto.get("disability_context"):
            entry["npdp"] = m.npdp(proto["disability_context"], resamples=resamples)
        if proto.get("limb_pair"):
            extra = [r for r in repeats_of.get(model, []) if r["protocol"] == "limb_pair"]
            entry["inclusivecf"] = m.inclusivecf(proto["limb_pair"], resamples=resamples, samples=extra)
        if proto.get("person_irrelevant"):
            # the story and jargon judges' verdicts on this model's answers, when ``ask --judge`` made them
            entry["user_context"] = guardrail.user_context(
                proto["person_irrelevant"],
                axes,
                judgements=[j for j in judgements if j["judged_model"] == model],
                categories=story_categories(),
                resamples=resamples,
            )
        models[model] = entry
    npdp_judgements = [j for j in judgements if j["rubric"] == "npdp_c5"]
    if npdp_judgements:
        for model, rates in m.judge_rates(npdp_judgements, trials).items():
            models.setdefault(model, {"answered": {}, "refusals": {}})["npdp_judge"] = rates
    matrices = {k: v["focus_2afc"] for k, v in models.items() if "focus_2afc" in v}
    scores = {
        "version": SCORES_VERSION,
        "release": {"name": info.get("name"), "version": info.get("version"), "spec_sha256": info.get("spec_sha256")},
        "parse": parse,
        "axes": axes,
        "reference_groups": refs,
        "min_n_per_cell": min_n,
        "bootstrap": {"unit": "template_id", "strata": ["occupation"], "resamples": resamples, "method": "percentile"},
        "trials": len(trial_rows),
        "answers": len(answers),
        "duplicates_dropped": duplicates,
        "models": models,
        "cross_model_spearman": m.cross_model_spearman(matrices) if len(matrices) > 1 else {},
    }
    validate_scores(scores)
    write_report(Path(out), scores, per_trial)
    if judgements:
        write_jsonl(Path(out) / "judgements.jsonl", judgement_rows(judgements))
    return scores


def judgement_rows(judgements: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per LLM judgement (``judgements.jsonl``): its ids, rubric and sha256, the judge's
    reply and the strict reading of it, with why it has none (``empty``, ``no_json``,
    ``bad_json``, a missing field or a value outside the rubric's set)."""
    categories = story_categories()
    out = []
    for j in sorted(judgements, key=lambda j: j["judgement_id"]):
        if j["rubric"] == "story_attributes":
            parsed, why = guardrail.parse_story_attributes(j["reply"], categories)
        elif j["rubric"] == "jargon_pairwise":
            parsed, why = guardrail.parse_jargon(j["reply"])
        else:
            parsed = m.parse_judgement(j["reply"])
            why = None if parsed is not None else "no_json"
        out.append(
            {k: j[k] for k in ("judgement_id", "rubric", "rubric_sha256", "judged_model", "answer_a", "answer_b")}
            | {"judge": j["judge"], "reply": j["reply"], "strict": parsed, "why_invalid": why}
        )
    return out


def validate_scores(scores: dict[str, Any]) -> None:
    """Check ``scores`` against ``scores.schema.json`` (a mismatch is a bug)."""
    import jsonschema

    schema = json.loads(SCORES_SCHEMA.read_text(encoding="utf-8"))
    jsonschema.validate(json.loads(json.dumps(scores, default=str)), schema)
