"""trial_runs.jobs_ahead, tasks.jobs_ahead: the pending jobs Slurm considers first (issue 37)

How many pending jobs Slurm considers before a pending run's or task's job
(``slurm_backend.pending.jobs_ahead``); null when unknown or not pending.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for table in ("trial_runs", "tasks"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("jobs_ahead", sa.Integer(), nullable=True))


def downgrade() -> None:
    for table in ("trial_runs", "tasks"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("jobs_ahead")
