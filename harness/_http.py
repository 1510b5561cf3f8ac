"""A tiny JSON-over-HTTP client for the master, on ``urllib`` (keeps the in-job import light)."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("harness.http")

JSON = dict[str, Any]


class MasterError(Exception):
    """The master answered with an HTTP error."""

    def __init__(self, status: int, message: str, code: str = "", field: str = "") -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.code = code
        self.field = field

    @property
    def retryable(self) -> bool:
        return self.status >= 500 or self.status in (408, 425, 429)


class MasterUnreachable(Exception):
    """No answer from the master (connection refused, reset, timeout)."""


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, MasterError):
        return exc.retryable
    return isinstance(exc, (MasterUnreachable, OSError))


class MasterSession:
    """Bearer-authenticated JSON calls to one master. Thread-safe (no shared mutable state)."""

    def __init__(self, master_url: str, token: str, *, timeout_s: float = 30.0) -> None:
        self.master_url = master_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def request(
        self,
        method: str,
        path: str,
        body: JSON | None = None,
        *,
        params: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> JSON:
        import urllib.error  # deferred: urllib.request pulls in http.client, email, ssl (~15 ms)
        import urllib.parse
        import urllib.request

        url = self.master_url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raise _to_master_error(e) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            raise MasterUnreachable(f"{method} {url}: {e}") from None
        if not raw:
            return {}
        out = json.loads(raw)
        return out if isinstance(out, dict) else {"value": out}

    def get(self, path: str, *, params: dict[str, str] | None = None, timeout_s: float | None = None) -> JSON:
        return self.request("GET", path, params=params, timeout_s=timeout_s)

    def post(self, path: str, body: JSON | None = None, *, timeout_s: float | None = None) -> JSON:
        return self.request("POST", path, body if body is not None else {}, timeout_s=timeout_s)

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        return self.request("DELETE", path, body)

    def with_retry(self, fn: Callable[[], JSON], *, what: str, deadline_s: float = 300.0) -> JSON:
        """Call ``fn`` until it succeeds, retrying transient failures with capped exponential backoff."""
        return retry(fn, what=what, deadline_s=deadline_s)


def _to_master_error(e: Any) -> MasterError:
    message, code, field = e.reason if isinstance(e.reason, str) else str(e.reason), "", ""
    try:
        body = json.loads(e.read() or b"{}")
        if isinstance(body, dict):
            message = str(body.get("message") or body.get("detail") or message)
            code, field = str(body.get("code") or ""), str(body.get("field") or "")
    except (ValueError, OSError):
        pass
    return MasterError(e.code, message, code, field)


def backoff_s(attempt: int, *, base_s: float = 0.2, cap_s: float = 10.0) -> float:
    """Full-jitter exponential backoff for retry number ``attempt`` (0-based)."""
    top: float = min(cap_s, base_s * (2.0 ** min(attempt, 30)))
    return top / 2 + random.random() * top / 2


def retry(fn: Callable[[], JSON], *, what: str, deadline_s: float = 300.0) -> JSON:
    start = time.monotonic()
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as e:
            if not is_retryable(e) or time.monotonic() - start > deadline_s:
                raise
            delay = backoff_s(attempt)
            logger.warning("%s failed (%s); retrying in %.1fs", what, e, delay)
            time.sleep(delay)
            attempt += 1
