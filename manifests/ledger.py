"""The factory's ledger: domain state in SQL, so a killed run resumes from it.

SQLite file by default, any SQLAlchemy URL accepted (``postgresql+psycopg://...`` for teams).
What lives here:

- ``sources``: every photo the spec names, ``ok`` or ``failed`` with its reason;
- ``attempts``: one row per editor call, keyed by the attempt id (a hash of everything that
  decides the output); ``status`` ``ok`` means its output is in the image store and it is
  never run again;
- ``candidates``: an attempt's aligned image, its metrics, thresholds and verdict;
- ``editor_journal``: what a remote backend must not lose between submit and result;
- ``runs``: one row per ``counterfactory run``, with how many editor calls it made;
- ``reviewers``, ``review_decisions``, ``spot_trials``: people's decisions
  (:mod:`counterfactory.manifests.review`).

The schema is kept by Alembic (:mod:`counterfactory.manifests.schema`); opening a ledger
upgrades it in place.

Every write is its own short transaction, so a SIGKILL loses at most the call in flight.

A ledger that cannot be trusted is refused with a :class:`LedgerError` that says how to recover,
never silently replaced by an empty one: an empty (0-byte) or corrupt SQLite file, tables whose
columns do not match this version's, or a database that cannot be reached.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    create_engine,
    event,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, NoSuchModuleError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.schema import upgrade_ledger
from counterfactory.manifests.vocabulary import FAILED, OK, RUNNING


class LedgerError(CounterfactoryError, RuntimeError):
    """The ledger cannot be opened safely; the message names it and says how to recover."""


def _now() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class SourceRow(Base):
    __tablename__ = "sources"

    source_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    status: Mapped[str] = mapped_column(String(16))  # ok | failed
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    meta: Mapped[dict] = mapped_column(JSON, default=dict)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class AttemptRow(Base):
    __tablename__ = "attempts"

    attempt_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    cell_id: Mapped[str] = mapped_column(String(400), index=True)
    attempt_no: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(Integer)
    backend: Mapped[str] = mapped_column(String(40))
    lineage: Mapped[dict] = mapped_column(JSON, default=dict)
    prompt: Mapped[str] = mapped_column(Text)
    # running | ok | refused | failed
    status: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    output_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    calls: Mapped[int] = mapped_column(Integer, default=0)
    meta: Mapped[dict] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    #: the run executing a ``running`` attempt (revision 0003); another live run keeps off it
    claimed_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class CandidateRow(Base):
    __tablename__ = "candidates"

    attempt_id: Mapped[str] = mapped_column(String(64), ForeignKey("attempts.attempt_id"), primary_key=True)
    cell_id: Mapped[str] = mapped_column(String(400), index=True)
    judge_key: Mapped[str] = mapped_column(String(64))
    image_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    alignment: Mapped[dict] = mapped_column(JSON, default=dict)
    verdict: Mapped[str] = mapped_column(String(16), index=True)
    reasons: Mapped[list] = mapped_column(JSON, default=list)
    gates: Mapped[dict] = mapped_column(JSON, default=dict)
    judged_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class JournalRow(Base):
    __tablename__ = "editor_journal"

    attempt_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    backend: Mapped[str] = mapped_column(String(40))
    data: Mapped[dict] = mapped_column(JSON, default=dict)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class RunRow(Base):
    __tablename__ = "runs"

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    spec_name: Mapped[str] = mapped_column(String(200))
    spec_hash: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    editor_calls: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16), default=RUNNING)


class ReviewerRow(Base):
    """A person who reviews; only the sha256 of their token is stored."""

    __tablename__ = "reviewers"

    reviewer_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    #: set by ``review revoke-reviewer``: the token signs nobody in any more
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class DecisionRow(Base):
    """One review decision (append-only: the database refuses UPDATE and DELETE)."""

    __tablename__ = "review_decisions"
    __table_args__ = (
        Index("ux_review_decisions_seq", "attempt_id", "seq", unique=True),
        Index("ux_review_decisions_ballot", "attempt_id", "ballot", unique=True),
    )

    decision_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    attempt_id: Mapped[str] = mapped_column(String(64), ForeignKey("candidates.attempt_id"), index=True)
    reviewer_id: Mapped[int] = mapped_column(Integer, ForeignKey("reviewers.reviewer_id"))
    #: how the item came to the reviewer: queue (needs_review), audit, double, tiebreak
    mode: Mapped[str] = mapped_column(String(16))
    decision: Mapped[str] = mapped_column(String(8))  # accept | reject | skip | undo
    reason: Mapped[str | None] = mapped_column(String(40), nullable=True)
    note: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: accept/reject decisions on the item the reviewer had seen when deciding
    seen: Mapped[int] = mapped_column(Integer)
    decided_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    #: an accept, reject or undo's position among the item's votes (unique per item: a second
    #: decision answering the same view is refused by the database); NULL for a skip
    seq: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: ``vote:<reviewer>:<round>`` / ``undo:<reviewer>:<round>`` (unique per item: one standing
    #: vote per reviewer); NULL for a skip
    ballot: Mapped[str | None] = mapped_column(String(48), nullable=True)


class SpotTrialRow(Base):
    """One blinded spot-the-edit answer (append-only)."""

    __tablename__ = "spot_trials"

    trial_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    attempt_id: Mapped[str] = mapped_column(String(64), ForeignKey("candidates.attempt_id"), index=True)
    reviewer_id: Mapped[int] = mapped_column(Integer, ForeignKey("reviewers.reviewer_id"))
    shown: Mapped[str] = mapped_column(String(16))  # source | candidate
    said_edited: Mapped[bool] = mapped_column(Boolean)
    #: the click in the image's own pixels (x right, y down); None when the reviewer said "not edited"
    click_x: Mapped[float | None] = mapped_column(Float, nullable=True)
    click_y: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: the click fell inside the dilated edit mask (None: source shown or no click)
    localised: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    decided_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    #: the deal this answers (:class:`SpotDealRow`'s ``deal_id``; None in rows written before
    #: revision 0005): a deal is answered once (a plain column: SQLite adds no foreign key in place)
    deal_id: Mapped[int | None] = mapped_column(Integer, nullable=True)

    __table_args__ = (Index("ux_spot_trials_deal", "deal_id", unique=True),)


class SpotDealRow(Base):
    """A blinded trial dealt to a reviewer, recorded when it is shown (before any answer): which
    candidate, and whether it or its source photo was shown. One per reviewer and candidate, so
    a reload deals the same trial again, and one shown but never answered stays on record."""

    __tablename__ = "spot_deals"

    deal_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    attempt_id: Mapped[str] = mapped_column(String(64), ForeignKey("candidates.attempt_id"), index=True)
    reviewer_id: Mapped[int] = mapped_column(Integer, ForeignKey("reviewers.reviewer_id"))
    shown: Mapped[str] = mapped_column(String(16))  # source | candidate
    dealt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)

    __table_args__ = (Index("ux_spot_deals_reviewer_attempt", "reviewer_id", "attempt_id", unique=True),)


@dataclass(frozen=True)
class Attempt:
    """A read-only view of an attempts row."""

    attempt_id: str
    cell_id: str
    attempt_no: int
    seed: int
    backend: str
    status: str
    reason: str | None
    output_sha256: str | None
    cost_usd: float
    calls: int
    lineage: dict
    prompt: str
    meta: dict


@dataclass(frozen=True)
class Candidate:
    """A read-only view of a candidates row."""

    attempt_id: str
    cell_id: str
    judge_key: str
    image_sha256: str | None
    alignment: dict
    verdict: str
    reasons: list
    gates: dict


@dataclass(frozen=True)
class SettledState:
    """What decides whether an attempt is settled (:func:`counterfactory.flows.resume.settled_outcomes`):
    its attempts row's status, reason, output and meta, and its candidate's judgement (None
    fields: not judged). Read without the rows' other JSON columns (lineage, alignment, gates)."""

    attempt_id: str
    status: str
    reason: str | None
    output_sha256: str | None
    meta: dict
    judge_key: str | None
    image_sha256: str | None
    verdict: str | None
    reasons: list


def _attempt(row: AttemptRow) -> Attempt:
    return Attempt(
        row.attempt_id,
        row.cell_id,
        row.attempt_no,
        row.seed,
        row.backend,
        row.status,
        row.reason,
        row.output_sha256,
        row.cost_usd,
        row.calls,
        row.lineage or {},
        row.prompt,
        row.meta or {},
    )


def _candidate(row: CandidateRow) -> Candidate:
    return Candidate(
        row.attempt_id,
        row.cell_id,
        row.judge_key,
        row.image_sha256,
        row.alignment or {},
        row.verdict,
        list(row.reasons or []),
        row.gates or {},
    )


def _jsonable(data: Mapping[str, Any]) -> dict:
    # round-trip through json so numpy scalars and tuples never reach the driver
    return json.loads(json.dumps(dict(data), default=_json_default))


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


class Ledger:
    """The ledger on one database.

    Args:
        url: an SQLAlchemy URL, e.g. ``sqlite:///out/ledger.sqlite`` or
            ``postgresql+psycopg://user@localhost/counterfactory``.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        shown = _shown_url(url)
        kwargs: dict[str, Any] = {"future": True}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 60}
            _check_sqlite_file(url)
        missing = missing_driver(url)
        if missing is not None:
            raise LedgerError(f"ledger_url {shown!r}: {missing}; nothing was run")
        try:
            self.engine = create_engine(url, **kwargs)
        except (ArgumentError, NoSuchModuleError, ValueError) as exc:
            raise LedgerError(
                f"ledger_url {shown!r} is not a usable SQLAlchemy URL ({exc}); use e.g. "
                "'sqlite:////abs/path/ledger.sqlite' or 'postgresql+psycopg://user@host/db'"
            ) from None
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        try:
            # Alembic, not create_all: a ledger written by an older version is upgraded in place
            upgrade_ledger(self.engine)
            _check_schema(self.engine, shown)
        except LedgerError:
            self.engine.dispose()
            raise
        except DBAPIError as exc:
            self.engine.dispose()
            raise LedgerError(_damaged_message(shown, exc)) from None
        except RuntimeError as exc:  # upgrade_ledger: a damaged or newer-than-this-code ledger
            self.engine.dispose()
            raise LedgerError(f"{exc}; nothing was run") from None
        self._session = sessionmaker(self.engine, expire_on_commit=False)

    def close(self) -> None:
        connection = getattr(self, "_run_connection", None)
        if connection is not None:
            connection.close()  # releases the run's advisory lock
            self._run_connection = None
        self.engine.dispose()

    def session(self) -> Session:
        return self._session()

    # sources ---------------------------------------------------------------------------
    def record_source(
        self,
        source_id: str,
        path: str,
        *,
        sha256: str | None,
        status: str,
        reason: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.record_sources(
            [{"source_id": source_id, "path": path, "sha256": sha256, "status": status, "reason": reason, "meta": meta}]
        )

    def record_sources(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """:meth:`record_source` for each of ``rows`` (its arguments by name), in one transaction
        and, on SQLite and PostgreSQL, one statement: a run records every source, and one commit
        (then one statement) each was most of a settled re-run's writing."""
        now = _now()
        by_id = {
            row["source_id"]: {
                "source_id": row["source_id"],
                "path": row["path"],
                "sha256": row["sha256"],
                "status": row["status"],
                "reason": row.get("reason"),
                "meta": _jsonable(row.get("meta") or {}),
                "updated_at": now,
            }
            for row in rows  # an id given twice: its last row, as one upsert after the other
        }
        if not by_id:
            return
        update = ("path", "sha256", "status", "reason", "meta", "updated_at")
        with self.session() as s, s.begin():
            dialect = s.get_bind().dialect.name
            if dialect not in ("postgresql", "sqlite"):
                for values in by_id.values():
                    _upsert(s, SourceRow, values, key="source_id", update=update)
                return
            if dialect == "postgresql":
                from sqlalchemy.dialects.postgresql import insert
            else:
                from sqlalchemy.dialects.sqlite import insert
            # workers of one study sharing a ledger record the same photos at the same moment
            statement = insert(SourceRow)
            statement = statement.on_conflict_do_update(
                index_elements=["source_id"], set_={c: statement.excluded[c] for c in update}
            )
            s.execute(statement, list(by_id.values()))

    def sources(self) -> list[SourceRow]:
        with self.session() as s:
            return list(s.scalars(select(SourceRow).order_by(SourceRow.source_id)))

    # attempts --------------------------------------------------------------------------
    def attempt(self, attempt_id: str) -> Attempt | None:
        with self.session() as s:
            row = s.get(AttemptRow, attempt_id)
            return _attempt(row) if row else None

    def attempts(self, cell_ids: Iterable[str] | None = None) -> list[Attempt]:
        with self.session() as s:
            q = select(AttemptRow).order_by(AttemptRow.cell_id, AttemptRow.attempt_no)
            if cell_ids is not None:
                q = q.where(AttemptRow.cell_id.in_(list(cell_ids)))
            return [_attempt(r) for r in s.scalars(q)]

    def finished_outputs(self) -> list[str]:
        """The output sha256 of every ``ok`` attempt, in one query of that one column."""
        q = select(AttemptRow.output_sha256).where(AttemptRow.status == OK, AttemptRow.output_sha256.is_not(None))
        with self.session() as s:
            return list(s.scalars(q))

    def has_attempts(self) -> bool:
        """Whether any attempt was ever started through this ledger."""
        with self.session() as s:
            return s.scalar(select(AttemptRow.attempt_id).limit(1)) is not None

    def attempts_by_id(self, attempt_ids: Iterable[str]) -> dict[str, Attempt]:
        """The attempts among ``attempt_ids`` that exist, by id, in one query (:func:`_by_ids`)."""
        with self.session() as s:
            return {
                row.attempt_id: _attempt(row)
                for row in _by_ids(s, select(AttemptRow), AttemptRow.attempt_id, attempt_ids, scalars=True)
            }

    def settled_states(self, attempt_ids: Iterable[str]) -> dict[str, SettledState]:
        """The :class:`SettledState` of those of ``attempt_ids`` that exist, by id: attempts joined
        with their candidates, in one query (:func:`_by_ids`), only the columns the settled check
        reads."""
        columns = (
            AttemptRow.attempt_id,
            AttemptRow.status,
            AttemptRow.reason,
            AttemptRow.output_sha256,
            AttemptRow.meta,
            CandidateRow.judge_key,
            CandidateRow.image_sha256,
            CandidateRow.verdict,
            CandidateRow.reasons,
        )
        q = select(*columns).outerjoin(CandidateRow, CandidateRow.attempt_id == AttemptRow.attempt_id)
        with self.session() as s:
            return {
                aid: SettledState(aid, status, reason, output, meta or {}, jkey, image, verdict, list(reasons or []))
                for aid, status, reason, output, meta, jkey, image, verdict, reasons in _by_ids(
                    s, q, AttemptRow.attempt_id, attempt_ids
                )
            }

    def start_attempt(
        self,
        attempt_id: str,
        *,
        cell_id: str,
        attempt_no: int,
        seed: int,
        backend: str,
        lineage: Mapping[str, Any],
        prompt: str,
        run_id: str | None = None,
    ) -> bool:
        """Claim an attempt for ``run_id`` and mark it running (counting the call) just before
        the editor is called.

        Returns False, changing nothing, when another run that is still alive holds the claim
        (on PostgreSQL: a row lock decides between simultaneous claims, and a run is alive
        while its :meth:`start_run` advisory lock is held), or has finished the attempt since
        the caller last looked; the caller must not call the editor then. A dead run's claim
        is taken over.
        """
        try:
            with self.session() as s, s.begin():
                return self._claim(s, attempt_id, cell_id, attempt_no, seed, backend, lineage, prompt, run_id)
        except IntegrityError:
            return False  # another run inserted the same attempt a moment ago: it is theirs

    def _claim(
        self,
        s: Session,
        attempt_id: str,
        cell_id: str,
        attempt_no: int,
        seed: int,
        backend: str,
        lineage: Mapping[str, Any],
        prompt: str,
        run_id: str | None,
    ) -> bool:
        row = s.get(AttemptRow, attempt_id, with_for_update=True)
        if (
            row is not None
            and row.status == RUNNING
            and row.claimed_by not in (None, run_id)
            and self._run_alive(row.claimed_by)
        ):
            return False
        if row is None:
            row = AttemptRow(
                attempt_id=attempt_id,
                cell_id=cell_id,
                attempt_no=attempt_no,
                seed=seed,
                backend=backend,
                lineage=_jsonable(lineage),
                prompt=prompt,
                calls=0,
            )
        if row.status == OK:
            # another run finished it after the caller looked: its output stands, no new call
            return False
        row.status, row.reason, row.calls = RUNNING, None, (row.calls or 0) + 1
        row.claimed_by, row.claimed_at = run_id, _now()
        s.add(row)
        return True

    def _run_alive(self, run_id: str) -> bool:
        """Whether the run ``run_id`` still holds its advisory lock (PostgreSQL; elsewhere the
        run folder's lock already keeps a second run out, so a claim is never honoured)."""
        if self.engine.dialect.name != "postgresql":
            return False
        with self.engine.connect() as connection:
            key = _run_lock_key(run_id)
            if connection.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar():
                connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                return False
            return True

    def finish_attempt(
        self,
        attempt_id: str,
        *,
        status: str,
        output_sha256: str | None = None,
        reason: str | None = None,
        cost_usd: float = 0.0,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        with self.session() as s, s.begin():
            row = s.get(AttemptRow, attempt_id)
            if row is None:
                raise KeyError(f"attempt {attempt_id} was never started")
            row.status, row.output_sha256, row.reason = status, output_sha256, reason
            row.cost_usd, row.meta, row.finished_at = cost_usd, _jsonable(meta or {}), _now()

    def reopen_attempt(self, attempt_id: str, *, reason: str) -> None:
        """Make a finished attempt runnable again because its output blob is gone from the store.

        Its candidate row goes too (it judged an image that no longer exists). The call count is
        kept, so the ledger still shows what the rebuild cost.
        """
        with self.session() as s, s.begin():
            row = s.get(AttemptRow, attempt_id)
            if row is None:
                raise KeyError(f"attempt {attempt_id} was never started")
            candidate = s.get(CandidateRow, attempt_id)
            if candidate is not None:
                s.delete(candidate)
            row.status, row.reason, row.output_sha256 = FAILED, reason, None

    def cost_usd(self, attempt_ids: Iterable[str]) -> float:
        """Money spent on these attempts (USD); ids not in the ledger count 0. One query."""
        q = select(AttemptRow.attempt_id, AttemptRow.cost_usd)
        with self.session() as s:
            return float(sum(cost or 0.0 for _, cost in _by_ids(s, q, AttemptRow.attempt_id, attempt_ids)))

    def editor_calls(self) -> int:
        """Total editor calls ever made through this ledger."""
        with self.session() as s:
            return int(s.scalar(select(func.coalesce(func.sum(AttemptRow.calls), 0))))

    # candidates ------------------------------------------------------------------------
    def candidate(self, attempt_id: str) -> Candidate | None:
        with self.session() as s:
            row = s.get(CandidateRow, attempt_id)
            return _candidate(row) if row else None

    def candidates_by_id(self, attempt_ids: Iterable[str]) -> dict[str, Candidate]:
        """The candidates of those of ``attempt_ids`` that were judged, by attempt id, in one query."""
        with self.session() as s:
            return {
                row.attempt_id: _candidate(row)
                for row in _by_ids(s, select(CandidateRow), CandidateRow.attempt_id, attempt_ids, scalars=True)
            }

    def candidates_of_cells(self, cell_ids: Sequence[str]) -> list[Candidate]:
        """The candidates recorded for those of ``cell_ids`` (every attempt of each), in a few queries."""
        with self.session() as s:
            return [
                _candidate(row)
                for chunk in _chunks(list(cell_ids))
                for row in s.scalars(select(CandidateRow).where(CandidateRow.cell_id.in_(chunk)))
            ]

    def candidates(self) -> list[Candidate]:
        with self.session() as s:
            return [_candidate(r) for r in s.scalars(select(CandidateRow))]

    def record_candidate(
        self,
        attempt_id: str,
        *,
        cell_id: str,
        judge_key: str,
        image_sha256: str | None,
        alignment: Mapping[str, Any],
        verdict: str,
        reasons: Iterable[str],
        gates: Mapping[str, Any],
    ) -> None:
        with self.session() as s, s.begin():
            row = s.get(CandidateRow, attempt_id) or CandidateRow(attempt_id=attempt_id)
            row.cell_id, row.judge_key, row.image_sha256 = cell_id, judge_key, image_sha256
            row.alignment, row.verdict = _jsonable(alignment), verdict
            row.reasons, row.gates, row.judged_at = list(reasons), _jsonable(gates), _now()
            s.add(row)

    # runs ------------------------------------------------------------------------------
    def start_run(self, run_id: str, *, spec_name: str, spec_hash: str) -> None:
        """Record the run; on PostgreSQL also hold an advisory lock named by it for as long as
        this ledger is open (or the process lives), which is how other runs see it is alive."""
        with self.session() as s, s.begin():
            s.add(RunRow(run_id=run_id, spec_name=spec_name, spec_hash=spec_hash))
        if self.engine.dialect.name == "postgresql":
            self._run_connection = self.engine.connect()
            self._run_connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _run_lock_key(run_id)})
            self._run_connection.commit()

    def finish_run(self, run_id: str, *, editor_calls: int, status: str = "completed") -> None:
        with self.session() as s, s.begin():
            row = s.get(RunRow, run_id)
            if row is not None:
                row.finished_at, row.editor_calls, row.status = _now(), editor_calls, status

    # the editor journal ----------------------------------------------------------------
    def journal(self, backend: str) -> LedgerJournal:
        """A :class:`~counterfactory.manifests.paid.base.PaidJournal` for one paid client (an editor
        backend, a gate's model) on this database."""
        return LedgerJournal(self, backend)


class LedgerJournal:
    """A :class:`~counterfactory.manifests.paid.base.PaidJournal` on the ledger's ``editor_journal``
    table (durable across SIGKILL)."""

    def __init__(self, ledger: Ledger, backend: str) -> None:
        self.ledger = ledger
        self.backend = backend

    def load(self, attempt_id: str) -> dict[str, Any] | None:
        with self.ledger.session() as s:
            row = s.get(JournalRow, attempt_id)
            return dict(row.data) if row is not None else None

    def save(self, attempt_id: str, data: Mapping[str, Any], *, cost_usd: float = 0.0) -> None:
        values = {
            "attempt_id": attempt_id,
            "backend": self.backend,
            "data": _jsonable(data),
            "cost_usd": float(cost_usd),
            "updated_at": _now(),
        }
        with self.ledger.session() as s, s.begin():
            _upsert(s, JournalRow, values, key="attempt_id", update=("data", "cost_usd", "updated_at"))

    def spent_usd(self) -> float:
        with self.ledger.session() as s:
            total = s.scalar(
                select(func.coalesce(func.sum(JournalRow.cost_usd), 0.0)).where(JournalRow.backend == self.backend)
            )
            return float(total or 0.0)


def _upsert(s: Session, model: type[Base], values: Mapping[str, Any], *, key: str, update: tuple[str, ...]) -> None:
    """Insert ``values`` as a row of ``model``, or, where a row with its ``key`` exists, set
    its ``update`` columns: one statement on PostgreSQL and SQLite (a read-then-insert lets two
    writers both insert), a locked read-then-write elsewhere."""
    dialect = s.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        row = s.get(model, values[key], with_for_update=True)
        if row is None:
            s.add(model(**values))
        else:
            for column in update:
                setattr(row, column, values[column])
        return
    statement = insert(model).values(**values)
    s.execute(statement.on_conflict_do_update(index_elements=[key], set_={c: statement.excluded[c] for c in update}))


#: the longest ``IN (...)`` list a query is given (every database accepts it)
_CHUNK = 500


def _chunks(ids: Iterable[str], size: int = _CHUNK) -> list[list[str]]:
    """Distinct ids in bounded lists, so an ``IN (...)`` stays within every database's limits."""
    unique = sorted(set(ids))
    return [unique[i : i + size] for i in range(0, len(unique), size)]


def _by_ids(s: Session, q: Any, column: Any, ids: Iterable[str], *, scalars: bool = False) -> list[Any]:
    """The rows of ``q`` whose ``column`` is one of ``ids``, in one query however many there are.

    Up to one bounded ``IN (...)`` list (:func:`_chunks`' size) the database filters; beyond
    it, ``q`` is read whole, once, and filtered here: a re-run's settled check and its release
    ask for every cell's attempt at once, and one statement per 500 ids made their cost grow
    with the cells already settled (the key column must be the rows' first column, or with
    ``scalars`` the rows' ``attempt_id``)."""
    wanted = set(ids)
    if not wanted:
        return []
    if len(wanted) <= _CHUNK:
        q = q.where(column.in_(sorted(wanted)))
        return list(s.scalars(q) if scalars else s.execute(q))
    if scalars:
        return [row for row in s.scalars(q) if row.attempt_id in wanted]
    return [row for row in s.execute(q) if row[0] in wanted]


def _run_lock_key(run_id: str) -> int:
    """A signed 64-bit advisory-lock key for a run id (stable across processes)."""
    return int.from_bytes(hashlib.sha256(f"counterfactory-run:{run_id}".encode()).digest()[:8], "big", signed=True)


#: (dialect, driver) -> what to pip install for it
_DRIVER_PACKAGES = {
    ("postgresql", "psycopg"): "'counterfactory[postgres]'",
    (
        "postgresql",
        "psycopg2",
    ): "psycopg2-binary (or write postgresql+psycopg:// and pip install 'counterfactory[postgres]')",
    ("mysql", "mysqldb"): "mysqlclient",
    ("mysql", "pymysql"): "pymysql",
    ("mysql", "mysqlconnector"): "mysql-connector-python",
    ("mssql", "pyodbc"): "pyodbc",
}


def missing_driver(url: str) -> str | None:
    """Why the database driver ``url`` names cannot be used here and what to install, or None
    when it imports (or the URL does not parse: that is reported on its own)."""
    try:
        dialect = make_url(url).get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError):
        return None
    if getattr(dialect, "is_async", False):
        # the ledger's engine is synchronous: an async driver fails at the first query
        # (MissingGreenlet), after the run has started
        return (
            f"the {dialect.name} driver {dialect.driver!r} is asynchronous and the ledger talks to its "
            "database synchronously: write postgresql+psycopg://... (pip install 'counterfactory[postgres]') "
            "or sqlite:///..."
        )
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        package = _DRIVER_PACKAGES.get((dialect.name, dialect.driver), f"the {dialect.driver} package")
        return (
            f"the {dialect.name} driver {dialect.driver!r} is not installed ({exc}): pip install {package}; "
            "the ledger runs on SQLite (the default) or PostgreSQL"
        )
    return None


def _shown_url(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def _check_sqlite_file(url: str) -> None:
    """Refuse an empty (0-byte) SQLite ledger: SQLite would treat it as new and pay for everything again."""
    try:
        database = make_url(url).database
    except ArgumentError:
        return
    if not database or database == ":memory:":
        return
    path = Path(database)
    wal = Path(f"{database}-wal")
    if path.is_file() and path.stat().st_size == 0 and not (wal.is_file() and wal.stat().st_size > 0):
        raise LedgerError(
            f"{path}: the ledger is empty (0 bytes), so it no longer says which attempts were paid "
            "for; restore it from a backup, or, to start over and pay for every edit again, delete "
            "it and run again"
        )
    if path.is_dir():
        raise LedgerError(f"{path}: the ledger path is a folder; point ledger_url at a file")


def _check_schema(engine: Any, shown: str) -> None:
    """After the migrations, every table must have every column this version uses; a ledger
    older than the migrations' baseline (or altered by hand) is refused, not half-used."""
    existing = inspect(engine)
    names = set(existing.get_table_names())
    problems = []
    for table in Base.metadata.sorted_tables:
        if table.name not in names:
            continue
        have = {c["name"] for c in existing.get_columns(table.name)}
        missing = [c.name for c in table.columns if c.name not in have]
        if missing:
            problems.append(f"table {table.name!r} lacks column(s) {', '.join(missing)}")
    if problems:
        raise LedgerError(
            f"ledger {shown}: written by an older version of counterfactory than any migration "
            f"covers ({'; '.join(problems)}); nothing was run. Keep a copy of it and run it with the "
            "counterfactory version that wrote it, or start a new output folder"
        )


def _damaged_message(shown: str, exc: DBAPIError) -> str:
    detail = str(exc.orig).strip() if exc.orig is not None else str(exc)
    if "not a database" in detail or "malformed" in detail or "corrupt" in detail:
        return (
            f"ledger {shown}: the file is damaged ({detail}); nothing was run. Restore it from a "
            "backup (SQLite's `.recover` command in the sqlite3 shell can salvage rows), or move it "
            "aside to start over and pay for every edit again"
        )
    return (
        f"ledger {shown}: cannot be opened or brought up to date ({type(exc.orig).__name__}: {detail}); "
        "nothing was run. For a server, check that it is running and that the URL, user and "
        "permissions are right; for a file, check its folder's permissions, or restore it from a backup"
    )


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets the report read while workers write; a busy timeout instead of "locked" errors
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=60000")
    cursor.close()
