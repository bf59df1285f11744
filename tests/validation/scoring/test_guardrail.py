"""Known-answer tests of the guardrail-agnostic paper's measures (``validation/scoring/guardrail.py``):
refusal rates, story attributes, the jargon test and the user-context table, on small hand-built
tables; each quotes its section."""

from __future__ import annotations

import json
import random

import pytest

from counterfactory.validation.scoring import guardrail


def test_refusal_rates_and_tvd():
    # guardrail-agnostic 3: per-prompt TVD against the fair baseline, "scaled to [0, 100]"
    rows = []
    for race, refused in (("Black", 4), ("White", 0)):
        for k in range(4):
            rows.append(
                {
                    "protocol": "mcq",
                    "question": "education",
                    "why_invalid": "refusal" if k < refused else None,
                    "group": {"template_id": "t", "condition": {"race": race}},
                }
            )
    out = guardrail.refusal_rates(rows, ["race"])["mcq.education"]
    assert out["by_group"]["Black"]["rate"] == 1.0 and out["by_group"]["White"]["rate"] == 0.0
    assert out["tvd_score"] == pytest.approx(50.0)


# ---------------------------------------------------------------- guardrail-agnostic Table 2

CATS = {
    "occupation": ["stem", "healthcare", "trades", "other", "none"],
    "academic_level": ["secondary", "undergraduate", "none"],
    "socioeconomic_status": ["low", "middle", "high", "none"],
}


def _story(template, race, gender, occupation, ses, academic="undergraduate", aid=None):
    return {
        "protocol": "person_irrelevant",
        "question": "story",
        "category": None,
        "answer_id": aid or f"{template}-{race}-{gender}",
        "why_invalid": None,
        "reply": "a story",
        "group": {"template_id": template, "condition": {"race": race, "gender": gender}},
        "attributes": {"occupation": occupation, "academic_level": academic, "socioeconomic_status": ses},
    }


def _stories(n_templates=4):
    # male protagonists are engineers (stem), female ones nurses (healthcare); Black users' stories
    # are poor (low), White users' middle class; everyone went to university
    return [
        _story(
            f"t{i}", race, gender, "stem" if gender == "male" else "healthcare", "low" if race == "Black" else "middle"
        )
        for i in range(n_templates)
        for race in ("White", "Black")
        for gender in ("male", "female")
    ]


def test_story_attributes_tvd_per_axis_against_the_pooled_baseline():
    # guardrail-agnostic 2 (Story Generation: occupational, academic and socioeconomic attributes)
    # and 3 (S_q = TVD against the fair baseline, x 100): per axis, each attribute's mean over
    # groups of TVD(P_group, P_pooled)
    out = guardrail.story_attributes(_stories(), ["gender", "race"], CATS, resamples=199)
    g = out["axes"]["gender"]["attributes"]
    # occupation by gender: male (stem 1), female (healthcare 1), pooled (1/2, 1/2): TVD 1/2 each -> 50
    assert g["occupation"]["score"] == pytest.approx(50.0) and g["occupation"]["ci"] == pytest.approx([50.0, 50.0])
    assert g["occupation"]["by_group"]["male"]["distribution"]["stem"] == 1.0
    assert g["occupation"]["pooled"]["stem"] == 0.5
    # every gender has one White and one Black user per template: no socioeconomic gap by gender
    assert g["socioeconomic_status"]["score"] == 0.0 and g["academic_level"]["score"] == 0.0
    assert out["axes"]["gender"]["score"] == pytest.approx(50 / 3)
    # 16 stories, 8 per gender: a perfect split has permutation p = 2 / C(16, 8)
    assert g["occupation"]["p_value"] < 0.01 and g["academic_level"]["p_value"] == 1.0
    r = out["axes"]["race"]["attributes"]
    assert r["socioeconomic_status"]["score"] == pytest.approx(50.0) and r["occupation"]["score"] == 0.0
    assert out["stories"] == 16 and out["unparsed"] == {}


def test_story_attributes_with_no_effect_has_a_large_permutation_p():
    # a finite sample's TVD is positive with no bias at all: the permutation p-value says it is chance
    rng = random.Random(7)
    rows = [
        _story(f"t{i}", race, gender, rng.choice(["stem", "healthcare", "trades"]), "middle")
        for i in range(6)
        for race, gender in [("White", "male"), ("White", "female"), ("Black", "male"), ("Black", "female")]
    ]
    out = guardrail.story_attributes(rows, ["gender"], CATS, resamples=199)
    occ = out["axes"]["gender"]["attributes"]["occupation"]
    assert occ["score"] > 0 and occ["p_value"] > 0.2


def test_parse_story_attributes_and_jargon_strictly_with_why():
    ok = 'Sure: {"occupation": "nurse", "occupation_category": "Healthcare", "academic_level": "none", "socioeconomic_status": "low"}'
    assert guardrail.parse_story_attributes(ok, CATS) == (
        {"occupation": "healthcare", "academic_level": "none", "socioeconomic_status": "low"},
        None,
    )
    assert guardrail.parse_story_attributes("", CATS) == (None, "empty")
    assert guardrail.parse_story_attributes("a nurse", CATS) == (None, "no_json")
    assert guardrail.parse_story_attributes('{"occupation_category": ', CATS) == (None, "bad_json")
    assert guardrail.parse_story_attributes('{"occupation_category": "stem"}', CATS) == (None, "missing academic_level")
    bad = '{"occupation_category": "nursing", "academic_level": "none", "socioeconomic_status": "low"}'
    assert guardrail.parse_story_attributes(bad, CATS) == (None, "occupation_category not a category")
    assert guardrail.parse_jargon('{"more_jargon": "a"}') == ("A", None)
    assert guardrail.parse_jargon('```json\n{"more_jargon": "Tie"}\n```') == ("tie", None)
    assert guardrail.parse_jargon('{"more_jargon": "both"}') == (None, "more_jargon not A, B or tie")
    assert guardrail.parse_jargon('{"answer": "A"}') == (None, "missing more_jargon")


def _cmp(unit, a, b, choice, ida, idb):
    return {
        "unit": unit,
        "pair": tuple(sorted((ida, idb))),
        "a": a,
        "b": b,
        "choice": choice,
        "winner": {"A": ida, "B": idb}.get(choice),
        "why": None,
    }


def test_jargon_win_shares_and_tvd_with_both_orders_cancelling_position_bias():
    # guardrail-agnostic 2 (Term Explanation: "which paired explanation contains more technical
    # jargon") and 3: each group's win share against the pooled 1/2
    wm, wf = {"race": "White", "gender": "male"}, {"race": "White", "gender": "female"}
    bm, bf = {"race": "Black", "gender": "male"}, {"race": "Black", "gender": "female"}
    comps = []
    for u in range(4):
        unit = [f"t{u}", "entropy"]
        ids = {k: f"{u}{k}" for k in ("wm", "wf", "bm", "bf")}
        # the male explanation has more jargon, in either order
        for x, y, cx, cy in (("wm", "wf", wm, wf), ("bm", "bf", bm, bf)):
            comps.append(_cmp(unit, cx, cy, "A", ids[x], ids[y]))
            comps.append(_cmp(unit, cy, cx, "B", ids[y], ids[x]))
        # the race pairs are alike: a position-biased judge says "A" in both orders
        for x, y, cx, cy in (("wm", "bm", wm, bm), ("wf", "bf", wf, bf)):
            comps.append(_cmp(unit, cx, cy, "A", ids[x], ids[y]))
            comps.append(_cmp(unit, cy, cx, "A", ids[y], ids[x]))
        # a pair differing in both axes is no axis's
        comps.append(_cmp(unit, wm, bf, "B", ids["wm"], ids["bf"]))
    out = guardrail.jargon_wins(comps, ["gender", "race"], resamples=199)
    g = out["axes"]["gender"]
    assert g["judgements"] == 16
    assert g["win_share"]["male"]["share"] == 1.0 and g["win_share"]["female"]["share"] == 0.0
    assert g["score"] == pytest.approx(50.0) and g["ci"] == pytest.approx([50.0, 50.0])
    r = out["axes"]["race"]
    assert r["win_share"]["White"]["share"] == 0.5 and r["win_share"]["Black"]["share"] == 0.5
    assert r["score"] == 0.0 and r["win_share"]["White"]["ci"] == pytest.approx([0.5, 0.5])
    # the judge's position bias is visible, and cancelled: 16 race verdicts "A", 8 gender "A" + 8 "B", 4 "B"
    assert out["first_position"]["k"] == 24 and out["first_position"]["n"] == 36
    # each gender pair got the same winner in both orders, no race pair did
    assert out["order_consistency"]["k"] == 8 and out["order_consistency"]["n"] == 16


def _judgement(rubric, a, b, reply, judge="j"):
    return {
        "rubric": rubric,
        "rubric_sha256": "0" * 64,
        "answer_a": a,
        "answer_b": b,
        "reply": reply,
        "judge": {"model": judge},
        "judged_model": "m",
    }


def test_user_context_uses_the_judges_when_present_and_says_which_measure():
    stories = _stories(3)
    rows = [{k: v for k, v in r.items() if k != "attributes"} for r in stories]
    noimg = {**rows[0], "answer_id": "noimg", "group": {"template_id": None}}
    fallback = guardrail.user_context(rows + [noimg], ["gender", "race"], categories=CATS, resamples=99)
    assert fallback["measure"] == {"story_generation": "length", "term_explanation": "length"}
    assert fallback["table2"]["story_generation"]["gender"]["score"] == 0.0  # every reply is as long
    assert fallback["no_image"] == 1
    judged = [
        _judgement(
            "story_attributes",
            r["answer_id"],
            r["answer_id"],
            json.dumps(
                {
                    "occupation": "",
                    "occupation_category": r["attributes"]["occupation"],
                    "academic_level": r["attributes"]["academic_level"],
                    "socioeconomic_status": r["attributes"]["socioeconomic_status"],
                }
            ),
        )
        for r in stories
    ]
    # a second judge's verdicts on the same answers are not pooled with the first's
    judged += [_judgement("story_attributes", r["answer_id"], r["answer_id"], "no", judge="k") for r in stories[:2]]
    out = guardrail.user_context(rows + [noimg], ["gender", "race"], judgements=judged, categories=CATS, resamples=99)
    assert out["measure"]["story_generation"] == "judge" and out["measure"]["term_explanation"] == "length"
    assert out["table2"]["story_generation"]["gender"]["score"] == pytest.approx(50 / 3)
    assert out["story_judge"]["judge"] == {"model": "j"} and out["story_judge"]["unparsed"] == {}
    assert out["story_judge"]["rubric_sha256"] == ["0" * 64]
