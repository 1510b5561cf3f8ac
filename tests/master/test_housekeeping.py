"""The lifecycle loop's housekeeping (SQLite and PostgreSQL): expired sessions and trial tokens go, live ones
stay, and the chore runs at most once per period."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import SessionModel
from hpc_master.lifecycle.loop import LifecycleLoop
from hpc_master.services import lifecycle

from .helpers import seed_trial

pytestmark = pytest.mark.storage  # deletion queries


def _token_hashes(sessions: sessionmaker[Session]) -> set[str]:
    with sessions() as s:
        return set(s.scalars(select(SessionModel.token_hash)))


def test_housekeeping_deletes_expired_tokens_only(sessions: sessionmaker[Session]) -> None:
    trial_id = seed_trial(sessions)
    with transaction(sessions) as s:
        lifecycle.mint_trial_token(s, trial_id)  # valid 30 days
        lifecycle.mint_trial_token(s, trial_id, ttl=dt.timedelta(seconds=-1))  # already expired
    before = _token_hashes(sessions)
    assert len(before) == 2
    loop = LifecycleLoop(sessions, jobs=None)
    loop.tick()  # the first tick does the chores
    after = _token_hashes(sessions)
    assert len(after) == 1 and after < before
    with transaction(sessions) as s:
        lifecycle.mint_trial_token(s, trial_id, ttl=dt.timedelta(seconds=-1))
    loop.tick()  # within the period: not again
    assert len(_token_hashes(sessions)) == 2
    loop.housekeeping(every_s=0)
    assert _token_hashes(sessions) == after
