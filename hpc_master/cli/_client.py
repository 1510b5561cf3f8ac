"""HTTP to the master (httpx) and the per-(master, user) token cache.

Tokens live in ``$XDG_CONFIG_HOME/hpc-det/auth.json`` (default ``~/.config/hpc-det/auth.json``), created with
mode 0600 by ``os.open`` and replaced atomically, never chmod'ed after the secret is written. With no cached
token and no ``DET_USER``, the CLI logs in as ``determined`` with a blank password, as Determined does; a
blank password goes with the key of a personal master on this host (``hpc_master.owner_key``) when this
account has it, so only the master's owner gets in that way.
``DET_USER``/``DET_PASS`` log in non-interactively (for scripts).

Before the first credential (a token, a password, an owner key) goes to a master on a loopback address, the
CLI checks who listens there (``_peer``): its own account for its personal master, else the account it saw
when it first logged in there (``server_uid`` in ``auth.json``); another account's listener gets nothing.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from hpc_master import owner_key, paths
from hpc_master.cli import _peer
from hpc_master.errors import ClientError, ConfigError, ServerError, UnauthenticatedError
from hpc_master.masterconf import is_loopback

DEFAULT_USER = "determined"
CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 60.0
UPLOAD_CHUNK_BYTES = 1 << 20


class MasterUnreachableError(ClientError):
    default_code = "unreachable"


class ApiError(ClientError):
    """An error the master returned: its ``code``, ``message`` and ``field``, plus the HTTP status."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message, code=code, field=field)
        self.http_status = status

    def __str__(self) -> str:
        where = f"{self.field}: " if self.field else ""
        return f"{where}{self.message} ({self.code}, HTTP {self.http_status})"


class ApiConfigError(ApiError, ConfigError):
    """The master refused the experiment config (exit status 2, like a local config error)."""


class ApiServerError(ServerError):
    pass


def normalize_master(address: str) -> str:
    """``host:port`` or ``http(s)://host:port[/]`` → ``http(s)://host:port``."""
    address = address.strip().rstrip("/")
    if not address:
        raise ClientError("the master address is empty (-m/--master or DET_MASTER)")
    if "://" not in address:
        address = "http://" + address
    return address


# ---------------------------------------------------------------- the token cache


def get_auth_file() -> Path:
    return paths.get_config_dir() / "auth.json"


def _read_auth() -> dict[str, Any]:
    try:
        data = json.loads(get_auth_file().read_text())
    except (OSError, ValueError):
        return {"version": 1, "masters": {}}
    if not isinstance(data, dict) or not isinstance(data.get("masters"), dict):
        return {"version": 1, "masters": {}}
    return data


def _write_auth(data: dict[str, Any]) -> None:
    owner_key.write_private_file(get_auth_file(), json.dumps(data, indent=2))


def cached_token(master: str, user: str) -> str | None:
    entry = _read_auth()["masters"].get(master) or {}
    token = (entry.get("tokens") or {}).get(user)
    return token if isinstance(token, str) else None


def active_user(master: str) -> str | None:
    user = (_read_auth()["masters"].get(master) or {}).get("active_user")
    return user if isinstance(user, str) else None


def pinned_uid(master: str) -> int | None:
    """The uid that served `master` (a loopback one) when a token was first cached for it."""
    uid = (_read_auth()["masters"].get(master) or {}).get("server_uid")
    return uid if isinstance(uid, int) else None


def store_token(
    master: str, user: str, token: str, *, make_active: bool = True, server_uid: int | None = None
) -> None:
    data = _read_auth()
    entry = data["masters"].setdefault(master, {})
    entry.setdefault("tokens", {})[user] = token
    if server_uid is not None:
        entry.setdefault("server_uid", server_uid)
    if make_active:
        entry["active_user"] = user
    _write_auth(data)


def drop_token(master: str, user: str, *, keep_active: bool = False) -> None:
    data = _read_auth()
    entry = data["masters"].get(master)
    if not entry:
        return
    (entry.get("tokens") or {}).pop(user, None)
    if entry.get("active_user") == user and not keep_active:
        entry.pop("active_user", None)
    _write_auth(data)


# ---------------------------------------------------------------- HTTP


def _error_parts(response: httpx.Response) -> tuple[str, str, Any]:
    """The ``code``, ``message`` and ``field`` of a failed response: from its JSON body, else from its text."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "message" in body:
        return str(body.get("code") or ""), str(body["message"]), body.get("field")
    return "", (response.text.strip()[:300] or response.reason_phrase), None


def _raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    code, message, field = _error_parts(response)
    if response.status_code >= 500:
        raise ApiServerError(f"the master failed: {message} (HTTP {response.status_code})")
    cls = ApiConfigError if code == "invalid_config" else ApiError
    raise cls(response.status_code, code or "error", message, field if isinstance(field, str) else None)


class UntrustedMasterError(ClientError):
    default_code = "untrusted_master"


def _expect(master: str, port: int, uid: int) -> None:
    """Raise unless `uid` serves `master` as expected: this account, for its personal master on `port` (it holds
    the owner key); else the account pinned at the first login (none pinned yet: anyone, to be pinned)."""
    mine = owner_key.read(port) is not None
    expected = os.getuid() if mine else pinned_uid(master)
    if expected is None or uid == expected:
        return
    whose = "your personal master's (yours is not running there)" if mine else "the master's you logged in to"
    advice = (
        "Start yours with: det-master --daemon"
        if mine
        else "If it really moved, log in again: det user login"
    )
    raise UntrustedMasterError(
        f"not sending credentials to {master}: the process listening there is run by {_peer.user_name(uid)}, "
        f"not by {_peer.user_name(expected)}, {whose}. {advice}"
    )


class Session:
    """One master, one user. ``request`` logs in on first need and retries once on an expired token."""

    def __init__(self, master: str, user: str | None = None) -> None:
        self.master = normalize_master(master)
        self._explicit_user = user
        self._user: str | None = None
        self._token: str | None = None
        self._peer_checked = False
        self._server_uid: int | None = None
        self._http = httpx.Client(
            base_url=self.master, timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        )

    # -- who

    @property
    def username(self) -> str:
        if self._user is None:
            self._user = self._explicit_user or active_user(self.master) or DEFAULT_USER
        return self._user

    def _unreachable(self, err: Exception) -> MasterUnreachableError:
        return MasterUnreachableError(
            f"Cannot reach the master at {self.master}. Start one with: det-master --daemon"
        )

    # -- auth

    def login(self, username: str, password: str, *, make_active: bool = True) -> str:
        """Log in and cache the token; `make_active` makes this user the default for this master.

        A blank password goes with the owner key of a personal master on this host, if this account has it
        (never sent anywhere but loopback)."""
        request: dict[str, Any] = {"username": username, "password": password}
        key = self._owner_key() if password == "" else None
        if key is not None:
            request["ownerKey"] = key
        body = self.call("POST", "/api/v1/auth/login", json=request, auth=False)  # checks whom it talks to
        token = str(body["token"])
        store_token(self.master, username, token, make_active=make_active, server_uid=self._server_uid)
        self._user, self._token = username, token
        return token

    def munge_login(self) -> str | None:
        """Log in as this Unix account with the site's munge (``services.munge_login``); the master user's
        name, or None where munge is not installed here or the master takes no munge logins."""
        import shutil
        import subprocess

        munge = shutil.which("munge")
        if munge is None:
            return None
        try:
            offer = self.call("POST", "/api/v1/auth/munge/nonce", auth=False)  # checks whom it talks to
        except ApiError as err:
            if err.code == "munge_disabled":
                return None
            raise
        claim = json.dumps({"nonce": offer["nonce"], "url": self.master})
        made = subprocess.run(
            [munge, "--restrict-uid", str(int(offer["masterUid"]))],
            input=claim.encode(), capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        if made.returncode != 0:
            raise ClientError(
                f"munge could not make a credential: {made.stderr.decode(errors='replace').strip()}"
            )
        body = self.call(
            "POST", "/api/v1/auth/munge/login", json={"credential": made.stdout.decode().strip()}, auth=False
        )
        username, token = str(body["user"]["username"]), str(body["token"])
        store_token(self.master, username, token, make_active=True, server_uid=self._server_uid)
        self._user, self._token = username, token
        return username

    def check_peer(self) -> None:
        """Refuse to send credentials to a loopback master served by an account other than the expected one."""
        if self._peer_checked:
            return
        url = httpx.URL(self.master)
        if not is_loopback(url.host):
            self._peer_checked = True
            return
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            uid = _peer.server_uid(url.host, port)
        except OSError:
            return  # nothing listens: the request itself says the master is unreachable
        self._peer_checked, self._server_uid = True, uid
        if uid is not None:
            _expect(self.master, port, uid)

    def _owner_key(self) -> str | None:
        url = httpx.URL(self.master)
        if not is_loopback(url.host) or url.port is None:
            return None
        return owner_key.read(url.port)

    def _auto_login(self) -> str:
        user = self.username
        password = os.environ.get("DET_PASS")
        if password is None:
            if user == DEFAULT_USER and not self._explicit_user:
                password = ""
            elif sys.stdin.isatty():
                password = getpass.getpass(f"Password for user '{user}': ")
            else:
                raise UnauthenticatedError(
                    f"not logged in as {user!r} on {self.master}: run `det user login {user}` or set DET_PASS"
                )
        try:
            return self.login(user, password, make_active=False)
        except ApiError as err:
            if err.http_status == 401 and password == "":
                raise UnauthenticatedError(
                    f"could not log in as {user!r} with a blank password ({err.message}); "
                    "log in with: det user login USERNAME"
                ) from None
            raise

    def token(self) -> str:
        self.check_peer()
        if self._token is None:
            self._token = cached_token(self.master, self.username) or self._auto_login()
        return self._token

    # -- requests

    def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        content: bytes | Callable[[], Iterator[bytes]] | None = None,
        headers: dict[str, str] | None = None,
        auth: bool = True,
    ) -> Any:
        """One request; the decoded JSON body. Re-logs in once when a cached token was refused.

        `content` may be a function returning a fresh iterator of chunks (a streamed upload that can be retried).
        """
        self.check_peer()
        for attempt in range(2):
            hdrs = dict(headers or {})
            if auth:
                hdrs["Authorization"] = f"Bearer {self.token()}"
            response = self._send(method, path, json=json, params=params, content=content, headers=hdrs)
            if auth and response.status_code == 401 and attempt == 0:
                drop_token(self.master, self.username, keep_active=True)  # stale: log in again
                self._token = None
                continue
            _raise_for(response)
            return response.json() if response.content else {}
        raise AssertionError("unreachable")

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any,
        params: dict[str, Any] | None,
        content: bytes | Callable[[], Iterator[bytes]] | None,
        headers: dict[str, str],
    ) -> httpx.Response:
        """One HTTP request (a callable `content` is called for a fresh body); transport failures become
        :class:`MasterUnreachableError`."""
        try:
            body = content() if callable(content) else content
            return self._http.request(method, path, json=json, params=params, content=body, headers=headers)
        except httpx.ConnectError as err:
            raise self._unreachable(err) from None
        except httpx.TimeoutException as err:
            raise MasterUnreachableError(f"the master at {self.master} did not answer in time ({err})") \
                from None  # fmt: skip

    @contextlib.contextmanager
    def stream_lines(self, path: str, params: dict[str, Any] | None = None) -> Iterator[Iterator[str]]:
        """A streamed GET (newline-delimited JSON); no read timeout, so ``follow`` can wait."""
        headers = {"Authorization": f"Bearer {self.token()}"}
        timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
        try:
            with self._http.stream("GET", path, params=params, headers=headers, timeout=timeout) as resp:
                if not resp.is_success:
                    resp.read()
                    _raise_for(resp)
                yield resp.iter_lines()
        except httpx.ConnectError as err:
            raise self._unreachable(err) from None

    def close(self) -> None:
        self._http.close()


def session_from_args(args: Any) -> Session:
    return Session(args.master, getattr(args, "user", None))
