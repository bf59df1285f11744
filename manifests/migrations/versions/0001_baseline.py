"""Baseline: the ledger as counterfactory 0.1.0 created it (before Alembic).

A ledger written by that version has these tables and no ``alembic_version``;
:func:`counterfactory.manifests.schema.upgrade_ledger` stamps it with this revision instead of
running it, then applies the later ones in place.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "sources",
        sa.Column("source_id", sa.String(200), primary_key=True),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("meta", sa.JSON(), nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
    )
    op.create_table(
        "attempts",
        sa.Column("attempt_id", sa.String(64), primary_key=True),
        sa.Column("cell_id", sa.String(400), nullable=False),
        sa.Column("attempt_no", sa.Integer(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(40), nullable=False),
        sa.Column("lineage", sa.JSON(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("output_sha256", sa.String(64), nullable=True),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("calls", sa.Integer(), nullable=False),
        sa.Column("meta", sa.JSON(), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("finished_at", TZ, nullable=True),
    )
    op.create_index("ix_attempts_cell_id", "attempts", ["cell_id"])
    op.create_index("ix_attempts_status", "attempts", ["status"])
    op.create_table(
        "candidates",
        sa.Column("attempt_id", sa.String(64), sa.ForeignKey("attempts.attempt_id"), primary_key=True),
        sa.Column("cell_id", sa.String(400), nullable=False),
        sa.Column("judge_key", sa.String(64), nullable=False),
        sa.Column("image_sha256", sa.String(64), nullable=True),
        sa.Column("alignment", sa.JSON(), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("reasons", sa.JSON(), nullable=False),
        sa.Column("gates", sa.JSON(), nullable=False),
        sa.Column("judged_at", TZ, nullable=False),
    )
    op.create_index("ix_candidates_cell_id", "candidates", ["cell_id"])
    op.create_index("ix_candidates_verdict", "candidates", ["verdict"])
    op.create_table(
        "editor_journal",
        sa.Column("attempt_id", sa.String(64), primary_key=True),
        sa.Column("backend", sa.String(40), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
    )
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("spec_name", sa.String(200), nullable=False),
        sa.Column("spec_hash", sa.String(64), nullable=False),
        sa.Column("started_at", TZ, nullable=False),
        sa.Column("finished_at", TZ, nullable=True),
        sa.Column("editor_calls", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
    )


def downgrade() -> None:
    for table in ("runs", "editor_journal", "candidates", "attempts", "sources"):
        op.drop_table(table)
