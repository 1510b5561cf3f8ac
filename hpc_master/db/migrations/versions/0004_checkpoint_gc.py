"""checkpoint GC: each checkpoint's size and deletion attempts, and the outbox of experiments to collect

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BACKFILL_BATCH = 1000


def _size(resources: object) -> int:
    if not isinstance(resources, dict):
        return 0
    return sum(v for v in resources.values() if isinstance(v, int) and not isinstance(v, bool) and v > 0)


def upgrade() -> None:
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.add_column(sa.Column("size_bytes", sa.BigInteger(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("gc_attempts", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("gc_error", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("gc_retry_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index(batch_op.f("ix_checkpoints_gc_retry_at"), ["gc_retry_at"], unique=False)

    op.create_table(
        "checkpoint_gc_requests",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("checkpoint_gc_requests", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_checkpoint_gc_requests_experiment_id"), ["experiment_id"], unique=False
        )

    # The sizes of the checkpoints already recorded, from their resources ({path: bytes}).
    checkpoints = sa.table(
        "checkpoints", sa.column("uuid", sa.String()), sa.column("resources", sa.JSON()),
        sa.column("size_bytes", sa.BigInteger()),
    )  # fmt: skip
    bind = op.get_bind()
    last = ""
    while True:
        rows = bind.execute(
            sa.select(checkpoints.c.uuid, checkpoints.c.resources)
            .where(checkpoints.c.uuid > last)
            .order_by(checkpoints.c.uuid)
            .limit(BACKFILL_BATCH)
        ).all()
        if not rows:
            break
        for uuid, resources in rows:
            size = _size(resources)
            if size:
                bind.execute(sa.update(checkpoints).where(checkpoints.c.uuid == uuid).values(size_bytes=size))
        last = rows[-1][0]


def downgrade() -> None:
    with op.batch_alter_table("checkpoint_gc_requests", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_checkpoint_gc_requests_experiment_id"))
    op.drop_table("checkpoint_gc_requests")
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_checkpoints_gc_retry_at"))
        batch_op.drop_column("gc_retry_at")
        batch_op.drop_column("gc_error")
        batch_op.drop_column("gc_attempts")
        batch_op.drop_column("size_bytes")
