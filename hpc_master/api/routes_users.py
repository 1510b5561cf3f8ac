"""Users: login and logout, who am I, the users themselves (Determined's routes and names)."""

from __future__ import annotations

import datetime as dt
import logging
import os
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request, Response
from sqlalchemy import select

from hpc_master import owner_key
from hpc_master.api import browser_origin, convert, responses, session_cookie
from hpc_master.api.bounds import Id, Limit, Offset
from hpc_master.api.deps import State, UserPrincipal, request_token
from hpc_master.api.schemas import LoginRequest, MungeLoginRequest, PatchUserRequest, PostUserRequest
from hpc_master.auth import hash_token
from hpc_master.db.models import UserModel
from hpc_master.errors import ClientError, NotFoundError, PermissionDeniedError
from hpc_master.services import access, ldap_login, unix_users, users
from hpc_master.services import munge_login as munge
from hpc_master.services.common import get_or_404

router = APIRouter(prefix="/api/v1", tags=["users"])
log = logging.getLogger(__name__)


@router.post("/auth/login", response_model=responses.Login)
def login(
    body: LoginRequest, request: Request, response: Response, state: State, cookie: bool = False
) -> dict[str, Any]:
    """Repeated failures are slowed per user name, and failures on names that do not exist per address
    (``services.throttle``): other users' failures never refuse a correct password. A refusal is 429 with
    ``Retry-After``.

    ``cookie=true`` (the web UI): the token goes into an HttpOnly session cookie instead of the answer,
    which carries the CSRF token to send with state-changing requests (``api.session_cookie``); refused
    with ``https_required`` over plain HTTP where the master serves browsers over HTTPS (``api.browser_origin``).

    ``isHashed`` (Determined's own client): a refusal is 403, as from Determined's master, because that
    client shows the message of a 403 and replaces a 401's with its own advice."""
    if cookie:  # never a session over plain HTTP where the master serves browsers over HTTPS
        browser_origin.refuse_plain_session(request)
    ttl = dt.timedelta(hours=state.config.security.token_ttl_hours)
    # The address that connected; a proxy's X-Forwarded-For only from `listen.forwarded_allow_ips` (server.py).
    address = request.client.host if request.client else "unknown"
    with state.throttle.attempt(body.username, address) as attempt:
        try:
            answer = _password_login(state, body, ttl)
        except users.LoginFailedError as exc:
            refusal = attempt.failed(user_exists=exc.user_exists)
            if refusal is not None:
                raise refusal from None
            if body.is_hashed:
                raise PermissionDeniedError(exc.message) from None
            raise
        attempt.succeeded()
    if cookie:
        answer["csrfToken"] = session_cookie.set_session_cookies(
            response,
            str(answer.pop("token")),
            max_age_s=int(ttl.total_seconds()),
            secure=request.url.scheme == "https",
        )
    return answer


def _password_login(state: Any, body: LoginRequest, ttl: dt.timedelta) -> dict[str, Any]:
    """A master user's password; failing that, where ``security.ldap`` is enabled, the directory's
    (``services.ldap_login``; not for Determined's client, which sends a hash of the password)."""
    try:
        with state.tx() as session:
            token, user = users.login(
                session,
                body.username,
                body.password,
                ttl=ttl,
                require_passwords=state.config.passwords_required(),
                is_owner=owner_key.matches(body.owner_key, state.owner_key_digest),
                is_hashed=body.is_hashed,
            )
            return {"token": token, "user": convert.user_to_api(user)}
    except users.LoginFailedError:
        rules = state.config.security.ldap
        if not rules.enabled or body.is_hashed:
            raise
    found = ldap_login.authenticate(rules, body.username, body.password)  # no transaction open meanwhile
    with state.tx() as session:
        account = unix_users.account_named(found.account, ldap_login.refused)
        user = unix_users.user_for(session, account, rules, ldap_login.refused, "LDAP")
        token = users.open_session(session, user, ttl)
        log.info("LDAP login: %s as the master user %s", found.dn, user.username)
        return {"token": token, "user": convert.user_to_api(user)}


@router.post("/auth/munge/nonce", response_model=responses.MungeNonce)
def munge_nonce(state: State) -> dict[str, Any]:
    """Ours (munge login, ``services.munge_login``): a nonce for ``det user login`` with no user name to put in a
    munge credential restricted to ``masterUid``, the master's Unix account."""
    _munge_enabled(state)
    return {"nonce": state.munge_nonces.issue(), "masterUid": os.geteuid()}


@router.post("/auth/munge/login", response_model=responses.Login)
def munge_login(body: MungeLoginRequest, state: State) -> dict[str, Any]:
    """Ours: a session for the Unix account that encoded ``credential`` (see ``munge_nonce``)."""
    _munge_enabled(state)
    decoded = munge.decode(body.credential, state.config.security.munge.unmunge)
    ttl = dt.timedelta(hours=state.config.security.token_ttl_hours)
    with state.tx() as session:
        user = munge.login(session, state.config, state.munge_nonces, decoded)
        token = users.open_session(session, user, ttl)
        return {"token": token, "user": convert.user_to_api(user)}


def _munge_enabled(state: Any) -> None:
    if not state.config.security.munge.enabled:
        raise ClientError(
            "this master does not take munge logins (security.munge.enabled); log in with a user name",
            code="munge_disabled",
        )


@router.post("/auth/logout", response_model=responses.Empty)
def logout(request: Request, response: Response, principal: UserPrincipal, state: State) -> dict[str, Any]:
    with state.tx() as session:
        users.logout(session, request_token(request), state.tokens)
    if session_cookie.cookie_token(request) is not None:
        session_cookie.clear_session_cookies(response, secure=request.url.scheme == "https")
    return {}


@router.get("/me", response_model=responses.UserAnswer)
def me(principal: UserPrincipal, state: State) -> dict[str, Any]:
    with state.tx() as session:
        return {"user": convert.user_to_api(get_or_404(session, UserModel, principal.user_id, "user"))}


@router.get("/users", response_model=responses.Users)
def list_users(
    principal: UserPrincipal, state: State, active: bool | None = None, offset: Offset = 0, limit: Limit = 0
) -> dict[str, Any]:
    """All users (``active``: only those that are, or are not, active), a page of them with `offset` and
    `limit` (0 or less: no limit), and Determined's ``pagination``."""
    with state.tx() as session:
        rows = [convert.user_to_api(u) for u in users.list_users(session) if active in (None, u.active)]
    page = rows[offset:] if limit <= 0 else rows[offset : offset + limit]
    return {"users": page, "pagination": convert.pagination(offset, limit, len(rows), len(page))}


@router.post("/users", response_model=responses.UserAnswer)
def create_user(body: PostUserRequest, principal: UserPrincipal, state: State) -> dict[str, Any]:
    unix = body.user.unix_username or (body.user.agent_user_group or {}).get("agentUser")
    with state.tx() as session:
        user = users.create_user(
            session,
            principal,
            username=body.user.username,
            password=body.password or "",
            admin=body.user.admin,
            active=body.user.active,
            unix_username=unix,
            display_name=body.user.display_name,
            require_passwords=state.config.passwords_required(),
            is_hashed=body.is_hashed,
        )
        return {"user": convert.user_to_api(user)}


@router.patch("/users/{user_id}", response_model=responses.UserAnswer)
def patch_user(
    user_id: Id, body: PatchUserRequest, request: Request, principal: UserPrincipal, state: State
) -> dict[str, Any]:
    unix = body.unix_username or (body.agent_user_group or {}).get("agentUser")
    with state.tx() as session:
        current = session.get(UserModel, user_id)
        may_change = access.may_change_user(principal, user_id)
        renamed = body.username is not None and current is not None and current.username != body.username
        if renamed and may_change:  # (one who may not change the user is refused by patch_user)
            raise ClientError(
                "renaming a user is not supported: create a user with the new name instead",
                code="not_supported",
                field="username",
            )
        user = users.patch_user(
            session,
            principal,
            user_id,
            password=body.password,
            active=body.active,
            admin=body.admin,
            unix_username=unix,
            display_name=body.display_name,
            require_passwords=state.config.passwords_required(),
            cache=state.tokens,
            keep_token_hash=hash_token(request_token(request)),
            is_hashed=body.is_hashed,
        )
        return {"user": convert.user_to_api(user)}


@router.get("/users/{username}/by-username", tags=["determined-compat"], response_model=responses.UserAnswer)
def user_by_username(username: str, principal: UserPrincipal, state: State) -> dict[str, Any]:
    with state.tx() as session:
        user = session.scalar(select(UserModel).where(UserModel.username == username))
        if user is None:
            raise NotFoundError(f"user {username!r} not found")
        return {"user": convert.user_to_api(user)}


@router.get("/users/{user_id}", tags=["determined-compat"], response_model=responses.UserAnswer)
def get_user(user_id: Id, principal: UserPrincipal, state: State) -> dict[str, Any]:
    with state.tx() as session:
        return {"user": convert.user_to_api(get_or_404(session, UserModel, user_id, "user"))}


@router.post("/users/{user_id}/password", tags=["determined-compat"], response_model=responses.UserAnswer)
def set_user_password(
    user_id: Id,
    password: Annotated[str, Body(max_length=1024)],
    request: Request,
    principal: UserPrincipal,
    state: State,
) -> dict[str, Any]:
    """Determined's ``SetUserPassword``: the body is the new password itself, a JSON string, in plain text
    (the master hashes it). The same rules as a password in ``PATCH /users/{id}``."""
    with state.tx() as session:
        user = users.patch_user(
            session,
            principal,
            user_id,
            password=password,
            require_passwords=state.config.passwords_required(),
            cache=state.tokens,
            keep_token_hash=hash_token(request_token(request)),
        )
        return {"user": convert.user_to_api(user)}
