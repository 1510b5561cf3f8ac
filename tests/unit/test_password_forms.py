"""The stored password form: one hash that verifies a plain password (hpc-det's det, the web UI) and
Determined's client-side hash of it (Determined's own CLI and SDK); the old form still verifies plain ones."""

from __future__ import annotations

import hashlib
import secrets

from hpc_master import auth

PASSWORD = "Secret123pw"


def determined_salt_and_hash(password: str) -> str:
    """Determined 0.38.1's ``determined.common.api.salt_and_hash``, written out here as its source has it."""
    if password:
        return hashlib.sha512(("GubPEmmotfiK9TMD6Zdw" + password).encode()).hexdigest()
    return password


def old_form(password: str) -> str:
    """How passwords were stored before: scrypt over the plain password."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=auth.SCRYPT_N, r=8, p=1, dklen=32)
    return f"scrypt${auth.SCRYPT_N}$8$1${salt.hex()}${digest.hex()}"


def test_the_client_hash_is_determineds() -> None:
    assert auth.determined_hash(PASSWORD) == determined_salt_and_hash(PASSWORD)
    assert auth.determined_hash("") == ""
    assert auth.is_client_hash(auth.determined_hash(PASSWORD)) and auth.is_client_hash("")
    assert not auth.is_client_hash(PASSWORD) and not auth.is_client_hash("A" * 128)


def test_one_stored_hash_verifies_the_plain_password_and_the_client_hash() -> None:
    client_hash = determined_salt_and_hash(PASSWORD)
    for stored in (auth.hash_password(PASSWORD), auth.hash_password(client_hash, is_hashed=True)):
        assert stored.startswith("scrypt-dethash$")
        assert auth.verify_password(PASSWORD, stored)
        assert auth.verify_password(client_hash, stored, is_hashed=True)
        assert not auth.needs_rehash(stored) and auth.verifiable(stored, is_hashed=True)


def test_wrong_passwords_fail_either_way() -> None:
    stored = auth.hash_password(PASSWORD)
    assert not auth.verify_password("Secret123pX", stored)
    assert not auth.verify_password(determined_salt_and_hash("Secret123pX"), stored, is_hashed=True)
    # The client hash is not the password: sent plain it is hashed again, and fails.
    assert not auth.verify_password(determined_salt_and_hash(PASSWORD), stored)
    # Nor is the plain password a client hash.
    assert not auth.verify_password(PASSWORD, stored, is_hashed=True)
    assert not auth.verify_password("", stored) and not auth.verify_password("", stored, is_hashed=True)


def test_nothing_fast_or_plain_is_stored() -> None:
    stored = auth.hash_password(PASSWORD)
    assert PASSWORD not in stored and determined_salt_and_hash(PASSWORD) not in stored
    scheme, n, r, p, salt_hex, digest_hex = stored.split("$")
    assert (scheme, int(n), int(r), int(p)) == ("scrypt-dethash", 2**14, 8, 1)
    assert len(bytes.fromhex(salt_hex)) == 16 and len(bytes.fromhex(digest_hex)) == 32
    assert auth.hash_password(PASSWORD) != stored  # a new salt each time


def test_the_old_form_verifies_plain_passwords_and_asks_for_an_upgrade() -> None:
    stored = old_form(PASSWORD)
    assert auth.verify_password(PASSWORD, stored)
    assert not auth.verify_password("wrong", stored)
    assert auth.needs_rehash(stored)
    # Determined's client hash cannot be checked against it, right or wrong.
    assert not auth.verifiable(stored, is_hashed=True) and auth.verifiable(stored, is_hashed=False)
    assert not auth.verify_password(determined_salt_and_hash(PASSWORD), stored, is_hashed=True)


def test_blank_passwords() -> None:
    assert auth.hash_password("") == auth.BLANK_PASSWORD_HASH == auth.hash_password("", is_hashed=True)
    assert auth.verify_password("", "") and auth.verify_password("", "", is_hashed=True)
    assert not auth.verify_password("x", "") and not auth.needs_rehash("")


def test_a_malformed_stored_hash_verifies_nothing() -> None:
    malformed = (
        "bcrypt$1$2$3$00$00",
        "scrypt$x$8$1$00$00",
        "scrypt-dethash$16384$8$1$zz$00",
        "scrypt-dethash$1000$8$1$00$00",  # n not a power of 2
        "scrypt-dethash$16384$8$1$00$",  # no digest
        "garbage",
    )
    for stored in malformed:
        assert not auth.verify_password(PASSWORD, stored)
        assert not auth.verify_password(determined_salt_and_hash(PASSWORD), stored, is_hashed=True)
