"""Issue 37's first "done when": a Unix account the master has never seen runs `det user login` and `det e create`
on the cluster with no password and no hpc-det admin step (the test gives it a Slurm association, as a site
would have); its trial runs as that account. Then the same person logs into the web UI, in Chromium over
HTTPS, with their password of the site's directory (a real slapd, ``tests/ldap_server.py``), and sees the
experiment; the wrong password is refused."""

from __future__ import annotations

import json
import pwd
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from local_cluster.accounting import LOCAL_ACCOUNT
from tests.e2e.conftest import Master, new_master, started
from tests.ldap_server import Person, Slapd
from tests.slurm.fixtures import REPO, Researcher
from tests.webui.conftest import Page
from tests.webui.conftest import browser as browser  # the chromium fixture (one per module)

pytestmark = [pytest.mark.slurm, pytest.mark.browser]
LDAP_PASSWORD = "directory-pw-of-the-newcomer"
VENV_BIN = REPO / ".venv" / "bin"
CONFIG = """
name: munge-newcomer
entrypoint: python3 whoami.py
searcher: {name: single, metric: x, max_length: {batches: 1}}
resources: {slots_per_trial: 0}
max_restarts: 0
"""


@pytest.fixture
def newcomer() -> Iterator[str]:
    name = f"detnew{uuid.uuid4().hex[:6]}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True, timeout=60)
    added = subprocess.run(["sacctmgr", "-i", "add", "user", name, f"Account={LOCAL_ACCOUNT}"],
                           capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert added.returncode == 0, added.stdout + added.stderr
    try:
        yield name
    finally:
        subprocess.run(["scancel", "-u", name], capture_output=True, check=False, timeout=60)
        subprocess.run(["sacctmgr", "-i", "delete", "user", f"name={name}"], capture_output=True, check=False)
        subprocess.run(["userdel", "-r", name], capture_output=True, check=False, timeout=60)


@pytest.fixture
def directory(newcomer: str, tmp_path: Path) -> Iterator[Slapd]:
    with Slapd(tmp_path / "slapd", [Person(newcomer, LDAP_PASSWORD)]) as server:
        yield server


def test_a_unix_account_never_seen_logs_in_by_munge_and_runs_a_trial(
    researcher: Researcher, newcomer: str, directory: Slapd, browser: Any
) -> None:
    m: Master = new_master(researcher)
    ldap = {
        "enabled": True,
        "url": directory.ldaps_url,
        "ca_file": directory.ca_file,
        "base_dn": directory.base_dn,
    }
    with (m.root / "master.yaml").open("a") as f:
        f.write(f"security: {{munge: {{enabled: true, create_users: everyone}}, ldap: {json.dumps(ldap)}}}\n")
    home = Path(pwd.getpwnam(newcomer).pw_dir)
    work = home / "exp"
    work.mkdir()
    (work / "whoami.py").write_text("import os, pwd\nprint('ran as', pwd.getpwuid(os.getuid()).pw_name)\n")
    (work / "config.yaml").write_text(CONFIG)
    subprocess.run(["chown", "-R", f"{newcomer}:", str(work)], check=True)

    def det(*args: str) -> subprocess.CompletedProcess[str]:
        env = [f"HOME={home}", f"PATH={VENV_BIN}:/usr/bin:/bin", f"DET_MASTER={m.url}"]
        return subprocess.run(["runuser", "-u", newcomer, "--", "env", *env, "det", *args], capture_output=True,
                              text=True, cwd=work, timeout=300, check=False)  # fmt: skip

    with started(m):
        logged = det("user", "login")
        assert logged.returncode == 0 and f"Logged in as '{newcomer}'" in logged.stdout, logged.stderr
        created = det("e", "create", "config.yaml", ".")
        assert created.returncode == 0, created.stderr
        exp = int(created.stdout.strip().split()[-1])
        waited = det("e", "wait", str(exp))
        assert waited.returncode == 0, waited.stdout + waited.stderr
        trials = json.loads(det("e", "list-trials", str(exp), "--json").stdout)["trials"]
        logs = det("trial", "logs", str(trials[0]["id"]))
        assert f"ran as {newcomer}" in logs.stdout, logs.stdout[-2000:] + logs.stderr

        ui = Page(browser, m.browser_url)
        try:
            p = ui.page
            p.goto("/login")
            p.wait_for_selector(".note[data-login=ldap]")  # the page says which password it takes
            p.fill("input[name=username]", newcomer)
            p.fill("input[name=password]", "not-" + LDAP_PASSWORD)
            p.click("button[type=submit]")
            p.wait_for_selector("text=invalid credentials")
            ui.login(newcomer, LDAP_PASSWORD)
            p.wait_for_selector(f"#experiments tr[data-experiment='{exp}']")
            assert newcomer in p.inner_text("body")
        finally:
            ui.close()
