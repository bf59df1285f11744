"""The LLM judges over earlier answers, ``counterfactory ask RELEASE --judge NAME --of MODEL``:
``npdp``, NP/DP's rubric (its appendix C.5) on each image's neutral (A) and disability-context (B)
descriptions; ``story``, the guardrail-agnostic story-attribute extraction (occupation, academic
level, socioeconomic status) on each story; ``jargon``, its blind pairwise jargon test on term
explanations of images that differ in one axis, each pair in both orders.

Each judgement is content-addressed like an answer (the rubric's sha256, both answers' ids, the
judge's lineage and decoding), committed as it returns in the ``judgements`` table of the same
answers ledger, with the rubric's name and sha256 on its row. ``score`` reads the judge's JSON
(C.5's "Output Format") into NP/DP's Interpret, Stereotype and Framing rates (Tables 1-2) and the
declines it marks, and the user-context judges' JSON into the guardrail paper's Table 2 (its Story
Generation and Term Explanation columns). The user-context rubrics are not in the trial bank but in
``assets/trials/judge_rubrics_v1.yaml``: a release pins its bank's bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from counterfactory.manifests.trials import judge_rubric, user_context_rubric
from counterfactory.validation.scoring.answers import AnswersLedger, check_ledger_place, ledger_path
from counterfactory.validation.scoring.ask import (
    AskError,
    AskSummary,
    Question,
    answer_backend,
    ask_questions,
    check_max_spend,
)
from counterfactory.validation.scoring.registry import ANSWER_BACKENDS
from counterfactory.validation.scoring.score import load_release

#: the judge's decoding: deterministic, room for C.5's JSON with spans
JUDGE_DECODING = {"temperature": 0.0, "max_tokens": 800}


def judge_prompt(rubric: str, question_a: str, response_a: str, question_b: str, response_b: str) -> str:
    """C.5's prompt with its four placeholders filled."""
    return (
        rubric.replace("##Question A##", question_a)
        .replace("##Response A##", response_a)
        .replace("##Question B##", question_b)
        .replace("##Response B##", response_b)
    )


def _judgement_id(sha: str, answer_a: str, answer_b: str, lineage: Any) -> str:
    """A judgement's id: the rubric's sha256, the two answers judged, the judge's lineage and decoding."""
    return hashlib.sha256(
        json.dumps([sha, answer_a, answer_b, lineage, JUDGE_DECODING], sort_keys=True).encode()
    ).hexdigest()


def _judgement_row(
    jid: str, rubric: str, sha: str, a: dict[str, Any], b: dict[str, Any], of_model: str, lineage: Any
) -> dict[str, Any]:
    """The ``judgements`` row of one judgement of answers ``a`` (shown first) and ``b``."""
    return {
        "judgement_id": jid,
        "rubric": rubric,
        "rubric_sha256": sha,
        "answer_a": a["answer_id"],
        "answer_b": b["answer_id"],
        "trial_b": b["trial_id"],
        "judged_model": of_model,
        "judge": lineage,
    }


def judge_npdp(
    release: Path,
    *,
    backend: str,
    options: dict[str, Any],
    of_model: str,
    concurrency: int = 4,
    retries: int = 4,
    max_spend: float | None = None,
    ledger: Path | None = None,
) -> AskSummary:
    """Judge every (neutral, context) pair of ``of_model``'s disability-context answers not yet judged."""
    by_id, store, answers, client, lineage = _judge_setup(
        release, backend, options, of_model, ledger, "npdp", "disability_context"
    )
    units: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for a in answers:
        t = by_id[a["trial_id"]]
        units[t["pair_id"]]["neutral" if t["variant"] == "neutral" else a["trial_id"]] = a
    known = store.known_judgements()
    todo = []
    summary = AskSummary(ledger=str(store.path))
    for unit in units.values():
        neutral = unit.get("neutral")
        if neutral is None or not neutral["reply"]:
            continue
        for key, b in unit.items():
            if key == "neutral":
                continue
            found = judge_rubric(by_id[b["trial_id"]]["prompt_file"])
            if found is None:
                store.close()
                raise AskError(f"{by_id[b['trial_id']]['prompt_file']} has no judge rubric; use trial_prompts_v3")
            rubric, sha = found
            summary.wanted += 1
            jid = _judgement_id(sha, neutral["answer_id"], b["answer_id"], lineage)
            if jid in known:
                summary.already += 1
                continue
            prompt = judge_prompt(
                rubric,
                by_id[neutral["trial_id"]]["prompt"],
                neutral["reply"],
                by_id[b["trial_id"]]["prompt"],
                b["reply"] or "",
            )
            row = _judgement_row(jid, "npdp_c5", sha, neutral, b, of_model, lineage)
            todo.append(Question(jid, b["trial_id"], prompt, (), JUDGE_DECODING, 0, row))
    return _run_judgements(client, store, todo, summary, concurrency=concurrency, retries=retries, max_spend=max_spend)


# ---------------------------------------------------------------- guardrail-agnostic user context


def _judge_setup(
    release: Path,
    backend: str,
    options: dict[str, Any],
    of_model: str,
    ledger: Path | None,
    flag: str,
    protocol: str = "person_irrelevant",
) -> tuple[dict[str, dict[str, Any]], AnswersLedger, list[dict[str, Any]], Any, dict[str, Any]]:
    """The release's ``protocol`` trials, the ledger, ``of_model``'s sample-0 answers to them,
    the judge's client and its lineage, for ``--judge flag``: every judge's checks, each a
    one-line error."""
    release = Path(release)
    store_path = check_ledger_place(release, ledger or ledger_path(release))
    _, trials = load_release(release)
    by_id = {t["trial_id"]: t for t in trials if t["protocol"] == protocol}
    if not by_id:
        raise AskError(f"--judge {flag}: this release has no {protocol} trials")
    if backend not in ANSWER_BACKENDS:
        raise AskError(f"--backend {backend}: one of {', '.join(ANSWER_BACKENDS.names())}")
    store = AnswersLedger(store_path)
    answers = [a for a in store.rows() if a["model"] == of_model and a["sample"] == 0 and a["trial_id"] in by_id]
    if not answers:
        store.close()
        raise AskError(f"--judge {flag} --of {of_model}: no {protocol} answers of {of_model} in {store.path}")
    client = answer_backend(backend, options)
    if getattr(client, "needs_images", False):
        store.close()
        raise AskError(
            f"--judge {flag} --backend {backend}: this backend answers questions about images; judge with openai"
        )
    return by_id, store, answers, client, client.lineage()


def _run_judgements(
    client: Any,
    store: AnswersLedger,
    todo: list[Question],
    summary: AskSummary,
    *,
    concurrency: int,
    retries: int,
    max_spend: float | None,
) -> AskSummary:
    def commit(question: Question, got: dict[str, Any], seconds: float, settles: str | None) -> None:
        store.commit_judgement({**question.row, "reply": got.get("reply")}, settles=settles)

    try:
        ask_questions(
            client,
            todo,
            store,
            commit,
            summary,
            concurrency=concurrency,
            retries=retries,
            max_spend=check_max_spend(max_spend),
            spent_before=0.0,
        )
    finally:
        store.close()
    return summary


def judge_story(
    release: Path,
    *,
    backend: str,
    options: dict[str, Any],
    of_model: str,
    concurrency: int = 4,
    retries: int = 4,
    max_spend: float | None = None,
    ledger: Path | None = None,
) -> AskSummary:
    """Extract the protagonist's occupation, academic level and socioeconomic status from each of
    ``of_model``'s story answers not yet judged (``ask --judge story --of MODEL``).

    Guardrail-agnostic 2: "Story Generation tests open-ended creative writing, prompting models
    to invent characters while using an LLM assistant to extract occupational, academic, and
    socioeconomic attributes, checking whether the user's demographic profile induces
    stereotypical roles". The rubric (ours: the paper prints none) and its fixed category sets are
    ``assets/trials/judge_rubrics_v1.yaml``'s ``story_attributes``; its sha256 is on every
    judgement (``answer_a`` and ``answer_b`` both the story's answer id). The no-image stories
    are judged too: the baseline the report shows beside the groups."""
    text, sha, _ = user_context_rubric("story_attributes")
    by_id, store, answers, client, lineage = _judge_setup(release, backend, options, of_model, ledger, "story")
    known = store.known_judgements()
    summary = AskSummary(ledger=str(store.path))
    todo = []
    for a in answers:
        trial = by_id[a["trial_id"]]
        if trial["question"] != "story" or not a["reply"]:
            continue
        summary.wanted += 1
        jid = _judgement_id(sha, a["answer_id"], a["answer_id"], lineage)
        if jid in known:
            summary.already += 1
            continue
        row = _judgement_row(jid, "story_attributes", sha, a, a, of_model, lineage)
        todo.append(Question(jid, a["trial_id"], text.replace("##Story##", a["reply"]), (), JUDGE_DECODING, 0, row))
    return _run_judgements(client, store, todo, summary, concurrency=concurrency, retries=retries, max_spend=max_spend)


def jargon_pairs(answers: list[dict[str, Any]], by_id: dict[str, dict[str, Any]]) -> list[tuple[dict, dict]]:
    """The ordered (A, B) pairs the jargon judge sees: within one template, concept and sample,
    every two term explanations whose images' conditions differ in exactly one axis (a
    counterfactual pair: the gender pairs of one race, the race pairs of one gender), each in
    both orders (the position-bias cancellation). Ours: pairs differing in two axes are not
    judged, as Table 2 scores each axis alone."""
    cells: dict[tuple[Any, Any, int], list[dict[str, Any]]] = defaultdict(list)
    for a in answers:
        t = by_id[a["trial_id"]]
        if t["question"] != "term_explanation" or t["group"].get("template_id") is None or not a["reply"]:
            continue
        cells[(t["group"]["template_id"], t.get("category"), a["sample"])].append(a)
    pairs = []
    for key in sorted(cells, key=lambda k: tuple(map(str, k))):
        rows = sorted(cells[key], key=lambda a: a["trial_id"])
        for i, x in enumerate(rows):
            for y in rows[i + 1 :]:
                cx = by_id[x["trial_id"]]["group"].get("condition") or {}
                cy = by_id[y["trial_id"]]["group"].get("condition") or {}
                differ = [k for k in set(cx) | set(cy) if cx.get(k) != cy.get(k)]
                if len(differ) != 1:
                    continue
                pairs += [(x, y), (y, x)]
    return pairs


def judge_jargon(
    release: Path,
    *,
    backend: str,
    options: dict[str, Any],
    of_model: str,
    concurrency: int = 4,
    retries: int = 4,
    max_spend: float | None = None,
    ledger: Path | None = None,
) -> AskSummary:
    """The blind pairwise jargon test over ``of_model``'s term explanations (``ask --judge jargon
    --of MODEL``): each pair of :func:`jargon_pairs`, shown as Explanation A and B in both
    orders, without the image or the group, the judge answering which has more technical jargon.

    Guardrail-agnostic 2: "Term Explanation spans 20 college-level concepts across six academic
    domains (math, physics, CS, art, literature, music), asking the LLM assistant in a blind test
    which paired explanation contains more technical jargon, thereby revealing patronizing
    simplifications." The rubric is ``judge_rubrics_v1.yaml``'s ``jargon_pairwise`` (ours); its
    sha256 is on every judgement, ``answer_a`` / ``answer_b`` the answers shown as A and B."""
    text, sha, _ = user_context_rubric("jargon_pairwise")
    by_id, store, answers, client, lineage = _judge_setup(release, backend, options, of_model, ledger, "jargon")
    known = store.known_judgements()
    summary = AskSummary(ledger=str(store.path))
    todo = []
    for a, b in jargon_pairs(answers, by_id):
        summary.wanted += 1
        jid = _judgement_id(sha, a["answer_id"], b["answer_id"], lineage)
        if jid in known:
            summary.already += 1
            continue
        prompt = (
            text.replace("##Concept##", str(by_id[a["trial_id"]].get("category")))
            .replace("##Explanation A##", a["reply"])
            .replace("##Explanation B##", b["reply"])
        )
        row = _judgement_row(jid, "jargon_pairwise", sha, a, b, of_model, lineage)
        todo.append(Question(jid, b["trial_id"], prompt, (), JUDGE_DECODING, 0, row))
    return _run_judgements(client, store, todo, summary, concurrency=concurrency, retries=retries, max_spend=max_spend)


#: ``ask --judge NAME``: the judges and what each judges
JUDGES = {"npdp": judge_npdp, "story": judge_story, "jargon": judge_jargon}
