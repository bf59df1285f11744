"""Release stats of the intended change: skin-tone shifts per condition and source group, and
label consistency per condition with Wilson intervals.

- :func:`skin_tone_stats`: from each item's ``skin`` gate metrics, the distribution of face
  ITA change (candidate minus source, degrees) per condition, and per source group the share
  of candidates lightened beyond the gate's tolerance (``lightened``), with Wilson 95 %
  intervals; Seo et al. (2026) measured 62-71 % lightened overall, 72-75 % for Black and
  Indian sources, 44 % for White ones, which a release can now be set against.
- :func:`label_consistency`: from each item's ``attribute`` gate metrics, per condition the
  share of candidates whose perceived label equals the requested one, per axis and jointly,
  with Wilson 95 % intervals, and the coverage (items the classifier or VLM answered), as
  FOCUS reported its VLM check (race 97.9 %, gender 100 %, joint 97.9 %, coverage 1.0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from counterfactory.validation.attrition import wilson_interval

UNKNOWN_GROUP = "unknown"


def _label(condition: Mapping[str, str]) -> str:
    return " x ".join(f"{k}={v}" for k, v in condition.items()) or "all"


def _share(k: int, n: int) -> dict[str, Any]:
    low, high = wilson_interval(k, n)
    return {"n": n, "k": k, "share": (k / n) if n else None, "ci_low": low, "ci_high": high}


def _metrics(row: Mapping[str, Any], gate: str) -> Mapping[str, Any] | None:
    g = (row.get("gates") or {}).get(gate)
    return g.get("metrics") if isinstance(g, Mapping) else None


def skin_tone_stats(items: Sequence[Mapping[str, Any]], source_groups: Mapping[str, str | None]) -> dict[str, Any]:
    """ITA change per condition and lightened share per source group.

    Args:
        items: release rows (``condition``, ``source.id``, ``gates.skin.metrics``); rows
            without a measured face ITA change are left out and counted in ``unmeasured``.
        source_groups: source id -> its own group (e.g. its recorded race), or None.

    Returns:
        ``{"by_condition": [{label, condition, n, median, q25, q75, min, max, values}],
        "lightened_by_source_group": [{group, n, k, share, ci_low, ci_high}],
        "lightened_all": {...}, "unmeasured": int, "congruence_by_condition": [{label,
        condition, n, face_ita_median, body_ita_median, gap_median, gap_growth_median,
        incongruent: {n, k, share, ci_low, ci_high}}]}``; ITA in degrees. Congruence (the
        candidate's face against the body skin outside the edit region, a covariate that is
        not judged by default) counts only items whose body skin was measured.
    """
    by_condition: dict[str, tuple[dict, list[float]]] = {}
    by_group: dict[str, list[bool]] = {}
    congruence: dict[str, tuple[dict, list[tuple[float, float, float, float | None, bool]]]] = {}
    unmeasured = 0
    for row in items:
        m = _metrics(row, "skin")
        if m and m.get("face_ita_deg") is not None and m.get("body_ita_deg") is not None:
            condition = dict(row.get("condition") or {})
            growth = m.get("face_body_gap_growth_deg")
            congruence.setdefault(_label(condition), (condition, []))[1].append(
                (
                    float(m["face_ita_deg"]),
                    float(m["body_ita_deg"]),
                    float(m.get("face_body_gap_deg") or m["face_ita_deg"] - m["body_ita_deg"]),
                    None if growth is None else float(growth),
                    bool(m.get("face_body_incongruent")),
                )
            )
        change = m.get("face_ita_change_deg") if m else None
        if change is None:
            unmeasured += 1
            continue
        condition = dict(row.get("condition") or {})
        by_condition.setdefault(_label(condition), (condition, []))[1].append(float(change))
        if m.get("lightened") is not None:
            group = source_groups.get(str((row.get("source") or {}).get("id"))) or UNKNOWN_GROUP
            by_group.setdefault(str(group), []).append(bool(m["lightened"]))
    conditions = []
    for label, (condition, values) in sorted(by_condition.items()):
        v = np.asarray(values, dtype=np.float64)
        conditions.append(
            {
                "label": label,
                "condition": condition,
                "n": int(v.size),
                "median": float(np.median(v)),
                "q25": float(np.quantile(v, 0.25)),
                "q75": float(np.quantile(v, 0.75)),
                "min": float(v.min()),
                "max": float(v.max()),
                "values": [round(x, 3) for x in values],
            }
        )
    groups = [{"group": g, **_share(sum(flags), len(flags))} for g, flags in sorted(by_group.items())]
    every = [f for flags in by_group.values() for f in flags]
    congruent = []
    for label, (condition, rows) in sorted(congruence.items()):
        face, body, gap, growth, flag = zip(*rows, strict=True)
        grown = [g for g in growth if g is not None]
        congruent.append(
            {
                "label": label,
                "condition": condition,
                "n": len(rows),
                "face_ita_median": float(np.median(face)),
                "body_ita_median": float(np.median(body)),
                "gap_median": float(np.median(gap)),
                "gap_growth_median": float(np.median(grown)) if grown else None,
                "incongruent": _share(sum(flag), len(flag)),
            }
        )
    return {
        "by_condition": conditions,
        "lightened_by_source_group": groups,
        "lightened_all": _share(sum(every), len(every)),
        "unmeasured": unmeasured,
        "congruence_by_condition": congruent,
    }


def label_consistency(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per condition: for each checked axis and jointly, matches / answered with Wilson 95 %
    intervals, and coverage = answered / items with an attribute gate.

    An item is answered when every checked axis has a ``match_<axis>`` of True or False
    (a VLM refusal, malformed answer or unmapped class leaves it unanswered).
    """
    per: dict[str, dict[str, Any]] = {}
    for row in items:
        m = _metrics(row, "attribute")
        if m is None:
            continue
        condition = dict(row.get("condition") or {})
        slot = per.setdefault(
            _label(condition), {"condition": condition, "items": 0, "answered": 0, "axes": {}, "joint": [0, 0]}
        )
        slot["items"] += 1
        matches = {k.removeprefix("match_"): v for k, v in m.items() if k.startswith("match_")}
        if not matches or any(v is None for v in matches.values()):
            continue
        slot["answered"] += 1
        for axis, ok in matches.items():
            counts = slot["axes"].setdefault(axis, [0, 0])
            counts[0] += bool(ok)
            counts[1] += 1
        slot["joint"][0] += all(bool(v) for v in matches.values())
        slot["joint"][1] += 1
    out = []
    for label, slot in sorted(per.items()):
        out.append(
            {
                "label": label,
                "condition": slot["condition"],
                "coverage": _share(slot["answered"], slot["items"]),
                "axes": {axis: _share(k, n) for axis, (k, n) in sorted(slot["axes"].items())},
                "joint": _share(*slot["joint"]),
            }
        )
    return {"by_condition": out}


#: FOCUS's published QC figures of its released set (Dehdashtian et al. 2025), keyed as
#: :func:`focus_comparison` computes them: the locality means and median from
#: :data:`~counterfactory.validation.calibration.calibrate.PUBLISHED`, the VLM check's joint target-label
#: agreement and the template-level expression drift rate
FOCUS_TARGET_LABEL_ACCURACY = 0.979
FOCUS_EXPRESSION_DRIFT = 0.121


def focus_published() -> dict[str, float]:
    """FOCUS's published figures: ``diff_face_mean``, ``diff_nonface_mean``, ``ratio_median``,
    ``target_label_accuracy``, ``expression_drift``."""
    from counterfactory.validation.calibration.calibrate import PUBLISHED

    return {
        "diff_face_mean": PUBLISHED["focus_diff_face_mean"],
        "diff_nonface_mean": PUBLISHED["focus_diff_nonface_mean"],
        "ratio_median": PUBLISHED["focus_ratio_median"],
        "target_label_accuracy": FOCUS_TARGET_LABEL_ACCURACY,
        "expression_drift": FOCUS_EXPRESSION_DRIFT,
    }


def _finite(value: Any) -> float | None:
    return (
        float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value) else None
    )


def focus_figures(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """FOCUS's QC figures computed as FOCUS computes them, over ``rows`` (items or manifest rows).

    - ``diff_face_mean``, ``diff_nonface_mean``: means of the locality gate's ``focus_diff_face``
      and ``focus_diff_nonface`` (the output as the editor returned it, resized to the source,
      no registration), over the rows that have them (``n``); ``ratio_median``: the median of
      ``focus_ratio`` over those with a finite ratio (``n_ratio``).
    - ``target_label_accuracy``: the attribute gate's joint agreement (every checked axis's
      ``match_<axis>`` True) over the rows it answered, with its Wilson interval; None without
      an attribute gate.
    - ``expression_drift``: the share of rows whose expression label differs from their
      template's modal label (the release's expression audit), with its Wilson interval.
    """
    face, nonface, ratio = [], [], []
    for row in rows:
        m = _metrics(row, "locality") or {}
        a, b = _finite(m.get("focus_diff_face")), _finite(m.get("focus_diff_nonface"))
        if a is None or b is None:
            continue
        face.append(a)
        nonface.append(b)
        if (r := _finite(m.get("focus_ratio"))) is not None:
            ratio.append(r)
    answered = matched = 0
    for row in rows:
        m = _metrics(row, "attribute")
        matches = [v for k, v in (m or {}).items() if k.startswith("match_")]
        if not matches or any(v is None for v in matches):
            continue
        answered += 1
        matched += all(bool(v) for v in matches)
    labelled = [r for r in rows if r.get("expression")]
    drifted = sum(not r["expression"]["consistent"] for r in labelled)
    return {
        "n": len(face),
        "diff_face_mean": float(np.mean(face)) if face else None,
        "diff_nonface_mean": float(np.mean(nonface)) if nonface else None,
        "n_ratio": len(ratio),
        "ratio_median": float(np.median(ratio)) if ratio else None,
        "target_label_accuracy": _share(matched, answered) if answered else None,
        "expression_drift": _share(drifted, len(labelled)) if labelled else None,
    }


def focus_comparison(items: Sequence[Mapping[str, Any]], manifest: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """stats.json ``audit.focus``: :func:`focus_figures` of the whole imported set (``set``: every
    item) and of what the release keeps (``accepted``: the manifest rows), beside
    :func:`focus_published`."""
    return {"published": focus_published(), "set": focus_figures(items), "accepted": focus_figures(manifest)}


def focus_html(focus: Mapping[str, Any] | None) -> str:
    """The report's table of :func:`focus_comparison`."""
    if not focus:
        return ""

    def value(figures: Mapping[str, Any], key: str) -> str:
        v = figures.get(key)
        if v is None:
            return "n/a"
        if isinstance(v, Mapping):
            return "n/a" if v["share"] is None else f"{100 * v['share']:.1f} % (n={v['n']})"
        return f"{100 * v:.1f} %" if key in ("target_label_accuracy", "expression_drift") else f"{v:.3f}"

    names = {
        "diff_face_mean": "diff_face, mean",
        "diff_nonface_mean": "diff_nonface, mean",
        "ratio_median": "diff_face / diff_nonface, median",
        "target_label_accuracy": "target-label accuracy (joint)",
        "expression_drift": "expression drift",
    }
    rows = "".join(
        f"<tr><td>{label}</td><td>{value(focus['set'], key)}</td><td>{value(focus['accepted'], key)}</td>"
        f"<td>{value(focus['published'], key)}</td></tr>"
        for key, label in names.items()
    )
    return (
        "<h2>Against FOCUS's published figures</h2>"
        f"<p>This imported set's own QC figures, computed as FOCUS computes them (locality on the output as "
        f"returned, resized to the source, no registration: {focus['set']['n']} items measured, "
        f"{focus['accepted']['n']} of them accepted), beside the figures FOCUS published for its set. "
        "Target-label accuracy needs an attribute gate; n/a: not measured.</p>"
        '<table id="focus-comparison"><tr><th>figure</th><th>this set (all items)</th><th>accepted</th>'
        f"<th>FOCUS published</th></tr>{rows}</table>"
    )


def plot_skin_tone(stats: Mapping[str, Any], path_png: str | Path) -> Path:
    """Two panels: the ITA change per condition (box: quartiles, whiskers: range, dots:
    candidates), and the share lightened beyond tolerance per source group with Wilson 95 %
    intervals. PNG via matplotlib's Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conditions = list(stats.get("by_condition", []))
    groups = list(stats.get("lightened_by_source_group", []))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, max(2.8, 0.35 * max(len(conditions), len(groups)) + 1.4)))
    if conditions:
        left.boxplot(
            [c["values"] for c in conditions], vert=False, whis=(0, 100), tick_labels=[c["label"] for c in conditions]
        )
        for i, c in enumerate(conditions, start=1):
            left.plot(c["values"], [i] * len(c["values"]), "o", color="C0", alpha=0.5, markersize=3)
    left.axvline(0.0, color="0.5", linestyle="--", linewidth=1)
    left.set_xlabel("face ITA change, candidate - source (degrees; > 0 lighter)")
    left.set_title("ITA change per condition")
    for yi, g in enumerate(groups):
        if g["share"] is None:
            continue
        right.errorbar(
            g["share"],
            yi,
            xerr=[[g["share"] - g["ci_low"]], [g["ci_high"] - g["share"]]],
            fmt="o",
            capsize=3,
            color="C3",
        )
    right.set_yticks(range(len(groups)))
    right.set_yticklabels([f"{g['group']} (n={g['n']})" for g in groups])
    right.set_xlim(-0.02, 1.02)
    right.set_xlabel("share lightened beyond tolerance (Wilson 95 %)")
    right.set_title("lightened per source group")
    fig.tight_layout()
    path = Path(path_png)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def target_html(skin: Mapping[str, Any] | None, labels: Mapping[str, Any] | None) -> str:
    """The report's section for :func:`skin_tone_stats` and :func:`label_consistency`."""
    import html

    def pct(s: Mapping[str, Any]) -> str:
        if s["share"] is None:
            return "n/a"
        return f"{100 * s['share']:.1f} % [{100 * s['ci_low']:.1f}, {100 * s['ci_high']:.1f}] (n={s['n']})"

    parts = []
    if skin and (skin.get("by_condition") or skin.get("lightened_by_source_group")):
        rows = "".join(
            f"<tr><td>{html.escape(c['label'])}</td><td>{c['n']}</td><td>{c['median']:+.1f}</td>"
            f"<td>{c['q25']:+.1f} .. {c['q75']:+.1f}</td></tr>"
            for c in skin["by_condition"]
        )
        groups = "".join(
            f"<tr><td>{html.escape(g['group'])}</td><td>{pct(g)}</td></tr>" for g in skin["lightened_by_source_group"]
        )
        parts.append(
            "<h2>Skin tone (ITA°)</h2>"
            '<table id="skin-by-condition"><tr><th>condition</th><th>n</th><th>median change</th>'
            f"<th>quartiles</th></tr>{rows}</table>"
            '<table id="skin-lightened"><tr><th>source group</th><th>lightened beyond tolerance (every condition)</th>'
            f"</tr>{groups}</table>"
            '<p id="skin-lightened-reading">This counts every edited face, whatever its condition asked for. Where the '
            "conditions change a person's group, a face asked for a lighter-skinned group than its source is meant "
            "to be lighter, so a high share here can be the design working, not an editor's bias: read it beside the "
            "median change per condition above. What must not move is a same-group control's tone; the skin gate "
            "holds those (<code>skin_tone_shift</code>). A source whose own group its metadata does not give is "
            "counted as <em>unknown</em>. For scale, Seo et al. (2026) found image editors lightening skin in 62-71 % "
            "of outputs (72-75 % for Black and Indian sources, 44 % for White ones).</p>"
            '<img src="skin_tone.png" alt="ITA change per condition and lightened share per source group" '
            'style="max-width: 100%">'
        )
    if skin and skin.get("congruence_by_condition"):
        rows = "".join(
            f"<tr><td>{html.escape(c['label'])}</td><td>{c['n']}</td><td>{c['face_ita_median']:.1f}</td>"
            f"<td>{c['body_ita_median']:.1f}</td><td>{c['gap_median']:+.1f}</td><td>{pct(c['incongruent'])}</td></tr>"
            for c in skin["congruence_by_condition"]
        )
        parts.append(
            "<h3>Face-body congruence (recorded, not judged unless skin.require_congruent)</h3>"
            '<table id="skin-congruence"><tr><th>condition</th><th>n with body skin</th><th>face ITA°</th>'
            f"<th>body ITA°</th><th>median gap</th><th>gap grew beyond tolerance</th></tr>{rows}</table>"
        )
    if labels and labels.get("by_condition"):
        rows = "".join(
            f"<tr><td>{html.escape(c['label'])}</td><td>{pct(c['coverage'])}</td>"
            + "".join(f"<td>{html.escape(a)}: {pct(s)}</td>" for a, s in c["axes"].items())
            + f"<td>{pct(c['joint'])}</td></tr>"
            for c in labels["by_condition"]
        )
        parts.append(
            "<h2>Label consistency (Wilson 95 % intervals)</h2>"
            '<table id="label-consistency"><tr><th>condition</th><th>coverage</th><th colspan="2">per axis</th>'
            f"<th>joint</th></tr>{rows}</table>"
        )
    return "\n".join(parts)
