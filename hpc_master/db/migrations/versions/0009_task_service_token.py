"""tasks.service_token: the master's record of a notebook's or TensorBoard's server token

Written to the job's run directory for the server, never read back from there (a user could replace that file
with a link to any file the master can read): the proxy takes the token from here.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("service_token", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("service_token")
