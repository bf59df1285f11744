"""One vote per reviewer per item, and stale views refused, in the database itself.

``review_decisions`` gains ``seq`` (the position of an accept, reject or undo among the item's
votes: the number of such rows before it, which the reviewer's signed view carries) and
``ballot`` (``vote:<reviewer>:<round>`` or ``undo:<reviewer>:<round>``, the round being how
many of their votes on the item the reviewer has undone). A unique index on each means that
two decisions answering the same view, or a second vote by one reviewer, cannot both be
stored, on SQLite and PostgreSQL alike, whatever the application checked before. Skips carry
neither (NULLs never collide). Rows written before this revision keep NULL in both: the table
is append-only, so they are read as they are.

``reviewers`` gains ``revoked_at``: a revoked token signs nobody in.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # plain ADD COLUMN on both dialects (no table rebuild, so the append-only triggers stay)
    op.add_column("review_decisions", sa.Column("seq", sa.Integer(), nullable=True))
    op.add_column("review_decisions", sa.Column("ballot", sa.String(48), nullable=True))
    op.create_index("ux_review_decisions_seq", "review_decisions", ["attempt_id", "seq"], unique=True)
    op.create_index("ux_review_decisions_ballot", "review_decisions", ["attempt_id", "ballot"], unique=True)
    op.add_column("reviewers", sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_index("ux_review_decisions_ballot", "review_decisions")
    op.drop_index("ux_review_decisions_seq", "review_decisions")
    with op.batch_alter_table("reviewers") as batch:
        batch.drop_column("revoked_at")
    with op.batch_alter_table("review_decisions") as batch:
        batch.drop_column("ballot")
        batch.drop_column("seq")
