"""Editors compared: per editor and condition group, what the gates found, with intervals.

A spec with ``editors:`` runs the same grid once per editor; every release row carries the
label of the editor that filled it (``editor_name``). This module turns those rows into
``stats.json``'s ``editors`` section and the report's "Editors compared" table: per editor and
group (the design's full condition, e.g. ``race=Black|gender=female``, and ``all``) the pass
rate with its Wilson 95 % interval (Wilson 1927), the reasons that failed, the mean identity
cosine, the mean face ITA° change and the share lightened beyond the skin gate's tolerance,
the expression-drift share, and each editor's noise floor; and per pair of editors and group
the difference in pass rate with a two-sided test: the pooled two-proportion z test, or
Fisher's exact test where an expected count is under 5 (Agresti, *Categorical Data
Analysis*, 3rd ed., sections 1.4 and 3.5).

Pure functions of release rows; no I/O.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any

from counterfactory.manifests.vocabulary import ACCEPTED
from counterfactory.validation.attrition import wilson_interval

#: the group of every row of an editor
ALL = "all"
#: an expected cell count below this sends the comparison to Fisher's exact test
MIN_EXPECTED = 5.0


def _group_key(condition: Mapping[str, str]) -> str:
    return "|".join(f"{k}={v}" for k, v in condition.items())


def proportion(k: int, n: int) -> dict[str, Any]:
    """``{n, k, rate, ci_low, ci_high}``: ``k`` of ``n`` with its Wilson 95 % interval
    (``rate`` None when ``n`` is 0, and the interval then ``[0, 1]``)."""
    low, high = wilson_interval(k, n)
    return {"n": n, "k": k, "rate": k / n if n else None, "ci_low": low, "ci_high": high}


def compare_proportions(k1: int, n1: int, k2: int, n2: int) -> dict[str, Any]:
    """Two-sided test of ``k1/n1`` against ``k2/n2``.

    Returns:
        ``{"diff": k1/n1 - k2/n2, "test": "z" | "fisher" | None, "z": float | None,
        "p_value": float | None}``. The pooled two-proportion z test
        (``statsmodels.stats.proportion.proportions_ztest``: ``z = (p1 - p2) / sqrt(p (1 - p)
        (1/n1 + 1/n2))``, ``p = (k1 + k2) / (n1 + n2)``) when every expected count of the 2 x 2
        table is at least :data:`MIN_EXPECTED`, else Fisher's exact test (:func:`fisher_exact_p`).
        Nothing to test (an empty side) gives None; equal all-pass or all-fail sides give
        ``p_value`` 1.
    """
    if n1 == 0 or n2 == 0:
        return {"diff": None, "test": None, "z": None, "p_value": None}
    diff = k1 / n1 - k2 / n2
    pooled = (k1 + k2) / (n1 + n2)
    expected = [n * share for n in (n1, n2) for share in (pooled, 1 - pooled)]
    if min(expected) >= MIN_EXPECTED:
        from statsmodels.stats.proportion import proportions_ztest

        z, p = proportions_ztest([k1, k2], [n1, n2], value=0, alternative="two-sided", prop_var=False)
        return {"diff": diff, "test": "z", "z": float(z), "p_value": float(p)}
    return {"diff": diff, "test": "fisher", "z": None, "p_value": fisher_exact_p(k1, n1, k2, n2)}


def fisher_exact_p(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p-value of Fisher's exact test on the 2 x 2 table ``[[k1, n1 - k1], [k2, n2 - k2]]``
    (``scipy.stats.fisher_exact``: with the margins fixed ``k1`` is hypergeometric, and the
    p-value sums the probabilities of every table no more likely than the one observed, as R's
    ``fisher.test`` does). Fisher's tea tasting table ``[[3, 1], [1, 3]]`` gives 17/35 = 0.486.
    """
    from scipy.stats import fisher_exact

    return min(1.0, float(fisher_exact([[k1, n1 - k1], [k2, n2 - k2]], alternative="two-sided").pvalue))


def _metric(row: Mapping[str, Any], gate: str, name: str) -> Any:
    return (((row.get("gates") or {}).get(gate) or {}).get("metrics") or {}).get(name)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _group_stats(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    accepted = sum(r["status"] == ACCEPTED for r in rows)
    reasons = Counter(
        str(code).split(":")[0] for r in rows if r["status"] != ACCEPTED for code in r.get("reasons") or ()
    )
    cosines = [float(v) for r in rows if isinstance(v := _metric(r, "identity", "cosine"), int | float)]
    changes = [float(v) for r in rows if isinstance(v := _metric(r, "skin", "face_ita_change_deg"), int | float)]
    lightened = [bool(v) for r in rows if (v := _metric(r, "skin", "lightened")) is not None]
    labelled = [bool(e["consistent"]) for r in rows if (e := r.get("expression")) and e.get("consistent") is not None]
    return {
        "n": len(rows),
        "accepted": accepted,
        "pass_rate": proportion(accepted, len(rows)),
        "reasons": dict(reasons.most_common()),
        "identity_cosine_mean": _mean(cosines),
        "face_ita_change_deg_mean": _mean(changes),
        "lightened": proportion(sum(lightened), len(lightened)),
        "expression_drift": proportion(sum(not c for c in labelled), len(labelled)),
    }


def _floor_summary(floor: Mapping[str, Any]) -> dict[str, Any]:
    """Per editor: how many templates have a floor, and each floor metric's mean over them."""
    values: dict[str, list[float]] = {}
    for entry in floor.values():
        for name, v in (entry.get("metrics") or {}).items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                values.setdefault(name, []).append(float(v))
    return {"templates": len(floor), "means": {name: _mean(v) for name, v in sorted(values.items())}}


def editor_stats(
    items: Sequence[Mapping[str, Any]], *, floors: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """``stats.json``'s ``editors`` section from release rows (``items.jsonl``: every cell).

    Args:
        items: rows with ``editor_name``, ``condition``, ``status``, ``reasons``, ``gates``
            and ``expression``.
        floors: per editor label, its noise floor per template (``{template_id: {metrics}}``).

    Returns:
        ``{"names": [...], "groups": [...], "by_editor": {name: {"groups": {group: {n,
        accepted, pass_rate, reasons, identity_cosine_mean, face_ita_change_deg_mean,
        lightened, expression_drift}}, "noise_floor": {templates, means}}},
        "comparisons": [{"a", "b", "group", "rate_a", "rate_b", "diff", "test", "z",
        "p_value"}]}``; each proportion is ``{n, k, rate, ci_low, ci_high}`` (Wilson 95 %).
    """
    floors = floors or {}
    by_name: dict[str, list[Mapping[str, Any]]] = {}
    for row in items:
        by_name.setdefault(str(row.get("editor_name")), []).append(row)
    groups = [ALL, *dict.fromkeys(_group_key(r["condition"]) for r in items)]
    by_editor: dict[str, Any] = {}
    for name, rows in by_name.items():
        split: dict[str, list[Mapping[str, Any]]] = {ALL: list(rows)}
        for r in rows:
            split.setdefault(_group_key(r["condition"]), []).append(r)
        by_editor[name] = {
            "groups": {g: _group_stats(split[g]) for g in groups if g in split},
            "noise_floor": _floor_summary(floors.get(name) or {}),
        }
    comparisons = []
    for a, b in combinations(by_editor, 2):
        for g in groups:
            ga, gb = by_editor[a]["groups"].get(g), by_editor[b]["groups"].get(g)
            if ga is None or gb is None:
                continue
            test = compare_proportions(ga["accepted"], ga["n"], gb["accepted"], gb["n"])
            comparisons.append(
                {"a": a, "b": b, "group": g, "rate_a": ga["pass_rate"]["rate"], "rate_b": gb["pass_rate"]["rate"]}
                | test
            )
    return {"names": list(by_editor), "groups": groups, "by_editor": by_editor, "comparisons": comparisons}


def _num(value: Any, fmt: str = ".3g") -> str:
    return format(value, fmt) if isinstance(value, int | float) else "-"


def _share(p: Mapping[str, Any]) -> str:
    if not p.get("n"):
        return "-"
    return f"{p['k']}/{p['n']} ({p['rate']:.0%}, {p['ci_low']:.0%}-{p['ci_high']:.0%})"


def editors_html(section: Mapping[str, Any] | None) -> str:
    """The report's "Editors compared" section (empty with fewer than two editors)."""
    if not section or len(section.get("names") or ()) < 2:
        return ""
    head = (
        "<tr><th>group</th><th>editor</th><th>n</th><th>pass rate (Wilson 95 %)</th><th>failed for</th>"
        "<th>identity cosine (mean)</th><th>face ITA° change (mean)</th><th>lightened beyond tolerance</th>"
        "<th>expression drift</th></tr>"
    )
    body = []
    for g in section["groups"]:
        for name in section["names"]:
            s = section["by_editor"][name]["groups"].get(g)
            if s is None:
                continue
            reasons = ", ".join(f"{html.escape(code)} {n}" for code, n in s["reasons"].items()) or "-"
            body.append(
                f"<tr><td>{html.escape(g)}</td><td>{html.escape(name)}</td><td>{s['n']}</td>"
                f"<td>{_share(s['pass_rate'])}</td><td>{reasons}</td><td>{_num(s['identity_cosine_mean'], '.4f')}</td>"
                f"<td>{_num(s['face_ita_change_deg_mean'], '.2f')}</td><td>{_share(s['lightened'])}</td>"
                f"<td>{_share(s['expression_drift'])}</td></tr>"
            )
    tests = "".join(
        f"<tr><td>{html.escape(c['group'])}</td><td>{html.escape(c['a'])} - {html.escape(c['b'])}</td>"
        f"<td>{_num(c['diff'], '+.2f')}</td><td>{c['test'] or '-'}</td><td>{_num(c['p_value'], '.3g')}</td></tr>"
        for c in section["comparisons"]
    )
    floor_rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{e['noise_floor']['templates']}</td><td>"
        + (", ".join(f"{html.escape(k)} {_num(v)}" for k, v in e["noise_floor"]["means"].items()) or "-")
        + "</td></tr>"
        for name, e in section["by_editor"].items()
    )
    return f"""<h2>Editors compared</h2>
<p>The same grid, once per editor. Per condition group, each editor's pass rate with its Wilson 95 %
interval and what failed, then the difference in pass rate between two editors with a two-sided test
(z: pooled two-proportion z test; fisher: Fisher's exact test, used where an expected count is under 5).
A p-value is per row, not corrected for the number of rows.</p>
<table id="editors-compared">{head}{"".join(body)}</table>
<table id="editors-tests"><tr><th>group</th><th>editors (a - b)</th><th>pass-rate difference</th><th>test</th>
<th>p-value</th></tr>{tests}</table>
<table id="editors-noise-floor"><tr><th>editor</th><th>templates with a noise floor</th><th>mean floor</th></tr>
{floor_rows}</table>
"""
