"""Helpers shared by the services: loading rows, guarded updates, events."""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import update
from sqlalchemy.orm import Session

from hpc_master.db.models import Base, EventModel
from hpc_master.errors import ConflictError, NotFoundError

M = TypeVar("M", bound=Base)


class StaleError(ConflictError):
    """The row changed since it was loaded (version mismatch); drop the result and reload."""

    default_code = "stale"


class InvalidTransitionError(ConflictError):
    default_code = "invalid_state"


def get_or_404(session: Session, model: type[M], key: Any, what: str) -> M:
    row = session.get(model, key)
    if row is None:
        raise NotFoundError(f"{what} {key} not found")
    return row


def guarded_update(
    session: Session, model: type[Base], key: int, expected_version: int, **values: Any
) -> bool:
    """``UPDATE … SET values, version = version + 1 WHERE id = key AND version = expected``.

    Returns False (nothing written) when the row changed since it was loaded: the caller's result is stale.
    This is the *apply* step of load → act → apply.
    """
    table: Any = model
    stmt = (
        update(model)
        .where(table.id == key, table.version == expected_version)
        .values(**values, version=table.version + 1)
        .execution_options(synchronize_session=False)
    )
    result: Any = session.execute(stmt)
    return bool(result.rowcount == 1)


def record_event(
    session: Session, entity: str, entity_id: int, old_state: str | None, new_state: str, reason: str
) -> None:
    session.add(
        EventModel(
            entity=entity, entity_id=entity_id, old_state=old_state, new_state=new_state, reason=reason
        )
    )
