"""Golden tests of the local cluster's rendered Slurm configuration, and the /etc/hosts edits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from local_cluster import cleanup, hosts, render
from local_cluster.spec import LocalClusterSpec

GOLDEN = Path(__file__).parent / "golden" / "local_cluster"
SPEC = LocalClusterSpec(nodes=3, gpus_per_node=4, controller_host="login1", state_dir="/srv/det")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("slurm.conf", render.render_slurm_conf(SPEC)),
        ("gres.conf", render.render_gres_conf(SPEC)),
        ("mpi.conf", render.render_mpi_conf(SPEC)),
    ],
)
def test_rendered_config_matches_golden(name: str, text: str) -> None:
    golden = GOLDEN / name
    if os.environ.get("DET_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


def test_cpu_only_cluster_has_no_gres() -> None:
    spec = LocalClusterSpec(nodes=1, gpus_per_node=0)
    conf = render.render_slurm_conf(spec)
    assert "Gres=" not in conf
    assert "NodeName=node1 NodeAddr=10.77.0.11 CPUs=4" in conf
    assert render.render_gres_conf(spec) == render.HEADER


def test_single_gpu_device_is_not_a_range() -> None:
    spec = LocalClusterSpec(nodes=2, gpus_per_node=1, state_dir="/s")
    assert "File=/s/dev/nvidia0\n" in render.render_gres_conf(spec)


def test_spec_rejects_impossible_sizes() -> None:
    with pytest.raises(ValueError, match="nodes must be between 1 and 64"):
        LocalClusterSpec(nodes=0)
    with pytest.raises(ValueError, match="gpus per node"):
        LocalClusterSpec(gpus_per_node=17)


def test_spec_round_trips_through_json() -> None:
    assert LocalClusterSpec.from_json(SPEC.to_json()) == SPEC


def test_hosts_block_is_added_once_and_removed_exactly() -> None:
    original = "127.0.0.1 localhost\n10.0.0.5 nas  # site entry\n"
    entries = render.render_hosts_block(SPEC)
    added = hosts.add_block(original, entries)
    assert added.count(hosts.BEGIN) == 1
    assert "10.77.0.13 node3" in added
    assert hosts.add_block(added, entries) == added  # idempotent
    assert hosts.remove_block(added) == original
    assert hosts.has_block(added) and not hosts.has_block(original)


def test_hosts_block_added_to_file_without_trailing_newline() -> None:
    added = hosts.add_block("127.0.0.1 localhost", ["10.77.0.11 node1"])
    assert added.startswith("127.0.0.1 localhost\n# BEGIN")


# ---- what `down` may remove (local_cluster/cleanup.py); the real cycle: tests/slurm/test_zz_down_keeps_data.py
def test_make_dirs_returns_only_the_directories_it_created(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    assert cleanup.make_dirs(tmp_path / "a" / "b" / "c") == [tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"]
    assert cleanup.make_dirs(tmp_path / "a" / "b") == []


def test_a_created_directory_is_removed_only_when_empty(tmp_path: Path) -> None:
    (tmp_path / "top" / "quickstart").mkdir(parents=True)
    kept = cleanup.remove_if_empty(tmp_path / "top", "`up` created it")
    assert kept is not None and kept.what == str(tmp_path / "top") and "quickstart" in kept.why
    assert (tmp_path / "top" / "quickstart").is_dir()
    (tmp_path / "top" / "quickstart").rmdir()
    assert cleanup.remove_if_empty(tmp_path / "top", "`up` created it") is None
    assert not (tmp_path / "top").exists()


def test_a_home_holds_nothing_but_the_skeleton_by_names_and_content(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".config").mkdir(parents=True)
    (home / ".bashrc").write_text("# skel\n")
    (home / ".config" / "x").write_text("skel too\n")
    skeleton = cleanup.manifest(home)
    assert cleanup.extra_entries(home, skeleton) == []
    (home / ".config" / "x").unlink()  # a skeleton file removed: nothing of the researcher's is there
    assert cleanup.extra_entries(home, skeleton) == []
    (home / ".bashrc").write_text("# skel\nexport PATH=~/bin:$PATH\n")  # same name, new content
    (home / "data" / "deep").mkdir(parents=True)  # an unexpected directory is named once, not walked
    (home / "data" / "deep" / "f").write_text("1")
    (home / ".config" / "y").symlink_to("/etc/hostname")
    assert cleanup.extra_entries(home, skeleton) == [".bashrc", "data", ".config/y"]
