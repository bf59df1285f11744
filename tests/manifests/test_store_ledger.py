"""Image store and ledger: content addressing, attempt lifecycle, the durable editor journal."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from counterfactory.generation.editors.base import EditJournal
from counterfactory.manifests.ledger import Ledger
from counterfactory.manifests.store import ImageStore
from tests.manifests.pg import postgres_server


@pytest.fixture(scope="module")
def pg_url():
    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
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
    with pytest.raises(RuntimeError, match="must not run again"):
        _start(ledger)


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
