"""job_entry's parts: safe context unpacking, node lists, entrypoint resolution, environment."""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from harness.exec._job_unpack import UnsafeArchiveError, iter_tree, unpack_context
from harness.exec.job_contract import JobPlan
from harness.exec.job_entry import build_environment
from harness.exec.job_nodes import container_addrs, expand_nodelist
from harness.exec.job_plan import resolve_entrypoint, tasks_per_slot

PY = "/venv/bin/python"


# -- archives -------------------------------------------------------------------------------------------------


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


def _file(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, data


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def _special(name: str, kind: bytes) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    return info, None


def _dir(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    return info, None


def test_unpacks_files_dirs_modes_and_inner_links(tmp_path: Path) -> None:
    archive = _tar(
        tmp_path / "ctx.tar.gz",
        [
            _dir("pkg"),
            _file("pkg/model.py", b"print(1)\n"),
            _file("run.sh", b"#!/bin/sh\n", 0o4755),  # setuid dropped
            _link("pkg/alias.py", "model.py"),
            _link("copy.py", "pkg/model.py", tarfile.LNKTYPE),
        ],
    )
    dest = tmp_path / "work"
    assert unpack_context(str(archive), str(dest)) == len(b"print(1)\n") * 2 + len(b"#!/bin/sh\n")
    assert (dest / "pkg" / "alias.py").read_text() == "print(1)\n"
    assert (dest / "copy.py").read_text() == "print(1)\n"
    assert oct((dest / "run.sh").stat().st_mode & 0o7777) == oct(0o755)
    assert sorted(iter_tree(str(dest))) == ["copy.py", "pkg", "pkg/alias.py", "pkg/model.py", "run.sh"]


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([_file("ok.py"), _file("../evil.py")], "'../evil.py' has a '..' component"),
        ([_file("a/../../evil.py")], "has a '..' component"),
        ([_file("/etc/cron.d/evil")], "has an absolute path"),
        ([_link("etc", "../../etc")], "points outside the context"),
        ([_link("passwd", "/etc/passwd")], "points to the absolute path"),
        ([_dir("sub"), _link("sub/b", "../.."), _file("x")], "'sub/b' points outside the context"),
        ([_link("b", "."), _link("a", "b/..")], "'a' resolves outside the context"),  # a chain of links
        ([_link("l", "sub"), _dir("sub"), _file("l/x.py")], "'l/x.py' is inside the link 'l'"),
        ([_link("h", "/etc/shadow", tarfile.LNKTYPE)], "has an absolute path"),
        ([_link("h", "missing.py", tarfile.LNKTYPE)], "not an earlier file"),
        ([_special("null", tarfile.CHRTYPE)], "device file 'null' is not allowed"),
        ([_special("disk", tarfile.BLKTYPE)], "device file 'disk' is not allowed"),
        ([_special("pipe", tarfile.FIFOTYPE)], "FIFO 'pipe' is not allowed"),
        ([_file("twice.py"), _file("twice.py")], "'twice.py' appears twice"),
    ],
)
def test_unsafe_tar_is_refused_and_leaves_nothing(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], message: str
) -> None:
    archive = _tar(tmp_path / "ctx.tar.gz", members)
    dest = tmp_path / "out" / "work"
    dest.parent.mkdir()
    with pytest.raises(UnsafeArchiveError, match=message.replace("(", r"\(").replace(")", r"\)")):
        unpack_context(str(archive), str(dest))
    assert list(dest.parent.iterdir()) == []  # no work/, no temporary directory
    assert not (tmp_path / "etc").exists() and not (tmp_path / "evil.py").exists()


def test_huge_content_is_refused_while_writing(tmp_path: Path) -> None:
    archive = _tar(
        tmp_path / "big.tar.gz", [_file("small.py", b"1"), _file("weights.bin", b"\0" * (3 << 20))]
    )
    dest = tmp_path / "out" / "work"
    dest.parent.mkdir()
    with pytest.raises(UnsafeArchiveError, match=r"more than 1048576 bytes \(at entry 'weights.bin'\)"):
        unpack_context(str(archive), str(dest), max_bytes=1 << 20)
    assert list(dest.parent.iterdir()) == []


def test_zip_is_supported_and_checked(tmp_path: Path) -> None:
    good = tmp_path / "good.zip"
    with zipfile.ZipFile(good, "w") as zf:
        zf.writestr("train.py", "print('hi')\n")
        zf.writestr("data/", "")
    unpack_context(str(good), str(tmp_path / "w1"))
    assert (tmp_path / "w1" / "train.py").read_text() == "print('hi')\n"
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("../escape.py", "x")
    with pytest.raises(UnsafeArchiveError, match=r"'\.\.' component"):
        unpack_context(str(bad), str(tmp_path / "w2"))
    link = tmp_path / "link.zip"
    with zipfile.ZipFile(link, "w") as zf:
        info = zipfile.ZipInfo("evil")
        info.external_attr = 0o120777 << 16
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(UnsafeArchiveError, match="absolute path"):
        unpack_context(str(link), str(tmp_path / "w3"))
    assert not (tmp_path / "w2").exists() and not (tmp_path / "w3").exists()


def test_not_an_archive(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"definitely not an archive")
    with pytest.raises(UnsafeArchiveError, match="is not a tar or zip archive"):
        unpack_context(str(junk), str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()


# -- node lists -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodelist", "names"),
    [
        ("node1", ["node1"]),
        ("node[1-2]", ["node1", "node2"]),
        ("gpu[01-03,7],login", ["gpu01", "gpu02", "gpu03", "gpu7", "login"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ],
)
def test_expand_nodelist(nodelist: str, names: list[str]) -> None:
    assert expand_nodelist(nodelist) == names


def test_container_addrs_overrides() -> None:
    assert container_addrs({"DET_NODE_ADDRS": "10.0.0.1, 10.0.0.2"}) == ["10.0.0.1", "10.0.0.2"]
    env = {"SLURM_JOB_NODELIST": "localhost", "DET_RESOLVE_OVERRIDE": "localhost=10.9.9.9"}
    assert container_addrs(env) == ["10.9.9.9"]
    assert container_addrs({"SLURM_JOB_NODELIST": "localhost"}) == ["127.0.0.1"]
    assert container_addrs({}) == ["127.0.0.1"]


# -- entrypoints ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entrypoint", "slots", "argv"),
    [
        ("python3 train.py --lr 0.1", 1, ["python3", "train.py", "--lr", "0.1"]),
        (["python3", "train.py"], 4, [PY, "-m", "launchers.torch_distributed", "python3", "train.py"]),
        (
            "model_def:MNistTrial",
            1,
            [PY, "-m", "launchers.torch_distributed", "--trial", "model_def:MNistTrial"],
        ),
        ("pkg.model:Trial", 8, [PY, "-m", "launchers.torch_distributed", "--trial", "pkg.model:Trial"]),
        (
            "python3 -m determined.launch.torch_distributed python3 train.py",
            4,
            ["python3", "-m", "determined.launch.torch_distributed", "python3", "train.py"],
        ),
        ("torchrun --nproc-per-node 2 train.py", 2, ["torchrun", "--nproc-per-node", "2", "train.py"]),
        (
            "python3 -m launchers.mpi python3 hvd.py",
            4,
            ["python3", "-m", "launchers.mpi", "python3", "hvd.py"],
        ),
    ],
)
def test_resolve_entrypoint(entrypoint: str | list[str], slots: int, argv: list[str]) -> None:
    assert resolve_entrypoint(entrypoint, slots, PY) == argv


def test_tasks_per_slot() -> None:
    assert tasks_per_slot(["python3", "-m", "determined.launch.horovod", "x.py"])
    assert not tasks_per_slot(["python3", "-m", "launchers.torch_distributed", "x.py"])


def test_environment_ours_win_and_pythonpath_keeps_ours_first() -> None:
    plan = JobPlan(
        entrypoint="python3 train.py",
        slots_per_trial=1,
        python="/venv/bin/python",
        context_archive=None,
        max_context_bytes=1 << 20,
        workdir="/w",
        env={"PYTHONPATH": "/p/determined_compat:/p", "DET_TRIAL_ID": "7"},
        user_env={"DET_TRIAL_ID": "999", "PYTHONPATH": "/mine", "FOO": "bar"},
        preempt_signal="SIGUSR1",
    )
    env = build_environment(plan, "tok", {"PATH": "/usr/bin", "HOME": "/h"}, ["10.0.0.1", "10.0.0.2"])
    assert env["DET_TRIAL_ID"] == "7"
    assert env["FOO"] == "bar"
    assert env["PYTHONPATH"] == os.pathsep.join(["/p/determined_compat", "/p", "/mine"])
    assert env["PATH"].split(os.pathsep)[:2] == ["/venv/bin", "/usr/bin"]
    assert env["DET_SESSION_TOKEN"] == "tok"
    assert env["DET_CHIEF_IP"] == "10.0.0.1"
    assert env["HOME"] == "/h"


def test_a_single_node_list_needs_no_scontrol(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from harness.exec import job_nodes

    def no_lookup(name: str) -> None:
        raise AssertionError(f"looked up {name}: one node needs no expansion")

    monkeypatch.setattr(shutil, "which", no_lookup)
    assert job_nodes.hostnames(" node7 ") == ["node7"]
    monkeypatch.undo()
    assert job_nodes.hostnames("node[1-2]") == ["node1", "node2"]  # scontrol or our own expansion


def test_the_job_entry_imports_nothing_a_plain_launch_does_not_need() -> None:
    """Every trial job starts the job entry before its entrypoint, so its imports are paid on every launch:
    typing, datetime, shutil (which pulls bz2 and lzma), the archive modules, argparse and the container
    modules are left to the type checker or to the branches that need them."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    code = "import sys, harness.exec.job_entry; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-S", "-c", code],
        env={"PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    heavy = {
        *("typing", "datetime", "shutil", "bz2", "lzma"),
        *("tarfile", "zipfile", "argparse", "containers.job"),
    }
    assert "harness.exec.job_entry" in out
    assert sorted(heavy & set(out)) == []
