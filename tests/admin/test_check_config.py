"""``det-master --check-config master.yaml``: 0 and ``ok``, or 2 and the field (with the closest valid key for
a typo), without starting anything or touching the database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_master.masterconf import load_master_config
from hpc_master.masterconf_doc import EXAMPLE

from ._master_process import REPO


def check(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    return subprocess.run(
        [sys.executable, "-m", "hpc_master.server", "--check-config", str(path)],
        env={**full_env, "PYTHONPATH": str(REPO), **env}, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_valid_file_is_ok_and_nothing_is_touched(tmp_path: Path) -> None:
    path = tmp_path / "master.yaml"
    path.write_text(EXAMPLE)  # its database is on a host that does not exist: never connected to
    r = check(path, DET_LDAP_BIND_PASSWORD="from-the-unit")
    assert (r.returncode, r.stdout, r.stderr) == (0, "ok\n", "")
    db = tmp_path / "data" / "master.db"
    path.write_text(f"db: {{url: 'sqlite:///{db}'}}\nlisten: {{port: 9999}}\n")
    assert check(path).returncode == 0
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (
            "resource_pools:\n  gpu:\n    partiton: a100\n",
            "resource_pools.gpu.partiton",
            "did you mean `partition`?",
        ),
        ("listen:\n  hots: 0.0.0.0\n", "listen.hots", "did you mean `host`?"),
        ("chekpoint_storage: {}\n", "chekpoint_storage", "did you mean `checkpoint_storage`?"),
        ("preemption: {lead_time_s: -5}\n", "preemption.lead_time_s", "greater than or equal to 0"),
        ("preemption: {signal: SIGNOPE}\n", "preemption.signal", "unknown signal"),
        ("default_resource_pool: gpu\n", "default_resource_pool", "'gpu' is not one of resource_pools"),
        (
            "resource_pools:\n  a: {default_time_limit: '2:00:00', max_time_limit: 60}\n",
            "resource_pools.a.max_time_limit",
            "shorter than default_time_limit",
        ),
        ("resource_pools:\n  a: {mem_per_node: lots}\n", "resource_pools.a.mem_per_node", "'64G'"),
    ],
)
def test_an_error_names_the_field_and_exits_2(tmp_path: Path, text: str, field: str, words: str) -> None:
    path = tmp_path / "master.yaml"
    path.write_text(text)
    r = check(path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"det-master: {path}: {field}: "), r.stderr
    assert words in r.stderr


def test_yaml_errors_environment_overrides_and_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "master.yaml"
    path.write_text("listen: {port: 1}\nlisten: {port: 2}\n")
    r = check(path)
    assert r.returncode == 2 and "line 2, column 1: duplicate key 'listen'" in r.stderr
    path.write_text("listen: {port: 1}\n")
    r = check(path, DET_LISTEN_PORT="http")  # the environment is checked too: the master would use it
    assert r.returncode == 2 and "listen.port" in r.stderr
    r = check(tmp_path / "missing.yaml")
    assert r.returncode == 2 and "cannot read master config" in r.stderr


def test_slurm_times_are_read_as_written(tmp_path: Path) -> None:
    """The strict loader of every config: ``1:30:00`` is 90 minutes, not YAML 1.1's base-60 integer 5400."""
    path = tmp_path / "master.yaml"
    path.write_text("resource_pools:\n  default: {default_time_limit: 1:30:00, max_time_limit: 2-00:00:00}\n")
    pool = load_master_config(path, env={}).resource_pools["default"]
    assert (pool.default_time_limit_min, pool.max_time_limit_min) == (90, 2 * 24 * 60)
