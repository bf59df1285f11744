"""Review statistics: Cohen's kappa, against a textbook table and against statsmodels to the bit."""

from __future__ import annotations

import numpy as np
import pytest

from counterfactory.validation.review_stats import cohens_kappa


def _pairs(table: list[list[int]], labels: list[str]) -> list[tuple[str, str]]:
    return [(labels[i], labels[j]) for i, row in enumerate(table) for j, n in enumerate(row) for _ in range(n)]


def test_kappa_of_a_textbook_table():
    # 50 items, two raters: 20 both yes, 15 both no, 5 and 10 apart: p_o 0.7, p_e 0.5, kappa 0.4
    assert cohens_kappa(_pairs([[20, 5], [10, 15]], ["yes", "no"])) == pytest.approx(0.4, abs=1e-12)
    assert cohens_kappa([]) is None and cohens_kappa([("a", "a")] * 3) == 1.0


def test_kappa_is_statsmodels_to_the_last_bit():
    from statsmodels.stats.inter_rater import cohens_kappa as theirs

    rng = np.random.default_rng(0)
    for _ in range(300):
        k = int(rng.integers(2, 5))
        labels = [f"l{i}" for i in range(k)]
        pairs = [(labels[a], labels[b]) for a, b in rng.integers(0, k, (int(rng.integers(2, 60)), 2))]
        seen: dict[str, int] = {}
        for a, b in pairs:
            seen.setdefault(a, len(seen))
            seen.setdefault(b, len(seen))
        if len(seen) == 1:
            continue
        table = np.zeros((len(seen), len(seen)), np.int64)
        for a, b in pairs:
            table[seen[a], seen[b]] += 1
        expected = float(theirs(table, return_results=False))
        got = cohens_kappa(pairs)
        assert got == expected or (np.isnan(expected) and np.isnan(got)), (pairs, got, expected)
