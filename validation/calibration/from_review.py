"""Thresholds fitted from reviewers' decisions on a run (``counterfactory calibrate --from-review RUN``).

The shipped thresholds come from a synthetic corpus; a lab's editor re-renders, relights and
retouches in its own way, and the people who review its outputs are the ground truth. This
module turns a run's review into a calibration:

- **Cases.** Every reviewed candidate (a ``needs_review`` item or an audit sample) is paired
  with the measures its gate record in the ledger already holds (nothing is edited or
  measured again) and labelled with the reviewers' *first* votes
  (:func:`~counterfactory.manifests.review.first_votes`: what each said before anything
  undid it): the majority of them; a tie is reported and left out.
- **Replay.** A candidate's verdict under other thresholds is its stored reasons with every
  fitted threshold's reason (:data:`REASON_OF`) decided again from the stored metric
  (:func:`replay`); the stored thresholds reproduce the stored verdicts, which the report
  checks (``replay_matches``).
- **Fit.** Each threshold of :data:`~counterfactory.validation.calibration.corpus_fit.CORPUS_THRESHOLDS`
  (locality's on each judging path, :data:`~counterfactory.validation.calibration.corpus_fit.PATH_LOCALITY`,
  on the candidates judged on that path) is moved to the value that agrees most often with the
  labels, one threshold at a time over a few sweeps, from the run's own thresholds (and, for
  an item people accepted that several thresholds reject, all of them moved past it together
  when that raises agreement: :func:`_rescue`): rounded
  outward to 2 significant digits and never finer than the metric's resolution as corpus_fit
  rounds them; ties keep the value nearer the run's. A threshold whose metric fewer than
  :data:`MIN_PER_LABEL` accepted or rejected candidates measured keeps the run's value, and
  the output says which threshold came from where.
- **Held out by source.** The sources are dealt into folds (:func:`folds`); each fold's
  candidates are judged with thresholds fitted on the other folds only, and the figures
  (agreement with a Wilson interval, Cohen's kappa, per group, per direction, catch per
  reason) are computed on those held-out verdicts of the audit sample's *random* share (items
  chosen for being near a threshold bias agreement). The calibration written is fitted on
  every fold.
"""

from __future__ import annotations

import copy
import datetime as _dt
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.ledger import Ledger
from counterfactory.manifests.review import QueueItem, ReviewOptions, first_votes, review_queue
from counterfactory.manifests.vocabulary import ACCEPTED, FAILED, REJECTED
from counterfactory.validation.attrition import wilson_interval
from counterfactory.validation.calibration.base import sig_down, sig_up
from counterfactory.validation.calibration.corpus_fit import (
    CORPUS_THRESHOLDS,
    METRIC_RESOLUTION,
    PATH_CONFIG_KEY,
    PATH_LOCALITY,
)
from counterfactory.validation.review_stats import cohens_kappa

SCHEMA = "counterfactory.calibration/1"
REPORT_SCHEMA = "counterfactory.review-calibration-report/1"

#: the reason code each corpus threshold gives when it is crossed (the gates' own codes)
REASON_OF: dict[tuple[str, str], str] = {
    ("face", "min_detection_score"): "face_low_confidence",
    ("face", "max_pose_change_deg"): "face_pose_change_above_max",
    ("face", "max_position_change"): "face_position_change_above_max",
    ("face", "max_scale_change"): "face_scale_change_above_max",
    ("identity", "min_cosine"): "identity_below_band",
    ("expression", "max_au_change"): "expression_au_change_above_max",
    ("expression", "max_mean_au_change"): "expression_mean_au_change_above_max",
    ("expression", "max_mouth_corner_change_iod"): "expression_mouth_corner_change_above_max",
    ("expression", "max_brow_change_iod"): "expression_brow_change_above_max",
    ("expression", "max_mouth_open_change_iod"): "expression_mouth_open_change_above_max",
    ("expression", "max_mouth_corner_shift_iod"): "expression_mouth_corner_shift_above_max",
    ("locality", "max_changed_share"): "locality_changed_share_above_max",
    ("locality", "max_global_shift"): "locality_global_shift_above_max",
    ("locality", "max_global_gain_change"): "locality_global_gain_above_max",
    ("locality", "max_body_skin_delta_e"): "locality_body_skin_above_max",
    ("locality", "max_hair_delta_e"): "locality_hair_above_max",
    ("locality", "max_largest_change_share"): "locality_largest_change_above_max",
    ("locality", "max_excess_share"): "locality_excess_share_above_max",
    ("locality", "min_face_change"): "locality_face_unchanged",
}
FITTED_CODES = frozenset(REASON_OF.values())
#: a threshold is fitted only when at least this many accepted and this many rejected
#: candidates (training folds) measured its metric; else the run's value is kept
MIN_PER_LABEL = 5
#: fewer labelled candidates than this: nothing to fit (an error)
MIN_LABELS = 10
#: the interval half-width the "labels needed" figures aim at
TARGET_HALF_WIDTH = 0.05
SWEEPS = 3
#: a move (of one threshold, or of several together) is kept only when it agrees with at least
#: this many more labels: one label, perhaps a reviewer's slip, moves nothing
MIN_GAIN = 2
FOLDS = 5


class ReviewCalibrationError(CounterfactoryError, ValueError):
    """A run that cannot be calibrated from its review: no reviewed items, too few labels or sources."""


# ---------------------------------------------------------------------------------------
# cases


@dataclass
class ReviewedCase:
    """One reviewed candidate: its stored measures and the people's label."""

    attempt_id: str
    source: str
    condition: dict[str, str]
    mode: str  # queue | audit
    random: bool  # in the audit sample's random share
    gate_verdict: str
    codes: list[str]  # stored reasons and review codes
    path: str  # the locality judging path
    metrics: dict[str, float]  # "gate.metric" -> value
    label: str | None  # accepted | rejected | None (a tie)
    votes: list[tuple[str, str, str | None]] = field(default_factory=list)  # (reviewer, decision, reason)
    reason: str | None = None  # the people's most frequent reject reason
    direction: str = ""  # lighter | darker (the face's ITA change)


def _flat_metrics(gates: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for gate, record in (gates or {}).items():
        for key, value in ((record or {}).get("metrics") or {}).items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                continue
            out[f"{gate}.{key}"] = float(value)
    return out


def _codes(gates: Mapping[str, Any], reasons: Sequence[str]) -> list[str]:
    codes = [c.split(":")[0] for c in reasons]
    for record in (gates or {}).values():
        codes += [c for c in (record or {}).get("review") or () if c not in codes]
    return codes


def label_of(votes: Sequence[tuple[str, str, str | None]]) -> tuple[str | None, str | None]:
    """``(label, reason)`` from first votes: the majority (accepted / rejected), None on a tie;
    the most frequent reject reason (the first given among equals)."""
    accepts = sum(d == "accept" for _, d, _ in votes)
    rejects = len(votes) - accepts
    codes = [r for _, d, r in votes if d == "reject" and r]
    reason = max(codes, key=lambda c: (codes.count(c), -codes.index(c))) if codes else None
    if accepts == rejects:
        return None, reason
    return (ACCEPTED if accepts > rejects else REJECTED), reason


def reviewed_cases(
    ledger: Ledger, options: ReviewOptions, items: Sequence[QueueItem] | None = None
) -> list[ReviewedCase]:
    """Every queued candidate with at least one first vote, with its stored measures."""
    items = review_queue(ledger, options) if items is None else items
    voted = [i for i in items if first_votes(i.decisions)]
    candidates = ledger.candidates_by_id([i.attempt_id for i in voted])
    out = []
    for item in voted:
        cand = candidates.get(item.attempt_id)
        if cand is None:
            continue
        votes = [(d.reviewer, d.decision, d.reason) for d in first_votes(item.decisions)]
        label, reason = label_of(votes)
        metrics = _flat_metrics(cand.gates)
        ita = metrics.get("skin.face_ita_change_deg")
        out.append(
            ReviewedCase(
                attempt_id=item.attempt_id,
                source=item.template_id,
                condition=dict(item.condition),
                mode=item.mode,
                random=item.mode == "audit" and bool(item.random),
                gate_verdict=item.verdict,
                codes=_codes(cand.gates, cand.reasons),
                path=str(((cand.gates or {}).get("locality") or {}).get("metrics", {}).get("floor_path") or "request"),
                metrics=metrics,
                label=label,
                votes=votes,
                reason=reason,
                direction="" if ita is None else ("lighter" if ita > 0 else "darker"),
            )
        )
    return out


# ---------------------------------------------------------------------------------------
# thresholds and replay


@dataclass(frozen=True)
class Param:
    """One fitted threshold: ``gate.name`` (locality's per judging path)."""

    gate: str
    name: str
    metric: str
    bound: str  # max | min
    path: str | None  # None: every path

    @property
    def key(self) -> str:
        return f"{self.gate}.{self.name}" + (f"@{self.path}" if self.path else "")


def params() -> list[Param]:
    out = [Param(g, n, m, b, None) for g, n, m, b in CORPUS_THRESHOLDS if g != "locality"]
    for path, rows in PATH_LOCALITY.items():
        out += [Param(g, n, m, b, path) for g, n, m, b in rows]
    return out


def thresholds_of(face_gates: Mapping[str, Any], ps: Sequence[Param]) -> dict[str, float | None]:
    """Each param's value in a calibration's ``suggested["face"]`` (locality per path)."""
    out: dict[str, float | None] = {}
    for p in ps:
        settings = dict(face_gates.get(p.gate) or {})
        if p.path in PATH_CONFIG_KEY:
            settings = dict(settings.get(PATH_CONFIG_KEY[p.path]) or {})
        value = settings.get(p.name)
        out[p.key] = None if value is None else float(value)
    return out


def with_thresholds(face_gates: Mapping[str, Any], values: Mapping[str, float | None], ps: Sequence[Param]):
    """``face_gates`` (a ``suggested["face"]``) with each param set to ``values[param.key]``."""
    out = copy.deepcopy(dict(face_gates))
    for p in ps:
        gate = out.setdefault(p.gate, {})
        if p.path in PATH_CONFIG_KEY:
            gate = gate.setdefault(PATH_CONFIG_KEY[p.path], {})
        gate[p.name] = values[p.key]
    return out


class Replay:
    """The cases' measures as arrays: verdicts under any thresholds without the gates."""

    def __init__(self, cases: Sequence[ReviewedCase], ps: Sequence[Param]) -> None:
        self.params = list(ps)
        n = len(cases)
        #: a code no fitted threshold gives (registration, face count, skin): not accepted
        self.fixed = np.array([any(c not in FITTED_CODES for c in case.codes) for case in cases], bool)
        self.failed = np.array([case.gate_verdict == FAILED for case in cases], bool)
        self.values = np.full((len(ps), n), np.nan)
        for j, p in enumerate(ps):
            for i, case in enumerate(cases):
                if p.path is not None and case.path != p.path:
                    continue
                v = case.metrics.get(p.metric)
                if v is not None:
                    self.values[j, i] = v

    def violations(self, j: int, value: float | None) -> np.ndarray:
        v = self.values[j]
        if value is None:
            return np.zeros(v.shape, bool)
        with np.errstate(invalid="ignore"):
            return (v > value) if self.params[j].bound == "max" else (v < value)

    def accepted(self, values: Mapping[str, float | None]) -> np.ndarray:
        out = ~(self.fixed | self.failed)
        for j, p in enumerate(self.params):
            out &= ~self.violations(j, values[p.key])
        return out


def _candidates(p: Param, v: np.ndarray, current: float | None) -> list[float | None]:
    """Thresholds worth trying: between each two measured values, rounded outward as corpus_fit
    rounds (and never finer than the metric's resolution), and the current value."""
    v = np.unique(v[np.isfinite(v)])
    if v.size == 0:
        return [current]
    if v.size > 400:
        v = np.unique(np.quantile(v, np.linspace(0, 1, 400)))
    mids = np.concatenate([[v[0] - abs(v[0]) * 0.5 - 1e-9], (v[:-1] + v[1:]) / 2, [v[-1] + abs(v[-1]) * 0.5 + 1e-9]])
    out: set[float] = set()
    for m in mids:
        if p.bound == "max":
            if m <= 0:
                continue
            out.add(sig_up(max(float(m), METRIC_RESOLUTION.get(p.metric, 0.0))))
        else:
            out.add(sig_down(float(m)) if m > 0 else round(float(m), 10))
    return [current, *sorted(out)]


def fit(
    cases: Sequence[ReviewedCase], base: Mapping[str, float | None], ps: Sequence[Param]
) -> tuple[dict[str, float | None], dict[str, dict[str, Any]]]:
    """Thresholds agreeing most often with the labels of ``cases`` (see the module docstring).

    Returns ``(values by param key, {key: {"from": "review" | "run", "why", ...}})``."""
    labelled = [c for c in cases if c.label is not None]
    replay = Replay(labelled, ps)
    y = np.array([c.label == ACCEPTED for c in labelled], bool)
    values = dict(base)
    origin: dict[str, dict[str, Any]] = {}
    fittable = []
    for j, p in enumerate(ps):
        measured = np.isfinite(replay.values[j])
        n_acc, n_rej = int((measured & y).sum()), int((measured & ~y).sum())
        if min(n_acc, n_rej) < MIN_PER_LABEL:
            origin[p.key] = {
                "from": "run",
                "why": f"too few labels: {n_acc} accepted and {n_rej} rejected measured it (needs {MIN_PER_LABEL} of each)",
            }
        else:
            fittable.append(j)
            origin[p.key] = {"from": "review", "accepted": n_acc, "rejected": n_rej}
    base_ok = ~(replay.fixed | replay.failed)
    for _ in range(SWEEPS):
        changed = False
        for j in fittable:
            p = ps[j]
            others = base_ok.copy()
            for k, q in enumerate(ps):
                if k != j:
                    others &= ~replay.violations(k, values[q.key])
            current = int(((others & ~replay.violations(j, values[p.key])) == y).sum())
            best, best_hits, best_dist = values[p.key], -1, math.inf
            for t in _candidates(p, replay.values[j], values[p.key]):
                pred = others & ~replay.violations(j, t)
                hits = int((pred == y).sum())
                dist = _distance(t, base[p.key])
                if hits > best_hits or (hits == best_hits and dist < best_dist):
                    best, best_hits, best_dist = t, hits, dist
            if best != values[p.key] and (best_hits >= current + MIN_GAIN or best_hits == current):
                values[p.key] = best
                changed = True
        changed |= _rescue(replay, y, values, fittable, base_ok)
        if not changed:
            break
    for j in fittable:
        key = ps[j].key
        origin[key]["run_value"] = base[key]
        origin[key]["value"] = values[key]
    return values, origin


def _rescue(replay: Replay, y: np.ndarray, values: dict[str, float | None], fittable: Sequence[int], ok) -> bool:
    """Joint moves: an item people accepted that several fitted thresholds reject (a change the
    lab allows that moves several measures at once) is passed by moving all of them just past
    its measures together, kept only when agreement rises; one threshold at a time could not
    (no single move changes a verdict). Items with the fewest such thresholds are tried first."""
    ps = replay.params
    fit = set(fittable)
    changed = False
    viol = {j: replay.violations(j, values[ps[j].key]) for j in range(len(ps))}
    pred = ok.copy()
    for v in viol.values():
        pred &= ~v
    hits = int((pred == y).sum())
    blocked = [i for i in np.flatnonzero(y & ~pred & ok)]
    blocked.sort(key=lambda i: sum(bool(viol[j][i]) for j in viol))
    for i in blocked:
        by = [j for j in viol if viol[j][i]]
        if not by or any(j not in fit for j in by):
            continue  # a threshold kept from the run (too few labels) holds it: not moved
        trial = dict(values)
        for j in by:
            v = float(replay.values[j, i])
            p = ps[j]
            if p.bound == "max":
                trial[p.key] = sig_up(max(v * 1.001, METRIC_RESOLUTION.get(p.metric, 0.0)))
            else:
                trial[p.key] = sig_down(v * 0.999) if v > 0 else round(v - abs(v) * 0.001, 10)
        new_pred = replay.accepted(trial)
        new_hits = int((new_pred == y).sum())
        if new_hits >= hits + MIN_GAIN:
            values.update(trial)
            hits, changed = new_hits, True
            for j in by:
                viol[j] = replay.violations(j, values[ps[j].key])
    return changed


def _distance(t: float | None, ref: float | None) -> float:
    if t is None or ref is None:
        return 0.0 if t == ref else math.inf
    return abs(t - ref) / max(abs(ref), 1e-12)


def folds(sources: Iterable[str], k: int = FOLDS) -> dict[str, int]:
    """Each source's fold: sources ordered by the sha256 of their id, dealt round-robin."""
    ordered = sorted(set(sources), key=lambda s: hashlib.sha256(s.encode()).hexdigest())
    k = max(1, min(k, len(ordered)))
    return {s: i % k for i, s in enumerate(ordered)}


# ---------------------------------------------------------------------------------------
# figures


def rate(hits: int, n: int) -> dict[str, Any]:
    """A share with its Wilson 95 % interval and how many more labels bring the interval's
    half-width to :data:`TARGET_HALF_WIDTH` at the same share."""
    low, high = wilson_interval(hits, n)
    out: dict[str, Any] = {"n": n, "hits": hits, "rate": round(hits / n, 4) if n else None}
    out["ci_low"] = None if low is None else round(low, 4)
    out["ci_high"] = None if high is None else round(high, 4)
    out["more_labels_for_5_points"] = more_labels(hits, n)
    return out


def more_labels(hits: int, n: int, half_width: float = TARGET_HALF_WIDTH, z: float = 1.959964) -> int | None:
    """Labels beyond ``n`` at which the Wilson 95 % interval of the same share ``hits / n`` is
    at most ``+-half_width`` wide (its half-width ``z / (1 + z^2/m) * sqrt(p (1 - p) / m +
    z^2 / (4 m^2))`` falls with ``m``; the smallest such ``m`` by bisection). None for ``n = 0``."""
    if n == 0:
        return None
    p = hits / n

    def half(m: int) -> float:
        return z / (1 + z * z / m) * math.sqrt(p * (1 - p) / m + z * z / (4 * m * m))

    lo, hi = 1, 1
    while half(hi) > half_width:
        hi *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        if half(mid) <= half_width:
            hi = mid
        else:
            lo = mid + 1
    return max(0, lo - n)


def agreement_figures(pred: Sequence[bool], cases: Sequence[ReviewedCase]) -> dict[str, Any]:
    """Agreement of gate verdicts (``pred``: accepted or not) with the people's labels: overall,
    Cohen's kappa, false rejects (people accepted, gates did not) and missed failures."""
    pairs = [(bool(p), c.label == ACCEPTED) for p, c in zip(pred, cases, strict=True)]
    kappa = cohens_kappa(pairs)
    people_acc = [p for p, y in pairs if y]
    people_rej = [p for p, y in pairs if not y]
    return {
        "agreement": rate(sum(p == y for p, y in pairs), len(pairs)),
        "kappa": None if kappa is None else round(kappa, 4),
        "accepted_of_people_accepted": rate(sum(people_acc), len(people_acc)),
        "false_reject": rate(sum(not p for p in people_acc), len(people_acc)),
        "missed_failure": rate(sum(people_rej), len(people_rej)),
    }


def _groups(case: ReviewedCase) -> list[str]:
    return [f"{axis}={value}" for axis, value in sorted(case.condition.items())]


def held_out_figures(pred: np.ndarray, cases: Sequence[ReviewedCase]) -> dict[str, Any]:
    """Agreement, per group and direction (largest gaps), catch per people's reason."""
    out = agreement_figures(list(pred), cases)
    by_group: dict[str, Any] = {}
    for g in sorted({g for c in cases for g in _groups(c)}):
        idx = [i for i, c in enumerate(cases) if g in _groups(c)]
        by_group[g] = agreement_figures([pred[i] for i in idx], [cases[i] for i in idx])
    out["by_group"] = by_group
    by_direction: dict[str, Any] = {}
    for d in ("lighter", "darker"):
        idx = [i for i, c in enumerate(cases) if c.direction == d and c.label == ACCEPTED]
        if idx:
            by_direction[d] = rate(int(sum(pred[i] for i in idx)), len(idx))
    out["accepted_of_people_accepted_by_direction"] = by_direction
    # groups of one axis against each other (race=Black vs race=White), the largest over the axes
    axes = sorted({g.split("=", 1)[0] for g in by_group})
    out["largest_group_gap"] = {
        key: max(
            (
                gap
                for axis in axes
                if (gap := _gap({g: v[key]["rate"] for g, v in by_group.items() if g.startswith(f"{axis}=")}))
            ),
            key=lambda gap: gap["gap"],
            default=None,
        )
        for key in ("agreement", "accepted_of_people_accepted")
    }
    out["largest_direction_gap"] = _gap({d: v["rate"] for d, v in by_direction.items()})
    caught: dict[str, Any] = {}
    for reason in sorted({c.reason or "unspecified" for c in cases if c.label == REJECTED}):
        idx = [i for i, c in enumerate(cases) if c.label == REJECTED and (c.reason or "unspecified") == reason]
        caught[reason] = rate(int(sum(not pred[i] for i in idx)), len(idx))
    out["caught_by_reason"] = caught
    return out


def _gap(rates: Mapping[str, float | None]) -> dict[str, Any] | None:
    known = {k: v for k, v in rates.items() if v is not None}
    if len(known) < 2:
        return None
    ordered = sorted(known, key=lambda k: (known[k], k))
    lo, hi = ordered[0], ordered[-1]
    return {"gap": round(known[hi] - known[lo], 4), "highest": hi, "lowest": lo}


def reviewer_agreement(cases: Sequence[ReviewedCase], gate_pred: Mapping[str, bool] | None = None) -> dict[str, Any]:
    """Cohen's kappa of reviewers with each other (the first two first votes of items several
    voted on), and of the gates (``gate_pred`` by attempt id) with each reviewer."""
    pairs = [(c.votes[0][1] == "accept", c.votes[1][1] == "accept") for c in cases if len(c.votes) >= 2]
    kappa = cohens_kappa(pairs)
    out: dict[str, Any] = {
        "items_with_several_votes": len(pairs),
        "reviewers_kappa": None if kappa is None else round(kappa, 4),
        "reviewers_agreement": rate(sum(a == b for a, b in pairs), len(pairs)) if pairs else None,
    }
    if gate_pred is not None:
        per: dict[str, Any] = {}
        for name in sorted({r for c in cases for r, _, _ in c.votes}):
            mine = [
                (gate_pred[c.attempt_id], d == "accept")
                for c in cases
                if c.attempt_id in gate_pred
                for r, d, _ in c.votes
                if r == name
            ]
            k = cohens_kappa(mine)
            per[name] = {"n": len(mine), "gates_kappa": None if k is None else round(k, 4)}
        out["gates_kappa_with_each_reviewer"] = per
    return out


# ---------------------------------------------------------------------------------------
# the whole step


def calibrate_from_review(
    ledger: Ledger,
    options: ReviewOptions,
    base_calibration: Mapping[str, Any],
    *,
    run_face_gates: Mapping[str, Any] | None = None,
    provenance: Mapping[str, Any] | None = None,
    k: int = FOLDS,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fit the face-edit thresholds from the run's review.

    Args:
        ledger, options: the run's ledger and its spec's ``review`` section.
        base_calibration: the calibration the run judged with (its ``suggested`` section is
            the start and what is kept where labels are too few).
        run_face_gates: the face gates the run judged with (a spec may override some of the
            calibration's values); ``base_calibration["suggested"]["face"]`` by default.
        provenance: what the calibration records about where it came from (run, editor
            lineage); reviewers and label counts are added here.

    Returns: ``(calibration, report)``, both JSON-ready; the calibration loads as a spec's
    ``gates.calibration``.

    Raises:
        ReviewCalibrationError: no reviewed items, fewer than :data:`MIN_LABELS` labels, or
            fewer than two sources.
    """
    cases = reviewed_cases(ledger, options)
    if not cases:
        raise ReviewCalibrationError(
            "no reviewed items in this run: review its queue first (`counterfactory review serve RUN_DIR`)"
        )
    labelled = [c for c in cases if c.label is not None]
    ties = [c for c in cases if c.label is None]
    if len(labelled) < MIN_LABELS:
        raise ReviewCalibrationError(
            f"too few labels: {len(labelled)} reviewed item(s) with a majority vote ({len(ties)} tied); "
            f"at least {MIN_LABELS} are needed; review more of the queue (raise review.audit_accepted_rate "
            "and review.audit_rejected_rate for a larger audit sample)"
        )
    sources = {c.source for c in labelled}
    if len(sources) < 2:
        raise ReviewCalibrationError(
            f"the reviewed items come from {len(sources)} source; at least 2 are needed to hold sources out"
        )
    suggested = copy.deepcopy(dict(base_calibration.get("suggested") or {}))
    if "face" not in suggested:
        raise ReviewCalibrationError("the base calibration has no face thresholds (suggested.face)")
    run_gates = copy.deepcopy(dict(run_face_gates or suggested["face"]))
    ps = params()
    base = thresholds_of(run_gates, ps)
    replay_all = Replay(labelled, ps)
    stored_accepted = np.array([c.gate_verdict == ACCEPTED for c in labelled], bool)
    replay_matches = int((replay_all.accepted(base) == stored_accepted).sum())

    fold_of = folds(sources, k)
    held = np.zeros(len(labelled), bool)
    for f in sorted(set(fold_of.values())):
        train = [c for c in labelled if fold_of[c.source] != f]
        values, _ = fit(train, base, ps)
        idx = [i for i, c in enumerate(labelled) if fold_of[c.source] == f]
        pred = Replay([labelled[i] for i in idx], ps).accepted(values)
        held[idx] = pred
    final, origin = fit(labelled, base, ps)

    random_idx = [i for i, c in enumerate(labelled) if c.random]
    rcases = [labelled[i] for i in random_idx]
    report_random = held_out_figures(held[random_idx], rcases) if rcases else None
    run_random = agreement_figures([bool(stored_accepted[i]) for i in random_idx], rcases) if rcases else None
    gate_pred = {labelled[i].attempt_id: bool(held[i]) for i in random_idx}

    reviewers: dict[str, int] = {}
    for c in cases:
        for name, _, _ in c.votes:
            reviewers[name] = reviewers.get(name, 0) + 1
    labels = {
        "reviewed_items": len(cases),
        "labelled": len(labelled),
        "accepted": sum(c.label == ACCEPTED for c in labelled),
        "rejected": sum(c.label == REJECTED for c in labelled),
        "ties": len(ties),
        "random_share": len(rcases),
        "sources": len(sources),
        "folds": len(set(fold_of.values())),
    }
    face = with_thresholds(suggested["face"], final, ps)
    suggested["face"] = face
    created = _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()
    record = {
        **dict(provenance or {}),
        "reviewers": dict(sorted(reviewers.items())),
        "labels": labels,
        "base_calibration_sha256": base_calibration.get("_sha256"),
    }
    calibration = {
        "schema": SCHEMA,
        "created": created,
        "rerun": "counterfactory calibrate --from-review RUN_DIR --out DIR",
        "suggested": suggested,
        "from_review": {
            "rule": (
                "each corpus threshold (locality's per judging path) moved to the value agreeing most often with the "
                "majority of reviewers' first votes, one threshold at a time from the run's thresholds (those rejecting "
                "one people-accepted item moved together when that raises agreement), rounded outward "
                f"to 2 significant digits and never finer than the metric's resolution; fewer than {MIN_PER_LABEL} "
                "accepted or rejected labels measuring a metric: the run's value kept"
            ),
            "thresholds": {
                key: {**info, "value": final[key]} if info["from"] == "run" else info for key, info in origin.items()
            },
            "provenance": record,
        },
    }
    report = {
        "schema": REPORT_SCHEMA,
        "created": created,
        "provenance": record,
        "labels": labels,
        "replay_matches": {"n": len(labelled), "matching_stored_verdicts": replay_matches},
        "held_out_random": report_random,
        "run_thresholds_random": run_random,
        "reviewers": reviewer_agreement(cases, gate_pred),
        "thresholds": calibration["from_review"]["thresholds"],
        "ties": [{"attempt_id": c.attempt_id, "votes": [list(v) for v in c.votes]} for c in ties],
    }
    return calibration, report


def report_lines(report: Mapping[str, Any]) -> list[str]:
    """The report as the command prints it."""
    lab = report["labels"]
    lines = [
        f"labels: {lab['labelled']} reviewed items with a majority of first votes ({lab['accepted']} accepted, "
        f"{lab['rejected']} rejected; {lab['ties']} tied, left out) over {lab['sources']} sources in "
        f"{lab['folds']} folds; random share of the audit sample: {lab['random_share']}",
        f"replayed with the run's thresholds: {report['replay_matches']['matching_stored_verdicts']} of "
        f"{report['replay_matches']['n']} stored verdicts reproduced",
    ]
    fig = report.get("held_out_random")
    if fig is None:
        lines.append("held-out agreement: no reviewed item of the random share (no audit sample was reviewed)")
    else:
        lines.append("held out by source, random share of the audit sample (fitted thresholds vs the people):")
        lines.append(f"  agreement {_ci(fig['agreement'])}; Cohen's kappa {_num(fig['kappa'])}")
        lines.append(
            f"  people-accepted items accepted {_ci(fig['accepted_of_people_accepted'])}; "
            f"false rejects {_ci(fig['false_reject'])}; missed failures {_ci(fig['missed_failure'])}"
        )
        run = report.get("run_thresholds_random")
        if run:
            lines.append(
                f"  the run's own thresholds on the same items: agreement {_ci(run['agreement'])}; "
                f"kappa {_num(run['kappa'])}"
            )
        for g, v in fig["by_group"].items():
            lines.append(
                f"  group {g}: agreement {_ci(v['agreement'])}; false rejects {_ci(v['false_reject'])}; "
                f"missed failures {_ci(v['missed_failure'])}"
            )
        gaps = fig["largest_group_gap"]
        for key, gap in gaps.items():
            if gap:
                lines.append(
                    f"  largest gap between groups in {key}: {gap['gap']:.1%} ({gap['highest']} vs {gap['lowest']})"
                )
        for d, v in fig["accepted_of_people_accepted_by_direction"].items():
            lines.append(f"  direction {d}: people-accepted items accepted {_ci(v)}")
        if fig["largest_direction_gap"]:
            gap = fig["largest_direction_gap"]
            lines.append(f"  largest gap between directions: {gap['gap']:.1%}")
        for reason, v in fig["caught_by_reason"].items():
            lines.append(f"  caught, people's reason {reason}: {_ci(v)}")
    rev = report["reviewers"]
    if rev["items_with_several_votes"]:
        lines.append(
            f"reviewers with each other: kappa {_num(rev['reviewers_kappa'])} on {rev['items_with_several_votes']} "
            "items several voted on"
        )
    for name, v in (rev.get("gates_kappa_with_each_reviewer") or {}).items():
        lines.append(f"gates (held out) with reviewer {name}: kappa {_num(v['gates_kappa'])} (n={v['n']})")
    moved = {k: v for k, v in report["thresholds"].items() if v["from"] == "review" and v["value"] != v["run_value"]}
    kept = sum(v["from"] == "run" for v in report["thresholds"].values())
    lines.append(
        f"thresholds: {len(report['thresholds']) - kept} fitted from the review ({len(moved)} moved), "
        f"{kept} kept from the run (too few labels)"
    )
    for key, v in moved.items():
        lines.append(f"  {key}: {v['run_value']} -> {v['value']}")
    return lines


def _ci(r: Mapping[str, Any] | None) -> str:
    if not r or r.get("rate") is None:
        return "n/a (n=0)"
    more = r.get("more_labels_for_5_points")
    extra = f"; +{more} labels for +-5 points" if more else ""
    return f"{r['rate']:.1%} [{r['ci_low']:.1%}, {r['ci_high']:.1%}] (n={r['n']}{extra})"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"
