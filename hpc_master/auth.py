"""Password hashing and bearer tokens (pure functions; no DB, no HTTP).

Passwords: scrypt with a per-user random salt, stored as ``scrypt$n$r$p$salt_hex$hash_hex``; a blank password
(Determined's first-start ``admin`` and ``determined`` users) is stored as the empty string. Tokens: 32 random
bytes (``secrets.token_urlsafe``), stored only as their SHA-256.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
BLANK_PASSWORD_HASH = ""


def hash_password(password: str) -> str:
    if password == "":
        return BLANK_PASSWORD_HASH
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${salt.hex()}${digest.hex()}"


def verify_password(password: str, stored: str) -> bool:
    if stored == BLANK_PASSWORD_HASH:
        return hmac.compare_digest(password.encode(), b"")
    try:
        scheme, n, r, p, salt_hex, digest_hex = stored.split("$")
    except ValueError:
        return False
    if scheme != "scrypt":
        return False
    digest = hashlib.scrypt(
        password.encode(),
        salt=bytes.fromhex(salt_hex),
        n=int(n),
        r=int(r),
        p=int(p),
        dklen=len(digest_hex) // 2,
    )
    return hmac.compare_digest(digest.hex(), digest_hex)


def new_token() -> str:
    return secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
