"""Issue 37, item 1: munge login. Unix accounts the master has never seen run `det user login` (no user name)
with the cluster's real munge: one in the allowed group gets a master user (an admin: it is in the admin
group too), one outside is refused. A credential is good once, for this master's URL, with a nonce it issued,
restricted to its uid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.master.test_browsers_https import stop, wait_up
from tests.slurm.fixtures import REPO

pytestmark = pytest.mark.slurm
VENV_BIN = REPO / ".venv" / "bin"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def as_user(name: str, cmd: list[str], stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    home = f"/tmp/{name}-home"
    env = [f"HOME={home}", f"PATH={VENV_BIN}:/usr/bin:/bin", f"PYTHONPATH={REPO}"]
    return subprocess.run(["runuser", "-u", name, "--", "env", *env, *cmd], input=stdin, capture_output=True,
                          timeout=120, cwd="/", check=False)  # fmt: skip


@pytest.fixture
def accounts() -> Iterator[tuple[str, str, str]]:
    tag = uuid.uuid4().hex[:6]
    group, inside, outside = f"detmg{tag}", f"detmi{tag}", f"detmo{tag}"
    subprocess.run(["groupadd", group], check=True)
    for name in (inside, outside):
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/bash", name], check=True)
        os.makedirs(f"/tmp/{name}-home", exist_ok=True)
        subprocess.run(["chown", name, f"/tmp/{name}-home"], check=True)
    subprocess.run(["usermod", "-aG", group, inside], check=True)
    try:
        yield group, inside, outside
    finally:
        for name in (inside, outside):
            subprocess.run(["userdel", name], capture_output=True, check=False)
            subprocess.run(["rm", "-rf", f"/tmp/{name}-home"], check=False)
        subprocess.run(["groupdel", group], capture_output=True, check=False)


def test_unix_accounts_log_in_with_munge_once_per_credential(
    tmp_path: Path, accounts: tuple[str, str, str]
) -> None:
    group, inside, outside = accounts
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "master.yaml"
    config.write_text(
        f"listen: {{host: 127.0.0.1, port: {port}}}\n"
        f'db: {{url: "sqlite:///{tmp_path}/master.db"}}\n'
        "security:\n  require_passwords: true\n"
        f"  munge: {{enabled: true, create_users: groups, user_groups: [{group}], admin_group: {group}}}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "DET_ADMIN_PASSWORD": "Adm1n-pass-word",
           "DET_MASTER_STATE_DIR": str(tmp_path / "state"), "DET_MASTER_DATA_DIR": str(tmp_path / "data")}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "hpc_master.server", "--config", str(config)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        wait_up(proc, f"{url}/api/v1/master")
        det = [str(VENV_BIN / "det"), "-m", url]
        # A member of the group: no password, no admin step; a master user mapped to the account, an admin.
        logged = as_user(inside, [*det, "user", "login"])
        assert logged.returncode == 0, logged.stderr.decode()
        assert f"Logged in as '{inside}'" in logged.stdout.decode()
        who = as_user(inside, [*det, "user", "whoami"])
        assert inside in who.stdout.decode(), who.stderr.decode()
        admin = httpx.post(
            f"{url}/api/v1/auth/login", json={"username": "admin", "password": "Adm1n-pass-word"}
        )
        users = httpx.get(f"{url}/api/v1/users", headers={"Authorization": f"Bearer {admin.json()['token']}"})
        (made,) = [u for u in users.json()["users"] if u["username"] == inside]
        assert made["admin"] is True
        # Outside the group: refused, saying why.
        refused = as_user(outside, [*det, "user", "login"])
        assert refused.returncode != 0 and "creates none" in refused.stderr.decode(), refused.stderr.decode()

        def credential(name: str, nonce: str, for_url: str, restrict_uid: int = 0) -> str:
            claim = json.dumps({"nonce": nonce, "url": for_url}).encode()
            made = as_user(name, ["munge", "--restrict-uid", str(restrict_uid)], stdin=claim)
            assert made.returncode == 0, made.stderr.decode()
            return made.stdout.decode().strip()

        def nonce() -> str:
            return str(httpx.post(f"{url}/api/v1/auth/munge/nonce").json()["nonce"])

        def login(cred: str) -> httpx.Response:
            return httpx.post(f"{url}/api/v1/auth/munge/login", json={"credential": cred})

        good = credential(inside, nonce(), url)
        assert login(good).status_code == 200
        again = login(good)  # a replayed credential
        assert again.status_code == 403 and again.json()["code"] == "munge_refused", again.text
        elsewhere = login(
            credential(inside, nonce(), f"http://127.0.0.1:{_free_port()}")
        )  # a squatted port's
        assert elsewhere.status_code == 403 and "not for this master" in elsewhere.json()["message"]
        unknown = login(credential(inside, "a-nonce-it-never-issued", url))
        assert unknown.status_code == 403 and "nonce" in unknown.json()["message"]
        inside_uid = int(as_user(inside, ["id", "-u"]).stdout)
        other = login(
            credential(inside, nonce(), url, restrict_uid=inside_uid)
        )  # for another account to read
        assert other.status_code == 403 and other.json()["code"] == "munge_refused", other.text
    finally:
        if proc.poll() is None:
            stop(proc)
