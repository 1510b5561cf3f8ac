"""Who a master is (personal, its service account, or a deprecated root one) and the sudoers rule it prints."""

from __future__ import annotations

import pwd
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hpc_master.errors import ConfigError
from hpc_master.helper_client import SCRIPT
from hpc_master.masterconf import MasterConfig
from hpc_master.service_account import DEFAULT_ACCOUNT, Identity, identity_for, sudoers

NOBODY = pwd.getpwnam("nobody")


def config(**keys: object) -> MasterConfig:
    return MasterConfig.model_validate(keys)


def test_a_root_master_switches_to_its_service_account_or_stays_root_without_one() -> None:
    assert identity_for(config(service_account="nobody"), euid=0) == Identity(
        True, "sudo", "nobody", switch=True
    )
    try:
        pwd.getpwnam(DEFAULT_ACCOUNT)
    except KeyError:  # no default account here: root, through runuser (it warns at start)
        assert identity_for(config(), euid=0) == Identity(True, "runuser")
    with pytest.raises(ConfigError, match="useradd --system no-such-account") as e:
        identity_for(config(service_account="no-such-account"), euid=0)
    assert e.value.field == "service_account"
    with pytest.raises(ConfigError, match="must not be root"):
        identity_for(config(service_account="root"), euid=0)


def test_a_master_started_as_its_service_account_acts_for_users_and_anyone_else_is_personal() -> None:
    assert identity_for(config(), euid=NOBODY.pw_uid) == Identity(False)
    assert identity_for(config(service_account="nobody"), euid=NOBODY.pw_uid) == Identity(
        True, "sudo", "nobody"
    )
    with pytest.raises(ConfigError, match="start it as root"):
        identity_for(config(service_account="daemon"), euid=NOBODY.pw_uid)


def test_the_sudoers_rule_names_the_helpers_exact_command_line_and_parses(tmp_path: Path) -> None:
    c = config(job_storage_root="/scratch/{unix_user}/jobs", checkpoint_storage={"host_path": "/shared/ck"},
               service_account="hpc-det")  # fmt: skip
    text = sudoers(c, account="hpc-det", users_group="researchers", python="/opt/hpc-det/.venv/bin/python")
    command = (
        f"/opt/hpc-det/.venv/bin/python -I -S {SCRIPT} --root /scratch/{{unix_user}}/jobs --root /shared/ck"
    )
    (alias,) = re.findall(rf"^Cmnd_Alias (HPC_DET_HELPER_[0-9A-F]{{8}}) = {re.escape(command)}$", text, re.M)
    assert f"hpc-det ALL=(%researchers) NOPASSWD: {alias}" in text
    assert "SETENV" not in text and "ALL=(ALL)" not in text
    # Another master's rule on the same host (other roots) names its own alias: sudo reads both files as one.
    other = sudoers(config(job_storage_root="/other/jobs"), account="hpc-det", users_group="researchers")
    assert alias not in other
    if shutil.which("visudo"):
        (tmp_path / "rule").write_text(text + other)
        check = subprocess.run(["visudo", "-cf", str(tmp_path / "rule")], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
    with pytest.raises(ConfigError, match="white space"):
        sudoers(config(job_storage_root="/my jobs"), account="x", users_group="y")
    odd = sudoers(config(job_storage_root="/j,obs=1"), account="x", users_group="y")
    assert "--root /j\\,obs\\=1" in odd


def test_becoming_nobody_else_changes_nothing_for_a_personal_master_and_refuses_no_new_privileges() -> None:
    import os

    from hpc_master.service_account import become

    become(Identity(acts_for_users=False), [])  # a personal master: nothing to do, nothing said
    status = Path("/proc/self/status").read_text()
    if any(line.split() == ["NoNewPrivs:", "1"] for line in status.splitlines()):
        with pytest.raises(ConfigError, match="NoNewPrivileges=no"):
            become(Identity(True, "sudo", "nobody"), [])
    else:
        become(Identity(True, "sudo", pwd.getpwuid(os.geteuid()).pw_name), [])  # started as it: no switch
