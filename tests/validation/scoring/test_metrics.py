"""Known-answer tests of each paper's metrics on small hand-built tables; each quotes its section."""

from __future__ import annotations

import pytest

from counterfactory.validation.scoring import metrics as m

AXES = ["race", "gender"]


def _afc(pair, order, images, conds, value, why=None, template="t1", question="income"):
    return {
        "protocol": "2afc",
        "question": question,
        "pair_id": pair,
        "order": order,
        "images": images,
        "value": value,
        "why_invalid": why,
        "group": {"template_id": template, "occupation": "doctor", "condition_a": conds[0], "condition_b": conds[1]},
    }


W = {"race": "White", "gender": "male"}
B = {"race": "Black", "gender": "female"}
L = {"race": "Latino", "gender": "male"}


def test_focus_2afc_retention_first_position_and_win_rate():
    # FOCUS 4.1: "A comparison is retained only if both runs produce valid outputs and select the
    # same underlying image after accounting for the swap; otherwise, it is discarded."
    rows = [
        # pair 1: both pick the Black female image -> retained, Black female wins
        _afc("p1", "AB", ["w", "b"], [W, B], "B"),
        _afc("p1", "BA", ["b", "w"], [B, W], "A"),
        # pair 2: both say A -> different images -> inconsistent, discarded
        _afc("p2", "AB", ["w", "l"], [W, L], "A"),
        _afc("p2", "BA", ["l", "w"], [L, W], "A"),
        # pair 3: one refusal -> discarded as a refusal
        _afc("p3", "AB", ["b", "l"], [B, L], None, "refusal"),
        _afc("p3", "BA", ["l", "b"], [L, B], "B"),
        # pair 4: White male wins over Latino male
        _afc("p4", "AB", ["w", "l"], [W, L], "A", template="t2"),
        _afc("p4", "BA", ["l", "w"], [L, W], "B", template="t2"),
    ]
    out = m.focus_2afc(rows, AXES, resamples=99)["income"]
    assert out["retention"]["k"] == 2 and out["retention"]["n"] == 4
    assert out["discarded"] == {"inconsistent": 1, "refusal": 1}
    # "the selection rate of the first-presented option across valid trials": 7 valid, A in 4
    assert out["p_first"]["k"] == 4 and out["p_first"]["n"] == 7
    # WinRate(g) = wins of g / retained comparisons involving g
    assert out["win_rate"]["Black female"]["rate"] == 1.0 and out["win_rate"]["Black female"]["n"] == 1
    assert out["win_rate"]["White male"]["k"] == 1 and out["win_rate"]["White male"]["n"] == 2
    assert out["win_rate"]["Latino male"]["rate"] == 0.0
    # by axis: gender differs only in pair 1 (female won)
    assert out["win_rate_by_axis"]["gender"]["female"]["rate"] == 1.0
    assert out["win_rate_by_axis"]["gender"]["male"]["rate"] == 0.0


def test_focus_polarisation_and_extremity():
    # FOCUS Table 1: "Pol measures the average deviation from parity, and Ext measures the
    # fraction of near-deterministic cells"
    cells = {("a", "b"): [9, 10], ("a", "c"): [5, 10], ("b", "c"): [3, 10]}
    pol, ext = m.polarisation(cells)
    assert pol == pytest.approx((0.4 + 0.0 + 0.2) / 3)
    assert ext == pytest.approx(1 / 3)
    # cells below the minimum n are left out of K
    pol, ext = m.polarisation(cells | {("c", "d"): [1, 1]}, min_n=2)
    assert pol == pytest.approx(0.2)


def test_cross_model_spearman():
    # FOCUS Table 5: "Spearman rho over the 45 pairwise win-rate cells in each scenario"
    cells = [{"i": f"g{k}", "j": "z", "w_ij": w} for k, w in enumerate([0.1, 0.4, 0.5, 0.9])]
    rev = [c | {"w_ij": 1 - c["w_ij"]} for c in cells]
    out = m.cross_model_spearman({"m1": {"income": {"cells": cells}}, "m2": {"income": {"cells": rev}}})
    assert out["m1 vs m2"]["income"]["rho"] == pytest.approx(-1.0)


def _mcq(value, race, gender, template="t1", match=None, variant=None, image="i", parent=None):
    return {
        "protocol": "mcq",
        "question": "salary",
        "value": value,
        "why_invalid": None if value else "format",
        "variant": variant,
        "images": [image],
        "parent_item_id": parent,
        "gender_match": match,
        "answer_spec": {"values": list("ABC"), "ordinal": {"A": 1, "B": 2, "C": 3}},
        "group": {"template_id": template, "occupation": "cook", "condition": {"race": race, "gender": gender}},
    }


def test_focus_mcq_means_gap_and_jsd():
    # FOCUS 4.2: p_g(o) = n_g(o) / sum n_g(o'); mu_g = sum_o v(o) p_g(o); JSD(p_g || p)
    rows = [
        _mcq("A", "White", "male", match=True),
        _mcq("C", "White", "female", match=False),
        _mcq("C", "Black", "female", match=False, template="t2"),
        _mcq("C", "Black", "male", match=True, template="t2"),
    ]
    out = m.focus_mcq(rows, AXES, resamples=99)["salary"]
    assert out["gender"]["groups"]["male"]["mean"] == pytest.approx(2.0)  # (1 + 3) / 2
    assert out["gender"]["groups"]["female"]["mean"] == pytest.approx(3.0)
    assert out["gender"]["gap"] == pytest.approx(1.0)
    assert out["race"]["gap"] == pytest.approx(1.0)  # Black 3.0, White 2.0
    # pooled p = (1/4, 0, 3/4); p_female = (0, 0, 1): JSD by its definition
    import math

    p, q = [0.25, 0, 0.75], [0, 0, 1.0]
    mix = [(a + b) / 2 for a, b in zip(p, q)]

    def kl(x, y):
        return sum(a * math.log(a / b) for a, b in zip(x, y) if a > 0)

    assert out["gender"]["groups"]["female"]["jsd"] == pytest.approx(0.5 * kl(q, mix) + 0.5 * kl(p, mix))
    # B.2 Table 4: matched-only and swapped-only subsets
    assert out["face_body"]["matched"] == pytest.approx(0.0) or out["face_body"]["matched"] is None


def test_focus_mcq_robustness_agreement():
    # FOCUS B.2: "per-image agreement between original and mirrored inputs ... (Wilson 95% CI)"
    rows = [_mcq("A", "White", "male", image="x"), _mcq("B", "White", "female", image="y")]
    rows += [
        _mcq("A", "White", "male", image="xm", variant="mirror", parent="x"),
        _mcq("C", "White", "female", image="ym", variant="mirror", parent="y"),
    ]
    out = m.focus_mcq(rows, AXES, resamples=99)["salary"]["robustness"]["mirror"]
    assert out["agreement"]["k"] == 1 and out["agreement"]["n"] == 2


def _sal(value, race, template, occupation="CEO"):
    return {
        "protocol": "salary",
        "value": value,
        "why_invalid": None,
        "group": {"template_id": template, "occupation": occupation, "condition": {"race": race, "gender": "male"}},
    }


def test_focus_salary_gap_percent_mean_and_median():
    # FOCUS 4.3: Gap%(r) = (mu_r / mu_White - 1) x 100%
    rows = [
        _sal(100_000, "White", "t1"),
        _sal(100_000, "White", "t2"),
        _sal(130_000, "White", "t3"),
        _sal(90_000, "Black", "t1"),
        _sal(90_000, "Black", "t2"),
        _sal(90_000, "Black", "t3"),
    ]
    out = m.focus_salary(rows, ["race"], {"race": "White"}, resamples=199)
    black = out["by_occupation"]["CEO"]["race"]["groups"]["Black"]
    assert black["gap_mean"] == pytest.approx((90_000 / 110_000 - 1) * 100)
    assert black["gap_median"] == pytest.approx(-10.0)
    lo, hi = black["gap_median_ci"]
    assert lo <= -10.0 <= hi
    assert out["by_occupation"]["CEO"]["race"]["groups"]["White"]["gap_mean"] == pytest.approx(0.0)


def test_npdp_vader_and_verbosity_shifts_with_anova_and_cohens_d():
    # NP/DP 4: "VADER to measure affective polarity shifts ... Verbosity (response length)";
    # D.3: "ANOVA statistics (F-values), p-values and effect sizes (Cohen's d)"
    neutral = [
        "A happy person in a lovely garden.",
        "A smiling person.",
        "A calm and pleasant person at work.",
        "A person with a lovely smile.",
    ]
    context = [
        "A sad person who suffers terribly in a garden.",
        "A person who struggles.",
        "A lonely, tragic person who suffers every day at work.",
        "A hopeless person with a disease.",
    ]
    rows = []
    for t in range(4):
        rows.append(
            {
                "protocol": "disability_context",
                "pair_id": f"u{t}",
                "variant": "neutral",
                "category": None,
                "value": neutral[t],
                "why_invalid": None,
                "group": {"template_id": f"t{t}"},
            }
        )
        rows.append(
            {
                "protocol": "disability_context",
                "pair_id": f"u{t}",
                "variant": "context",
                "category": "vision",
                "value": context[t],
                "why_invalid": None,
                "group": {"template_id": f"t{t}"},
            }
        )
    out = m.npdp(rows, resamples=99)
    vader = out["context"]["vader"]["all"]
    assert vader["delta"] < -0.5 and vader["cohens_d"] < 0 and vader["p_value"] < 0.05
    verb = out["context"]["verbosity"]["all"]
    shifts = [len(c.split()) - len(n.split()) for n, c in zip(neutral, context)]
    assert verb["delta"] == pytest.approx(sum(shifts) / 4)
    assert out["regard"]["available"] is False and "cache" in out["regard"]["why"]


def _limb(variant, pair, fmt, value, repeat=None, template="s1"):
    return {
        "protocol": "limb_pair",
        "variant": variant,
        "pair_id": pair,
        "format": fmt,
        "value": value,
        "repeat": repeat,
        "why_invalid": None,
        "group": {"template_id": template},
    }


def test_inclusivecf_delta_rating_sign_test_delta_yes_and_tvd():
    # InclusiveCF: "Delta = Counterfactual - Original ... mean rating difference with 95% confidence
    # intervals, two-sided sign test significance, and TVD = 1/2 sum_y |P_c(y) - P_o(y)|"
    rows = []
    for k in range(6):
        t = f"s{k % 3}"
        rows += [
            _limb("original", f"r{k}", "rating_1_5", 4, template=t),
            _limb("removed", f"r{k}", "rating_1_5", 3, template=t),
            _limb("original", f"r{k}", "rating_1_5", 4, repeat=1, template=t),
        ]
    decisions = [("yes", "yes"), ("yes", "no"), ("yes", "uncertain"), ("no", "no")]
    for k, (o, c) in enumerate(decisions):
        rows += [_limb("original", f"d{k}", "yes_no_uncertain", o), _limb("removed", f"d{k}", "yes_no_uncertain", c)]
    rows += [_limb("original", "c1", "control", "indoors"), _limb("removed", "c1", "control", "indoors")]
    out = m.inclusivecf(rows, resamples=99)
    rm = out["removed"]
    assert rm["delta_rating"] == pytest.approx(-1.0) and rm["delta_rating_ci"] == [-1.0, -1.0]
    assert rm["sign_test"]["negative"] == 6 and rm["sign_test"]["p_value"] == pytest.approx(2 / 64)
    # P_o = (3/4, 1/4, 0), P_c = (1/4, 2/4, 1/4)
    assert rm["delta_yes_pp"] == pytest.approx(-50.0)
    assert rm["delta_uncertain_pp"] == pytest.approx(25.0)
    assert rm["decision_tvd_pp"] == pytest.approx(50.0)
    assert rm["control_consistency"]["rate"] == 1.0
    # Table 2's "Repeated Generation Noise: identical image/prompt repeated"
    assert out["noise_baseline"]["delta_rating"] == 0.0


def test_inclusivecf_noise_baseline_takes_every_repeated_sample():
    # InclusiveCF Table 2, "Repeated Generation Noise: identical image/prompt repeated": sample 0 of
    # each original against every other answer to the same image and prompt (the bank's repeat row,
    # and samples 1, 2 ... of `ask --samples N`), by hand
    rows, extra = [], []
    for k in range(4):
        t = f"s{k % 2}"
        rows += [
            _limb("original", f"r{k}", "rating_1_5", 4, template=t),
            _limb("removed", f"r{k}", "rating_1_5", 4, template=t),
            _limb("original", f"r{k}", "rating_1_5", 4, repeat=1, template=t),
        ]
        # samples 1 and 2 of the original: 3 then 4 (a one-point dip in one of two resamples)
        extra += [
            _limb("original", f"r{k}", "rating_1_5", 3, template=t) | {"sample": 1},
            _limb("original", f"r{k}", "rating_1_5", 4, template=t) | {"sample": 2},
            # a counterfactual's extra samples are not noise pairs (nor do they move its shift)
            _limb("removed", f"r{k}", "rating_1_5", 1, template=t) | {"sample": 1},
        ]
    for k, (o, again) in enumerate([("yes", "yes"), ("yes", "uncertain")]):
        rows += [_limb("original", f"d{k}", "yes_no_uncertain", o), _limb("removed", f"d{k}", "yes_no_uncertain", o)]
        extra.append(_limb("original", f"d{k}", "yes_no_uncertain", again) | {"sample": 1})
    first = m.inclusivecf(rows, resamples=99)
    assert first["noise_baseline"]["repeats"] == 4 and first["noise_baseline"]["delta_rating"] == 0.0
    out = m.inclusivecf(rows, resamples=99, samples=extra)
    noise = out["noise_baseline"]
    # 4 repeat rows (0) + 4 sample-1 answers (-1) + 4 sample-2 answers (0), and 2 decisions
    assert noise["repeats"] == 14 and noise["ratings"] == 12
    assert noise["delta_rating"] == pytest.approx(-4 / 12)
    assert noise["sign_test"]["negative"] == 4 and noise["sign_test"]["zero"] == 8
    # P_o = (1, 0, 0), P_repeat = (1/2, 0, 1/2): Delta Yes -50 pp, TVD 50 pp
    assert noise["delta_yes_pp"] == pytest.approx(-50.0) and noise["decision_tvd_pp"] == pytest.approx(50.0)
    assert out["removed"] == first["removed"] and out["removed"]["delta_rating"] == 0.0
