"""Munge login (``security.munge``): a Unix account logs in with a credential of the site's munge, no password.

``det user login`` (no user name) asks the master for a nonce (``Nonces``: random, single-use, 120 s) and the
master's Unix uid, encodes ``{"nonce": …, "url": <the master's URL it used>}`` with ``munge --restrict-uid
<that uid>`` and sends the credential. The master decodes it with the site's ``unmunge`` (``decode``), which
says which uid encoded it and refuses a credential restricted to another uid, expired, or replayed. The master
then refuses a nonce it did not issue (or already took) and a URL that is not one of its own (``own_url``), so
that a server squatting a port ``det`` was pointed at can neither use nor relay the credential. The account's
master user is the one mapped to it; a first login creates it where ``create_users`` allows; members of
``admin_group`` are admins (``services.unix_users``).
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from sqlalchemy.orm import Session

from hpc_master.db.models import UserModel
from hpc_master.errors import ClientError, PermissionDeniedError, TooManyRequestsError
from hpc_master.masterconf import MasterConfig, is_loopback
from hpc_master.services import unix_users

NONCE_TTL_S = 120.0
MAX_NONCES = 10_000
MAX_CREDENTIAL = 8192


class Nonces:
    """The nonces this master issued, in memory (a restart forgets them: ``det`` asks for another)."""

    def __init__(self) -> None:
        self._issued: dict[str, float] = {}
        self._lock = threading.Lock()

    def issue(self) -> str:
        nonce = secrets.token_urlsafe(24)
        now = time.monotonic()
        with self._lock:
            if len(self._issued) >= MAX_NONCES:  # the oldest make way
                for old in sorted(self._issued, key=self._issued.__getitem__)[: MAX_NONCES // 10]:
                    del self._issued[old]
            self._issued[nonce] = now + NONCE_TTL_S
        return nonce

    def take(self, nonce: str) -> bool:
        with self._lock:
            expires = self._issued.pop(nonce, None)
        return expires is not None and expires > time.monotonic()


@dataclass(frozen=True)
class Decoded:
    uid: int
    gid: int
    payload: bytes


def refused(why: str) -> PermissionDeniedError:
    return PermissionDeniedError(f"munge login refused: {why}", code="munge_refused")


_DECODING = threading.BoundedSemaphore(8)
"""At most this many ``unmunge`` at once: the route is open to anyone (it is a login), a process each."""


def decode(credential: str, unmunge: str) -> Decoded:
    """The site's ``unmunge`` on the credential: its encoder's uid and gid, and its payload."""
    if not credential or len(credential) > MAX_CREDENTIAL or not credential.isascii():
        raise ClientError("credential: expected a munge credential (MUNGE:…)", field="credential")
    if not _DECODING.acquire(blocking=False):
        raise TooManyRequestsError("too many munge logins at once; try again", retry_after_s=1)
    try:
        return _decode(credential, unmunge)
    finally:
        _DECODING.release()


def _decode(credential: str, unmunge: str) -> Decoded:
    try:
        with tempfile.TemporaryDirectory(prefix="det-unmunge-") as tmp:  # the payload apart from the metadata
            out = Path(tmp) / "payload"
            done = subprocess.run(
                [unmunge, "--numeric", f"--output={out}"],
                input=credential.encode(), capture_output=True, timeout=10, check=False,
            )  # fmt: skip
            payload = out.read_bytes()[:MAX_CREDENTIAL] if out.exists() else b""
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PermissionDeniedError(
            f"munge login is unavailable on this master: {e}", code="munge_unavailable"
        ) from None
    if done.returncode != 0:
        raise refused(done.stderr.decode(errors="replace").strip().removeprefix("unmunge: Error: ")[:300])
    meta = dict(
        line.split(":", 1) for line in done.stdout.decode(errors="replace").splitlines() if ":" in line
    )
    try:
        return Decoded(int(meta["UID"].split()[0]), int(meta["GID"].split()[0]), payload)
    except (KeyError, ValueError):
        raise refused("unmunge gave no UID") from None


def own_url(url: str, config: MasterConfig) -> bool:
    """Whether ``url`` (the one ``det`` used, from the credential) is this master's: its port, and a host name
    that reaches this master's own socket: its listen address, ``external_url``'s host, ``munge.names``, and,
    only when it listens on every address, loopback and this machine's names. (On a master bound to one
    address, another account may listen on the same port of loopback and relay the credential.)"""
    try:
        host, port = _host_port(url)
    except ValueError:
        return False
    own_host, own_port = _host_port(config.master_url())
    everywhere = config.listen.host in ("0.0.0.0", "::")
    names = {own_host, config.listen.host, *config.security.munge.names}
    if everywhere:
        names |= {socket.gethostname(), socket.getfqdn()}
    known = {n.lower() for n in names} - {"0.0.0.0", "::"}
    return port in (config.listen.port, own_port) and (host in known or (everywhere and is_loopback(host)))


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)


def login(session: Session, config: MasterConfig, nonces: Nonces, decoded: Decoded) -> UserModel:
    """The master user of the account that encoded ``decoded`` (created where allowed), after the checks
    of the module's docstring."""
    try:
        claim = json.loads(decoded.payload)
        nonce, url = str(claim["nonce"]), str(claim["url"])
    except (ValueError, KeyError, TypeError):
        raise refused("the credential's payload is not det's") from None
    if not nonces.take(nonce):
        raise refused("the nonce was not issued by this master, has expired, or was used already")
    if not own_url(url, config):
        raise refused(f"the credential was made for {url[:200]!r}, not for this master")
    account = unix_users.account_of_uid(decoded.uid, refused)
    return unix_users.user_for(session, account, config.security.munge, refused, "munge")
