"""tasks: commands, notebooks, shells and TensorBoards, each one Slurm job (``hpc_master.tasks``)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tasks",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("task_type", sa.String(length=16), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("description", sa.String(length=512), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("context_archive", sa.LargeBinary(), nullable=True),
        sa.Column("resource_pool", sa.String(length=128), nullable=False),
        sa.Column("run_dir", sa.Text(), nullable=False),
        sa.Column("slurm_job_id", sa.String(length=64), nullable=True),
        sa.Column("submit_attempted", sa.Boolean(), nullable=False),
        sa.Column("node_list", sa.Text(), nullable=True),
        sa.Column("pending_reason", sa.String(length=256), nullable=True),
        sa.Column("kill_requested", sa.Boolean(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("exit_status", sa.Text(), nullable=True),
        sa.Column("service_args", sa.JSON(), nullable=True),
        sa.Column("service_address", sa.String(length=256), nullable=True),
        sa.Column("last_activity", sa.DateTime(timezone=True), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("start_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_time", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["owner_id"], ["users.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index("ix_tasks_task_type", ["task_type"], unique=False)
        batch_op.create_index("ix_tasks_owner_id", ["owner_id"], unique=False)
        batch_op.create_index("ix_tasks_state", ["state"], unique=False)
        batch_op.create_index("ix_tasks_slurm_job_id", ["slurm_job_id"], unique=False)


def downgrade() -> None:
    op.drop_table("tasks")
