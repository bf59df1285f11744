"""The ledger's schema history, kept by Alembic (``manifests/migrations/``).

Revisions: ``0001`` the ledger as counterfactory 0.1.0 created it, ``0002`` the review tables,
``0003`` the attempts' run claims, ``0004`` one vote per reviewer per item (unique indexes) and
revoked reviewers.
:func:`upgrade_ledger` brings any ledger to the newest revision in place: an empty database
gets every table, a ledger written before Alembic (tables, no ``alembic_version``) is stamped
``0001`` and upgraded, keeping every row. :class:`~counterfactory.manifests.ledger.Ledger` calls
it on open, so opening a ledger is enough.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, inspect, text

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
#: the revision a pre-Alembic ledger is stamped with: its tables are exactly this revision's
BASELINE = "0001"
#: tables the 0.1.0 code created; their presence without ``alembic_version`` marks such a ledger
BASELINE_TABLES = frozenset({"sources", "attempts", "candidates", "editor_journal", "runs"})
# any constant works; it only has to be the same for every process migrating one database
_PG_LOCK_KEY = 0x63664C6564676572


def _config(connection: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision the code knows."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The ledger's revision, ``None`` for an empty or pre-Alembic database."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade_ledger(target: str | Engine) -> str:
    """Bring the ledger at ``target`` (an SQLAlchemy URL or engine) to the newest revision.

    Safe to call on every open and from several processes: on PostgreSQL an advisory lock
    serialises concurrent upgrades. Returns the revision the ledger is at afterwards.

    Raises:
        RuntimeError: the ledger has some of the 0.1.0 tables but not all (a damaged
            database), or a revision newer than this code knows (a newer counterfactory wrote it).
    """
    if isinstance(target, str):
        engine = create_engine(target)
        try:
            return upgrade_ledger(engine)
        finally:
            engine.dispose()
    engine = target
    head = head_revision()
    with engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
            connection.commit()
        try:
            tables = set(inspect(connection).get_table_names())
            current = MigrationContext.configure(connection).get_current_revision()
            config = _config(connection)
            if current is None and tables & BASELINE_TABLES:
                missing = BASELINE_TABLES - tables
                if missing:
                    raise RuntimeError(
                        f"{engine.url!r}: the ledger has tables {sorted(tables & BASELINE_TABLES)} but lacks "
                        f"{sorted(missing)}; it is damaged. Restore it from a backup or start a new output folder."
                    )
                command.stamp(config, BASELINE)
                connection.commit()
            elif current is not None and current != head:
                known = {s.revision for s in ScriptDirectory.from_config(config).walk_revisions()}
                if current not in known:
                    raise RuntimeError(
                        f"{engine.url!r}: the ledger is at schema revision {current!r}, which this version of "
                        "counterfactory does not know; upgrade counterfactory (pip install -U counterfactory)"
                    )
            if current != head:
                command.upgrade(config, "head")
                connection.commit()
        finally:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
                connection.commit()
    return head
