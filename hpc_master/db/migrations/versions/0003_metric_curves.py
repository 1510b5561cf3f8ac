"""metric curves: each (trial, group, metric)'s downsampled learning curve, and how far each experiment's read

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "metric_curves",
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("group", sa.String(length=64), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["trial_id"], ["trials.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("trial_id", "group", "name"),
    )
    op.create_table(
        "metric_curve_marks",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("last_id", sa.BigInteger(), nullable=False),
        sa.Column("recent", sa.LargeBinary(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("experiment_id"),
    )


def downgrade() -> None:
    op.drop_table("metric_curve_marks")
    op.drop_table("metric_curves")
