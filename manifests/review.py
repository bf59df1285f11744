"""Human review: reviewers, their append-only decisions, and what the decisions mean.

The queue is every ``needs_review`` candidate plus a random audit sample of ``accepted`` and
``rejected`` ones (rates in the spec's ``review:`` section, :class:`ReviewOptions`), so that the
gates' error rates can be measured. A candidate is in the audit sample when a hash of
``(purpose, seed, attempt id)`` falls below the rate: the sample is the same in every process
and every re-run, and it never depends on the order candidates were judged in.

The rule (``resolve``). Only ``accept`` and ``reject`` decisions count (``skip`` is recorded
and ignored), and each reviewer counts once: their *standing* vote is their first accept or
reject that no later ``undo`` of theirs withdrew. An item needs ``required`` matching
standing votes from distinct reviewers: 1, or 2 for the double-review sample. It is *resolved*
when one outcome has at least ``required`` votes and more votes than the other; while the votes
are tied (two reviewers disagree) it is *disputed* and goes back into the queue, flagged, for a
third reviewer, whose vote breaks the tie. A resolved item is closed.

Every decision answers one view of the item: ``seen`` is the number of votes (accepts,
rejects and undos) the item had when the reviewer's page was served, carried in a ticket the
site signs. A decision whose view is stale (someone voted since) is refused with 409, and the
database refuses it too: each vote takes position ``seq = seen`` among the item's votes, and
``(attempt_id, seq)`` is unique, as is ``(attempt_id, ballot)`` with one ballot per reviewer and
round (:mod:`~counterfactory.manifests.migrations` revision 0004). A double click, a key burst
or ten posts of one view therefore store one vote, whatever reaches the server first.

``undo`` withdraws the reviewer's standing vote on an item, recorded as a new row (the table
is append-only); it answers the view the vote returned, so it is refused once anyone else has
voted since. The reviewer may then vote again.

A resolved review is the candidate's effective verdict; publishing puts the whole history
into the item's manifest row (:func:`review_records`). A review never triggers an editor call:
a person rejecting a ``needs_review`` candidate ends the cell ``rejected``.
"""

from __future__ import annotations

import hashlib
import secrets
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from counterfactory.manifests.audit_sample import audit_mode, sampled
from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.ledger import (
    AttemptRow,
    CandidateRow,
    DecisionRow,
    Ledger,
    ReviewerRow,
    SpotDealRow,
    SpotTrialRow,
)
from counterfactory.manifests.lifecycle import Settled, attempt_pending, fill_cells
from counterfactory.manifests.vocabulary import (
    ACCEPTED,
    DECISIONS,
    FAILED,
    FILLING_VERDICTS,
    NEEDS_REVIEW,
    OUTCOME,
    REJECTED,
)

#: reject reason codes, with the label the review page shows
REASONS: dict[str, str] = {
    "artifact": "artifact",
    "face_deformation": "face deformation",
    "identity_drift": "identity drift",
    "expression_drift": "expression drift",
    "skin_tone_shift": "skin-tone shift",
    "wrong_group": "wrong group",
    "off_mask_change": "off-mask change",
    "other": "other (say what)",
}


class ReviewOptions(BaseModel):
    """``review``: which candidates people see, and how many look at each."""

    model_config = ConfigDict(extra="forbid")

    #: fraction of ``accepted`` candidates drawn into the audit sample
    audit_accepted_rate: float = Field(0.1, ge=0.0, le=1.0)
    #: fraction of ``rejected`` candidates drawn into the audit sample
    audit_rejected_rate: float = Field(0.1, ge=0.0, le=1.0)
    #: fraction of queued items that need two independent decisions (Cohen's kappa is measured on them)
    double_review_rate: float = Field(0.0, ge=0.0, le=1.0)
    #: uncertainty sampling: an ``accepted`` or ``rejected`` candidate outside the random audit
    #: sample whose measure lies within this relative distance of one of its thresholds
    #: (:func:`threshold_margin`: ``|ln(value / threshold)|``, 0.2 is about 20 %) is audited
    #: too, marked ``random: false``: the decisions teach the most there. Agreement figures
    #: (``calibrate --from-review``) use the random share only. None: off.
    audit_near_threshold: float | None = Field(None, gt=0.0, le=10.0)
    #: of the candidates near a threshold, the fraction drawn into the audit sample (by hash)
    audit_near_threshold_rate: float = Field(1.0, ge=0.0, le=1.0)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    #: blinded spot-the-edit: a click within this many pixels of the edit mask counts as localised
    spot_dilate_px: int = Field(24, ge=0, le=16_384)


class ReviewError(CounterfactoryError, ValueError):
    """A decision that cannot be recorded; ``status`` is the HTTP status it maps to."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def parse_cell_id(cell_id: str) -> tuple[str, dict[str, str]]:
    """``"biden|race=Black|gender=male"`` -> ``("biden", {"race": "Black", "gender": "male"})``.

    The editor label a spec comparing ``editors`` appends (``|editor=<label>``) is not part of
    the condition (reviewers see the condition, not which editor made the image)."""
    source_id, *parts = cell_id.split("|")
    pairs = (part.split("=", 1) for part in parts if "=" in part)
    return source_id, {k: v for k, v in pairs if k != "editor"}


# reviewers ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reviewer:
    reviewer_id: int
    name: str


#: letters of other scripts that look like Latin ones (Unicode's confusables for these scripts,
#: TR39), upper and lower case: a name's skeleton maps them to the Latin letter they pass for
_LOOKALIKES = str.maketrans(
    "АВЕКМНОРСТХУІЈЅԚԜҮаеорсухіјѕԁһԛԝӏүвкмнтΑΒΕΖΗΙΚΜΝΟΡΤΥΧαοριυνκχ",
    "ABEKMHOPCTXYIJSQWYaeopcyxijsdhqwlybkmhtABEZHIKMNOPTYXaopiuvkx",
)
#: scripts whose letters are told apart from Latin ones only by their code points
_SCRIPTS = ("LATIN", "CYRILLIC", "GREEK")


def reviewer_name(name: str) -> str:
    """``name`` as the ledger stores it: NFKC-normalised, surrounding spaces removed.

    Raises:
        ReviewError: empty or over 200 characters; a control, format (bidirectional overrides,
            zero-width) or separator character other than a space; letters of two scripts
            that look alike (Latin with Cyrillic or Greek, as in ``аlice`` with a Cyrillic а).
    """
    name = unicodedata.normalize("NFKC", name).strip()
    if not name or len(name) > 200:
        raise ReviewError("a reviewer name is 1 to 200 characters")
    for ch in name:
        category = unicodedata.category(ch)
        if category[0] == "C" or (category[0] == "Z" and ch != " "):
            raise ReviewError(
                f"a reviewer name has no control, invisible or direction-changing characters; {name!r} has "
                f"U+{ord(ch):04X} ({unicodedata.name(ch, 'unnamed')})"
            )
    scripts = {unicodedata.name(ch, "").split(" ", 1)[0] for ch in name if ch.isalpha()} & set(_SCRIPTS)
    if len(scripts) > 1:
        raise ReviewError(
            f"reviewer name {name!r} mixes {' and '.join(sorted(s.title() for s in scripts))} letters, which look "
            "alike; write it in one script"
        )
    return name


def name_key(name: str) -> str:
    """What two reviewer names must not share: the NFKC form case-folded, with letters that
    pass for Latin ones mapped to them (so ``ALICE``, ``alice`` and ``аlice`` share one)."""
    return unicodedata.normalize("NFKC", name).translate(_LOOKALIKES).casefold().translate(_LOOKALIKES)


def add_reviewer(ledger: Ledger, name: str) -> str:
    """Register ``name`` (:func:`reviewer_name`) and return their new token (shown once; the
    ledger keeps its sha256).

    Raises:
        ReviewError: a name :func:`reviewer_name` refuses; 409 when it is confusable with an
            existing reviewer's (same :func:`name_key`).
    """
    name = reviewer_name(name)
    key = name_key(name)
    token = secrets.token_urlsafe(32)
    with ledger.session() as s, s.begin():
        for existing in s.scalars(select(ReviewerRow.name)):
            if name_key(existing) == key:
                same = (
                    "already exists" if existing == name else f"is confusable with the existing reviewer {existing!r}"
                )
                raise ReviewError(f"reviewer {name!r} {same}; choose another name", status=409)
        s.add(ReviewerRow(name=name, token_sha256=hash_token(token)))
    return token


def reviewer_for_token(ledger: Ledger, token: str | None) -> Reviewer | None:
    if not token:
        return None
    with ledger.session() as s:
        row = s.scalar(select(ReviewerRow).where(ReviewerRow.token_sha256 == hash_token(token)))
        return Reviewer(row.reviewer_id, row.name) if row is not None and row.revoked_at is None else None


# the rule -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Decision:
    decision_id: int
    reviewer: str
    reviewer_id: int
    mode: str
    decision: str
    reason: str | None
    note: str | None
    seen: int
    decided_at: datetime
    #: position among the item's votes (accept, reject, undo); None for a skip or a row
    #: written before revision 0004
    seq: int | None = None

    def record(self) -> dict[str, Any]:
        return {
            "reviewer": self.reviewer,
            "mode": self.mode,
            "decision": self.decision,
            "reason": self.reason,
            "note": self.note,
            "decided_at": self.decided_at.isoformat(),
        }


@dataclass(frozen=True)
class Resolution:
    """``state`` open | disputed | resolved; ``outcome`` accepted | rejected when resolved.

    ``votes`` counts standing votes (one per reviewer); ``events`` counts every accept,
    reject and undo row: the ``seen`` a fresh view of the item carries.
    """

    state: str
    outcome: str | None
    reason: str | None
    votes: int
    events: int = 0


def counts_as_event(decision: str) -> bool:
    return decision in OUTCOME or decision == "undo"


def standing_votes(decisions: Sequence[Decision]) -> list[Decision]:
    """Each reviewer's standing vote, in the order they were made: their first accept or reject
    not withdrawn by a later undo of theirs. A second vote by one reviewer (possible only in
    ledgers written before revision 0004) does not count."""
    standing: dict[int, Decision] = {}
    for d in decisions:
        if d.decision in OUTCOME:
            standing.setdefault(d.reviewer_id, d)
        elif d.decision == "undo":
            standing.pop(d.reviewer_id, None)
    return sorted(standing.values(), key=lambda d: d.decision_id)


def first_votes(decisions: Sequence[Decision]) -> list[Decision]:
    """Each reviewer's first accept or reject, whatever they did after: an undo withdraws a
    vote from the item's resolution, not from what the reviewer said before any gate verdict
    was shown to them (the audit sample's override rates count these)."""
    first: dict[int, Decision] = {}
    for d in decisions:
        if d.decision in OUTCOME:
            first.setdefault(d.reviewer_id, d)
    return sorted(first.values(), key=lambda d: d.decision_id)


def resolve(decisions: Sequence[Decision], required: int) -> Resolution:
    """Apply the review rule (module docstring) to decisions in the order they were made."""
    events = sum(counts_as_event(d.decision) for d in decisions)
    votes = standing_votes(decisions)
    accepts = sum(d.decision == "accept" for d in votes)
    rejects = len(votes) - accepts
    if max(accepts, rejects) >= required and accepts != rejects:
        outcome = ACCEPTED if accepts > rejects else REJECTED
        reason = None
        if outcome == REJECTED:
            codes = [d.reason for d in votes if d.decision == "reject" and d.reason]
            # the most frequent reason; among equals the first one given
            reason = max(codes, key=lambda c: (codes.count(c), -codes.index(c))) if codes else None
        return Resolution("resolved", outcome, reason, len(votes), events)
    if accepts and rejects:
        return Resolution("disputed", None, None, len(votes), events)
    return Resolution("open", None, None, len(votes), events)


# the queue ----------------------------------------------------------------------------------
@dataclass
class QueueItem:
    """One candidate people review, with its decisions so far."""

    attempt_id: str
    cell_id: str
    template_id: str
    condition: dict[str, str]
    attempt_no: int
    final: bool
    verdict: str
    reasons: list[str]
    gates: dict
    image_sha256: str
    mode: str
    required: int
    decisions: list[Decision] = field(default_factory=list)
    #: an audit item: True when drawn into the random share, False when drawn for lying near a
    #: threshold (``audit_near_threshold``); None for a ``needs_review`` item
    random: bool | None = None

    @property
    def resolution(self) -> Resolution:
        return resolve(self.decisions, self.required)

    @property
    def first_resolution(self) -> Resolution:
        """The rule applied to each reviewer's first vote (:func:`first_votes`)."""
        return resolve(first_votes(self.decisions), self.required)

    def decided_by(self, reviewer_id: int) -> bool:
        """Whether the reviewer has a standing vote on the item."""
        return any(d.reviewer_id == reviewer_id for d in standing_votes(self.decisions))

    def skipped_by(self, reviewer_id: int) -> bool:
        return any(d.reviewer_id == reviewer_id and d.decision == "skip" for d in self.decisions)


def _decisions(session, attempt_ids: Iterable[str] | None = None) -> dict[str, list[Decision]]:
    q = (
        select(DecisionRow, ReviewerRow.name)
        .join(ReviewerRow, ReviewerRow.reviewer_id == DecisionRow.reviewer_id)
        .order_by(DecisionRow.decision_id)
    )
    if attempt_ids is not None:
        q = q.where(DecisionRow.attempt_id.in_(list(attempt_ids)))
    out: dict[str, list[Decision]] = {}
    for row, name in session.execute(q):
        out.setdefault(row.attempt_id, []).append(
            Decision(
                row.decision_id,
                name,
                row.reviewer_id,
                row.mode,
                row.decision,
                row.reason,
                row.note,
                row.seen,
                row.decided_at,
                row.seq,
            )
        )
    return out


#: a spec's attempt budget as the review reads it: one number, or one per editor label (None:
#: a one-editor spec's cells), or None for every attempt the ledger holds
AttemptBudget = int | Mapping[str | None, int] | None


@dataclass(frozen=True)
class _Row:
    attempt_id: str
    cell_id: str
    attempt_no: int
    status: str
    meta: dict


@dataclass(frozen=True)
class _LedgerCell:
    cell_id: str
    editor: str | None


@dataclass(frozen=True)
class _LedgerAttempt:
    attempt_id: str
    cell: _LedgerCell


def cell_editor(cell_id: str) -> str | None:
    """The editor label a spec comparing ``editors`` appends to a cell id (``|editor=<label>``), or None."""
    return cell_id.rsplit("|editor=", 1)[1] if "|editor=" in cell_id else None


def final_attempts(
    ledger: Ledger, cell_ids: Iterable[str] | None = None, *, max_attempts: AttemptBudget = None
) -> set[str]:
    """Each cell's final attempt: the one the run ends the cell with, found by the one lifecycle
    (:func:`~counterfactory.manifests.lifecycle.fill_cells` and its rule,
    :func:`~counterfactory.manifests.lifecycle.needs_next_attempt`) over the ledger's attempts.

    Attempt ``n`` of a cell is the ledger's attempt numbered ``n``; it settles as its candidate's
    verdict (``failed`` without one), and as pending while its outcome is still coming
    (:func:`~counterfactory.manifests.lifecycle.attempt_pending`): the cell then waits on it. A
    cell stops at the first attempt that fills it or that is pending, at a number the ledger
    lacks, or after ``max_attempts`` (the spec's ``editor.max_attempts``, per editor label for a
    spec comparing editors; None: every attempt the ledger holds). ``cell_ids`` limits the
    answer to those cells.
    """
    # the five columns read here, not every attempt row whole (its lineage, prompt, editor JSON):
    # a publish asks this three times over every cell
    q = (
        select(
            AttemptRow.attempt_id,
            AttemptRow.cell_id,
            AttemptRow.attempt_no,
            AttemptRow.status,
            AttemptRow.meta,
            CandidateRow.verdict,
            CandidateRow.reasons,
        )
        .outerjoin(CandidateRow, CandidateRow.attempt_id == AttemptRow.attempt_id)
        .order_by(AttemptRow.cell_id, AttemptRow.attempt_no, AttemptRow.attempt_id)
    )
    if cell_ids is not None:
        q = q.where(AttemptRow.cell_id.in_(list(cell_ids)))
    with ledger.session() as s:
        rows = [
            (_Row(aid, cid, no, status, dict(meta or {})), v, r) for aid, cid, no, status, meta, v, r in s.execute(q)
        ]
    numbered: dict[tuple[str, int], list[_LedgerAttempt]] = {}
    settled: dict[str, Settled] = {}
    cells: dict[str, _LedgerCell] = {}
    for attempt, verdict, reasons in rows:
        cell = cells.setdefault(attempt.cell_id, _LedgerCell(attempt.cell_id, cell_editor(attempt.cell_id)))
        numbered.setdefault((cell.cell_id, attempt.attempt_no), []).append(_LedgerAttempt(attempt.attempt_id, cell))
        settled[attempt.attempt_id] = Settled(verdict or FAILED, list(reasons or []), pending=attempt_pending(attempt))

    def plan(open_cells: Sequence[_LedgerCell], attempt_no: int) -> list[_LedgerAttempt]:
        return [attempt for cell in open_cells for attempt in numbered.get((cell.cell_id, attempt_no), [])]

    def settle(plans: Sequence[_LedgerAttempt]) -> dict[str, Settled]:
        return {planned.attempt_id: settled[planned.attempt_id] for planned in plans}

    by_budget: dict[int, list[_LedgerCell]] = {}
    most = max((n for _, n in numbered), default=0)
    for cell in cells.values():
        if max_attempts is None:
            budget = most
        elif isinstance(max_attempts, int):
            budget = max_attempts
        else:
            budget = max_attempts.get(cell.editor, most)
        by_budget.setdefault(budget, []).append(cell)
    finals: set[str] = set()
    for budget, group in by_budget.items():
        outcomes = fill_cells(group, budget, plan, settle)
        finals |= {o.final_attempt for o in outcomes.values() if o.final_attempt is not None}
    return finals


def review_queue(
    ledger: Ledger,
    options: ReviewOptions,
    attempt_ids: Iterable[str] | None = None,
    *,
    max_attempts: AttemptBudget = None,
) -> list[QueueItem]:
    """Every candidate people review (needs_review, and the audit sample), with its decisions.

    Candidates without an aligned image (an editor refusal, a failed alignment) are not
    shown: there is nothing to look at. Ordered by template, then cell, then attempt.
    ``attempt_ids`` limits the answer to those candidates. ``gates`` is left empty here (it is
    the bulk of a candidate row); :func:`queue_item` fills it for one item.
    """
    columns = [
        CandidateRow.attempt_id,
        CandidateRow.cell_id,
        CandidateRow.verdict,
        CandidateRow.reasons,
        CandidateRow.image_sha256,
        AttemptRow.attempt_no,
    ]
    near = options.audit_near_threshold is not None
    if near:  # uncertainty sampling reads the measures and thresholds of each candidate
        columns.append(CandidateRow.gates)
    q = (
        select(*columns)
        .join(AttemptRow, AttemptRow.attempt_id == CandidateRow.attempt_id)
        .order_by(CandidateRow.cell_id, AttemptRow.attempt_no)
    )
    wanted = None if attempt_ids is None else list(attempt_ids)
    if wanted is not None:
        q = q.where(CandidateRow.attempt_id.in_(wanted))
    with ledger.session() as s:
        rows = s.execute(q).all()
    modes = {
        r.attempt_id: audit_mode(options, r.attempt_id, r.verdict, r.gates if near else None)
        for r in rows
        if r.image_sha256
    }
    rows = [r for r in rows if r.image_sha256 and modes[r.attempt_id][0] is not None]
    with ledger.session() as s:
        decisions = _decisions(s, None if wanted is None else [r.attempt_id for r in rows])
    finals = final_attempts(ledger, None if wanted is None else {r.cell_id for r in rows}, max_attempts=max_attempts)
    items = []
    for row in rows:
        template_id, condition = parse_cell_id(row.cell_id)
        double = sampled("double", options.seed, row.attempt_id, options.double_review_rate)
        items.append(
            QueueItem(
                attempt_id=row.attempt_id,
                cell_id=row.cell_id,
                template_id=template_id,
                condition=condition,
                attempt_no=row.attempt_no,
                final=row.attempt_id in finals,
                verdict=row.verdict,
                reasons=list(row.reasons or []),
                gates={},
                image_sha256=row.image_sha256,
                mode=modes[row.attempt_id][0] or "queue",
                required=2 if double else 1,
                decisions=decisions.get(row.attempt_id, []),
                random=modes[row.attempt_id][1],
            )
        )
    return items


def queue_item(
    ledger: Ledger, options: ReviewOptions, attempt_id: str, *, max_attempts: AttemptBudget = None
) -> QueueItem | None:
    """One queued candidate with its gate record, or ``None`` when it is not in the queue."""
    found = review_queue(ledger, options, [attempt_id], max_attempts=max_attempts)
    if not found:
        return None
    candidate = ledger.candidate(attempt_id)
    found[0].gates = candidate.gates if candidate else {}
    return found[0]


def record_decision(
    ledger: Ledger,
    options: ReviewOptions,
    *,
    attempt_id: str,
    reviewer: Reviewer,
    decision: str,
    reason: str | None = None,
    note: str | None = None,
    seen: int,
) -> Resolution:
    """Append one decision answering the view ``seen`` (see the rule above); returns the item's
    new state. ``seen`` must come from a view the server issued (the site signs it); the
    check and the insert run in one transaction, and the database's unique indexes refuse a
    second vote answering the same view even when two requests pass the check at once.

    Raises:
        ReviewError: 404 for an item not in the queue; 409 for a stale view (someone voted
            since), an item already resolved or one this reviewer already decided; 400 for a
            bad decision or reason.
    """
    if decision not in DECISIONS:
        raise ReviewError(f"decision must be one of {', '.join(DECISIONS)}; got {decision!r}")
    note = (note or "").strip() or None
    if decision == "reject":
        if reason not in REASONS:
            raise ReviewError(f"a rejection needs a reason code, one of {', '.join(REASONS)}; got {reason!r}")
        if reason == "other" and not note:
            raise ReviewError("reason 'other' needs a note saying what is wrong")
    elif reason:
        raise ReviewError(f"only a rejection takes a reason; got reason {reason!r} with {decision!r}")
    if note is not None and len(note) > 2000:
        raise ReviewError("a note is at most 2000 characters")
    return _append(ledger, options, attempt_id, reviewer, decision, reason, note, seen)


def undo_decision(
    ledger: Ledger, options: ReviewOptions, *, attempt_id: str, reviewer: Reviewer, seen: int
) -> Resolution:
    """Withdraw the reviewer's standing vote on one item (a new ``undo`` row; nothing is edited).

    ``seen`` is the view the vote's answer carried, so an undo is refused (409) once anyone else
    has voted on the item since; the reviewer can then vote on it again.
    """
    return _append(ledger, options, attempt_id, reviewer, "undo", None, None, seen)


def _append(
    ledger: Ledger,
    options: ReviewOptions,
    attempt_id: str,
    reviewer: Reviewer,
    decision: str,
    reason: str | None,
    note: str | None,
    seen: int,
) -> Resolution:
    item = review_queue(ledger, options, [attempt_id])
    if not item:
        raise ReviewError(f"no candidate {attempt_id!r} is waiting for review", status=404)
    queued = item[0]
    try:
        with ledger.session() as s, s.begin():
            # the item's decisions read in the transaction that appends the new one
            history = _decisions(s, [attempt_id]).get(attempt_id, [])
            before = resolve(history, queued.required)
            mine = [d for d in history if d.reviewer_id == reviewer.reviewer_id]
            standing = any(d.reviewer_id == reviewer.reviewer_id for d in standing_votes(history))
            if seen < 0 or seen > before.events:
                raise ReviewError(f"seen={seen} but the item has {before.events} vote(s); reload the page")
            if decision == "undo" and not standing:
                raise ReviewError("you have no standing decision on this item to undo", status=409)
            if decision in OUTCOME and standing:
                raise ReviewError(
                    "you have already decided this item; a decision is never changed (undo it first)", status=409
                )
            if decision in OUTCOME and before.state == "resolved":
                raise ReviewError(
                    f"this item was already decided ({before.outcome}); it is shown again as it is now", status=409
                )
            if seen != before.events and counts_as_event(decision):
                raise ReviewError(
                    f"this item changed since your view ({seen} vote(s) then, {before.events} now); "
                    "it is shown again as it is now",
                    status=409,
                )
            seq = ballot = None
            if counts_as_event(decision):
                rounds = sum(d.decision == "undo" for d in mine)
                seq, ballot = seen, f"{'undo' if decision == 'undo' else 'vote'}:{reviewer.reviewer_id}:{rounds}"
            s.add(
                DecisionRow(
                    attempt_id=attempt_id,
                    reviewer_id=reviewer.reviewer_id,
                    mode="tiebreak" if before.state == "disputed" and decision in OUTCOME else queued.mode,
                    decision=decision,
                    reason=reason if decision == "reject" else None,
                    note=note,
                    seen=seen,
                    seq=seq,
                    ballot=ballot,
                )
            )
    except IntegrityError:
        # another request answering the same view (or a second vote of this reviewer) got in first
        raise ReviewError(
            "another decision on this item was recorded first (a double click, or someone else); "
            "it is shown again as it is now",
            status=409,
        ) from None
    after = review_queue(ledger, options, [attempt_id])
    return after[0].resolution


def revoke_reviewer(ledger: Ledger, name: str) -> bool:
    """Revoke ``name``'s token: it signs nobody in from now on (their decisions stay).

    Returns False when the reviewer was already revoked.

    Raises:
        ReviewError: 404, no reviewer of that name.
    """
    key = name_key(name.strip())
    with ledger.session() as s, s.begin():
        row = next((r for r in s.scalars(select(ReviewerRow)) if name_key(r.name) == key), None)
        if row is None:
            raise ReviewError(f"no reviewer named {name!r} in this ledger", status=404)
        if row.revoked_at is not None:
            return False
        row.revoked_at = datetime.now(UTC)
    return True


# blinded spot-the-edit ----------------------------------------------------------------------
@dataclass(frozen=True)
class SpotDeal:
    """A blinded trial dealt to a reviewer (recorded when shown)."""

    deal_id: int
    attempt_id: str
    reviewer_id: int
    shown: str
    answered: bool


def _deal(row: SpotDealRow, answered: bool) -> SpotDeal:
    return SpotDeal(row.deal_id, row.attempt_id, row.reviewer_id, row.shown, answered)


def open_spot_deal(ledger: Ledger, reviewer_id: int) -> SpotDeal | None:
    """The reviewer's oldest blinded trial dealt and not answered yet (what a reload shows again)."""
    with ledger.session() as s:
        answered = select(SpotTrialRow.deal_id).where(SpotTrialRow.deal_id.is_not(None))
        row = s.scalar(
            select(SpotDealRow)
            .where(SpotDealRow.reviewer_id == reviewer_id, SpotDealRow.deal_id.not_in(answered))
            .order_by(SpotDealRow.deal_id)
            .limit(1)
        )
        return None if row is None else _deal(row, False)


def spot_deal(ledger: Ledger, deal_id: int) -> SpotDeal | None:
    with ledger.session() as s:
        row = s.get(SpotDealRow, deal_id)
        if row is None:
            return None
        answered = s.scalar(select(SpotTrialRow.trial_id).where(SpotTrialRow.deal_id == deal_id)) is not None
        return _deal(row, answered)


def last_spot_attempt(ledger: Ledger, reviewer_id: int) -> str | None:
    """The candidate of the reviewer's latest blinded trial (the next one avoids its photo)."""
    with ledger.session() as s:
        return s.scalar(
            select(SpotDealRow.attempt_id)
            .where(SpotDealRow.reviewer_id == reviewer_id)
            .order_by(SpotDealRow.deal_id.desc())
            .limit(1)
        )


def deal_spot_trial(ledger: Ledger, reviewer: Reviewer, attempt_id: str, shown: str) -> SpotDeal:
    """Record that ``attempt_id`` (the candidate, or its source photo: ``shown``) is shown to the
    reviewer blinded, before any answer. A reviewer is dealt each candidate once (a unique
    index); when another request dealt one first, that deal is returned."""
    if shown not in ("source", "candidate"):
        raise ReviewError(f"shown must be source or candidate; got {shown!r}")
    try:
        with ledger.session() as s, s.begin():
            row = SpotDealRow(attempt_id=attempt_id, reviewer_id=reviewer.reviewer_id, shown=shown)
            s.add(row)
            s.flush()
            return _deal(row, False)
    except IntegrityError:
        with ledger.session() as s:
            row = s.scalar(
                select(SpotDealRow).where(
                    SpotDealRow.reviewer_id == reviewer.reviewer_id, SpotDealRow.attempt_id == attempt_id
                )
            )
        if row is None:
            raise
        return spot_deal(ledger, row.deal_id) or _deal(row, False)


def record_spot_trial(
    ledger: Ledger,
    *,
    deal: SpotDeal,
    reviewer: Reviewer,
    said_edited: bool,
    click: tuple[float, float] | None,
    localised: bool | None,
) -> None:
    """Append the answer to one dealt blinded trial (click in image pixels).

    Raises:
        ReviewError: 404 when the deal is not this reviewer's; 409 when it was answered already.
    """
    if deal.reviewer_id != reviewer.reviewer_id:
        raise ReviewError("unknown trial; reload the page", status=404)
    try:
        with ledger.session() as s, s.begin():
            s.add(
                SpotTrialRow(
                    attempt_id=deal.attempt_id,
                    reviewer_id=reviewer.reviewer_id,
                    shown=deal.shown,
                    said_edited=said_edited,
                    click_x=None if click is None else float(click[0]),
                    click_y=None if click is None else float(click[1]),
                    localised=localised,
                    deal_id=deal.deal_id,
                )
            )
    except IntegrityError:
        raise ReviewError("this trial was answered already; reload the page for the next one", status=409) from None


def unanswered_spot_deals(ledger: Ledger) -> int:
    """How many blinded trials were shown and never answered."""
    with ledger.session() as s:
        answered = set(s.scalars(select(SpotTrialRow.deal_id).where(SpotTrialRow.deal_id.is_not(None))))
        return sum(1 for d in s.scalars(select(SpotDealRow.deal_id)) if d not in answered)


@dataclass(frozen=True)
class SpotTrial:
    attempt_id: str
    cell_id: str
    reviewer_id: int
    shown: str
    said_edited: bool
    localised: bool | None


def spot_trials(ledger: Ledger) -> list[SpotTrial]:
    with ledger.session() as s:
        rows = s.execute(
            select(SpotTrialRow, CandidateRow.cell_id)
            .join(CandidateRow, CandidateRow.attempt_id == SpotTrialRow.attempt_id)
            .order_by(SpotTrialRow.trial_id)
        ).all()
    return [SpotTrial(r.attempt_id, cell, r.reviewer_id, r.shown, r.said_edited, r.localised) for r, cell in rows]


def spot_pool(ledger: Ledger, reviewer_id: int, *, max_attempts: AttemptBudget = None) -> list[tuple[str, str, str]]:
    """``(attempt_id, cell_id, image sha256)`` of final candidates that could be released
    (accepted or needs_review) and that this reviewer has not yet seen blinded."""
    finals = final_attempts(ledger, max_attempts=max_attempts)
    with ledger.session() as s:
        # seen blinded: dealt (answered or not), or answered before deals were recorded
        done = set(s.scalars(select(SpotTrialRow.attempt_id).where(SpotTrialRow.reviewer_id == reviewer_id)))
        done |= set(s.scalars(select(SpotDealRow.attempt_id).where(SpotDealRow.reviewer_id == reviewer_id)))
        rows = s.execute(
            select(CandidateRow.attempt_id, CandidateRow.cell_id, CandidateRow.image_sha256).where(
                CandidateRow.verdict.in_(FILLING_VERDICTS)
            )
        ).all()
    return sorted((a, c, sha) for a, c, sha in rows if a in finals and a not in done and sha)


# what publishing needs ----------------------------------------------------------------------
def review_records(ledger: Ledger, options: ReviewOptions, attempt_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """For each reviewed-or-queued attempt: ``{"gate_verdict", "mode", "required", "state",
    "outcome", "reason", "decisions": [{"reviewer", "mode", "decision", "reason", "note",
    "decided_at"}]}``. Attempts outside the queue are absent (their ``review`` stays ``None``)."""
    wanted = set(attempt_ids)
    out = {}
    for item in review_queue(ledger, options):
        if item.attempt_id not in wanted:
            continue
        res = item.resolution
        out[item.attempt_id] = {
            "gate_verdict": item.verdict,
            "mode": item.mode,
            # marked where uncertainty sampling is on (else every audit item is random)
            **({"random": item.random} if options.audit_near_threshold is not None else {}),
            "required": item.required,
            "state": res.state,
            "outcome": res.outcome,
            "reason": res.reason,
            "decisions": [d.record() for d in item.decisions],
        }
    return out


def apply_reviews(ledger: Ledger, options: ReviewOptions, rows: Sequence[dict[str, Any]]) -> None:
    """Give each release row (``items.jsonl`` schema) its review history and effective status.

    A resolved review replaces the gate's status (``accepted`` / ``rejected`` with
    ``review_rejected: <code>``); an unresolved one leaves it as it was, so an undecided
    ``needs_review`` item stays ``needs_review`` and is counted as waiting.
    """
    records = review_records(ledger, options, [r["item_id"] for r in rows if r.get("item_id")])
    for row in rows:
        record = records.get(row.get("item_id"))
        row["review"] = record
        if record is None or record["state"] != "resolved":
            continue
        row["status"] = record["outcome"]
        if record["outcome"] == REJECTED:
            row["reasons"] = [f"review_rejected: {record['reason'] or 'unspecified'}"] + list(row["reasons"])


def pending_by_group(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How many release rows still wait for a person, in total and per condition group."""
    waiting = [r for r in rows if r["status"] == NEEDS_REVIEW]
    groups: dict[str, int] = {}
    for r in waiting:
        for axis, value in r["condition"].items():
            key = f"{axis}={value}"
            groups[key] = groups.get(key, 0) + 1
    return {"total": len(waiting), "by_group": dict(sorted(groups.items()))}
