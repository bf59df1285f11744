"""The LLM judge over earlier answers: NP/DP's rubric (its appendix C.5) on each image's neutral
(A) and disability-context (B) descriptions, ``counterfactory ask RELEASE --judge npdp --of MODEL``.

Each judgement is content-addressed like an answer (the rubric's sha256, both answers' ids, the
judge's lineage and decoding), committed as it returns in the ``judgements`` table of the same
answers ledger, with the rubric's sha256 on its row. ``score`` reads the judge's JSON (C.5's
"Output Format") into NP/DP's Interpret, Stereotype and Framing rates (Tables 1-2) and the
declines it marks.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from counterfactory.manifests.registry import ANSWER_BACKENDS
from counterfactory.manifests.trials import judge_rubric
from counterfactory.validation.scoring.answers import AnswersLedger, ledger_path
from counterfactory.validation.scoring.ask import AskError, AskSummary, Question, answer_backend, ask_questions
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
    release = Path(release)
    _, trials = load_release(release)
    by_id = {t["trial_id"]: t for t in trials if t["protocol"] == "disability_context"}
    if not by_id:
        raise AskError("--judge npdp: this release has no disability_context trials")
    if backend not in ANSWER_BACKENDS:
        raise AskError(f"--backend {backend}: one of {', '.join(ANSWER_BACKENDS.names())}")
    store = AnswersLedger(ledger or ledger_path(release))
    answers = [a for a in store.rows() if a["model"] == of_model and a["sample"] == 0 and a["trial_id"] in by_id]
    if not answers:
        store.close()
        raise AskError(f"--judge npdp --of {of_model}: no disability_context answers of {of_model} in {store.path}")
    client = answer_backend(backend, options)
    if getattr(client, "needs_images", False):
        store.close()
        raise AskError(
            f"--judge npdp --backend {backend}: this backend answers questions about images; judge with openai"
        )
    lineage = client.lineage()
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
            jid = hashlib.sha256(
                json.dumps(
                    [sha, neutral["answer_id"], b["answer_id"], lineage, JUDGE_DECODING], sort_keys=True
                ).encode()
            ).hexdigest()
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
            row = {
                "judgement_id": jid,
                "rubric": "npdp_c5",
                "rubric_sha256": sha,
                "answer_a": neutral["answer_id"],
                "answer_b": b["answer_id"],
                "trial_b": b["trial_id"],
                "judged_model": of_model,
                "judge": lineage,
            }
            todo.append(Question(jid, b["trial_id"], prompt, (), JUDGE_DECODING, 0, row))

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
            max_spend=max_spend,
            spent_before=0.0,
        )
    finally:
        store.close()
    return summary
