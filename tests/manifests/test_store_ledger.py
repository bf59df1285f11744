"""Image store and ledger: content addressing, attempt lifecycle, the durable editor journal."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from counterfactory.generation.editors.base import EditJournal
from counterfactory.manifests.ledger import Ledger, LedgerError
from counterfactory.manifests.store import DamagedBlobError, ImageStore, MissingBlobError, png_bytes
from tests.manifests.pg import postgres_server


@pytest.fixture(scope="module")
def pg_url():
    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def ledger_url(request, tmp_path):
    """Every ledger test runs on SQLite (the default) and on a real PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'l.sqlite'}"
    url = request.getfixturevalue("pg_url")
    engine = Ledger(url).engine
    from counterfactory.manifests.ledger import Base

    Base.metadata.drop_all(engine)  # each test starts from an empty schema
    with engine.begin() as connection:
        connection.exec_driver_sql("DROP TABLE IF EXISTS alembic_version")
    engine.dispose()
    return url


def test_store_is_content_addressed_and_lossless(tmp_path, grace):
    store = ImageStore(tmp_path / "store")
    sha = store.put(grace)
    assert sha == hashlib.sha256(store.path(sha).read_bytes()).hexdigest()
    assert np.array_equal(store.get(sha), grace)
    assert store.put(grace.copy()) == sha  # same pixels, same file
    assert not list((tmp_path / "store").rglob("*.tmp"))


def test_store_missing_image_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="abcdef"):
        ImageStore(tmp_path).get("abcdef" + "0" * 58)


def _start(ledger: Ledger, aid: str = "a" * 64) -> None:
    ledger.start_attempt(
        aid,
        cell_id="src|race=Black",
        attempt_no=1,
        seed=0,
        backend="classical",
        lineage={"backend": "classical"},
        prompt="p",
    )


def test_attempt_lifecycle_and_call_count(ledger_url):
    ledger = Ledger(ledger_url)
    _start(ledger)
    assert ledger.attempt("a" * 64).status == "running"
    # a crashed (running) attempt may run again; the call is counted
    _start(ledger)
    ledger.finish_attempt("a" * 64, status="ok", output_sha256="b" * 64, cost_usd=0.04)
    row = ledger.attempt("a" * 64)
    assert (row.status, row.calls, row.cost_usd) == ("ok", 2, 0.04)
    assert ledger.editor_calls() == 2
    # a finished attempt is never claimed again: the caller must not call the editor
    assert not ledger.start_attempt(
        "a" * 64, cell_id="c", attempt_no=1, seed=0, backend="classical", lineage={}, prompt="p"
    )
    assert ledger.attempt("a" * 64).calls == 2 and ledger.editor_calls() == 2


def test_state_survives_reopening(ledger_url):
    url = ledger_url
    first = Ledger(url)
    _start(first)
    first.finish_attempt("a" * 64, status="ok", output_sha256="b" * 64)
    first.record_candidate(
        "a" * 64,
        cell_id="c",
        judge_key="k",
        image_sha256="c" * 64,
        alignment={"ok": True, "transform": np.eye(2, 3)},
        verdict="accepted",
        reasons=[],
        gates={"face": {"passed": True, "metrics": {"faces": np.int64(1)}}},
    )
    first.close()
    again = Ledger(url)
    assert again.attempt("a" * 64).output_sha256 == "b" * 64
    cand = again.candidate("a" * 64)
    assert cand.verdict == "accepted" and cand.alignment["transform"][0] == [1.0, 0.0, 0.0]
    assert cand.gates["face"]["metrics"]["faces"] == 1


def test_journal_is_an_edit_journal_and_sums_spend_per_backend(ledger_url):
    ledger = Ledger(ledger_url)
    fal = ledger.journal("fal")
    assert isinstance(fal, EditJournal)
    assert fal.load("x") is None
    fal.save("x", {"request_id": "r1", "state": "submitted"}, cost_usd=0.039)
    fal.save("y", {"request_id": "r2"}, cost_usd=0.039)
    ledger.journal("other").save("z", {}, cost_usd=5.0)
    assert fal.load("x") == {"request_id": "r1", "state": "submitted"}
    assert fal.spent_usd() == pytest.approx(0.078)


def test_a_blob_edited_in_place_is_a_clear_error_naming_the_file(tmp_path, grace):
    store = ImageStore(tmp_path / "store")
    sha = store.put(grace)
    path = store.path(sha)
    # reproduction: an in-place edit of a stored image (what a hard-linked release file invites)
    edited = grace.copy()
    edited[0, 0] ^= 1
    path.write_bytes(png_bytes(edited))
    with pytest.raises(DamagedBlobError, match=str(path)) as caught:
        store.get(sha)
    assert sha[:12] in str(caught.value) and "re-run" in str(caught.value)
    with pytest.raises(DamagedBlobError, match=str(path)):
        store.verified_path(sha)
    # storing the same pixels again repairs the blob rather than trusting the damaged file
    assert store.put(grace) == sha
    assert store.verified_path(sha) == path and np.array_equal(store.get(sha), grace)


def test_a_truncated_blob_is_damaged_and_a_deleted_one_is_missing(tmp_path, grace):
    store = ImageStore(tmp_path / "store")
    sha = store.put(grace)
    data = store.path(sha).read_bytes()
    store.path(sha).write_bytes(data[: len(data) // 2])
    with pytest.raises(DamagedBlobError):
        store.get(sha)
    store.path(sha).unlink()
    with pytest.raises(MissingBlobError, match="re-run the same spec"):
        store.verified_path(sha)
    assert not store.has(sha)


def test_a_zero_byte_ledger_is_refused_not_started_from_scratch(tmp_path):
    path = tmp_path / "ledger.sqlite"
    first = Ledger(f"sqlite:///{path}")
    _start(first)
    first.finish_attempt("a" * 64, status="ok", output_sha256="b" * 64, cost_usd=0.04)
    first.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    # reproduction: the file emptied (a failed copy, a full disk); SQLite would call it a new
    # database and every paid attempt would be bought again
    path.write_bytes(b"")
    with pytest.raises(LedgerError, match="empty \\(0 bytes\\)") as caught:
        Ledger(f"sqlite:///{path}")
    assert str(path) in str(caught.value) and "backup" in str(caught.value)
    assert path.stat().st_size == 0  # refused without writing to it


def test_a_corrupt_ledger_is_refused_with_how_to_recover(tmp_path):
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"this is not a database, it is a shopping list\n" * 200)
    with pytest.raises(LedgerError, match="damaged") as caught:
        Ledger(f"sqlite:///{path}")
    assert str(path) in str(caught.value) and ".recover" in str(caught.value)


def test_an_older_schema_ledger_goes_through_the_migrations_or_is_refused(tmp_path):
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(f"sqlite:///{path}")
    _start(ledger)
    ledger.close()
    # a ledger from before the migrations existed (no alembic_version, no review tables) is
    # stamped at the baseline and upgraded, keeping its rows
    with sqlite3.connect(path) as db:
        for table in ("alembic_version", "review_decisions", "spot_deals", "spot_trials", "reviewers"):
            db.execute(f"drop table if exists {table}")
        for column in ("claimed_by", "claimed_at"):  # revision 0003's
            db.execute(f"alter table attempts drop column {column}")
    again = Ledger(f"sqlite:///{path}")
    assert again.attempt("a" * 64).status == "running"
    again.close()
    # one older than the baseline (a column the migrations never add) is refused, naming it
    with sqlite3.connect(path) as db:
        for table in ("alembic_version", "review_decisions", "spot_deals", "spot_trials", "reviewers"):
            db.execute(f"drop table {table}")
        for column in ("claimed_by", "claimed_at", "meta"):
            db.execute(f"alter table attempts drop column {column}")
    with pytest.raises(LedgerError, match="older version") as caught:
        Ledger(f"sqlite:///{path}")
    assert "'attempts' lacks column(s) meta" in str(caught.value)
    # a partial ledger (some tables gone) is called damaged by the migrations, in one message
    with sqlite3.connect(path) as db:
        db.execute("drop table if exists alembic_version")
        db.execute("drop table candidates")
    with pytest.raises(LedgerError, match="damaged"):
        Ledger(f"sqlite:///{path}")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("not a url", "not a usable SQLAlchemy URL"),
        ("nosuchdb://host/db", "not a usable SQLAlchemy URL"),
        ("postgresql+psycopg://me:secret@127.0.0.1:9/db", "cannot be opened"),
    ],
)
def test_a_bad_ledger_url_is_one_message_without_the_password(url, expected):
    with pytest.raises(LedgerError, match=expected) as caught:
        Ledger(url)
    assert "secret" not in str(caught.value)


def test_reopening_an_attempt_whose_output_blob_is_gone(ledger_url):
    ledger = Ledger(ledger_url)
    _start(ledger)
    ledger.finish_attempt("a" * 64, status="ok", output_sha256="b" * 64)
    ledger.record_candidate(
        "a" * 64, cell_id="c", judge_key="k", image_sha256="c" * 64, alignment={}, verdict="ok", reasons=[], gates={}
    )
    ledger.reopen_attempt("a" * 64, reason="store_blob_missing")
    row = ledger.attempt("a" * 64)
    assert (row.status, row.output_sha256, row.calls) == ("failed", None, 1)
    assert ledger.candidate("a" * 64) is None
    _start(ledger)  # runnable again, and the second call is counted
    assert ledger.attempt("a" * 64).calls == 2


def test_cost_counts_only_the_named_attempts(ledger_url):
    ledger = Ledger(ledger_url)
    for aid, cost in (("a" * 64, 0.04), ("b" * 64, 0.5), ("c" * 64, 7.0)):
        _start(ledger, aid)
        ledger.finish_attempt(aid, status="ok", output_sha256="d" * 64, cost_usd=cost)
    assert ledger.cost_usd(["a" * 64, "b" * 64, "z" * 64]) == pytest.approx(0.54)
    assert ledger.cost_usd([]) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("ledger_url", ["postgres"], indirect=True)
def test_a_live_runs_claim_keeps_other_runs_off_the_attempt(ledger_url):
    pg_url = ledger_url
    first, second = Ledger(pg_url), Ledger(pg_url)  # two runs, two output folders, one database
    first.start_run("run-a", spec_name="s", spec_hash="h")
    second.start_run("run-b", spec_name="s", spec_hash="h")
    claim = {"cell_id": "c", "attempt_no": 1, "seed": 0, "backend": "fal", "lineage": {}, "prompt": "p"}
    assert first.start_attempt("a" * 64, run_id="run-a", **claim)
    # reproduction: the second run used to mark it running again and pay for it a second time
    assert not second.start_attempt("a" * 64, run_id="run-b", **claim)
    assert second.attempt("a" * 64).calls == 1
    # the claiming run dies (its connection and advisory lock go): the claim is taken over
    first.close()
    # the server drops a closed connection's locks as its backend exits, a moment later: until
    # then the claim is (rightly) still live, so wait for the server, not a fixed time
    deadline = time.monotonic() + 10
    while not second.start_attempt("a" * 64, run_id="run-b", **claim):
        assert time.monotonic() < deadline, "the dead run's advisory lock was never released"
        time.sleep(0.05)
    assert second.attempt("a" * 64).calls == 2
    second.close()


@pytest.mark.slow
@pytest.mark.parametrize("ledger_url", ["postgres"], indirect=True)
def test_an_attempt_another_run_finished_meanwhile_is_not_claimed(ledger_url):
    """Two workers: the second saw the attempt running, the first finished it before the
    second's claim. The claim says no (it used to raise, failing the second worker's template)."""
    first, second = Ledger(ledger_url), Ledger(ledger_url)
    first.start_run("run-a", spec_name="s", spec_hash="h")
    second.start_run("run-b", spec_name="s", spec_hash="h")
    claim = {"cell_id": "c", "attempt_no": 1, "seed": 0, "backend": "fal", "lineage": {}, "prompt": "p"}
    assert first.start_attempt("a" * 64, run_id="run-a", **claim)
    assert second.attempt("a" * 64).status == "running"  # what the second worker saw
    first.finish_attempt("a" * 64, status="ok", output_sha256="b" * 64)
    assert not second.start_attempt("a" * 64, run_id="run-b", **claim)
    assert second.attempt("a" * 64).status == "ok" and second.attempt("a" * 64).calls == 1
    first.close()
    second.close()


def test_workers_recording_the_same_photos_at_once_both_succeed(ledger_url):
    """Workers of one study share a ledger and record the same photos as they start: each
    record is one insert-or-update, never a read-then-insert that lets two of them insert (the
    `sources_pkey` violation a two-worker run on PostgreSQL once hit). The last record wins."""
    from concurrent.futures import ThreadPoolExecutor

    ledgers = [Ledger(ledger_url) for _ in range(4)]
    try:

        def record(i: int) -> None:
            for round_ in range(5):
                ledgers[i].record_source(
                    "astronaut", f"/photos/{i}-{round_}.png", sha256="ab" * 32, status="ok", meta={"worker": i}
                )

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(record, range(4)))
        rows = ledgers[0].sources()
        assert [r.source_id for r in rows] == ["astronaut"]
        assert rows[0].path.endswith("-4.png") and rows[0].meta["worker"] in range(4)
        ledgers[0].record_source("astronaut", "/photos/x.png", sha256=None, status="failed", reason="unreadable")
        (row,) = ledgers[1].sources()
        assert (row.path, row.sha256, row.status, row.reason) == ("/photos/x.png", None, "failed", "unreadable")
    finally:
        for ledger in ledgers:
            ledger.close()


def _count_statements(ledger: Ledger) -> list[str]:
    """Every SQL statement ``ledger`` sends from now on (a SQLAlchemy cursor event)."""
    from sqlalchemy import event

    sent: list[str] = []
    event.listen(ledger.engine, "before_cursor_execute", lambda conn, cur, stmt, *rest: sent.append(stmt))
    return sent


def test_reads_of_many_attempts_and_writes_of_many_sources_take_one_statement_each(ledger_url):
    """A settled re-run asks for every cell's attempt at once and records every source: one
    statement each, however many (one per 500 ids and one per source made a re-run's cost grow
    with the cells already settled; on the old code 2 statements per read of 600 ids, 600 upserts)."""
    from sqlalchemy import insert

    from counterfactory.manifests.ledger import AttemptRow, CandidateRow

    ledger = Ledger(ledger_url)
    n = 600  # more than one bounded IN list (500 ids)
    ids = [f"{i:064x}" for i in range(n)]
    with ledger.session() as s, s.begin():
        s.execute(
            insert(AttemptRow),
            [
                {"attempt_id": a, "cell_id": f"t{i % 7}|c={i}", "attempt_no": 1, "seed": 1, "backend": "fake",
                 "lineage": {}, "prompt": "p", "status": "ok", "output_sha256": a, "cost_usd": 0.25, "calls": 1,
                 "meta": {"i": i}}
                for i, a in enumerate(ids)
            ],
        )  # fmt: skip
        s.execute(
            insert(CandidateRow),
            [{"attempt_id": a, "cell_id": f"t{i % 7}|c={i}", "judge_key": "k", "image_sha256": a, "verdict": "accepted",
              "reasons": [], "gates": {}, "alignment": {}} for i, a in enumerate(ids) if i % 2]
        )  # fmt: skip
    asked = ids[3:] + ["f" * 64]  # one id the ledger lacks
    sent = _count_statements(ledger)
    states = ledger.settled_states(asked)
    assert len(sent) == 1 and set(states) == set(ids[3:])
    assert states[ids[5]].verdict == "accepted" and states[ids[4]].verdict is None and states[ids[4]].meta == {"i": 4}
    sent.clear()
    attempts = ledger.attempts_by_id(asked)
    candidates = ledger.candidates_by_id(asked)
    cost = ledger.cost_usd(asked)
    assert len(sent) == 3
    assert set(attempts) == set(ids[3:]) and set(candidates) == {a for i, a in enumerate(ids) if i % 2 and i >= 3}
    assert cost == pytest.approx(0.25 * (n - 3))
    # a short list is still filtered by the database, with the same answers
    sent.clear()
    assert set(ledger.settled_states(ids[:4])) == set(ids[:4]) and ledger.cost_usd(ids[:4]) == pytest.approx(1.0)
    assert len(sent) == 2 and all("IN" in statement for statement in sent)
    assert ledger.finished_outputs() and sorted(ledger.finished_outputs()) == ids
    sent.clear()
    rows = [{"source_id": f"s{i}", "path": f"p{i}.png", "sha256": "a" * 64, "status": "ok", "meta": {"i": i}}
            for i in range(n)]  # fmt: skip
    ledger.record_sources(rows)
    ledger.record_sources([{**rows[7], "status": "failed", "reason": "gone"}])  # an upsert updates
    assert len(sent) <= 2 + 2 * 2  # each: its one statement, and BEGIN/COMMIT where the driver sends them
    assert sum(s.lstrip().upper().startswith("INSERT") for s in sent) == 2
    recorded = {row.source_id: row for row in ledger.sources()}
    assert len(recorded) == n and recorded["s7"].status == "failed" and recorded["s7"].reason == "gone"
    assert recorded["s8"].meta == {"i": 8}
    ledger.close()
