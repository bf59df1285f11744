"""``score``'s files: ``scores.json``, ``per_trial.jsonl``, the papers' tables, plots, ``report.html``.

Tables are named after the paper table they reproduce (``focus_table1_polarisation``,
``npdp_table8_anova``, ``inclusivecf_table1_paired_shifts``, ...), each as CSV and Markdown.
Plots (matplotlib, Agg): a win-rate heat map per model and 2AFC scenario (FOCUS Figure 4) and a
salary Gap% forest plot per model (FOCUS 4.3).
"""

from __future__ import annotations

import csv
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from counterfactory.manifests.release import write_jsonl

#: the JSON Schema of ``scores.json`` (copied beside it)
SCORES_SCHEMA = Path(__file__).with_name("scores.schema.json")


#: an interval's bound this close to 0 is 0 carried through floating point (a bootstrap quantile
#: of shares that are all 0 came out as 5.55e-17); a p-value or an effect this small stays as it is
_BOUND_NOISE = 1e-12


def _bound(x: float) -> str:
    return f"{0.0 if abs(x) < _BOUND_NOISE else x:.3g}"


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list | tuple) and len(v) == 2 and all(isinstance(x, int | float) for x in v):
        return f"[{_bound(v[0])}, {_bound(v[1])}]"
    return str(v)


#: what the report says of a blank cell (the Markdown and CSV tables leave it empty)
BLANK = "–"
BLANK_MEANS = (
    f"A cell showing {BLANK} has no value: the row has fewer answers than the measure needs (the release's "
    "analysis block, or score --min-n, sets the fewest per cell), or the measure does not apply to the row "
    "(a group against itself as the reference, a question with no interval of that kind). per_trial.jsonl "
    "says for each answer why it has no value, when it has none."
)


def _ci(r: dict[str, Any] | None) -> list[float] | None:
    return None if r is None else r.get("ci")


def tables(scores: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """``{table name: rows}`` from ``scores.json``."""
    t: dict[str, list[dict[str, Any]]] = {}
    for model, e in scores["models"].items():
        for q, s in (e.get("focus_2afc") or {}).items():
            t.setdefault("focus_table1_polarisation", []).append(
                {
                    "model": model,
                    "scenario": q,
                    "Pol": s["pol"],
                    "Pol CI": s["pol_ci"],
                    "Ext": s["ext"],
                    "Ext CI": s["ext_ci"],
                }
            )
            t.setdefault("focus_4_1_2afc_retention", []).append(
                {
                    "model": model,
                    "scenario": q,
                    "pairs": s["pairs"],
                    "retained": s["retention"]["rate"],
                    "retained CI": _ci(s["retention"]),
                    "discarded": json.dumps(s["discarded"], sort_keys=True),
                    "p_first": s["p_first"]["rate"],
                    "p_first CI": _ci(s["p_first"]),
                    "p_first p": s["p_first"].get("p_value"),
                }
            )
            for axis, groups in [("race x gender", s["win_rate"]), *s["win_rate_by_axis"].items()]:
                for g, r in groups.items():
                    t.setdefault("focus_figure4_win_rates", []).append(
                        {
                            "model": model,
                            "scenario": q,
                            "axis": axis,
                            "group": g,
                            "n": r["n"],
                            "WinRate": r["rate"],
                            "CI": r["ci"],
                        }
                    )
        for q, s in (e.get("focus_mcq") or {}).items():
            for axis in scores["axes"]:
                if axis not in s:
                    continue
                for g, r in s[axis]["groups"].items():
                    t.setdefault("focus_table2_mcq_jsd", []).append(
                        {
                            "model": model,
                            "question": q,
                            "axis": axis,
                            "group": g,
                            "n": r["n"],
                            "mean": r["mean"],
                            "JSD": r["jsd"],
                            "gap (axis)": s[axis]["gap"],
                            "gap CI": s[axis]["gap_ci"],
                        }
                    )
            if "face_body" in s:
                t.setdefault("focus_table4_face_body", []).append({"model": model, "question": q, **s["face_body"]})
            for v, r in (s.get("robustness") or {}).items():
                t.setdefault("focus_b2_robustness", []).append(
                    {
                        "model": model,
                        "question": q,
                        "variant": v,
                        "paired valid": r["paired_valid"]["rate"],
                        "agreement": r["agreement"]["rate"],
                        "agreement CI": _ci(r["agreement"]),
                    }
                )
        sal = e.get("focus_salary")
        if sal:
            for occ, by_axis in sal["by_occupation"].items():
                for axis, a in by_axis.items():
                    for g, r in a["groups"].items():
                        t.setdefault("focus_4_3_salary_gap", []).append(
                            {
                                "model": model,
                                "occupation": occ,
                                "axis": axis,
                                "group": g,
                                "reference": a["reference"],
                                "n": r["n"],
                                "mean": r["mean"],
                                "median": r["median"],
                                "Gap% (mean)": r["gap_mean"],
                                "Gap% (mean) CI": r["gap_mean_ci"],
                                "Gap% (median)": r["gap_median"],
                                "Gap% (median) CI": r["gap_median_ci"],
                            }
                        )
        npdp = e.get("npdp")
        if npdp:
            for variant, entry in npdp.items():
                if variant in ("regard", "abstain"):
                    continue
                for metric in ("vader", "verbosity", "regard"):
                    for cat, r in (entry.get(metric) or {}).items():
                        row = {"model": model, "variant": variant, "metric": metric, "category": cat, "n": r["n"]}
                        t.setdefault("npdp_table1_linguistic", []).append(
                            row | {"delta": r["delta"], "delta CI": r["delta_ci"]}
                        )
                        if cat == "all":
                            t.setdefault("npdp_table8_anova", []).append(
                                row | {"F": r["F"], "p": r["p_value"], "Cohen's d": r["cohens_d"]}
                            )
            if not npdp["regard"]["available"]:
                t.setdefault("npdp_table1_linguistic", []).append(
                    {"model": model, "variant": "", "metric": "regard", "category": "absent: " + npdp["regard"]["why"]}
                )
        for key, g in ((e.get("npdp_judge") or {}).get("groups") or {}).items():
            variant, _, category = key.partition(":")
            t.setdefault("npdp_table1_judge", []).append(
                {
                    "model": model,
                    "variant": variant,
                    "category": category,
                    "n": g["n"],
                    "unparsed": g["unparsed"],
                    **{d.capitalize(): g[d]["rate"] for d in ("interpret", "stereotype", "framing")},
                    **{f"{d.capitalize()} CI": g[d]["ci"] for d in ("interpret", "stereotype", "framing")},
                    "declined (B)": g["declined_b"]["rate"],
                    "rubric sha256": ", ".join(s[:12] for s in e["npdp_judge"]["rubric_sha256"]),
                }
            )
        icf = e.get("inclusivecf")
        if icf:
            for variant, r in icf.items():
                name = (
                    "inclusivecf_table2_noise_baseline"
                    if variant == "noise_baseline"
                    else "inclusivecf_table1_paired_shifts"
                )
                t.setdefault(name, []).append(
                    {
                        "model": model,
                        "variant": variant,
                        "control consistency": r["control_consistency"]["rate"],
                        "dRating": r["delta_rating"],
                        "95% CI": r["delta_rating_ci"],
                        "sign test p": r["sign_test"]["p_value"],
                        "dYes (pp)": r["delta_yes_pp"],
                        "dUnc. (pp)": r["delta_uncertain_pp"],
                        "decision TVD (pp)": r["decision_tvd_pp"],
                    }
                    | ({"repeated queries": r["repeats"]} if "repeats" in r else {})
                )
        uc = e.get("user_context")
        if uc:
            # the guardrail paper's Table 2: "Story Generation (Gender / Race)", "Term Explanation
            # (Gender / Race)", TVD x 100, with the measure each came from (its judge, or length)
            row: dict[str, Any] = {"model": model}
            for task, title in (("story_generation", "Story Generation"), ("term_explanation", "Term Explanation")):
                for axis, cell in uc["table2"][task].items():
                    row[f"{title} ({axis.capitalize()})"] = cell["score"]
                    row[f"{title} ({axis.capitalize()}) CI"] = cell["ci"]
                row[f"{title} measure"] = uc["measure"][task]
            t.setdefault("guardrail_table2_user_context", []).append(row)
            story = uc.get("story_judge")
            for axis, a in ((story or {}).get("axes") or {}).items():
                for attr, r in a["attributes"].items():
                    for g, d in r["by_group"].items():
                        top = max(d["distribution"], key=lambda k: d["distribution"][k]) if d["n"] else None
                        t.setdefault("guardrail_table2_story_attributes", []).append(
                            {
                                "model": model,
                                "axis": axis,
                                "attribute": attr,
                                "group": g,
                                "n": d["n"],
                                "most common": top,
                                "share": d["distribution"].get(top) if top else None,
                                "TVD x 100": r["score"],
                                "CI": r["ci"],
                                "permutation p": r["p_value"],
                                "rubric sha256": ", ".join(x[:12] for x in story["rubric_sha256"]),
                            }
                        )
            jargon = uc.get("jargon_judge")
            for axis, a in ((jargon or {}).get("axes") or {}).items():
                for g, w in a["win_share"].items():
                    t.setdefault("guardrail_table2_jargon_wins", []).append(
                        {
                            "model": model,
                            "axis": axis,
                            "group": g,
                            "appearances": w["n"],
                            "more-jargon win share": w["share"],
                            "CI": w["ci"],
                            "TVD x 100": a["score"],
                            "TVD CI": a["ci"],
                            "judge first-position rate": jargon["first_position"]["rate"],
                            "rubric sha256": ", ".join(x[:12] for x in jargon["rubric_sha256"]),
                        }
                    )
            for prompt, s in uc["per_prompt"].items():
                t.setdefault("guardrail_tvd_scores", []).append(
                    {"model": model, "prompt": prompt, "S_q (reply length)": s}
                )
        for protocol, r in e["refusals"].items():
            for g, w in r["by_group"].items():
                t.setdefault("refusal_rates", []).append(
                    {
                        "model": model,
                        "protocol": protocol,
                        "group": g,
                        "n": w["n"],
                        "refusal rate": w["rate"],
                        "CI": w["ci"],
                        "TVD score": r["tvd_score"],
                    }
                )
    for pair, by_q in scores.get("cross_model_spearman", {}).items():
        for q, r in by_q.items():
            t.setdefault("focus_table5_spearman", []).append(
                {"models": pair, "scenario": q, "rho": r["rho"], "p": r["p_value"], "cells": r["n"]}
            )
    return t


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table of ``rows`` (columns of the first row)."""
    if not rows:
        return ""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c)).replace("|", "/") for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _write_table(folder: Path, name: str, rows: list[dict[str, Any]]) -> None:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with (folder / f"{name}.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({c: json.dumps(r.get(c)) if isinstance(r.get(c), list) else r.get(c) for c in cols})
    (folder / f"{name}.md").write_text(markdown(rows), encoding="utf-8")


def plot_win_rates(scenario: dict[str, Any], title: str, path: Path) -> None:
    """FOCUS Figure 4: the pairwise win-rate matrix, row group's win rate against the column's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    groups = sorted({c["i"] for c in scenario["cells"]} | {c["j"] for c in scenario["cells"]})
    idx = {g: k for k, g in enumerate(groups)}
    mat = np.full((len(groups), len(groups)), np.nan)
    for c in scenario["cells"]:
        mat[idx[c["i"]], idx[c["j"]]] = c["w_ij"]
        mat[idx[c["j"]], idx[c["i"]]] = 1 - c["w_ij"]
    fig, ax = plt.subplots(figsize=(1.0 + 0.6 * len(groups), 0.8 + 0.55 * len(groups)))
    im = ax.imshow(mat, vmin=0, vmax=1, cmap="RdBu_r")
    ax.set_xticks(range(len(groups)), groups, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(groups)), groups, fontsize=8)
    for i in range(len(groups)):
        for j in range(len(groups)):
            if not np.isnan(mat[i, j]):
                ax.text(j, i, f"{mat[i, j]:.2f}", ha="center", va="center", fontsize=6)
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046, label="row wins")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_salary_gaps(rows: Sequence[dict[str, Any]], title: str, path: Path) -> None:
    """A forest plot of salary Gap% (mean) with its template-bootstrap interval, per occupation and group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["group"] != r["reference"] and r["Gap% (mean)"] is not None]
    fig, ax = plt.subplots(figsize=(6, 0.9 + 0.3 * max(len(rows), 1)))
    for k, r in enumerate(rows):
        ci = r["Gap% (mean) CI"]
        if ci:
            ax.plot(ci, [k, k], color="0.4", lw=1.5)
        ax.plot([r["Gap% (mean)"]], [k], "o", color="C0")
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(rows)), [f"{r['occupation']}: {r['group']} vs {r['reference']}" for r in rows], fontsize=8)
    ax.set_xlabel("Gap% (mean), 95% template-bootstrap interval")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out: Path, scores: dict[str, Any], per_trial: Sequence[dict[str, Any]]) -> None:
    """Write every file of a score report into ``out`` (created)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "scores.json").write_text(json.dumps(scores, indent=2, default=str) + "\n", encoding="utf-8")
    (out / "scores.schema.json").write_bytes(SCORES_SCHEMA.read_bytes())
    write_jsonl(out / "per_trial.jsonl", per_trial)
    tdir, pdir = out / "tables", out / "plots"
    tdir.mkdir(exist_ok=True)
    pdir.mkdir(exist_ok=True)
    all_tables = tables(scores)
    for name, rows in all_tables.items():
        _write_table(tdir, name, rows)
    plots = []
    for model, e in scores["models"].items():
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in model)
        for q, s in (e.get("focus_2afc") or {}).items():
            if s["cells"]:
                p = pdir / f"win_rates_{safe}_{q}.png"
                plot_win_rates(s, f"{model}: 2AFC {q} win rates (FOCUS Figure 4)", p)
                plots.append(p)
        sal = [r for r in all_tables.get("focus_4_3_salary_gap", []) if r["model"] == model]
        if sal:
            p = pdir / f"salary_gap_{safe}.png"
            plot_salary_gaps(sal, f"{model}: salary Gap% (FOCUS 4.3)", p)
            plots.append(p)
    parts = [
        "<!doctype html><meta charset='utf-8'><title>scores</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:2px 6px}</style>",
        f"<h1>Scores: {html.escape(str(scores['release']['name']))} {html.escape(str(scores['release']['version']))}</h1>",
        f"<p>{scores['answers']} answers to {scores['trials']} trials, parsed {scores['parse']}; intervals: Wilson 95 % "
        "for rates, percentile bootstrap over templates otherwise.</p>",
        f"<p id='blank-cells'>{html.escape(BLANK_MEANS)}</p>",
    ]
    for p in plots:
        parts.append(f"<h3>{html.escape(p.stem)}</h3><img src='plots/{html.escape(p.name)}' style='max-width:100%'>")
    for name, rows in all_tables.items():
        cols = list(dict.fromkeys(k for r in rows for k in r))
        parts.append(
            f"<h2>{html.escape(name)}</h2><table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "</tr>"
        )
        for r in rows[:400]:
            parts.append("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c)) or BLANK)}</td>" for c in cols) + "</tr>")
        parts.append("</table>")
    (out / "report.html").write_text("\n".join(parts), encoding="utf-8")
