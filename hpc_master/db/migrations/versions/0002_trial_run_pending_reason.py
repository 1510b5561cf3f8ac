"""trial runs: why a pending run waits, and since when

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("trial_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("pending_reason", sa.String(length=256), nullable=True))
        batch_op.add_column(sa.Column("pending_since", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trial_runs", schema=None) as batch_op:
        batch_op.drop_column("pending_since")
        batch_op.drop_column("pending_reason")
