"""A new, empty PostgreSQL database on the test server, dropped afterwards (the e2e masters, the admin guide
and the migration tests each want one of their own)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url


@contextlib.contextmanager
def new_database(server_url: str, prefix: str) -> Iterator[str]:
    """The SQLAlchemy URL of a database ``<prefix>_<random>`` on ``server_url``'s server."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
