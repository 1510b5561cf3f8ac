"""Run the packaged Alembic migrations programmatically (no alembic.ini on disk)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config(engine: Engine | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if engine is not None:
        cfg.set_main_option(
            "sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%")
        )
        cfg.attributes["engine"] = engine
    return cfg


def upgrade_to_head(engine: Engine) -> None:
    """One transaction. On SQLite it runs with foreign keys off (a table rebuild drops a table that others
    reference; with them on, SQLite would run the cascades); a migration that rebuilds checks them itself."""
    sqlite = engine.dialect.name == "sqlite"
    with engine.connect() as connection:
        raw = connection.connection.driver_connection
        assert raw is not None
        if sqlite:  # a PRAGMA on the driver's connection: inside a transaction SQLite ignores this one
            raw.execute("PRAGMA foreign_keys=OFF")
        try:
            with connection.begin():
                cfg = alembic_config(engine)
                cfg.attributes["connection"] = connection
                command.upgrade(cfg, "head")
        finally:
            if sqlite:
                raw.execute("PRAGMA foreign_keys=ON")
