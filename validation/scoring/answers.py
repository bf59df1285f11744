"""The answers ledger: one row per trial x model x sample, beside the release (SQLite by SQLAlchemy).

An answer's id hashes the trial (its id and prompt file sha256), the model's lineage (backend,
model name, endpoint, with no credentials: a base URL holding them is refused, and any revision)
and the decoding settings, and the sample index: asked again with the same settings it is the same answer, so ``ask`` never pays
twice. Each answer is committed in its own short transaction the moment it returns (WAL
journal), so a SIGKILL loses only the requests in flight. A backend whose requests can be
fetched later (fal's queue) journals each request id in the ``requests`` table before it
waits, so those are fetched on resume, not paid again; the answer's commit settles that row. Answers also read from and write to
JSON lines (one answer object a line) for other tools.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, DateTime, Float, Integer, String, Text, create_engine, delete, event, select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from counterfactory.manifests.errors import CounterfactoryError
from counterfactory.manifests.safefiles import InputFileError, read_regular

#: the largest answers JSON-lines file ``score`` reads (bytes)
MAX_ANSWERS_BYTES = 2 << 30


class AnswersError(CounterfactoryError, ValueError):
    """Answers that cannot be read or do not belong to the release; the message says which."""


class _Base(DeclarativeBase):
    pass


class AnswerRow(_Base):
    """One model reply to one trial (``reply`` is the raw text; a refusal is an answer too)."""

    __tablename__ = "answers"

    answer_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    trial_id: Mapped[str] = mapped_column(String(64), index=True)
    prompt_sha256: Mapped[str] = mapped_column(String(64))
    protocol: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(256), index=True)
    backend: Mapped[str] = mapped_column(String(64))
    lineage: Mapped[dict[str, Any]] = mapped_column(JSON)
    decoding: Mapped[dict[str, Any]] = mapped_column(JSON)
    sample: Mapped[int] = mapped_column(Integer)
    reply: Mapped[str | None] = mapped_column(Text, nullable=True)
    finish_reason: Mapped[str | None] = mapped_column(String(64), nullable=True)
    tokens_in: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tokens_out: Mapped[int | None] = mapped_column(Integer, nullable=True)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    seconds: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    #: why the reply could not be recorded as an answer (``ask`` recorded an error row: paid
    #: for, not asked again, not scored); ``None`` for an answer
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class JudgementRow(_Base):
    """One LLM-judge reply over two answers (NP/DP C.5: A the neutral, B the disability-context
    description of one image), with the sha256 of the rubric it was asked with."""

    __tablename__ = "judgements"

    judgement_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    rubric: Mapped[str] = mapped_column(String(64))
    rubric_sha256: Mapped[str] = mapped_column(String(64))
    answer_a: Mapped[str] = mapped_column(String(64))
    answer_b: Mapped[str] = mapped_column(String(64), index=True)
    trial_b: Mapped[str] = mapped_column(String(64))
    judged_model: Mapped[str] = mapped_column(String(256), index=True)
    judge: Mapped[dict[str, Any]] = mapped_column(JSON)
    reply: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class RequestRow(_Base):
    """A paid request of ``ask`` not yet answered: its client's journal row (for fal, the
    request id, written before the wait), so a run killed mid-wait fetches it instead of paying
    again. The answer's commit deletes it in the same transaction."""

    __tablename__ = "requests"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


#: the fields of a judgement as JSON
JUDGEMENT_FIELDS = (
    "judgement_id",
    "rubric",
    "rubric_sha256",
    "answer_a",
    "answer_b",
    "trial_b",
    "judged_model",
    "judge",
    "reply",
)

#: the fields of an answer as JSON (``per_trial.jsonl`` and answer files)
ANSWER_FIELDS = (
    "answer_id",
    "trial_id",
    "prompt_sha256",
    "protocol",
    "model",
    "backend",
    "lineage",
    "decoding",
    "sample",
    "reply",
    "finish_reason",
    "tokens_in",
    "tokens_out",
    "cost_usd",
    "seconds",
)


def answer_id(trial: dict[str, Any], lineage: dict[str, Any], decoding: dict[str, Any], sample: int) -> str:
    """The content address of one answer: trial id, prompt file sha256, model lineage, decoding, sample."""
    key = json.dumps(
        [trial["trial_id"], trial["prompt_sha256"], lineage, decoding, int(sample)], sort_keys=True, default=str
    )
    return hashlib.sha256(key.encode()).hexdigest()


def check_ledger_place(release: Path, ledger: Path) -> Path:
    """``ledger`` when it lies outside the release folder.

    Raises:
        AnswersError: a ledger inside the release (symbolic links resolved): the release is
            sealed, and a file written there fails ``verify``.
    """
    folder, where = Path(release).resolve(), Path(ledger).resolve()
    if where == folder or folder in where.parents:
        raise AnswersError(
            f"--ledger {ledger}: inside the release folder {release}, which is sealed (a file written there "
            f"fails `counterfactory verify`); put the ledger outside it, e.g. the default {ledger_path(release)}"
        )
    return Path(ledger)


def ledger_path(release: Path) -> Path:
    """The default answers ledger of a release: ``<release folder>.answers.sqlite`` beside it
    (the release folder itself is sealed)."""
    release = Path(release).resolve()
    return release.parent / f"{release.name}.answers.sqlite"


def _pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=60000")
    cursor.close()


class AnswersLedger:
    """The SQLite answers ledger at ``path`` (created on first open)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if self.path.exists() and self.path.stat().st_size == 0:
            raise AnswersError(f"{self.path}: an empty answers ledger; delete it to start again")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # ``ask`` commits from one writer thread, the reads run on the caller's: a pooled
        # connection may serve either (never two at once)
        self.engine = create_engine(f"sqlite:///{self.path}", connect_args={"check_same_thread": False})
        event.listen(self.engine, "connect", _pragmas)
        _Base.metadata.create_all(self.engine)
        with self.engine.begin() as conn:  # a ledger from before error rows: add their column
            columns = {row[1] for row in conn.exec_driver_sql("PRAGMA table_info(answers)")}
            if "error" not in columns:
                conn.exec_driver_sql("ALTER TABLE answers ADD COLUMN error TEXT")

    def known(self) -> set[str]:
        """Every answer id already committed."""
        with Session(self.engine) as s:
            return set(s.scalars(select(AnswerRow.answer_id)))

    def add(self, row: dict[str, Any]) -> None:
        """Commit one answer now (its own transaction); an id already there is kept as it was."""
        self.commit_answer(row)

    def commit_answer(self, row: dict[str, Any], *, settles: str | None = None) -> None:
        """Commit one answer now, in its own transaction (an id already there is kept as it was),
        and in the same transaction drop the journaled request ``settles`` (the answer's key,
        when its request was journaled).

        One ``INSERT ... ON CONFLICT DO NOTHING`` statement (SQLAlchemy Core, not an ORM session:
        ``ask`` commits every answer as it returns, and the ORM's unit of work cost it a
        third of its CPU per answer)."""
        values = {k: row.get(k) for k in ANSWER_FIELDS} | {"created_at": datetime.now(UTC), "error": row.get("error")}
        cost = values.get("cost_usd")
        if cost is not None and not (isinstance(cost, (int, float)) and math.isfinite(cost) and cost >= 0):
            raise AnswersError(f"answer {row.get('answer_id')}: cost_usd {cost!r} is not a USD amount >= 0")
        with self.engine.begin() as conn:
            conn.execute(sqlite_insert(AnswerRow).values(**values).on_conflict_do_nothing())
            if settles is not None:
                conn.execute(delete(RequestRow).where(RequestRow.key == settles))

    def commit_judgement(self, row: dict[str, Any], *, settles: str | None = None) -> None:
        """Commit one judgement now (its own transaction), dropping the request row ``settles``."""
        values = {k: row.get(k) for k in JUDGEMENT_FIELDS} | {"created_at": datetime.now(UTC)}
        with self.engine.begin() as conn:
            conn.execute(sqlite_insert(JudgementRow).values(**values).on_conflict_do_nothing())
            if settles is not None:
                conn.execute(delete(RequestRow).where(RequestRow.key == settles))

    def requests(self, keys: Iterable[str] | None = None) -> dict[str, tuple[dict[str, Any], float]]:
        """Journaled requests not yet answered: key -> (journal row, USD), of ``keys`` only when given."""
        wanted = None if keys is None else set(keys)
        with self.engine.connect() as conn:
            found = conn.execute(select(RequestRow.key, RequestRow.data, RequestRow.cost_usd)).all()
        return {k: (dict(d or {}), float(c or 0.0)) for k, d, c in found if wanted is None or k in wanted}

    def save_request(self, key: str, data: dict[str, Any], cost_usd: float) -> None:
        """Insert or replace one request's journal row (its own transaction)."""
        values = {"key": key, "data": dict(data), "cost_usd": float(cost_usd), "updated_at": datetime.now(UTC)}
        stmt = sqlite_insert(RequestRow).values(**values)
        stmt = stmt.on_conflict_do_update(
            index_elements=[RequestRow.key],
            set_={
                "data": stmt.excluded.data,
                "cost_usd": stmt.excluded.cost_usd,
                "updated_at": stmt.excluded.updated_at,
            },
        )
        with self.engine.begin() as conn:
            conn.execute(stmt)

    def rows(self) -> list[dict[str, Any]]:
        """Every answer as a dict of :data:`ANSWER_FIELDS`, by trial then model then sample
        (not the error rows: no reply was recorded for those)."""
        with Session(self.engine) as s:
            found = s.scalars(select(AnswerRow).where(AnswerRow.error.is_(None)))
            out = [{k: getattr(r, k) for k in ANSWER_FIELDS} for r in found]
        return sorted(out, key=lambda r: (r["trial_id"], r["model"], r["sample"]))

    def errors(self) -> list[dict[str, Any]]:
        """The error rows: ``answer_id``, ``trial_id``, ``model``, ``sample`` and ``error``."""
        with Session(self.engine) as s:
            found = s.scalars(select(AnswerRow).where(AnswerRow.error.is_not(None)))
            return [{k: getattr(r, k) for k in ("answer_id", "trial_id", "model", "sample", "error")} for r in found]

    def known_judgements(self) -> set[str]:
        with Session(self.engine) as s:
            return set(s.scalars(select(JudgementRow.judgement_id)))

    def add_judgement(self, row: dict[str, Any]) -> None:
        """Commit one judgement now (its own transaction)."""
        self.commit_judgement(row)

    def judgements(self) -> list[dict[str, Any]]:
        with Session(self.engine) as s:
            return [{k: getattr(r, k) for k in JUDGEMENT_FIELDS} for r in s.scalars(select(JudgementRow))]

    def spent_usd(self, model: str) -> float:
        """What ``model``'s answers cost: a negative or unknown row counts as nothing (a ledger
        written before costs were checked must not lift the spend cap)."""
        with Session(self.engine) as s:
            costs = s.scalars(select(AnswerRow.cost_usd).where(AnswerRow.model == model))
            return float(sum(c for c in costs if isinstance(c, (int, float)) and c > 0))

    def close(self) -> None:
        self.engine.dispose()


def answer_spec_of(trial: dict[str, Any]) -> dict[str, Any]:
    """The trial's ``answer_spec``; for a row of a bank before specs were written into rows, the
    spec its protocol and format get now (same answer formats)."""
    if trial.get("answer_spec"):
        return trial["answer_spec"]
    from counterfactory.manifests.answers import YES_NO_UNCERTAIN, choice_spec, integer_spec, text_spec

    protocol = trial["protocol"]
    if protocol == "2afc":
        return choice_spec(["A", "B"], ordered=False)
    if protocol == "mcq":
        options = trial.get("options") or {}
        return choice_spec(list(options), ordered=True, labels=options)
    if protocol == "salary":
        return integer_spec(0, 100_000_000, usd=True)
    if protocol == "limb_pair":
        fmt = trial.get("format")
        if fmt == "yes_no_uncertain":
            return YES_NO_UNCERTAIN
        if fmt == "rating_1_5":
            return integer_spec(1, 5)
        return text_spec(short=fmt == "control")
    return text_spec(short=False)


def read_judgements(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every judgement of the answers ledgers among ``paths`` (JSON-lines files hold none)."""
    out: list[dict[str, Any]] = []
    for path in map(Path, paths):
        if path.suffix in (".sqlite", ".db") and path.is_file():
            ledger = AnswersLedger(path)
            out += ledger.judgements()
            ledger.close()
    return out


#: the fields every answer row needs, and their types
_ANSWER_TYPES = {"trial_id": str, "prompt_sha256": str, "model": str}


def check_answer_row(row: Any, where: str) -> dict[str, Any]:
    """``row`` when it is an answer ``score`` can read (trial id, prompt sha256 and model
    strings, the reply a string or null, the sample a whole number >= 0, the answer id a string
    when given), with ``sample`` defaulted to 0 and where it was read (``_where``).

    Raises:
        AnswersError: naming ``where`` (file and line) and the field.
    """
    if not isinstance(row, dict):
        raise AnswersError(f"{where}: not a JSON object (an answer is one object a line)")
    missing = sorted({"trial_id", "prompt_sha256", "model", "reply"} - set(row))
    if missing:
        raise AnswersError(f"{where}: an answer needs {missing}")
    for name, kind in _ANSWER_TYPES.items():
        if not isinstance(row[name], kind):
            raise AnswersError(f"{where}: {name} is not a string")
    if row["reply"] is not None and not isinstance(row["reply"], str):
        raise AnswersError(f"{where}: reply is not a string (or null)")
    sample = row.get("sample", 0)
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
        raise AnswersError(f"{where}: sample {sample!r} is not a whole number >= 0")
    if row.get("answer_id") is not None and not isinstance(row["answer_id"], str):
        raise AnswersError(f"{where}: answer_id is not a string")
    return {**row, "sample": sample, "_where": where}


def read_answers(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Answers from answers ledgers (``.sqlite``) and JSON-lines files, in the order given, each
    checked (:func:`check_answer_row`) and marked with where it was read (``_where``).

    Raises:
        AnswersError: a file that does not exist or is not answers, or a row that is not an
            answer, naming the file and line (or answer id).
    """
    out: list[dict[str, Any]] = []
    for path in map(Path, paths):
        if not path.is_file():
            raise AnswersError(f"{path}: no such answers file (an answers ledger .sqlite or a .jsonl file)")
        if path.suffix in (".sqlite", ".db"):
            for row in _ledger_rows(path):
                out.append(check_answer_row(row, f"{path} answer {row.get('answer_id')}"))
            continue
        try:
            text = read_regular(path, MAX_ANSWERS_BYTES, limit_field="a smaller answers file").decode("utf-8")
        except (InputFileError, OSError, UnicodeDecodeError) as exc:
            raise AnswersError(f"{path}: not a readable answers file ({exc})") from None
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise AnswersError(f"{path}:{n}: not JSON: {exc}") from None
            out.append(check_answer_row(row, f"{path}:{n}"))
    return out


def _ledger_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of the answers ledger ``path``.

    Raises:
        AnswersError: the file is not an answers ledger (not SQLite, or without its tables).
    """
    from sqlalchemy.exc import SQLAlchemyError

    try:
        ledger = AnswersLedger(path)
        try:
            return ledger.rows()
        finally:
            ledger.close()
    except (SQLAlchemyError, TypeError, ValueError) as exc:
        if isinstance(exc, AnswersError):
            raise
        raise AnswersError(
            f"{path}: not an answers ledger ({type(exc).__name__}); give the .sqlite file `ask` wrote"
        ) from None
