"""The certificate a master generates for its web UI when the admin gives none (``tls.generate``).

A self-signed certificate (ECDSA P-256, with the names browsers may use for the master as its subject
alternative names), made with the ``openssl`` command-line tool of the master's host (Debian's ``openssl``
package; the Python ``cryptography`` package is not among the master's dependencies). It is kept in the state
directory (``tls/browser.crt``, ``tls/browser.key``, the key readable by the master's account only) and reused
at every start, so that a browser that was told to trust it once keeps trusting it; it is made again when it
is missing, expires within 30 days, or the names it must carry changed. Its SHA-256 fingerprint is logged at
each start and printed by the quickstart, for users to compare with what their browser shows.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

VALID_DAYS = 825
"""The longest validity browsers accept for a certificate they are told to trust."""
RENEW_WITHIN_S = 30 * 24 * 3600


class CertificateError(RuntimeError):
    pass


@dataclass(frozen=True)
class BrowserCertificate:
    cert: Path
    key: Path
    fingerprint: str
    """SHA-256, as browsers show it (colon-separated upper-case hex)."""


def names_for(hosts: list[str]) -> list[str]:
    """The subject alternative names: the given hosts (the master's address, its external URL's and task
    origin's host names) and this machine's names; a wildcard address is left out (nobody browses to it)."""
    wanted = [*hosts, socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1"]
    names: list[str] = []
    for host in wanted:
        host = host.strip("[]")
        if host and host not in ("0.0.0.0", "::") and host not in names:
            names.append(host)
    return names


def _san(names: list[str]) -> str:
    entries = []
    for name in names:
        try:
            ipaddress.ip_address(name)
        except ValueError:
            entries.append(f"DNS:{name}")
        else:
            entries.append(f"IP:{name}")
    return ",".join(entries)


def _openssl(*args: str) -> str:
    try:
        done = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise CertificateError(
            "the web UI needs a certificate (tls.generate) and the `openssl` command is not installed: install "
            "it, or set tls.cert and tls.key"
        ) from None
    if done.returncode != 0:
        raise CertificateError(f"openssl {args[0]} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def _fingerprint(cert: Path) -> str:
    out = _openssl("x509", "-in", str(cert), "-noout", "-fingerprint", "-sha256")
    return out.strip().split("=", 1)[-1]


def _still_good(directory: Path, names: list[str]) -> bool:
    cert, key, kept_names = directory / "browser.crt", directory / "browser.key", directory / "browser.names"
    if not (cert.is_file() and key.is_file() and kept_names.is_file()):
        return False
    if kept_names.read_text().split() != names:
        return False
    try:  # -checkend: exits 1 when the certificate expires within that many seconds
        _openssl("x509", "-in", str(cert), "-noout", "-checkend", str(RENEW_WITHIN_S))
    except CertificateError:
        return False
    return True


def ensure(directory: Path, hosts: list[str]) -> BrowserCertificate:
    """The web UI's certificate in ``directory`` (made, or made again, as the module says)."""
    names = names_for(hosts)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not _still_good(directory, names):
        # Made in a private directory beside, then renamed into place: a crash leaves the old pair or none.
        with tempfile.TemporaryDirectory(dir=directory, prefix=".new-") as tmp:
            new = Path(tmp)
            old_umask = os.umask(0o077)
            try:
                _openssl(
                    "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-sha256", "-days", str(VALID_DAYS), "-subj", f"/CN={names[0]}/O=hpc-det master (generated)",
                    "-addext", f"subjectAltName={_san(names)}", "-addext", "basicConstraints=critical,CA:FALSE",
                    "-addext", "extendedKeyUsage=serverAuth",
                    "-keyout", str(new / "browser.key"), "-out", str(new / "browser.crt"),
                )  # fmt: skip
                (new / "browser.names").write_text("\n".join(names) + "\n")
            finally:
                os.umask(old_umask)
            (new / "browser.crt").chmod(0o644)
            (directory / "browser.names").unlink(
                missing_ok=True
            )  # renamed last: a pair half-replaced is remade
            for name in ("browser.key", "browser.crt", "browser.names"):
                os.replace(new / name, directory / name)
    cert = directory / "browser.crt"
    return BrowserCertificate(cert=cert, key=directory / "browser.key", fingerprint=_fingerprint(cert))
