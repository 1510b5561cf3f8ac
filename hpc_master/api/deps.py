"""Per-app state and the request dependencies (who is calling, with which rights)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from hpc_master.api import browser_origin, session_cookie
from hpc_master.api.streams import StreamSlots
from hpc_master.auth import hash_token
from hpc_master.db.checkpointer import WalCheckpointer, sqlite_file
from hpc_master.db.engine import transaction
from hpc_master.db.models import CheckpointModel, ExperimentModel, TrialModel
from hpc_master.errors import UnauthenticatedError
from hpc_master.ingest.writer import MetricsWriter
from hpc_master.masterconf import MasterConfig
from hpc_master.services import access, users
from hpc_master.services.access import Action, Principal
from hpc_master.services.checkpoints.remover import CheckpointRemover
from hpc_master.services.common import get_or_404
from hpc_master.services.logs import LogReader
from hpc_master.services.munge_login import Nonces
from hpc_master.services.throttle import LoginThrottle
from hpc_master.services.users import TokenCache


@dataclass
class AppState:
    config: MasterConfig
    engine: Engine
    sessions: sessionmaker[Session]
    tokens: TokenCache
    master_id: str
    cluster_id: str
    owner_key_digest: str | None = None
    """A personal master's owner key (SHA-256; see ``hpc_master.owner_key``); None where passwords are required."""
    task_origin: str = ""
    """Where tasks' pages are served (``task_proxy``; ``api/task_origin.py``): never the master's own origin."""
    task_port: int | None = None
    """The port of the task origin's own listener, when it has one (set by ``det-master`` once bound)."""
    browser_port: int | None = None
    """The web UI's HTTPS port of a master that serves browsers apart (``api/browser_origin.py``); None else."""
    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    munge_nonces: Nonces = field(default_factory=Nonces)
    """The nonces of munge logins this master issued (``services.munge_login``)."""
    writer: MetricsWriter = field(init=False)
    checkpointer: WalCheckpointer | None = field(init=False)
    fast_ingests: int = 0
    """Metric batches answered by the fast path (``fast_ingest.MetricsFastPath``), for tests and benchmarks."""
    acts_for_users: bool = field(default_factory=lambda: os.geteuid() == 0)
    """Whether jobs run as their owners' Unix accounts (a shared master: root, or its service account), each
    user's files in their own directory below the job storage root; otherwise as the master's own."""
    log_reader: LogReader | None = None
    """How logs are read: None, by the master itself; a service-account master's, through its users' helpers."""
    helper_via: str = "runuser"
    """How the per-user helper becomes a user: ``runuser`` (a root master) or ``sudo`` (its service account)."""
    checkpoint_remover: CheckpointRemover = field(default_factory=CheckpointRemover)
    """Deletes checkpoint files for the API (as each owner's Unix account when the master runs as root)."""
    streams: StreamSlots = field(init=False)
    """Open streams and long polls per user (per trial for harness tokens), under ``security``'s caps."""

    def __post_init__(self) -> None:
        security = self.config.security
        self.streams = StreamSlots(security.max_streams_per_user, security.max_long_polls_per_trial)
        path = sqlite_file(self.engine)
        self.writer = MetricsWriter(self.sessions, worker_db=path)
        self.checkpointer = WalCheckpointer(path, lambda: self.writer.rows) if path else None

    def start(self) -> None:
        """Background work that lives as long as the app (started on the app's startup)."""
        if self.checkpointer is not None:
            self.checkpointer.start()

    def close(self) -> None:
        self.writer.close()
        if self.checkpointer is not None:
            self.checkpointer.stop()

    @contextmanager
    def tx(self) -> Iterator[Session]:
        """One short transaction (commit on success, rollback on error)."""
        with transaction(self.sessions) as session:
            yield session


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.det
    return state


async def get_state(request: Request) -> AppState:
    """Async on purpose: a sync dependency costs a thread-pool hop on every request."""
    return app_state(request)


State = Annotated[AppState, Depends(get_state)]


def bearer_token(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise UnauthenticatedError("missing bearer token (Authorization: Bearer <token>)")
    return token.strip()


def request_token(request: Request) -> str:
    """The session token: the ``Authorization`` header's, or else the web UI's session cookie (whose
    requests must come from the master's own pages and, when they change something, carry the CSRF header:
    ``session_cookie.check_cookie_request``)."""
    if "authorization" in request.headers:
        return bearer_token(request)
    token = session_cookie.cookie_token(request)
    if token is None:
        raise UnauthenticatedError("missing bearer token (Authorization: Bearer <token>)")
    browser_origin.refuse_plain_session(request)
    session_cookie.check_cookie_request(request, token)
    return token


async def get_principal(request: Request) -> Principal:
    state = app_state(request)
    token = request_token(request)
    cached = state.tokens.get(hash_token(token))
    if cached is not None:
        return cached

    def _lookup() -> Principal:
        with state.tx() as session:
            return users.authenticate(session, token, state.tokens)

    return await run_in_threadpool(_lookup)


AnyPrincipal = Annotated[Principal, Depends(get_principal)]


async def get_user(principal: AnyPrincipal) -> Principal:
    principal.require_user()
    return principal


UserPrincipal = Annotated[Principal, Depends(get_user)]


def check_trial_access(session: Session, principal: Principal, trial_id: int, *, write: bool) -> TrialModel:
    """Harness routes: the trial, once ``access.trial`` allows `principal` to read it or (`write`) report for
    it (a per-trial token is checked before the trial is looked up: another trial's id tells it nothing)."""
    action = Action.CHANGE if write else Action.VIEW
    if principal.trial_id is not None:
        access.trial(principal, trial_id, 0, action)
        return get_or_404(session, TrialModel, trial_id, "trial")
    trial = get_or_404(session, TrialModel, trial_id, "trial")
    owner_id = 0
    if write:
        owner_id = get_or_404(session, ExperimentModel, trial.experiment_id, "experiment").owner_id
    access.trial(principal, trial_id, owner_id, action)
    return trial


def check_checkpoint_access(
    principal: Principal, ckpt: CheckpointModel, owner_id: int, *, write: bool
) -> None:
    """``access.checkpoint``: a per-trial token reads its own trial's checkpoints and its experiment owner's,
    and changes only its own trial's; a user reads any and changes only their own experiments' (admins: all)."""
    access.checkpoint(principal, ckpt.uuid, ckpt.trial_id, owner_id, Action.CHANGE if write else Action.VIEW)
