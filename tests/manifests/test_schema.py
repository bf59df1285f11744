"""The ledger's Alembic history: a 0.1.0 ledger upgrades in place, a new one matches the models."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from counterfactory.manifests.ledger import Base, Ledger
from counterfactory.manifests.schema import _config, current_revision, head_revision, upgrade_ledger
from tests.manifests.pg import postgres_server

FIXTURE = Path(__file__).parent / "fixtures" / "ledger_0_1_0.sql"
OLD_TABLES = ("sources", "attempts", "candidates", "editor_journal", "runs")


def _rows(path: Path) -> dict[str, list[tuple]]:
    con = sqlite3.connect(path)
    try:
        return {t: sorted(con.execute(f"SELECT * FROM {t}").fetchall()) for t in OLD_TABLES}
    finally:
        con.close()


def _as_before(after: dict, before: dict) -> dict:
    """``after``'s rows cut to the columns each table had before (later revisions add columns)."""
    widths = {t: len(rows[0]) if rows else 0 for t, rows in before.items()}
    return {t: [row[: widths[t]] if widths[t] else row for row in rows] for t, rows in after.items()}


def _schema_diff(engine) -> list:
    with engine.connect() as connection:
        return compare_metadata(MigrationContext.configure(connection), Base.metadata)


@pytest.fixture
def old_ledger(tmp_path) -> Path:
    """A ledger exactly as counterfactory 0.1.0 wrote it (its sqlite3 dump, committed)."""
    path = tmp_path / "ledger.sqlite"
    con = sqlite3.connect(path)
    con.executescript(FIXTURE.read_text())
    con.close()
    return path


def test_old_ledger_upgrades_in_place_keeping_every_row(old_ledger):
    before = _rows(old_ledger)
    assert sum(len(v) for v in before.values()) == 10  # 2 sources, 3 attempts, 3 candidates, 1 journal, 1 run
    ledger = Ledger(f"sqlite:///{old_ledger}")
    assert current_revision(ledger.engine) == head_revision() == "0005"
    assert _as_before(_rows(old_ledger), before) == before
    # and the typed API reads them back
    assert {c.verdict for c in ledger.candidates()} == {"needs_review", "accepted", "rejected"}
    assert ledger.editor_calls() == 3 and ledger.journal("fal").spent_usd() == pytest.approx(0.04)
    assert _schema_diff(ledger.engine) == []
    ledger.close()
    # opening again is a no-op
    assert upgrade_ledger(f"sqlite:///{old_ledger}") == "0005"
    assert _as_before(_rows(old_ledger), before) == before


def test_new_ledger_matches_the_models(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'new.sqlite'}")
    assert _schema_diff(ledger.engine) == []
    ledger.close()


def test_decisions_are_append_only_in_the_database(old_ledger):
    ledger = Ledger(f"sqlite:///{old_ledger}")
    with ledger.engine.begin() as c:
        c.execute(text("INSERT INTO reviewers (name, token_sha256, created_at) VALUES ('ann', 'x', '2026-01-01')"))
        c.execute(
            text(
                "INSERT INTO review_decisions (attempt_id, reviewer_id, mode, decision, seen, decided_at) "
                "VALUES (:a, 1, 'queue', 'accept', 0, '2026-01-01')"
            ),
            {"a": "0" * 64},
        )
    for statement in ("UPDATE review_decisions SET decision = 'reject'", "DELETE FROM review_decisions"):
        with pytest.raises(DBAPIError, match="append-only"), ledger.engine.begin() as c:
            c.execute(text(statement))
    with ledger.engine.connect() as c:
        assert c.execute(text("SELECT decision FROM review_decisions")).scalars().all() == ["accept"]
    ledger.close()


def test_damaged_ledger_is_named_not_patched(tmp_path):
    path = tmp_path / "ledger.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE attempts (attempt_id VARCHAR(64) PRIMARY KEY)")
    con.close()
    with pytest.raises(RuntimeError, match=r"damaged.*lacks|lacks.*damaged|lacks \[") as info:
        Ledger(f"sqlite:///{path}")
    assert "candidates" in str(info.value) and "backup" in str(info.value)


@pytest.mark.slow
def test_postgres_old_ledger_upgrades_and_refuses_rewrites():
    with postgres_server() as url:
        engine = create_engine(url)
        # a 0.1.0 ledger on PostgreSQL: the baseline tables with rows and no alembic_version
        with engine.connect() as connection:
            command.upgrade(_config(connection), "0001")
            connection.commit()
        with engine.begin() as c:
            c.execute(text("DROP TABLE alembic_version"))
            c.execute(
                text(
                    "INSERT INTO attempts VALUES ('a', 'astronaut|race=Black', 1, 0, 'classical', '{}', 'p', 'ok', "
                    "NULL, 's', 0.0, 1, '{}', now(), now())"
                )
            )
            c.execute(
                text(
                    "INSERT INTO candidates VALUES ('a', 'astronaut|race=Black', 'k', 'i', '{}', "
                    "'needs_review', '[\"face_low_confidence\"]', '{}', now())"
                )
            )
        assert current_revision(engine) is None
        ledger = Ledger(url)
        assert current_revision(engine) == "0005"
        assert [c.verdict for c in ledger.candidates()] == ["needs_review"]
        assert ledger.editor_calls() == 1
        assert _schema_diff(engine) == []
        with engine.begin() as c:
            c.execute(text("INSERT INTO reviewers (name, token_sha256, created_at) VALUES ('ann', 'x', now())"))
            c.execute(
                text(
                    "INSERT INTO review_decisions (attempt_id, reviewer_id, mode, decision, seen, decided_at) "
                    "VALUES ('a', 1, 'queue', 'accept', 0, now())"
                )
            )
        with pytest.raises(DBAPIError, match="append-only"), engine.begin() as c:
            c.execute(text("DELETE FROM review_decisions"))
        ledger.close()
        engine.dispose()
