"""Users, sessions and bearer tokens."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from hpc_master import auth
from hpc_master.db.models import ExperimentModel, SessionModel, TrialModel, UserModel, utcnow
from hpc_master.errors import (
    ClientError,
    ConfigError,
    ConflictError,
    UnauthenticatedError,
)
from hpc_master.services import access, audit
from hpc_master.services.access import (
    Principal as Principal,  # re-exported: older callers (bench base trees) import it here
)
from hpc_master.services.common import get_or_404

DEFAULT_USERS = ("admin", "determined")
TRIAL_TOKEN_TTL = dt.timedelta(days=30)


class TokenCache:
    """Remembers recently validated token hashes for a few seconds, sparing the hot metrics path a query."""

    def __init__(self, ttl_s: float = 5.0) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[Principal, dt.datetime, float]] = {}
        self._lock = threading.Lock()

    def get(self, token_hash: str) -> Principal | None:
        with self._lock:
            entry = self._entries.get(token_hash)
        if entry is None:
            return None
        principal, expires_at, cached_at = entry
        if time.monotonic() - cached_at > self.ttl_s or utcnow() >= expires_at:
            self.forget(token_hash)
            return None
        return principal

    def put(self, token_hash: str, principal: Principal, expires_at: dt.datetime) -> None:
        with self._lock:
            if len(self._entries) > 10_000:
                self._entries.clear()
            self._entries[token_hash] = (principal, expires_at, time.monotonic())

    def forget(self, token_hash: str) -> None:
        with self._lock:
            self._entries.pop(token_hash, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def ensure_default_users(session: Session, *, require_passwords: bool, admin_password: str | None) -> None:
    """Create ``admin`` and ``determined`` at first start (blank passwords, as Determined).

    With passwords required, blank ones are refused: the admin password must be given (``DET_ADMIN_PASSWORD``)
    and ``determined`` is created inactive until an admin sets its password.
    """
    if session.scalar(select(UserModel.id).limit(1)) is not None:
        return
    if require_passwords and not admin_password:
        raise ConfigError(
            "passwords are required (security.require_passwords, or listening beyond loopback): set the admin "
            "password for the first start with DET_ADMIN_PASSWORD or security.admin_password",
            field="security.admin_password",
        )
    session.add(
        UserModel(username="admin", password_hash=auth.hash_password(admin_password or ""), admin=True)
    )
    session.add(UserModel(username="determined", password_hash="", admin=False, active=not require_passwords))


class LoginFailedError(UnauthenticatedError):
    """A refused login. `user_exists` is for the login throttle (``services.throttle``), never the caller."""

    def __init__(self, message: str, *, user_exists: bool) -> None:
        super().__init__(message)
        self.user_exists = user_exists


def login(
    session: Session,
    username: str,
    password: str,
    *,
    ttl: dt.timedelta,
    require_passwords: bool,
    is_owner: bool = False,
    is_hashed: bool = False,
) -> tuple[str, UserModel]:
    """A new session token. A blank password (a personal master's ``admin`` and ``determined``) is accepted
    only from the master's owner (`is_owner`: the login carried the key from the owner's 0600 file), so
    another account on the same login node cannot act, and run jobs, as the owner.

    `is_hashed`: the password is Determined's client-side hash of it (Determined's own CLI and SDK,
    ``auth.determined_hash``). A correct plain password stored in the old form is stored anew
    (``auth.needs_rehash``), so that Determined's client can log in from then on."""
    user = session.scalar(select(UserModel).where(UserModel.username == username))
    # Verify against a dummy hash for unknown users so timing does not reveal which usernames exist.
    stored = user.password_hash if user is not None else _DUMMY_HASH
    ok = auth.verify_password(password, stored, is_hashed=is_hashed)
    if user is None or not ok or not user.active:
        # The same answer whether or not the stored hash could take a client-side hash (``auth.verifiable``),
        # so that the hint reveals no username either.
        raise LoginFailedError(
            HASHED_LOGIN_FAILED if is_hashed else "invalid credentials", user_exists=user is not None
        )
    if user.password_hash == auth.BLANK_PASSWORD_HASH:
        _check_blank_login(require_passwords=require_passwords, is_owner=is_owner, is_hashed=is_hashed)
    elif not is_hashed and auth.needs_rehash(user.password_hash):
        user.password_hash = auth.hash_password(password)
    return open_session(session, user, ttl), user


def open_session(session: Session, user: UserModel, ttl: dt.timedelta) -> str:
    """A new session token of ``user`` (authenticated by the caller)."""
    token = auth.new_token()
    session.add(SessionModel(token_hash=auth.hash_token(token), user_id=user.id, expires_at=utcnow() + ttl))
    return token


def _check_blank_login(*, require_passwords: bool, is_owner: bool, is_hashed: bool) -> None:
    """Refuse a login with a blank password unless passwords are optional and it comes from the owner."""
    if require_passwords:
        raise LoginFailedError("this master requires passwords; ask an admin to set yours", user_exists=True)
    if not is_owner:
        raise LoginFailedError(BLANK_FROM_DETERMINED if is_hashed else BLANK_NOT_OWNER, user_exists=True)


HASHED_LOGIN_FAILED = (
    "invalid credentials (if this password was set before the master accepted Determined's client, log in "
    "once with hpc-det's `det user login` or the web UI, which upgrades it)"
)
BLANK_NOT_OWNER = (
    "a blank password works only for this personal master's owner (the CLI sends the key the "
    "master wrote to the owner's ~/.config/hpc-det); from another account, log in with a "
    "password the owner set (det user change-password)"
)
BLANK_FROM_DETERMINED = (
    "this user has a blank password, which works only with the owner key that hpc-det's `det` sends; "
    "Determined's client cannot send it: set a password with hpc-det's `det user change-password` and log "
    "in with that"
)


_DUMMY_HASH = auth.hash_password("not-a-real-password")
"""In the current form (for plain and client-side hashed logins alike)."""


def logout(session: Session, token: str, cache: TokenCache | None = None) -> None:
    token_hash = auth.hash_token(token)
    session.execute(delete(SessionModel).where(SessionModel.token_hash == token_hash))
    if cache is not None:
        cache.forget(token_hash)


def authenticate(session: Session, token: str, cache: TokenCache | None = None) -> Principal:
    return authenticate_hash(session, auth.hash_token(token), cache)


def authenticate_hash(session: Session, token_hash: str, cache: TokenCache | None = None) -> Principal:
    """The principal of the session whose token has this SHA-256 (a task page's session stands on its web UI
    session this way: logging out ends both)."""
    if cache is not None:
        cached = cache.get(token_hash)
        if cached is not None:
            return cached
    row = session.execute(
        select(SessionModel, UserModel)
        .join(UserModel, UserModel.id == SessionModel.user_id)
        .where(SessionModel.token_hash == token_hash)
    ).first()
    if row is None:
        raise UnauthenticatedError("invalid or expired token")
    sess, user = row
    if sess.expires_at <= utcnow() or not user.active:
        raise UnauthenticatedError("invalid or expired token")
    principal = Principal(user_id=user.id, username=user.username, admin=user.admin, trial_id=sess.trial_id)
    if cache is not None:
        cache.put(token_hash, principal, sess.expires_at)
    return principal


def mint_trial_token(session: Session, trial_id: int, ttl: dt.timedelta | None = None) -> str:
    """Token for the harness of one trial, owned by the experiment's owner and usable only on that trial."""
    trial = get_or_404(session, TrialModel, trial_id, "trial")
    experiment = get_or_404(session, ExperimentModel, trial.experiment_id, "experiment")
    token = auth.new_token()
    session.add(
        SessionModel(
            token_hash=auth.hash_token(token),
            user_id=experiment.owner_id,
            trial_id=trial_id,
            expires_at=utcnow() + (ttl or TRIAL_TOKEN_TTL),
        )
    )
    return token


def purge_expired_sessions(session: Session) -> int:
    result = session.execute(delete(SessionModel).where(SessionModel.expires_at <= utcnow()))
    return int(getattr(result, "rowcount", 0) or 0)


def list_users(session: Session) -> list[UserModel]:
    return list(session.scalars(select(UserModel).order_by(UserModel.id)))


def create_user(
    session: Session,
    principal: Principal,
    *,
    username: str,
    password: str,
    admin: bool = False,
    active: bool = True,
    unix_username: str | None = None,
    display_name: str | None = None,
    require_passwords: bool = False,
    is_hashed: bool = False,
) -> UserModel:
    """`is_hashed`: `password` is Determined's client-side hash of it (``auth.determined_hash``)."""
    principal.require_admin()
    if not username or len(username) > 128 or not username.isprintable() or " " in username:
        raise ClientError("username must be 1-128 printable characters without spaces", field="username")
    _check_new_password(password, is_hashed=is_hashed, require_passwords=require_passwords)
    if session.scalar(select(UserModel.id).where(UserModel.username == username)) is not None:
        raise ConflictError(f"user {username!r} already exists", field="username")
    user = UserModel(
        username=username,
        password_hash=auth.hash_password(password, is_hashed=is_hashed),
        admin=admin,
        active=active,
        unix_username=unix_username or username,
        display_name=display_name,
    )
    session.add(user)
    session.flush()
    audit.record(
        session, actor_id=principal.user_id, actor=principal.username, target=f"user {username}",
        owner=username, as_unix=user.unix_username, detail={"admin": admin, "active": active},
    )  # fmt: skip
    return user


def patch_user(
    session: Session,
    principal: Principal,
    user_id: int,
    *,
    password: str | None = None,
    active: bool | None = None,
    admin: bool | None = None,
    unix_username: str | None = None,
    display_name: str | None = None,
    require_passwords: bool = False,
    cache: TokenCache | None = None,
    keep_token_hash: str | None = None,
    is_hashed: bool = False,
) -> UserModel:
    """`keep_token_hash`: the caller's own session, which a password change leaves valid (every other
    session of the user ends; the per-trial tokens of running jobs stay). `is_hashed`: `password` is
    Determined's client-side hash of it (``auth.determined_hash``)."""
    principal.require_user()
    user = get_or_404(session, UserModel, user_id, "user")
    flags = active is not None or admin is not None or unix_username is not None
    access.user_account(principal, user.id, flags=flags)
    if _demotes_active_admin(user, admin=admin, active=active):
        _refuse_removing_last_admin(session, user)
    if password is not None:
        _check_new_password(password, is_hashed=is_hashed, require_passwords=require_passwords)
        user.password_hash = auth.hash_password(password, is_hashed=is_hashed)
        revoke_user_sessions(session, user.id, keep_token_hash=keep_token_hash)
    _set_fields(user, active=active, admin=admin, unix_username=unix_username, display_name=display_name)
    if flags or not access.is_own(
        principal, user.id
    ):  # an admin's change (one's own password is not audited)
        changed = {
            "active": active,
            "admin": admin,
            "unixUsername": unix_username,
            "displayName": display_name,
        }
        _audit_change(session, principal, user, changed | {"password": "changed" if password else None})
    if cache is not None:
        cache.clear()
    return user


def _audit_change(session: Session, principal: Principal, user: UserModel, changed: dict[str, Any]) -> None:
    audit.record(
        session, actor_id=principal.user_id, actor=principal.username, target=f"user {user.username}",
        owner=user.username, as_unix=user.unix_username, detail={k: v for k, v in changed.items() if v is not None},
    )  # fmt: skip


def _demotes_active_admin(user: UserModel, *, admin: bool | None, active: bool | None) -> bool:
    """Whether the patch takes an active admin's admin flag or activity away."""
    return user.admin and user.active and (admin is False or active is False)


def _set_fields(
    user: UserModel,
    *,
    active: bool | None,
    admin: bool | None,
    unix_username: str | None,
    display_name: str | None,
) -> None:
    """Set the fields the patch gives (those not None)."""
    if active is not None:
        user.active = active
    if admin is not None:
        user.admin = admin
    if unix_username is not None:
        user.unix_username = unix_username
    if display_name is not None:
        user.display_name = display_name


def _check_new_password(password: str, *, is_hashed: bool, require_passwords: bool) -> None:
    if require_passwords and not password:
        raise ClientError("this master requires a non-blank password", field="password")
    if is_hashed and not auth.is_client_hash(password):
        raise ClientError(
            "with isHashed, the password must be Determined's client-side hash of it (128 hex digits)",
            field="password",
        )


def _refuse_removing_last_admin(session: Session, user: UserModel) -> None:
    others = session.scalar(
        select(func.count())
        .select_from(UserModel)
        .where(UserModel.admin.is_(True), UserModel.active.is_(True), UserModel.id != user.id)
    )
    if not others:
        raise ConflictError(
            f"{user.username!r} is the last active admin: make another user an admin first", field="admin"
        )


def end_login_sessions(session: Session) -> int:
    """End every login session (the per-trial tokens of running jobs stay): a personal master does this at
    each start, so a token it issued dies with it (one captured while it was down is worth nothing)."""
    result = session.execute(delete(SessionModel).where(SessionModel.trial_id.is_(None)))
    return int(getattr(result, "rowcount", 0) or 0)


def revoke_user_sessions(session: Session, user_id: int, *, keep_token_hash: str | None = None) -> int:
    """End a user's login sessions (not the per-trial tokens of their running jobs), but `keep_token_hash`."""
    stmt = delete(SessionModel).where(SessionModel.user_id == user_id, SessionModel.trial_id.is_(None))
    if keep_token_hash is not None:
        stmt = stmt.where(SessionModel.token_hash != keep_token_hash)
    result = session.execute(stmt)
    return int(getattr(result, "rowcount", 0) or 0)
