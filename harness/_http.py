"""A tiny JSON-over-HTTP client for the master, on ``http.client`` with one kept-alive connection per thread.

``http.client`` rather than ``urllib.request``: the latter imports ``email``, ``ssl`` and ``hashlib`` besides
(~20 ms of every job's start-up), opens a new TCP connection per call, and would send the master's requests
through ``http_proxy`` when that is set (the master is on the cluster's own network). ``https`` masters are
verified with the default context (the system's CAs, or ``SSL_CERT_FILE``), as before.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import http.client

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


def split_url(master_url: str) -> tuple[str, str, int, str]:
    """``(scheme, host, port, base path)`` of ``http[s]://host[:port][/base]``."""
    scheme, sep, rest = master_url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        raise ValueError(f"the master's address must start with http:// or https://, not {master_url!r}")
    netloc, _, base = rest.partition("/")
    host, port = netloc, 443 if scheme == "https" else 80
    if netloc.startswith("["):  # [IPv6]:port
        end = netloc.find("]")
        host, tail = netloc[1:end], netloc[end + 1 :]
        if tail.startswith(":") and tail[1:]:
            port = int(tail[1:])
    elif ":" in netloc:
        host, _, port_text = netloc.rpartition(":")
        port = int(port_text)
    if not host:
        raise ValueError(f"the master's address has no host: {master_url!r}")
    return scheme, host, port, ("/" + base).rstrip("/")


class _Conn(threading.local):
    conn: http.client.HTTPConnection | None = None
    pid: int = 0
    used: bool = False  # at least one answer came back on it (so it may since have gone idle and been closed)


class MasterSession:
    """Bearer-authenticated JSON calls to one master. Thread-safe: each thread has its own connection."""

    def __init__(self, master_url: str, token: str, *, timeout_s: float = 30.0) -> None:
        self.master_url = master_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self._scheme, self._host, self._port, self._base = split_url(self.master_url)
        self._local = _Conn()

    def _connection(self, timeout_s: float) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection (a new one in a forked child: the parent's socket is not ours to use)."""
        import http.client

        local = self._local
        if local.conn is None or local.pid != os.getpid():
            if self._scheme == "https":
                import ssl

                local.conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=timeout_s, context=ssl.create_default_context()
                )
            else:
                local.conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)
            local.pid, local.used = os.getpid(), False
        conn = local.conn
        conn.timeout = timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(timeout_s)
        return conn, local.used

    def close(self) -> None:
        """Close this thread's connection (the next call opens a new one)."""
        conn, self._local.conn = self._local.conn, None
        if conn is not None and self._local.pid == os.getpid():
            conn.close()

    def request(
        self,
        method: str,
        path: str,
        body: JSON | None = None,
        *,
        params: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> JSON:
        import urllib.parse  # http.client imports it anyway

        target = self._base + path
        if params:
            target += "?" + urllib.parse.urlencode(params)
        data = json.dumps(body).encode() if body is not None else None
        resp, raw = self._exchange(method, target, data, timeout_s or self.timeout_s)
        if resp.will_close:
            self.close()
        else:
            self._local.used = True
        if resp.status >= 400:
            raise _to_master_error(resp.status, resp.reason, raw)
        if not raw:
            return {}
        out = json.loads(raw)
        return out if isinstance(out, dict) else {"value": out}

    def _headers(self, *, has_body: bool) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if has_body:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _exchange(
        self, method: str, target: str, data: bytes | None, timeout_s: float
    ) -> tuple[http.client.HTTPResponse, bytes]:
        """Send one request on this thread's connection and read the whole answer; MasterUnreachable when none
        comes back."""
        import http.client

        headers = self._headers(has_body=data is not None)
        where = f"{method} {self.master_url}{target}"
        while True:
            conn, reused = self._connection(timeout_s)
            try:
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                self.close()
                if reused:  # the master closed the idle connection before it read this request: send again
                    continue
                raise MasterUnreachable(f"{where}: {e}") from None
            except (OSError, http.client.HTTPException) as e:
                self.close()
                raise MasterUnreachable(f"{where}: {e}") from None
            return resp, raw

    def get(self, path: str, *, params: dict[str, str] | None = None, timeout_s: float | None = None) -> JSON:
        return self.request("GET", path, params=params, timeout_s=timeout_s)

    def post(self, path: str, body: JSON | None = None, *, timeout_s: float | None = None) -> JSON:
        return self.request("POST", path, body if body is not None else {}, timeout_s=timeout_s)

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        return self.request("DELETE", path, body)

    def with_retry(self, fn: Callable[[], JSON], *, what: str, deadline_s: float = 300.0) -> JSON:
        """Call ``fn`` until it succeeds, retrying transient failures with capped exponential backoff."""
        return retry(fn, what=what, deadline_s=deadline_s)


def _to_master_error(status: int, reason: str, raw: bytes) -> MasterError:
    message, code, field = reason or f"HTTP {status}", "", ""
    try:
        body = json.loads(raw or b"{}")
        if isinstance(body, dict):
            message = str(body.get("message") or body.get("detail") or message)
            code, field = str(body.get("code") or ""), str(body.get("field") or "")
    except ValueError:
        pass
    return MasterError(status, message, code, field)


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
