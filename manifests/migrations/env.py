"""Alembic environment for the ledger: always run online, on the connection the caller passes.

:func:`counterfactory.manifests.schema.upgrade_ledger` is the entry point; it puts its open
connection into ``config.attributes["connection"]`` so the upgrade shares its lock.
"""

from alembic import context

from counterfactory.manifests.ledger import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "the ledger migrations run through counterfactory.manifests.schema.upgrade_ledger(url), "
        "not the alembic command line"
    )
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
