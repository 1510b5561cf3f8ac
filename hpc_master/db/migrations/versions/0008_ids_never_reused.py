"""ids never reused: on SQLite, ``experiments``, ``trials`` and ``models`` are rebuilt with ``AUTOINCREMENT``

Without it SQLite hands out ``max(id) + 1``: deleting the newest experiment freed its id, and the next one got it
(and the deleted one's ``jobs/exp-N`` directories). With it, SQLite keeps the highest id ever given out in
``sqlite_sequence``. PostgreSQL's sequences never reuse a value: nothing to do there. Tasks have UUIDs.

The rebuild drops tables that others reference, so ``upgrade_to_head`` runs the migrations with SQLite's foreign
keys off (with them on, the implicit ``DELETE`` of a ``DROP TABLE`` would cascade to every trial and metric); this
migration checks the keys itself before its transaction commits.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28

"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("experiments", "trials", "models")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    for table in TABLES:
        with op.batch_alter_table(table, recreate="always", table_kwargs={"sqlite_autoincrement": True}):
            pass
    broken = bind.exec_driver_sql("PRAGMA foreign_key_check").all()
    if broken:
        raise RuntimeError(f"rebuilding {', '.join(TABLES)} broke foreign keys: {broken[:5]}")


def downgrade() -> None:
    """AUTOINCREMENT is kept: 0007's code reads and writes these tables the same way."""
