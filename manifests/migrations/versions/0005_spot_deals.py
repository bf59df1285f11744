"""Blinded trials are dealt once and recorded when shown.

``spot_deals`` records each blinded trial as it is dealt (reviewer, candidate, whether the
candidate or its source photo was shown), before any answer: one per reviewer and candidate
(a unique index), so reloading the page deals the same trial again, and a trial shown but
never answered stays on record. ``spot_trials`` gains ``deal_id``, the deal an answer answers,
unique, so a deal is answered once; rows written before this revision keep NULL (the table is
append-only, so they are read as they are).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "spot_deals",
        sa.Column("deal_id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("attempt_id", sa.String(64), sa.ForeignKey("candidates.attempt_id"), nullable=False),
        sa.Column("reviewer_id", sa.Integer(), sa.ForeignKey("reviewers.reviewer_id"), nullable=False),
        sa.Column("shown", sa.String(16), nullable=False),
        sa.Column("dealt_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_spot_deals_attempt_id", "spot_deals", ["attempt_id"])
    op.create_index("ux_spot_deals_reviewer_attempt", "spot_deals", ["reviewer_id", "attempt_id"], unique=True)
    # plain ADD COLUMN on both dialects (no table rebuild, so the append-only triggers stay)
    op.add_column("spot_trials", sa.Column("deal_id", sa.Integer(), nullable=True))
    op.create_index("ux_spot_trials_deal", "spot_trials", ["deal_id"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_spot_trials_deal", "spot_trials")
    with op.batch_alter_table("spot_trials") as batch:
        batch.drop_column("deal_id")
    op.drop_index("ux_spot_deals_reviewer_attempt", "spot_deals")
    op.drop_index("ix_spot_deals_attempt_id", "spot_deals")
    op.drop_table("spot_deals")
