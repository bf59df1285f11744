"""The scoring side's statistics (``validation/scoring/stats.py``) against values worked by hand
or printed in textbooks, not recomputed with the code's own library calls."""

from __future__ import annotations

import math

import pytest

from counterfactory.validation.scoring.stats import (
    anova_and_d,
    binomial_p,
    jsd,
    sign_test,
    spearman,
    template_bootstrap,
    wilson,
)


def test_wilson_and_template_bootstrap_come_from_statsmodels_and_scipy():
    w = wilson(8, 10)
    assert w["ci"][0] == pytest.approx(0.4902, abs=1e-3) and w["ci"][1] == pytest.approx(0.9433, abs=1e-3)
    data = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    ci = template_bootstrap(list(data), lambda ts: sum(data[t] for t in ts) / len(ts), resamples=499)
    assert 1.0 <= ci[0] < 2.5 < ci[1] <= 4.0
    assert template_bootstrap(["a"], lambda ts: 1.0) is None


def test_an_empty_count_has_no_rate():
    assert wilson(0, 0) == {"k": 0, "n": 0, "rate": None, "ci": None}
    assert binomial_p(0, 0) is None


def test_the_exact_binomial_and_sign_tests_by_hand():
    # 9 of 10 against a fair coin: P(X >= 9) = 11/1024, two-sided twice that
    assert binomial_p(9, 10) == pytest.approx(22 / 1024)
    assert binomial_p(5, 10) == pytest.approx(1.0)
    # five shifts up, one down, two ties: the ties drop out, P = 2 * (1 + 6) / 64
    got = sign_test([0.3, 0.1, 2.0, 0.5, 1.0, -0.2, 0.0, 0.0])
    assert got["positive"] == 5 and got["negative"] == 1 and got["zero"] == 2
    assert got["p_value"] == pytest.approx(14 / 64)


def test_anova_and_cohens_d_by_hand():
    # means 3 and 1, both sample variances 2.5 (ddof 1): pooled SD sqrt(2.5), d = 2 / 1.5811;
    # F = between MS (5 * 2^2 / 2 * 2 / 1 = 10) / within MS (2.5) = 4, p of F(1, 8) = 4 is 0.0805
    out = anova_and_d([1, 2, 3, 4, 5], [-1, 0, 1, 2, 3])
    assert out["cohens_d"] == pytest.approx(2 / math.sqrt(2.5))
    assert out["F"] == pytest.approx(4.0) and out["p_value"] == pytest.approx(0.0805, abs=1e-4)
    assert anova_and_d([1.0], [2.0, 3.0]) == {"F": None, "p_value": None, "cohens_d": None}


def test_spearman_and_jsd_at_their_known_ends():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40])["rho"] == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1])["rho"] == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) == {"rho": None, "p_value": None, "n": 2}
    assert spearman([1, 2, 3], [5, 5, 5])["rho"] is None  # a constant has no rank correlation
    # disjoint distributions are ln 2 apart (natural log); identical ones 0
    assert jsd([1, 0], [0, 1]) == pytest.approx(math.log(2))
    assert jsd([0.25, 0.75], [0.25, 0.75]) == pytest.approx(0.0, abs=1e-12)
