"""The web UI's session: the bearer token in an HttpOnly cookie, and CSRF protection for it.

A browser that logs in with ``POST /api/v1/auth/login?cookie=true`` gets two cookies, both
``SameSite=Strict`` (``Secure`` when the master serves TLS):

* ``det_session``: the session token itself, ``HttpOnly``: no script, the UI's included, can read it;
* ``det_csrf``: a value derived from the token (``csrf_token_for``), readable by the UI's script, which
  sends it back in the ``X-CSRF-Token`` header of every request that changes something.

A request authenticated by the cookie and not ``GET``/``HEAD``/``OPTIONS`` must carry that header, and the
header must match the value derived from the cookie's token (not merely the other cookie, so a cookie
planted from a sibling host cannot pair with a forged header). Requests with an ``Authorization`` header
(the CLI, scripts, the harness) never look at cookies, so they are unchanged.
"""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Request, Response

from hpc_master.errors import PermissionDeniedError

SESSION_COOKIE = "det_session"
CSRF_COOKIE = "det_csrf"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def csrf_token_for(session_token: str) -> str:
    return hashlib.sha256(b"hpc-det csrf\0" + session_token.encode()).hexdigest()


def cookie_token(request: Request) -> str | None:
    token = request.cookies.get(SESSION_COOKIE, "").strip()
    return token or None


def check_csrf(request: Request, session_token: str) -> None:
    """Refuse a state-changing request authenticated by cookie without the matching ``X-CSRF-Token``."""
    if request.method.upper() in SAFE_METHODS:
        return
    sent = request.headers.get(CSRF_HEADER, "")
    if not sent or not hmac.compare_digest(sent.encode(), csrf_token_for(session_token).encode()):
        raise PermissionDeniedError(
            "a request authenticated by the session cookie must carry the X-CSRF-Token header",
            code="csrf_failed",
        )


def set_session_cookies(response: Response, token: str, *, max_age_s: int, secure: bool) -> str:
    """Set both cookies; returns the CSRF value (also handed to the UI in the login answer)."""
    csrf = csrf_token_for(token)
    common = {"max_age": max_age_s, "path": "/", "samesite": "strict", "secure": secure}
    response.set_cookie(SESSION_COOKIE, token, httponly=True, **common)  # type: ignore[arg-type]
    response.set_cookie(CSRF_COOKIE, csrf, httponly=False, **common)  # type: ignore[arg-type]
    return csrf


def clear_session_cookies(response: Response, *, secure: bool) -> None:
    for name in (SESSION_COOKIE, CSRF_COOKIE):
        response.delete_cookie(
            name, path="/", samesite="strict", secure=secure, httponly=name == SESSION_COOKIE
        )
