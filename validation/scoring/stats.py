"""Intervals and tests for ``score``, from scipy and statsmodels (none hand-written but the Wilson
interval, statsmodels' own formula written out to the bit).

- :func:`wilson`: a rate's Wilson 95 % interval (``statsmodels.stats.proportion.proportion_confint``,
  as :func:`counterfactory.validation.attrition.wilson_bounds`);
- :func:`template_bootstrap`: a statistic's percentile interval by resampling templates, the unit
  that was edited, within strata (``scipy.stats.bootstrap``, one sample per stratum: FOCUS 5
  "stratified template-cluster bootstrap confidence intervals");
- :func:`sign_test`: the two-sided sign test (``scipy.stats.binomtest`` on the non-zero shifts;
  InclusiveCF "two-sided sign test significance");
- :func:`permutation_p`: a statistic's one-sided p-value under exchangeable group labels
  (``scipy.stats.permutation_test``, ``permutation_type="independent"``);
- :func:`anova_and_d`: one-way ANOVA (``scipy.stats.f_oneway``) and Cohen's d of two samples
  (NP/DP D.3 "ANOVA statistics (F-values), p-values and effect sizes (Cohen's d)").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def wilson(k: int, n: int, confidence: float = 0.95) -> dict[str, Any]:
    """``{"k", "n", "rate", "ci": [low, high]}`` (``rate`` and ``ci`` None when ``n`` is 0)."""
    if n == 0:
        return {"k": 0, "n": 0, "rate": None, "ci": None}
    from counterfactory.validation.attrition import wilson_bounds

    low, high = wilson_bounds(k, n, alpha=1 - confidence)
    return {"k": int(k), "n": int(n), "rate": k / n, "ci": [low, high]}


def binomial_p(k: int, n: int, p: float = 0.5) -> float | None:
    """Two-sided exact binomial test of ``k`` of ``n`` against ``p`` (``scipy.stats.binomtest``)."""
    if n == 0:
        return None
    from scipy.stats import binomtest

    return float(binomtest(k, n, p).pvalue)


def template_bootstrap(
    units: Sequence[Any],
    statistic: Callable[[list[Any]], float | None],
    *,
    strata: Sequence[Any] | None = None,
    resamples: int = 999,
    confidence: float = 0.95,
    seed: int = 0,
) -> list[float] | None:
    """A percentile interval for ``statistic(units)`` by resampling ``units`` (template ids) with
    replacement within each stratum (``scipy.stats.bootstrap`` with one sample per stratum, so
    every resample keeps each stratum's size). Strata of one template cannot be resampled on
    their own: then all templates are one stratum. None with fewer than 2 templates, or when the
    statistic is undefined on the data."""
    units = list(units)
    if len(units) < 2 or statistic(units) is None:
        return None
    from scipy.stats import bootstrap

    groups: dict[Any, list[int]] = {}
    for i, s in enumerate(strata if strata is not None else [0] * len(units)):
        groups.setdefault(s, []).append(i)
    samples = [np.array(idx) for idx in groups.values()]
    if any(len(s) < 2 for s in samples):
        samples = [np.arange(len(units))]

    def stat(*resampled: np.ndarray) -> float:
        chosen = [units[int(i)] for r in resampled for i in r]
        value = statistic(chosen)
        return float("nan") if value is None else float(value)

    import warnings

    with warnings.catch_warnings():
        # every resample giving one value (an exact effect) is a zero-width interval, not a problem
        warnings.simplefilter("ignore")
        res = bootstrap(
            tuple(samples),
            stat,
            n_resamples=resamples,
            confidence_level=confidence,
            method="percentile",
            vectorized=False,
            paired=False,
            random_state=np.random.default_rng(seed),
        )
    low, high = res.confidence_interval
    if math.isnan(low) or math.isnan(high):
        return None
    return [float(low), float(high)]


def permutation_p(
    samples: Sequence[Sequence[Any]],
    statistic: Callable[..., float | None],
    *,
    resamples: int = 999,
    seed: int = 0,
) -> float | None:
    """The p-value of ``statistic(*samples)`` (larger is more extreme) when the observations are
    exchangeable between the samples (groups): ``scipy.stats.permutation_test`` with
    ``permutation_type="independent"``, ``alternative="greater"`` (exact when the partitions
    number fewer than ``resamples``). None with fewer than two non-empty samples or an undefined
    statistic."""
    arrays = [np.asarray(list(s)) for s in samples if len(s)]
    if len(arrays) < 2 or statistic(*arrays) is None:
        return None
    import warnings

    from scipy.stats import permutation_test

    def stat(*resampled: np.ndarray) -> float:
        value = statistic(*resampled)
        return float("nan") if value is None else float(value)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = permutation_test(
            tuple(arrays),
            stat,
            permutation_type="independent",
            vectorized=False,
            n_resamples=resamples,
            alternative="greater",
            random_state=np.random.default_rng(seed),
        )
    return None if math.isnan(res.pvalue) else float(res.pvalue)


def sign_test(diffs: Sequence[float]) -> dict[str, Any]:
    """``{"positive", "negative", "zero", "p_value"}``: the two-sided sign test of paired shifts."""
    pos = sum(1 for d in diffs if d > 0)
    neg = sum(1 for d in diffs if d < 0)
    return {"positive": pos, "negative": neg, "zero": len(diffs) - pos - neg, "p_value": binomial_p(pos, pos + neg)}


def anova_and_d(context: Sequence[float], neutral: Sequence[float]) -> dict[str, Any]:
    """One-way ANOVA of the two samples and Cohen's d (context minus neutral, pooled SD)."""
    a, b = np.asarray(context, dtype=float), np.asarray(neutral, dtype=float)
    if len(a) < 2 or len(b) < 2:
        return {"F": None, "p_value": None, "cohens_d": None}
    from scipy.stats import f_oneway

    res = f_oneway(a, b)
    pooled = math.sqrt(((len(a) - 1) * a.var(ddof=1) + (len(b) - 1) * b.var(ddof=1)) / (len(a) + len(b) - 2))
    d = None if pooled == 0 else float((a.mean() - b.mean()) / pooled)
    f = None if math.isnan(res.statistic) else float(res.statistic)
    p = None if math.isnan(res.pvalue) else float(res.pvalue)
    return {"F": f, "p_value": p, "cohens_d": d}


def spearman(x: Sequence[float], y: Sequence[float]) -> dict[str, Any]:
    """Spearman's rho and its p-value (``scipy.stats.spearmanr``); None with fewer than 3 pairs."""
    if len(x) < 3:
        return {"rho": None, "p_value": None, "n": len(x)}
    import warnings

    from scipy.stats import spearmanr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant input has no rho: reported as None
        res = spearmanr(x, y)
    rho = None if math.isnan(res.statistic) else float(res.statistic)
    return {"rho": rho, "p_value": None if rho is None else float(res.pvalue), "n": len(x)}


def jsd(p: Sequence[float], q: Sequence[float]) -> float:
    """Jensen-Shannon divergence (natural log) of two distributions over the same options
    (``scipy.spatial.distance.jensenshannon`` returns its square root)."""
    from scipy.spatial.distance import jensenshannon

    return float(jensenshannon(np.asarray(p, dtype=float), np.asarray(q, dtype=float)) ** 2)
