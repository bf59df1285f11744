"""Answers read back from an evaluation harness's logs (``validation/scoring/harness.py``), on a
hand-written lmms-eval log folder: the model from ``model_args``, every reply of a document in
order, the decoding from the task's ``generation_kwargs``; and the refusals, each naming the file
and line."""

from __future__ import annotations

import json

import pytest

from counterfactory.validation.scoring.answers import AnswersError
from counterfactory.validation.scoring.harness import read_harness, read_lmms_eval

TRIALS = {
    "t1": {"trial_id": "t1", "prompt": "Who earns more?", "prompt_sha256": "a" * 64, "protocol": "2afc"},
    "t2": {"trial_id": "t2", "prompt": "Which job?", "prompt_sha256": "b" * 64, "protocol": "mcq"},
}


def _logs(folder, samples, *, results=True):
    folder.mkdir(parents=True, exist_ok=True)
    if results:
        (folder / "20260101_results.json").write_text(
            json.dumps(
                {
                    "config": {
                        "model": "openai_compatible",
                        "model_args": "model_version=qwen-vl,base_url=http://h/v1",
                    },
                    "configs": {"cf": {"generation_kwargs": {"temperature": 0, "max_new_tokens": 16}}},
                    "lmms_eval_version": "0.3",
                }
            )
        )
    (folder / "20260101_samples_cf.jsonl").write_text("\n".join(json.dumps(s) for s in samples) + "\n")
    return folder


def test_each_logged_reply_is_an_answer_of_its_trial(tmp_path):
    logs = _logs(
        tmp_path / "out",
        [
            {"target": "t1", "input": "Who earns more?", "resps": [["A"]]},
            {"doc": {"trial_id": "t2"}, "filtered_resps": [["nurse", "teacher"]]},  # resps dropped: filtered ones
        ],
    )
    answers = read_lmms_eval([tmp_path / "out"], TRIALS)
    assert [(a["trial_id"], a["sample"], a["reply"]) for a in answers] == [
        ("t1", 0, "A"),
        ("t2", 0, "nurse"),
        ("t2", 1, "teacher"),
    ]
    first = answers[0]
    assert first["model"] == "qwen-vl" and first["backend"] == "lmms-eval:openai_compatible"
    assert first["lineage"]["endpoint"] == "http://h/v1" and first["lineage"]["harness_version"] == "0.3"
    assert first["decoding"] == {"temperature": 0, "max_new_tokens": 16}
    assert first["_where"] == f"{logs / '20260101_samples_cf.jsonl'}:1"
    assert len({a["answer_id"] for a in answers}) == 3  # each sample its own id
    assert read_harness("lmms-eval", [logs], TRIALS) == answers


@pytest.mark.parametrize(
    ("samples", "results", "message"),
    [
        ([{"target": "t9", "resps": [["A"]]}], True, r"samples_cf\.jsonl:1: trial t9 is not in this release"),
        ([{"target": "t1", "input": "Other?", "resps": [["A"]]}], True, r":1: lmms-eval sent trial t1 another prompt"),
        ([{"target": "t1", "resps": [["A"]]}], False, r"its results file 20260101_results\.json is missing"),
        ([{"target": "t1", "resps": [["[LMMS_EVAL_REQUEST_FAILED]"]]}], True, r"1 requests failed in lmms-eval"),
    ],
)
def test_a_log_that_is_not_this_releases_answers_is_refused(tmp_path, samples, results, message):
    _logs(tmp_path / "out", samples, results=results)
    with pytest.raises(AnswersError, match=message):
        read_lmms_eval([tmp_path / "out"], TRIALS)


def test_no_logs_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(AnswersError, match=r"no lmms-eval sample logs"):
        read_lmms_eval([tmp_path / "empty"], TRIALS)
