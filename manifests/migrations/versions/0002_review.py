"""Human review: reviewers, append-only decisions, blinded spot-the-edit trials.

``review_decisions`` and ``spot_trials`` refuse UPDATE and DELETE in the database itself
(triggers), so the history a release quotes cannot be rewritten by any client.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)
APPEND_ONLY = ("review_decisions", "spot_trials")


def upgrade() -> None:
    op.create_table(
        "reviewers",
        sa.Column("reviewer_id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", TZ, nullable=False),
    )
    op.create_table(
        "review_decisions",
        sa.Column("decision_id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("attempt_id", sa.String(64), sa.ForeignKey("candidates.attempt_id"), nullable=False),
        sa.Column("reviewer_id", sa.Integer(), sa.ForeignKey("reviewers.reviewer_id"), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("decision", sa.String(8), nullable=False),
        sa.Column("reason", sa.String(40), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("seen", sa.Integer(), nullable=False),
        sa.Column("decided_at", TZ, nullable=False),
    )
    op.create_index("ix_review_decisions_attempt_id", "review_decisions", ["attempt_id"])
    op.create_table(
        "spot_trials",
        sa.Column("trial_id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("attempt_id", sa.String(64), sa.ForeignKey("candidates.attempt_id"), nullable=False),
        sa.Column("reviewer_id", sa.Integer(), sa.ForeignKey("reviewers.reviewer_id"), nullable=False),
        sa.Column("shown", sa.String(16), nullable=False),
        sa.Column("said_edited", sa.Boolean(), nullable=False),
        sa.Column("click_x", sa.Float(), nullable=True),
        sa.Column("click_y", sa.Float(), nullable=True),
        sa.Column("localised", sa.Boolean(), nullable=True),
        sa.Column("decided_at", TZ, nullable=False),
    )
    op.create_index("ix_spot_trials_attempt_id", "spot_trials", ["attempt_id"])
    dialect = op.get_bind().dialect.name
    for table in APPEND_ONLY:
        if dialect == "sqlite":
            for action in ("UPDATE", "DELETE"):
                op.execute(
                    f"CREATE TRIGGER {table}_no_{action.lower()} BEFORE {action} ON {table} "
                    f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
                )
        elif dialect == "postgresql":
            op.execute(
                f"CREATE OR REPLACE FUNCTION {table}_append_only() RETURNS trigger AS $$ "
                f"BEGIN RAISE EXCEPTION '{table} is append-only'; END $$ LANGUAGE plpgsql"
            )
            op.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION {table}_append_only()"
            )


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for table in APPEND_ONLY:
        if dialect == "postgresql":
            op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
            op.execute(f"DROP FUNCTION IF EXISTS {table}_append_only()")
        op.drop_table(table)
    op.drop_table("reviewers")
