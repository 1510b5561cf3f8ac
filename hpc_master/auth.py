"""Password hashing and bearer tokens (pure functions; no DB, no HTTP).

Passwords are stored in one form that verifies both a plain password (our ``det``, the web UI) and the hash
that Determined's own client sends instead (``isHashed: true``: the hex SHA-512 of a fixed salt and the
password, ``determined_hash``): the master applies ``determined_hash`` to a plain password itself, then scrypt
with a per-user random salt over that, stored as ``scrypt-dethash$n$r$p$salt_hex$hash_hex``. A blank password
(Determined's first-start ``admin`` and ``determined`` users) is stored as the empty string. The form before
this one, ``scrypt$n$r$p$salt_hex$hash_hex`` (scrypt over the plain password), still verifies plain passwords
and is replaced on the next plain login (``needs_rehash``); a client-side hash cannot be checked against it
(``verifiable``). Tokens: 32 random bytes (``secrets.token_urlsafe``), stored only as their SHA-256.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
BLANK_PASSWORD_HASH = ""
SCHEME = "scrypt-dethash"
"""The stored form: scrypt over ``determined_hash(password)``."""
PLAIN_SCHEME = "scrypt"
"""The form before ``SCHEME``: scrypt over the plain password (verifies plain passwords only)."""
DETERMINED_PASSWORD_SALT = "GubPEmmotfiK9TMD6Zdw"
"""Determined's client-side salt (``determined.common.api.authentication.PASSWORD_SALT``)."""
_CLIENT_HASH = re.compile(r"[0-9a-f]{128}")


def determined_hash(password: str) -> str:
    """What Determined's client sends for `password` with ``isHashed: true`` (its ``api.salt_and_hash``):
    the hex SHA-512 of the salt and the password; a blank password stays blank."""
    if password == "":
        return ""
    return hashlib.sha512((DETERMINED_PASSWORD_SALT + password).encode()).hexdigest()


def is_client_hash(value: str) -> bool:
    """Whether `value` has the shape of ``determined_hash``'s output (or is blank)."""
    return value == "" or _CLIENT_HASH.fullmatch(value) is not None


def hash_password(password: str, *, is_hashed: bool = False) -> str:
    """The stored form of `password`, given plain or, with `is_hashed`, as ``determined_hash`` of it."""
    client_hash = password if is_hashed else determined_hash(password)
    if client_hash == "":
        return BLANK_PASSWORD_HASH
    salt = secrets.token_bytes(16)
    return f"{SCHEME}${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${salt.hex()}${_scrypt(client_hash, salt)}"


def verify_password(password: str, stored: str, *, is_hashed: bool = False) -> bool:
    """Whether `password` (plain, or ``determined_hash`` of it with `is_hashed`) matches `stored`.

    A client-side hash against the old plain form is never a match (``verifiable`` tells that case apart);
    the scrypt is computed all the same, so the answer takes as long as any other."""
    if stored == BLANK_PASSWORD_HASH:
        return hmac.compare_digest(password.encode(), b"")
    parsed = _parse(stored)
    if parsed is None:
        return False
    scheme, n, r, p, salt, digest_hex = parsed
    # The current form hashes what Determined's client would send; the old one the plain password.
    as_given = scheme == PLAIN_SCHEME or is_hashed
    secret = password if as_given else determined_hash(password)
    try:
        digest = _scrypt(secret, salt, n=n, r=r, p=p, dklen=len(digest_hex) // 2)
    except ValueError:  # parameters scrypt refuses: not a hash this module wrote
        return False
    matches = hmac.compare_digest(digest, digest_hex)
    return matches and not (is_hashed and scheme == PLAIN_SCHEME)


def verifiable(stored: str, *, is_hashed: bool) -> bool:
    """Whether a password given this way can be checked against `stored` at all: a client-side hash cannot
    be checked against the old plain form (its owner logs in once with a plain password to upgrade it)."""
    return not (is_hashed and stored.startswith(PLAIN_SCHEME + "$"))


def needs_rehash(stored: str) -> bool:
    """Whether `stored` is in an older form than ``hash_password`` writes (to replace after a plain login)."""
    return stored != BLANK_PASSWORD_HASH and not stored.startswith(SCHEME + "$")


def _parse(stored: str) -> tuple[str, int, int, int, bytes, str] | None:
    try:
        scheme, n, r, p, salt_hex, digest_hex = stored.split("$")
        if scheme not in (SCHEME, PLAIN_SCHEME):
            return None
        return scheme, int(n), int(r), int(p), bytes.fromhex(salt_hex), digest_hex
    except ValueError:
        return None


def _scrypt(
    secret: str, salt: bytes, *, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P, dklen: int = 32
) -> str:
    return hashlib.scrypt(secret.encode(), salt=salt, n=n, r=r, p=p, dklen=dklen).hex()


def new_token() -> str:
    return secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
