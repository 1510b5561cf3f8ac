"""A real OpenLDAP server (Debian's ``slapd``) for the LDAP login tests, in a directory of its own and run as the
account that runs the tests: an ``ldaps://`` and an ``ldap://`` (StartTLS) listener on loopback, a certificate of
a CA made for it, a search account, and people entries (``posixAccount``, passwords stored ``{SSHA}`` by
``slappasswd``) whose ``uid`` names a Unix account of this machine.

    with Slapd(tmp_path, [Person("daemon", "pw")]) as server:
        server.ldaps_url, server.ca_file, server.base_dn, server.search_dn, server.search_password
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

BASE_DN = "dc=example,dc=org"
SEARCH_DN = f"cn=search,{BASE_DN}"
SEARCH_PASSWORD = "search-pw"  # the test directory's search account


@dataclass(frozen=True)
class Person:
    uid: str
    password: str
    ou: str = "people"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ssha(password: str) -> str:
    return subprocess.run(
        ["slappasswd", "-h", "{SSHA}", "-s", password], capture_output=True, text=True, check=True
    ).stdout.strip()


class Slapd:
    def __init__(self, root: Path, people: list[Person]) -> None:
        if shutil.which("slapd", path="/usr/sbin:/usr/bin") is None:
            pytest.fail("slapd is not installed (scripts/bootstrap.sh installs it)")
        self.root = root
        self.people = people
        self.base_dn, self.search_dn, self.search_password = BASE_DN, SEARCH_DN, SEARCH_PASSWORD
        self.ldaps_port, self.ldap_port = _free_port(), _free_port()
        self.ldaps_url = f"ldaps://127.0.0.1:{self.ldaps_port}"
        self.ldap_url = f"ldap://127.0.0.1:{self.ldap_port}"
        self.ca_file = str(root / "ca.crt")
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Slapd:
        self.root.mkdir(parents=True, exist_ok=True)
        self._certificates()
        (self.root / "db").mkdir()
        conf = self.root / "slapd.conf"
        conf.write_text(self._config())
        subprocess.run(
            ["/usr/sbin/slapadd", "-f", str(conf), "-l", "/dev/stdin"],
            input=self._entries().encode(), capture_output=True, check=True,
        )  # fmt: skip
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        log = (self.root / "slapd.log").open("ab")
        urls = f"{self.ldaps_url}/ {self.ldap_url}/"
        self.proc = subprocess.Popen(
            ["/usr/sbin/slapd", "-d", "256", "-h", urls, "-f", str(self.root / "slapd.conf")],  # stats: binds
            stdout=log, stderr=log,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while not self._listening():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"slapd did not start: {(self.root / 'slapd.log').read_text()[-2000:]}")
            time.sleep(0.05)

    def binds(self) -> list[str]:
        """The DNs binds asked for so far (slapd's ``stats`` log: ``BIND dn="..." method=128``)."""
        text = (self.root / "slapd.log").read_text(errors="replace")
        return [
            line.split('BIND dn="', 1)[1].split('"', 1)[0]
            for line in text.splitlines()
            if 'BIND dn="' in line
        ]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # slapd's clean shutdown
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.ldaps_port), timeout=0.2):
                return True
        except OSError:
            return False

    def _certificates(self) -> None:
        r = self.root
        ca = [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ]
        subprocess.run(
            [*ca, "-keyout", str(r / "ca.key"), "-out", self.ca_file, "-days", "2", "-subj", "/CN=test directory CA"],
            capture_output=True, check=True,
        )  # fmt: skip
        subprocess.run(
            ["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(r / "server.key"), "-out", str(r / "server.csr"), "-subj", "/CN=localhost"],
            capture_output=True, check=True,
        )  # fmt: skip
        (r / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        subprocess.run(
            ["openssl", "x509", "-req", "-in", str(r / "server.csr"), "-CA", self.ca_file, "-CAkey",
             str(r / "ca.key"), "-CAcreateserial", "-out", str(r / "server.crt"), "-days", "2",
             "-extfile", str(r / "san.ext")],
            capture_output=True, check=True,
        )  # fmt: skip

    def _config(self) -> str:
        r = self.root
        schemas = "".join(
            f"include /etc/ldap/schema/{name}.schema\n" for name in ("core", "cosine", "nis", "inetorgperson")
        )
        return f"""{schemas}
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile {r}/slapd.pid
argsfile {r}/slapd.args
TLSCertificateFile {r}/server.crt
TLSCertificateKeyFile {r}/server.key
TLSCACertificateFile {self.ca_file}
database mdb
maxsize 16777216
suffix "{BASE_DN}"
rootdn "cn=admin,{BASE_DN}"
directory {r}/db
access to attrs=userPassword by anonymous auth by * none
access to * by * read
"""

    def _entries(self) -> str:
        out = [
            f"dn: {BASE_DN}\nobjectClass: dcObject\nobjectClass: organization\ndc: example\no: Example\n",
            f"dn: {SEARCH_DN}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\n"
            f"cn: search\nuserPassword: {_ssha(SEARCH_PASSWORD)}\n",
        ]
        for ou in sorted({p.ou for p in self.people}):
            out.append(f"dn: ou={ou},{BASE_DN}\nobjectClass: organizationalUnit\nou: {ou}\n")
        for n, p in enumerate(self.people):
            out.append(
                f"dn: uid={p.uid},ou={p.ou},{BASE_DN}\nobjectClass: inetOrgPerson\nobjectClass: posixAccount\n"
                f"uid: {p.uid}\ncn: {p.uid}\nsn: {p.uid}\nuidNumber: {20000 + n}\ngidNumber: 20000\n"
                f"homeDirectory: /home/{p.uid}\nuserPassword: {_ssha(p.password)}\n"
            )
        return "\n".join(out)
