"""metrics: an index on (trial_id, group, steps_completed), for the reads of a trial's reports by group and steps

The unique constraint ``uq_metrics_report`` (trial_id, trial_run_id, group, steps_completed) only narrows a
trial's rows by ``trial_id``: with ``trial_run_id`` second, a read of one group of a trial, in steps order or at
given steps (Determined's metric streams, the web UI's trials table and time series, the checkpoint lists'
validation metrics, the checkpoint GC) walks every row of the trial, and at 50 million rows PostgreSQL planned
the trials table's latest-validation query as a sequential scan of the whole table
(``bench/results/pg_scale_reads.md``).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24

"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("metrics", schema=None) as batch_op:
        batch_op.create_index(
            "ix_metrics_trial_group_steps", ["trial_id", "group", "steps_completed"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("metrics", schema=None) as batch_op:
        batch_op.drop_index("ix_metrics_trial_group_steps")
