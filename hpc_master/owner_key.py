"""A personal master's proof of ownership: a random key in a 0600 file in its owner's config directory.

A master that does not require passwords (on loopback, ``security.require_passwords`` off) writes a new key at
each start to ``paths.get_owner_key_file(port)``; its blank-password users (``admin``, ``determined``) log in
only with that key, which the CLI reads from the same place. Another account on the same login node cannot
read the file, so it cannot act, or run jobs, as the owner; nothing needs configuring.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from hpc_master import paths


def write_private_file(path: Path, text: str) -> None:
    """Replace `path` atomically with a new file created 0600 (umask can only remove bits; the secret is
    never in a file anyone else could open, and a reader never sees it half-written)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def create(port: int) -> str:
    """A new key for the master on `port`, written for its owner; the key's SHA-256 (what the master keeps)."""
    key = secrets.token_urlsafe(32)
    write_private_file(paths.get_owner_key_file(port), key + "\n")
    return digest(key)


def read(port: int) -> str | None:
    """The key of the personal master on `port`, if this account has one."""
    try:
        key = paths.get_owner_key_file(port).read_text().strip()
    except OSError:
        return None
    return key or None


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def matches(key: str | None, expected_digest: str | None) -> bool:
    if not key or not expected_digest:
        return False
    return hmac.compare_digest(digest(key), expected_digest)
