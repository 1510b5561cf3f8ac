"""The web UI's session: the bearer token in an HttpOnly cookie, and what keeps other pages from using it.

A browser that logs in with ``POST /api/v1/auth/login?cookie=true`` gets one cookie, ``SameSite=Strict`` and
``HttpOnly`` (no script, the UI's included, can read it): ``__Host-det_session`` when the master serves TLS
(``Secure``, host-only, ``Path=/``: a page on another port of the host, served over plain HTTP, never gets
it), ``det_session`` over plain HTTP. No cookie of the master is readable by a script: the UI gets its CSRF
value in the login answer and from ``GET /api/v1/webui/session``, and keeps it in memory.

A request authenticated by the cookie:

* must come from the master's own pages: ``Sec-Fetch-Site`` is ``same-origin`` (or ``none``: the user typed
  the address), or, from a browser that does not send it, ``Origin`` is the master's own. Cookies ignore
  ports and ``SameSite`` counts every port of a host (and its sibling host names) as the same site, so a
  task's page served on another port would otherwise have the browser attach the session;
* that changes something (not ``GET``/``HEAD``/``OPTIONS``) must carry ``X-CSRF-Token``, matching the value
  derived from the cookie's token (``csrf_token_for``).

Requests with an ``Authorization`` header (the CLI, scripts, the harness) never look at cookies.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from fastapi import Request, Response

from hpc_master.errors import PermissionDeniedError

PLAIN_SESSION_COOKIE = "det_session"
TLS_SESSION_COOKIE = "__Host-det_session"
SESSION_COOKIES = (TLS_SESSION_COOKIE, PLAIN_SESSION_COOKIE)
SESSION_COOKIE = PLAIN_SESSION_COOKIE
CSRF_COOKIE = "det_csrf"
"""Set by earlier masters (script-readable); only ever cleared now."""
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OWN_PAGES = frozenset({"same-origin", "none"})


def session_cookie_name(secure: bool) -> str:
    return TLS_SESSION_COOKIE if secure else PLAIN_SESSION_COOKIE


def csrf_token_for(session_token: str) -> str:
    return hashlib.sha256(b"hpc-det csrf\0" + session_token.encode()).hexdigest()


def cookie_token(request: Request) -> str | None:
    for name in SESSION_COOKIES:
        token = request.cookies.get(name, "").strip()
        if token:
            return token
    return None


def from_own_pages(headers: Any) -> bool:
    """Whether a browser's request comes from the master's own pages (see the module's docstring)."""
    get = headers.get
    site = get("sec-fetch-site")
    if site is not None:
        return bool(site in OWN_PAGES)
    origin = get("origin")
    if origin is None:
        return True  # not a browser's cross-origin request: browsers send Origin on those
    return bool(origin.split("://", 1)[-1] == get("host", ""))


def check_cookie_request(request: Request, session_token: str) -> None:
    """Refuse a cookie-authenticated request from another page than the master's own, or a state-changing one
    without the matching ``X-CSRF-Token``."""
    if not from_own_pages(request.headers):
        raise PermissionDeniedError(
            "a request from another site, or from another port or host name of this master (a task's page), "
            "cannot use the web UI's session",
            code="cross_site",
        )
    if request.method.upper() in SAFE_METHODS:
        return
    sent = request.headers.get(CSRF_HEADER, "")
    if not sent or not hmac.compare_digest(sent.encode(), csrf_token_for(session_token).encode()):
        raise PermissionDeniedError(
            "a request authenticated by the session cookie must carry the X-CSRF-Token header",
            code="csrf_failed",
        )


def set_session_cookies(response: Response, token: str, *, max_age_s: int, secure: bool) -> str:
    """Set the session cookie; returns the CSRF value (handed to the UI in the login answer)."""
    response.set_cookie(
        session_cookie_name(secure), token, max_age=max_age_s, path="/", samesite="strict", secure=secure,
        httponly=True,
    )  # fmt: skip
    response.delete_cookie(CSRF_COOKIE, path="/", samesite="strict", secure=secure)
    return csrf_token_for(token)


def clear_session_cookies(response: Response, *, secure: bool) -> None:
    for name in (*SESSION_COOKIES, CSRF_COOKIE):
        if name.startswith("__Host-") and not secure:
            continue
        response.delete_cookie(name, path="/", samesite="strict", secure=secure, httponly=name != CSRF_COOKIE)
