"""Which judged candidates the review queue's audit sample holds: a random share, and, with
uncertainty sampling, candidates whose measures lie near a threshold.

The random share is drawn by a hash of ``(purpose, seed, attempt id)`` at the verdict's rate
(:func:`sampled`): the same in every process and re-run, whatever order candidates were judged
in. Uncertainty sampling (``review.audit_near_threshold``) adds the ``accepted`` and
``rejected`` candidates whose nearest measure lies within that relative distance of its
threshold (:func:`threshold_margin`, read from the candidate's own gate record), each marked
``random: false`` so that agreement is measured on the random share only; it too is decided per
candidate, never by ranking the others.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

from counterfactory.manifests.vocabulary import ACCEPTED, NEEDS_REVIEW, REJECTED


def sampled(purpose: str, seed: int, attempt_id: str, rate: float) -> bool:
    """Whether ``attempt_id`` is in the ``purpose`` sample at ``rate`` (deterministic, uniform)."""
    if rate <= 0.0:
        return False
    digest = hashlib.sha256(f"{purpose}:{seed}:{attempt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < rate


def in_random_audit(options: Any, attempt_id: str, verdict: str) -> bool:
    """(``options``: the spec's ``review`` section, a ``ReviewOptions``.) Whether an ``accepted`` or ``rejected`` candidate is in the audit sample's random share."""
    rate = {ACCEPTED: options.audit_accepted_rate, REJECTED: options.audit_rejected_rate}.get(verdict, 0.0)
    return sampled(f"audit-{verdict}", options.seed, attempt_id, rate)


#: threshold names whose metric is not the name without its ``max_`` / ``min_``
_METRIC_OF = {"max_au_change": "au_change_max", "max_mean_au_change": "au_change_mean"}


def threshold_margin(gates: Mapping[str, Any] | None) -> float | None:
    """How near a candidate's measures lie to its thresholds: the smallest ``|ln(value /
    threshold)|`` over every ``max_X`` / ``min_X`` threshold a gate record holds and its
    metric ``X`` (judged above a floor: ``X_above_floor``); None when no pair is positive."""
    best: float | None = None
    for record in (gates or {}).values():
        if not isinstance(record, Mapping):
            continue
        metrics = record.get("metrics") or {}
        for name, bound in (record.get("thresholds") or {}).items():
            if not name.startswith(("max_", "min_")) or isinstance(bound, bool) or not isinstance(bound, int | float):
                continue
            metric = _METRIC_OF.get(name, name[4:])
            value = metrics.get(f"{metric}_above_floor", metrics.get(metric))
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0 or bound <= 0:
                continue
            margin = abs(math.log(value / bound))
            best = margin if best is None else min(best, margin)
    return best


def audit_mode(options: Any, attempt_id: str, verdict: str, gates: Mapping[str, Any] | None = None):
    """``(mode, random)``: ``("queue", None)`` for ``needs_review``; ``("audit", True)`` in the
    random audit sample; ``("audit", False)`` drawn for lying near a threshold
    (``audit_near_threshold``); ``(None, None)`` outside the queue."""
    if verdict == NEEDS_REVIEW:
        return "queue", None
    if verdict not in (ACCEPTED, REJECTED):
        return None, None
    if in_random_audit(options, attempt_id, verdict):
        return "audit", True
    near = options.audit_near_threshold
    if near is not None and sampled("audit-near", options.seed, attempt_id, options.audit_near_threshold_rate):
        margin = threshold_margin(gates)
        if margin is not None and margin <= near:
            return "audit", False
    return None, None
