"""Persistence: ORM rows, engines, Alembic migrations."""

from hpc_master.db.engine import make_engine, make_sessionmaker, transaction
from hpc_master.db.migrate import upgrade_to_head

__all__ = ["make_engine", "make_sessionmaker", "transaction", "upgrade_to_head"]
