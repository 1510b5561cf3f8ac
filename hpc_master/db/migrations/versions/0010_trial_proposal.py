"""trials.proposal: where a trial's hyperparameters came from (issue 40)

``random`` (sampled), ``model`` (``proposals: model``, the searcher's TPE model), ``grid`` or ``given``;
null for trials created before this column (they were all sampled or grid points). ``det e describe``
shows it for searches with ``proposals: model``.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("proposal", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("proposal")
