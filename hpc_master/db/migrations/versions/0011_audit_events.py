"""audit_events: an append-only log of privileged and cross-user actions (issue 37, ``services.audit``)

Triggers refuse UPDATE and DELETE on the table (SQLite and PostgreSQL), so that no code path of the master,
nor a mistaken query, rewrites what was recorded; an admin with the database's own credentials still can
(drop the trigger), which the database's logs would show.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REFUSED = "audit_events is append-only"


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor_id", sa.Integer(), nullable=True),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=512), nullable=False),
        sa.Column("target", sa.String(length=256), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=True),
        sa.Column("as_unix", sa.String(length=128), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=True),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_audit_events_time", "audit_events", ["time"])
    if op.get_bind().dialect.name == "sqlite":
        for verb in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER audit_events_no_{verb.lower()} BEFORE {verb} ON audit_events "
                f"BEGIN SELECT RAISE(ABORT, '{REFUSED}'); END"
            )
    else:
        op.execute(
            "CREATE FUNCTION audit_events_append_only() RETURNS trigger AS $$ "
            f"BEGIN RAISE EXCEPTION '{REFUSED}'; END; $$ LANGUAGE plpgsql"
        )
        op.execute(
            "CREATE TRIGGER audit_events_append_only BEFORE UPDATE OR DELETE ON audit_events "
            "FOR EACH ROW EXECUTE FUNCTION audit_events_append_only()"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for verb in ("update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS audit_events_no_{verb}")
    else:
        op.execute("DROP TRIGGER IF EXISTS audit_events_append_only ON audit_events")
        op.execute("DROP FUNCTION IF EXISTS audit_events_append_only()")
    op.drop_index("ix_audit_events_time", table_name="audit_events")
    op.drop_table("audit_events")
