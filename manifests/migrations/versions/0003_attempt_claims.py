"""Attempt claims: which run is executing a running attempt, so two runs sharing one database
(a team's PostgreSQL ledger, several output folders) never pay for the same attempt twice.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("claimed_by", sa.String(64), nullable=True))
        batch.add_column(sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("claimed_at")
        batch.drop_column("claimed_by")
