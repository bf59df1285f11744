"""What people's review says about the gates and the edits: agreement, overrides, spot-the-edit.

- Reviewer agreement: Cohen's kappa (J. Cohen, "A coefficient of agreement for nominal
  scales", Educational and Psychological Measurement 20 (1960) 37-46) on the double-reviewed
  items, for accept/reject and, per reject reason, for "rejected for this reason or not".
- Override rate of each gate verdict: among audited ``accepted`` (``rejected``) candidates with a
  resolved review, how often people reversed it, with a Wilson interval.
- Blinded spot-the-edit: detection accuracy (said "edited" exactly when the candidate was shown)
  and localisation accuracy (candidate shown, said "edited", clicked inside the dilated edit mask,
  out of every candidate trial), per condition, with Wilson intervals. InclusiveCFImageBias
  reports annotators finding the edited limb in under 10 % of tries; a factory's edits should
  score near there, and near 50 % detection.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from counterfactory.manifests.ledger import Ledger
from counterfactory.manifests.review import (
    OUTCOME,
    REASONS,
    QueueItem,
    ReviewOptions,
    SpotTrial,
    parse_cell_id,
    pending_by_group,
    review_queue,
    spot_trials,
    standing_votes,
    unanswered_spot_deals,
)
from counterfactory.manifests.vocabulary import ACCEPTED, REJECTED
from counterfactory.validation.attrition import wilson_interval


def cohens_kappa(pairs: Sequence[tuple[Any, Any]]) -> float | None:
    """Cohen's kappa of two raters' labels on the same items, ``(p_o - p_e) / (1 - p_e)``:
    statsmodels' ``statsmodels.stats.inter_rater.cohens_kappa`` of the square table of counts
    (labels in order of first appearance), operation for operation, so equal to the last bit
    (``tests/validation/test_review_stats.py`` checks it against statsmodels); written out
    because importing statsmodels cost every command that writes a release 2 s.

    Args:
        pairs: ``(rater A's label, rater B's label)`` per item; any hashable labels.

    Returns:
        kappa in [-1, 1]; 1.0 when both raters used one and the same label for everything
        (``p_e`` = 1, perfect but uninformative agreement: statsmodels gives NaN there); ``None``
        for no items.
    """
    if not pairs:
        return None
    index: dict[Any, int] = {}
    for a, b in pairs:
        index.setdefault(a, len(index))
        index.setdefault(b, len(index))
    if len(index) == 1:
        return 1.0
    table = np.zeros((len(index), len(index)))  # counts, as floats (statsmodels' asarray(table, float))
    for a, b in pairs:
        table[index[a], index[b]] += 1
    agree = np.diag(table).sum()
    nobs = table.sum()
    freq_row = table.sum(1) / nobs
    freq_col = table.sum(0) / nobs
    agree_exp = np.diag(freq_col * freq_row[:, None]).sum()
    return float((agree / nobs - agree_exp) / (1 - agree_exp))


def _rate(hits: int, n: int) -> dict[str, Any]:
    low, high = wilson_interval(hits, n)
    return {"n": n, "hits": hits, "rate": hits / n if n else None, "ci_low": low, "ci_high": high}


def agreement(items: Sequence[QueueItem]) -> dict[str, Any]:
    """Kappa over the first two standing votes (two different people) on double-reviewed items."""
    pairs = []
    for item in items:
        if item.required < 2:
            continue
        votes = standing_votes(item.decisions)
        if len(votes) >= 2:
            pairs.append((votes[0], votes[1]))
    per_reason = {}
    for code in REASONS:
        labelled = [
            (a.decision == "reject" and a.reason == code, b.decision == "reject" and b.reason == code) for a, b in pairs
        ]
        if any(x or y for x, y in labelled):
            per_reason[code] = cohens_kappa(labelled)
    return {
        "pairs": len(pairs),
        "agree": sum(a.decision == b.decision for a, b in pairs),
        "kappa": cohens_kappa([(a.decision, b.decision) for a, b in pairs]),
        "kappa_per_reason": per_reason,
    }


def per_reviewer(items: Sequence[QueueItem]) -> dict[str, Any]:
    """Per reviewer: standing votes, skips and undos; how often their vote matches the item's
    resolved outcome (agreement with the panel); and the median seconds between two of their
    consecutive decisions (time per item; gaps over 10 minutes are breaks and left out)."""
    out: dict[str, dict[str, Any]] = {}
    times: dict[str, list[float]] = {}
    for item in items:
        res = item.resolution
        for d in item.decisions:
            row = out.setdefault(d.reviewer, {"decided": 0, "skipped": 0, "undone": 0, "matches": 0, "resolved": 0})
            times.setdefault(d.reviewer, []).append(d.decided_at.timestamp())
            row["skipped"] += d.decision == "skip"
            row["undone"] += d.decision == "undo"
        for d in standing_votes(item.decisions):
            row = out[d.reviewer]
            row["decided"] += 1
            if res.state == "resolved":
                row["resolved"] += 1
                row["matches"] += OUTCOME[d.decision] == res.outcome
    for name, row in out.items():
        stamps = sorted(times[name])
        gaps = [b - a for a, b in zip(stamps, stamps[1:]) if b - a <= 600]
        row["agreement"] = _rate(row.pop("matches"), row.pop("resolved"))
        row["median_seconds_per_item"] = float(np.median(gaps)) if gaps else None
    return dict(sorted(out.items()))


def override_rates(items: Sequence[QueueItem]) -> dict[str, Any]:
    """Per gate verdict of the audit sample: how often people's first votes reversed it.

    Each reviewer's first accept or reject counts (:attr:`QueueItem.first_resolution`): the
    answer to a decision shows the gate's verdict, so a vote made after reading it (reject,
    read "accepted", undo, accept) would no longer be blind."""
    out = {}
    for verdict in (ACCEPTED, REJECTED):
        resolved = [i for i in items if i.mode == "audit" and i.verdict == verdict and i.first_resolution.outcome]
        reversed_ = sum(i.first_resolution.outcome != verdict for i in resolved)
        out[verdict] = _rate(reversed_, len(resolved))
    return out


def spot_accuracy(trials: Sequence[SpotTrial], conditions: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """Detection and localisation accuracy, overall and per condition label.

    Args:
        trials: the blinded answers.
        conditions: cell id -> condition (``{"race": "Black", ...}``).
    """

    def summary(group: Sequence[SpotTrial]) -> dict[str, Any]:
        detected = sum(t.said_edited == (t.shown == "candidate") for t in group)
        edited = [t for t in group if t.shown == "candidate"]
        return {
            "trials": len(group),
            "detection": _rate(detected, len(group)),
            "localisation": _rate(sum(bool(t.localised) for t in edited), len(edited)),
        }

    by_condition: dict[str, list[SpotTrial]] = {}
    for t in trials:
        label = " x ".join(f"{k}={v}" for k, v in conditions.get(t.cell_id, {}).items()) or "(none)"
        by_condition.setdefault(label, []).append(t)
    return {
        "overall": summary(trials),
        "by_condition": {k: summary(v) for k, v in sorted(by_condition.items())},
    }


def review_summary(ledger: Ledger, options: ReviewOptions) -> dict[str, Any]:
    """Progress, agreement, override rates and spot-the-edit accuracy for a release's stats."""
    items = review_queue(ledger, options)
    states: dict[str, int] = {"open": 0, "disputed": 0, "resolved": 0}
    for item in items:
        states[item.resolution.state] += 1
    trials = spot_trials(ledger)
    conditions = {t.cell_id: parse_cell_id(t.cell_id)[1] for t in trials}
    return {
        "queue": {"total": len(items), **states},
        "by_mode": {m: sum(i.mode == m for i in items) for m in ("queue", "audit")},
        "decisions": sum(len(i.decisions) for i in items),
        "reviewers": per_reviewer(items),
        "agreement": agreement(items),
        "override": override_rates(items),
        "spot_the_edit": {**spot_accuracy(trials, conditions), "unanswered": unanswered_spot_deals(ledger)},
    }


def release_review_stats(ledger: Ledger, options: ReviewOptions, items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """:func:`review_summary` plus what of this release still waits for a person, per group."""
    return {"waiting": pending_by_group(items), **review_summary(ledger, options)}


def _pct(rate: Mapping[str, Any]) -> str:
    if not rate["n"]:
        return "n = 0"
    return f"{rate['rate']:.0%} [{rate['ci_low']:.0%}, {rate['ci_high']:.0%}] of {rate['n']}"


def review_html(review: Mapping[str, Any] | None) -> str:
    """The report's "Human review" section (``review``: :func:`release_review_stats`)."""
    import html

    if not review:
        return ""
    q, waiting = review["queue"], review["waiting"]
    groups = ", ".join(f"{html.escape(k)}: {v}" for k, v in waiting["by_group"].items()) or "none"
    agree = review["agreement"]
    kappa = "n/a" if agree["kappa"] is None else f"{agree['kappa']:.2f}"
    per_reason = ", ".join(
        f"{html.escape(k)} {'n/a' if v is None else f'{v:.2f}'}" for k, v in agree["kappa_per_reason"].items()
    )
    spot = review["spot_the_edit"]
    spot_rows = "".join(
        f"<tr><td>{html.escape(label)}</td><td>{s['trials']}</td><td>{_pct(s['detection'])}</td>"
        f"<td>{_pct(s['localisation'])}</td></tr>"
        for label, s in [("all", spot["overall"]), *spot["by_condition"].items()]
    )
    return f"""<h2>Human review</h2>
<p id="review-progress">Queue: {q["total"]} candidates ({review["by_mode"]["queue"]} needs review,
{review["by_mode"]["audit"]} audit sample): {q["resolved"]} decided, {q["disputed"]} disputed, {q["open"]} open.
Items of this release still waiting for review: <b>{waiting["total"]}</b> ({groups}).</p>
<p id="review-agreement">Reviewer agreement on {agree["pairs"]} double-reviewed items: Cohen's kappa {kappa}
({agree["agree"]} agree){"; per reason: " + per_reason if per_reason else ""}.</p>
<table id="review-override"><tr><th>gate verdict (audit sample)</th><th>reversed by people (Wilson 95 %)</th></tr>
<tr><td>accepted</td><td>{_pct(review["override"]["accepted"])}</td></tr>
<tr><td>rejected</td><td>{_pct(review["override"]["rejected"])}</td></tr></table>
<table id="review-spot"><tr><th>spot the edit</th><th>trials</th><th>detection</th><th>localisation</th></tr>
{spot_rows}</table>
"""
