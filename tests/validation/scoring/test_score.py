"""``score``'s guards on what it is given (``validation/scoring/score.py``): each answer counted
once, answers of another release refused naming them, the resamples the release records."""

from __future__ import annotations

import pytest

from counterfactory.validation.scoring.answers import AnswersError
from counterfactory.validation.scoring.score import (
    DEFAULT_RESAMPLES,
    check_answers,
    drop_duplicates,
    recorded_resamples,
)

TRIALS = {"t1": {"trial_id": "t1", "prompt_sha256": "a" * 64}, "t2": {"trial_id": "t2", "prompt_sha256": "b" * 64}}


def _answer(trial="t1", reply="A", sample=0, aid=None, where="answers.jsonl:1", sha=None):
    return {
        "answer_id": aid,
        "trial_id": trial,
        "prompt_sha256": sha or TRIALS.get(trial, {"prompt_sha256": "c" * 64})["prompt_sha256"],
        "model": "m",
        "sample": sample,
        "reply": reply,
        "_where": where,
    }


def test_the_same_answer_read_twice_counts_once():
    rows = [
        _answer(aid="x1"),
        _answer(aid="x1", where="ledger:3"),  # the ledger and its export
        _answer(sample=1),
        _answer(sample=1, where="again.jsonl:1"),  # no id: trial, prompt, model and sample
        _answer(sample=2),
    ]
    kept, dropped = drop_duplicates(rows)
    assert dropped == 2 and [r["_where"] for r in kept] == ["answers.jsonl:1"] * 3
    with pytest.raises(AnswersError, match=r"b.jsonl:9 and answers.jsonl:1: the same answer \(trial t1"):
        drop_duplicates([_answer(aid="x1"), _answer(aid="x1", reply="B", where="b.jsonl:9")])


def test_answers_of_another_release_are_refused_naming_them():
    check_answers(TRIALS, [_answer(), _answer("t2")])
    with pytest.raises(AnswersError, match=r"2 answers are not this release's: a:1: trial t9 is not in") as caught:
        check_answers(TRIALS, [_answer("t9", where="a:1"), _answer("t2", sha="d" * 64, where="a:2")])
    assert "a:2: trial t2 was asked with prompt file sha256 dddddddddddd..., the release's is bbbbbbbbbbbb" in str(
        caught.value
    )


def test_the_bootstrap_resamples_are_the_releases_when_it_records_a_count():
    assert recorded_resamples({"bootstrap": {"resamples": 499}}) == 499
    for odd in (None, {}, {"bootstrap": {"resamples": 0}}, {"bootstrap": {"resamples": True}}, {"bootstrap": 5}):
        assert recorded_resamples(odd) == DEFAULT_RESAMPLES
