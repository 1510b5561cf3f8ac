"""`det deploy local down` returns the machine to how it was, and `up` works again afterwards.

Named to run last among the Slurm tests: it takes the cluster down and brings the same cluster back up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from local_cluster import hosts, system
from local_cluster.spec import LocalClusterSpec, get_state_dir
from tests.slurm.fixtures import Researcher, up_args

# exclusive: takes the cluster down and brings it back up
pytestmark = [pytest.mark.slurm, pytest.mark.exclusive]
DET = [sys.executable, "-m", "hpc_master.cli.main"]


def det(*args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [*DET, *args]
    if user:
        cmd = ["runuser", "-u", user, "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, cwd="/")


def test_deploy_refuses_non_root_with_a_clear_message(researcher: Researcher) -> None:
    proc = det("deploy", "local", "up", user=researcher.name)
    assert proc.returncode != 0
    assert "must run as root" in proc.stderr and "sudo det deploy local up" in proc.stderr


def test_up_twice_says_already_up(researcher: Researcher) -> None:
    proc = det("deploy", "local", "up", "--no-install")
    assert proc.returncode == 1
    assert "already up" in proc.stderr


def test_a_stale_cluster_is_reported_and_up_starts_it_afresh(researcher: Researcher) -> None:
    """A state file whose daemons are gone (a restarted machine, one restored from a disk image) is not 'up'."""
    record = json.loads((get_state_dir() / "state.json").read_text())
    spec = LocalClusterSpec.from_json(record["spec"])
    system.kill_now(system.pids_named("slurmd") + system.pids_named("slurmctld"))

    status = det("deploy", "local", "status")
    assert status.returncode == 3, status.stdout
    assert (
        "slurmctld is not running" in status.stdout and f"0 of {spec.nodes} slurmd running" in status.stdout
    )
    assert json.loads(det("deploy", "local", "status", "--json").stdout)["healthy"] is False

    again = det(*up_args(record))
    assert again.returncode == 0, again.stderr
    assert "is stale" in again.stderr
    assert det("deploy", "local", "status").returncode == 0
    out = researcher.run(["srun", "-N", str(spec.nodes), "hostname"], timeout_s=120).stdout
    assert sorted(out.split()) == spec.node_names


def test_down_leaves_nothing_behind_and_up_works_again(researcher: Researcher) -> None:
    record = json.loads((get_state_dir() / "state.json").read_text())
    spec = LocalClusterSpec.from_json(record["spec"])
    hosts_before = hosts.remove_block(Path("/etc/hosts").read_text())

    proc = det("deploy", "local", "down")
    assert proc.returncode == 0, proc.stderr
    try:
        for daemon in ("slurmctld", "slurmd", "slurmstepd"):
            assert system.pids_named(daemon) == [], daemon
        if record["started_munge"]:
            assert system.pids_named("munged") == []
        assert not system.link_exists(spec.bridge)
        for node in spec.node_names:
            assert not system.netns_exists(node)
        assert Path("/etc/hosts").read_text() == hosts_before
        for link in record["linked_confs"]:
            assert not os.path.lexists(link)
        assert not spec.root.exists()
        for user in record["created_users"]:
            assert subprocess.run(["id", user], capture_output=True, check=False).returncode != 0
    finally:
        again = det(*up_args(record))
    assert again.returncode == 0, again.stderr
    status = json.loads(det("deploy", "local", "status", "--json").stdout)
    assert status["up"] and status["slurmd_running"] == spec.nodes
    sinfo = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, check=True)
    assert sorted({line.split()[0] for line in sinfo.stdout.splitlines()}) == spec.node_names
