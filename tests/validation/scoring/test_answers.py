"""The answers ledger (``validation/scoring/answers.py``): content-addressed answers, committed
once, a journaled request dropped by the answer that settles it, error rows apart, the spend of
one model; and where a ledger may lie."""

from __future__ import annotations

import pytest

from counterfactory.validation.scoring.answers import (
    AnswersError,
    AnswersLedger,
    answer_id,
    check_ledger_place,
    ledger_path,
)

TRIAL = {"trial_id": "t1", "prompt_sha256": "a" * 64}
LINEAGE = {"backend": "openai", "model": "m"}


def _row(sample, reply="A", cost=0.001, model="m", error=None):
    return {
        "answer_id": answer_id(TRIAL, LINEAGE | {"model": model}, {"temperature": 0}, sample),
        "trial_id": "t1",
        "prompt_sha256": TRIAL["prompt_sha256"],
        "protocol": "2afc",
        "model": model,
        "backend": "openai",
        "lineage": LINEAGE,
        "decoding": {"temperature": 0},
        "sample": sample,
        "reply": reply,
        "cost_usd": cost,
        "seconds": 0.5,
        "error": error,
    }


def test_an_answer_id_hashes_everything_that_decides_the_answer():
    base = answer_id(TRIAL, LINEAGE, {"temperature": 0}, 0)
    assert len(base) == 64 and base == answer_id(dict(TRIAL), dict(LINEAGE), {"temperature": 0}, 0)
    others = {
        answer_id(TRIAL | {"trial_id": "t2"}, LINEAGE, {"temperature": 0}, 0),
        answer_id(TRIAL | {"prompt_sha256": "b" * 64}, LINEAGE, {"temperature": 0}, 0),
        answer_id(TRIAL, LINEAGE | {"model": "n"}, {"temperature": 0}, 0),
        answer_id(TRIAL, LINEAGE, {"temperature": 1}, 0),
        answer_id(TRIAL, LINEAGE, {"temperature": 0}, 1),
    }
    assert base not in others and len(others) == 5


def test_the_ledger_keeps_the_first_answer_and_settles_its_request(tmp_path):
    ledger = AnswersLedger(tmp_path / "a.sqlite")
    try:
        first = _row(0)
        ledger.save_request(first["answer_id"], {"request_id": "r1"}, 0.01)
        assert ledger.requests() == {first["answer_id"]: ({"request_id": "r1"}, 0.01)}
        ledger.commit_answer(first, settles=first["answer_id"])
        assert ledger.requests() == {}
        ledger.commit_answer(first | {"reply": "B"})  # the same id again: kept as it was
        ledger.commit_answer(_row(1, reply=None, cost=0.002, error="not a chat completion"))
        ledger.commit_answer(_row(0, cost=0.5, model="other"))
        assert [(r["sample"], r["reply"]) for r in ledger.rows() if r["model"] == "m"] == [(0, "A")]
        assert [e["error"] for e in ledger.errors()] == ["not a chat completion"]
        assert ledger.spent_usd("m") == pytest.approx(0.003)  # the error row was paid for too
        with pytest.raises(AnswersError, match="cost_usd -1 is not a USD amount"):
            ledger.commit_answer(_row(5, cost=-1))
    finally:
        ledger.close()


def test_the_ledger_lies_beside_the_sealed_release_never_inside(tmp_path):
    release = tmp_path / "study" / "1.0.0"
    release.mkdir(parents=True)
    assert ledger_path(release) == tmp_path / "study" / "1.0.0.answers.sqlite"
    assert check_ledger_place(release, ledger_path(release)) == ledger_path(release)
    with pytest.raises(AnswersError, match="inside the release folder"):
        check_ledger_place(release, release / "answers.sqlite")
