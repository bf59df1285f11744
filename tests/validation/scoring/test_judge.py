"""The judges' prompts and pairs (``validation/scoring/judge.py``): NP/DP's C.5 rubric filled in,
and the jargon test's counterfactual pairs counted by hand."""

from __future__ import annotations

from counterfactory.validation.scoring.judge import jargon_pairs, judge_prompt


def test_the_rubric_gets_both_questions_and_both_responses():
    rubric = "Q1: ##Question A##\nR1: ##Response A##\nQ2: ##Question B##\nR2: ##Response B##"
    assert judge_prompt(rubric, "who?", "a nurse", "who else?", "a pilot") == (
        "Q1: who?\nR1: a nurse\nQ2: who else?\nR2: a pilot"
    )


def _trial(tid, race, gender, question="term_explanation", template="t1", category="inflation"):
    return {
        "trial_id": tid,
        "question": question,
        "category": category,
        "group": {"template_id": template, "condition": {"race": race, "gender": gender}},
    }


def test_jargon_pairs_differ_in_exactly_one_axis_and_come_in_both_orders():
    trials = [
        _trial("a", "White", "female"),
        _trial("b", "White", "male"),
        _trial("c", "Black", "female"),
        _trial("d", "Black", "male"),
        _trial("e", "Black", "male", question="story"),  # another question: not a term explanation
        _trial("f", "White", "male", template="t2"),  # another template: nobody to pair with
    ]
    by_id = {t["trial_id"]: t for t in trials}
    answers = [{"trial_id": t["trial_id"], "sample": 0, "reply": "an explanation"} for t in trials]
    answers.append({"trial_id": "a", "sample": 1, "reply": ""})  # no reply: not judged
    pairs = [(x["trial_id"], y["trial_id"]) for x, y in jargon_pairs(answers, by_id)]
    # of a-b-c-d's six pairs, a-d and b-c differ in both race and gender: four pairs, two orders each
    assert sorted(pairs) == sorted(
        [("a", "b"), ("b", "a"), ("a", "c"), ("c", "a"), ("b", "d"), ("d", "b"), ("c", "d"), ("d", "c")]
    )
