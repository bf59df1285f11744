"""Differential attrition: how often each gate passes, per condition group, with intervals.

Editors are known to treat groups differently (lightening skin more for some than for
others); a gate that rejects one group far more often than another changes who is in the
study. :func:`attrition_table` counts, for every gate and for overall acceptance, the pass
rate of every group (each condition axis alone, and the cross of all axes when a condition
has two or more) with a Wilson score interval; :func:`plot_attrition` draws it.

Reference: E. B. Wilson, "Probable inference, the law of succession, and statistical
inference", JASA 22 (1927) 209-212; R. G. Newcombe, "Two-sided confidence intervals for the
single proportion: comparison of seven methods", Statistics in Medicine 17 (1998) 857-872.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from counterfactory.manifests.vocabulary import ACCEPTED

#: Two-sided 95 % normal quantile.
Z95 = 1.959963984540054
OVERALL = "overall"


def wilson_interval(passed: int, n: int, *, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval ``(low, high)`` for ``passed`` successes in ``n`` trials at the
    two-sided level whose normal quantile is ``z`` (:func:`wilson_bounds`).

    Unlike the Wald interval it stays inside [0, 1] and is not degenerate at 0 or n
    successes. ``n == 0`` gives ``(0.0, 1.0)`` (nothing is known).
    """
    if n < 0 or passed < 0 or passed > n:
        raise ValueError(f"need 0 <= passed <= n, got passed={passed}, n={n}")
    if n == 0:
        return 0.0, 1.0
    low, high = wilson_bounds(passed, n, alpha=math.erfc(z / math.sqrt(2)))  # two-sided tail mass beyond +-z
    # at 0 or n successes the bound is exactly 0 or 1; say so rather than 1 - 1e-16
    low = 0.0 if passed == 0 else low
    high = 1.0 if passed == n else high
    return low, high


def wilson_bounds(k: int, n: int, *, alpha: float) -> tuple[float, float]:
    """statsmodels' ``proportion_confint(k, n, alpha, method="wilson")``, operation for operation
    (its quantile from ``scipy.special.ndtri``, as ``scipy.stats.norm.isf`` takes it), so equal to
    the last bit (``tests/validation/test_attrition.py`` checks 6,000 cases against statsmodels;
    400,000 agreed when it was written). Written out because importing
    ``statsmodels.stats.proportion`` (pandas, scipy.stats) cost every command that writes or
    verifies a release 1.5 s; ``n`` must be >= 1."""
    from scipy.special import ndtri

    crit = float(-ndtri(alpha / 2.0))
    nobs = float(n)
    q = k / nobs
    crit2 = crit**2
    denom = 1 + crit2 / nobs
    center = (q + crit2 / (2 * nobs)) / denom
    dist = crit * math.sqrt(q * (1.0 - q) / nobs + crit2 / (4.0 * nobs**2))
    dist /= denom
    return min(max(center - dist, 0.0), 1.0), min(max(center + dist, 0.0), 1.0)


def _rate(passed: int, n: int) -> dict[str, Any]:
    low, high = wilson_interval(passed, n)
    return {"n": n, "passed": passed, "rate": (passed / n) if n else None, "ci_low": low, "ci_high": high}


def _label(group: Mapping[str, str]) -> str:
    return " x ".join(f"{k}={v}" for k, v in group.items())


def attrition_table(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Pass rates per condition group for every gate and for overall acceptance.

    Args:
        rows: one per candidate: ``{"condition": {"race": "Black", "gender": "female"}`` (or
            ``{"cue": "removed"}``), ``"verdict": "accepted" | "rejected" | "needs_review" |
            "failed"``, ``"gates": {"face": True, "identity": False, ...}}``. A gate missing
            from a row did not run on it and is not counted for that gate.

    Returns:
        JSON-serialisable ``{"method", "confidence", "z", "rows", "axes", "gates",
        "all": {gate: rate}, "groups": [{"axis", "group", "label", "n", "gates": {gate:
        rate}}], "disparity": [{"gate", "axis", "min_rate", "max_rate", "gap", "lowest",
        "highest", "separated"}]}`` where a rate is ``{"n", "passed", "rate", "ci_low",
        "ci_high"}``; ``overall`` counts ``verdict == "accepted"``; ``axis`` is the axis name,
        or the axes joined by ``" x "`` for a cross; ``separated`` says the lowest and
        highest groups' intervals do not overlap.
    """
    rows = list(rows)
    axes: list[str] = []
    gates: list[str] = []
    for row in rows:
        for axis in row.get("condition", {}):
            if axis not in axes:
                axes.append(axis)
        for gate in row.get("gates", {}):
            if gate not in gates:
                gates.append(gate)
    all_gates = gates + [OVERALL]

    # counts[(axis_key, group_items)][gate] = [passed, n]
    counts: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, list[int]]] = {}
    totals: dict[str, list[int]] = {g: [0, 0] for g in all_gates}

    def add(key, row_gates: Mapping[str, bool], accepted: bool) -> None:
        slot = counts.setdefault(key, {g: [0, 0] for g in all_gates})
        for g, ok in row_gates.items():
            slot[g][0] += bool(ok)
            slot[g][1] += 1
        slot[OVERALL][0] += accepted
        slot[OVERALL][1] += 1

    for row in rows:
        condition = {str(k): str(v) for k, v in row.get("condition", {}).items()}
        row_gates = {g: bool(v) for g, v in row.get("gates", {}).items() if v is not None}
        accepted = row.get("verdict") == ACCEPTED
        for g, ok in row_gates.items():
            totals[g][0] += ok
            totals[g][1] += 1
        totals[OVERALL][0] += accepted
        totals[OVERALL][1] += 1
        for axis in axes:
            if axis in condition:
                add((axis, ((axis, condition[axis]),)), row_gates, accepted)
        if len(condition) >= 2:
            ordered = tuple((a, condition[a]) for a in axes if a in condition)
            add((" x ".join(a for a, _ in ordered), ordered), row_gates, accepted)

    def sort_key(item):
        (axis_key, group), _ = item
        return (axis_key.count(" x "), axes.index(group[0][0]) if group else 0, axis_key, group)

    groups = []
    for (axis_key, group), slot in sorted(counts.items(), key=sort_key):
        g = dict(group)
        groups.append(
            {
                "axis": axis_key,
                "group": g,
                "label": _label(g),
                "n": slot[OVERALL][1],
                "gates": {gate: _rate(*slot[gate]) for gate in all_gates if slot[gate][1] > 0},
            }
        )

    disparity = []
    for axis_key in dict.fromkeys(gr["axis"] for gr in groups):
        members = [gr for gr in groups if gr["axis"] == axis_key]
        if len(members) < 2:
            continue
        for gate in all_gates:
            rated = [(gr["label"], gr["gates"][gate]) for gr in members if gate in gr["gates"]]
            if len(rated) < 2:
                continue
            lowest = min(rated, key=lambda t: t[1]["rate"])
            highest = max(rated, key=lambda t: t[1]["rate"])
            disparity.append(
                {
                    "gate": gate,
                    "axis": axis_key,
                    "min_rate": lowest[1]["rate"],
                    "max_rate": highest[1]["rate"],
                    "gap": highest[1]["rate"] - lowest[1]["rate"],
                    "lowest": lowest[0],
                    "highest": highest[0],
                    "separated": lowest[1]["ci_high"] < highest[1]["ci_low"],
                }
            )

    return {
        "method": "Wilson score interval (Wilson 1927)",
        "confidence": 0.95,
        "z": Z95,
        "rows": len(rows),
        "axes": axes,
        "gates": all_gates,
        "all": {g: _rate(*totals[g]) for g in all_gates if totals[g][1] > 0},
        "groups": groups,
        "disparity": disparity,
    }


def plot_attrition(table: Mapping[str, Any], path_png: str | Path) -> Path:
    """Draw :func:`attrition_table`'s output: one panel per gate (and overall), each group's
    pass rate as a dot with its Wilson 95 % interval as an error bar.

    Returns the written path (PNG, matplotlib's Agg backend).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gates = list(table.get("gates", []))
    groups = list(table.get("groups", []))
    path = Path(path_png)
    n_panels = max(len(gates), 1)
    cols = min(3, n_panels)
    rows_ = math.ceil(n_panels / cols)
    height = max(2.5, 0.28 * len(groups) + 1.2)
    fig, axes = plt.subplots(rows_, cols, figsize=(5.2 * cols, height * rows_), squeeze=False, sharey=True)
    labels = [g["label"] for g in groups]
    y = list(range(len(groups)))[::-1]
    axis_names = list(dict.fromkeys(g["axis"] for g in groups))
    colours = {a: f"C{i % 10}" for i, a in enumerate(axis_names)}
    for ax, gate in zip(axes.ravel(), gates):
        for yi, grp in zip(y, groups):
            r = grp["gates"].get(gate)
            if r is None or r["rate"] is None:
                continue
            ax.errorbar(
                r["rate"],
                yi,
                xerr=[[max(r["rate"] - r["ci_low"], 0.0)], [max(r["ci_high"] - r["rate"], 0.0)]],
                fmt="o",
                color=colours[grp["axis"]],
                capsize=3,
                markersize=4,
            )
        overall = table.get("all", {}).get(gate)
        if overall and overall["rate"] is not None:
            ax.axvline(overall["rate"], color="0.5", linestyle="--", linewidth=1)
        ax.set_xlim(-0.02, 1.02)
        ax.set_title(f"{gate} pass rate" if gate != OVERALL else "accepted (overall)")
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=7)
        ax.grid(axis="x", alpha=0.3)
    for ax in axes.ravel()[len(gates) :]:
        ax.set_visible(False)
    fig.suptitle(
        f"Differential attrition: {table.get('rows', 0)} candidates, Wilson 95 % intervals (dashed: all candidates)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
