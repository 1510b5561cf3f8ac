"""``launchers.deepspeed``: argv building, the hostfile, and ``main()`` against a fake ``deepspeed`` executable.

DeepSpeed itself is not installed here; ``_deepspeed_runner_parser`` mirrors the options of DeepSpeed's runner
(``deepspeed/launcher/runner.py``: ``parse_args``) that the launcher relies on, to check how it reads our argv.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launchers import deepspeed

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{REPO / 'determined_compat'}:{REPO}"}
RANK_TAIL = ["--no_local_rank", "--module", "--", "launchers.deepspeed", "--rank"]

FAKE_DEEPSPEED = """
import json, os, sys
argv = sys.argv[1:]
with open(argv[argv.index("--hostfile") + 1]) as f:
    hostfile = f.read()
with open(os.environ["FAKE_DS_RECORD"], "w") as f:
    json.dump({"argv": argv, "env": dict(os.environ), "hostfile": hostfile}, f)
sys.exit(int(os.environ.get("FAKE_DS_EXIT", "0")))
"""


def test_hostfile_text() -> None:
    assert (
        deepspeed.build_hostfile_text(["10.0.0.1", "10.0.0.2"], 4) == "10.0.0.1 slots=4\n10.0.0.2 slots=4\n"
    )
    assert deepspeed.build_hostfile_text(["localhost"], 1) == "localhost slots=1\n"
    with pytest.raises(ValueError, match="distinct"):
        deepspeed.build_hostfile_text(["10.0.0.1", "10.0.0.1"], 2)


def test_deepspeed_argv_golden() -> None:
    assert deepspeed.build_deepspeed_cmd(
        hostfile="/run/hostfile-1.txt",
        node_rank=1,
        master_addr="10.0.0.1",
        master_port=29501,
        override_args=["--num_gpus", "2"],
        script=["python3", "train.py", "--lr", "0.1"],
    ) == [
        "deepspeed", "--hostfile", "/run/hostfile-1.txt", "--no_ssh", "--node_rank", "1",
        "--master_addr", "10.0.0.1", "--master_port", "29501", "--num_gpus", "2",
        *RANK_TAIL, "python3", "train.py", "--lr", "0.1",
    ]  # fmt: skip


def _deepspeed_runner_parser() -> argparse.ArgumentParser:
    """The options of DeepSpeed's runner our argv touches, declared as DeepSpeed declares them."""
    p = argparse.ArgumentParser()
    p.add_argument("-H", "--hostfile", type=str, default="/job/hostfile")
    p.add_argument("--num_nodes", type=int, default=-1)
    p.add_argument("--num_gpus", "--num_accelerators", type=int, default=-1)
    p.add_argument("--master_port", default=29500, type=int)
    p.add_argument("--master_addr", default="", type=str)
    p.add_argument("--node_rank", default=-1, type=int)
    p.add_argument("--module", action="store_true")
    p.add_argument("--no_python", action="store_true")
    p.add_argument("--no_local_rank", action="store_true")
    p.add_argument("--no_ssh", action="store_true")
    p.add_argument("--no_ssh_check", action="store_true")
    p.add_argument("user_script", type=str)
    p.add_argument("user_args", nargs=argparse.REMAINDER)
    return p


def test_deepspeed_reads_our_argv_and_leaves_the_scripts_flags_alone() -> None:
    # "--n" would be an ambiguous abbreviation and "--master_port" a runner option, were they not after "--".
    script = ["python3", "train.py", "--n", "3", "--master_port", "1", "--", "x"]
    cmd = deepspeed.build_deepspeed_cmd(
        hostfile="h",
        node_rank=2,
        master_addr="a",
        master_port=7,
        override_args=["--num_gpus=1"],
        script=script,
    )
    ns = _deepspeed_runner_parser().parse_args(cmd[1:])
    assert (ns.hostfile, ns.node_rank, ns.master_addr, ns.master_port, ns.num_gpus) == ("h", 2, "a", 7, 1)
    assert ns.no_ssh and ns.module and ns.no_local_rank and not ns.no_python
    assert ns.user_script == "launchers.deepspeed"
    assert ns.user_args == ["--rank", *script]


def test_srun_argv_golden() -> None:
    assert deepspeed.build_srun_cmd(nnodes=2, override_args=[], script=["python3", "train.py"]) == [
        "srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
        "python3", "-m", "launchers.deepspeed", "--node", "python3", "train.py",
    ]  # fmt: skip
    assert deepspeed.build_srun_cmd(
        nnodes=1, override_args=["--num_gpus", "1"], script=["s.py"], extra_srun_args=["--gpus-per-task=4"]
    ) == [
        "srun", "--nodes=1", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--gpus-per-task=4",
        "python3", "-m", "launchers.deepspeed", "--node", "--num_gpus", "1", "--", "s.py",
    ]  # fmt: skip


def test_parse_args_forms() -> None:
    assert deepspeed.parse_args(["train.py", "x"]) == (False, [], ["train.py", "x"])
    assert deepspeed.parse_args(["--node", "--num_gpus", "2", "--", "train.py"]) == (
        True, ["--num_gpus", "2"], ["train.py"],
    )  # fmt: skip
    _node, overrides, script = deepspeed.parse_args(["--bind_cores_to_rank", "--", "--trial", "model_def:T"])
    assert overrides == ["--bind_cores_to_rank"]
    assert script == [sys.executable, "-m", "harness.exec.run_trial", "model_def:T"]
    with pytest.raises(SystemExit):
        deepspeed.parse_args([])
    with pytest.raises(SystemExit, match="exactly one"):
        deepspeed.parse_args(["--trial", "a:B", "extra"])


@pytest.mark.parametrize(
    ("override", "why"),
    [
        ("--autotuning=tune", "autotuner"),
        ("--hostfile", "Slurm allocation"),
        ("-H", "Slurm allocation"),
        ("--node_rank", "Slurm allocation"),
        ("--no_python", "--module"),
        ("--launcher", "--no_ssh"),
    ],
)
def test_overrides_the_launcher_owns_or_cannot_honour_are_refused(override: str, why: str) -> None:
    with pytest.raises(SystemExit, match=why):
        deepspeed.parse_args([override, "x", "--", "train.py"])


def test_missing_deepspeed_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deepspeed.shutil, "which", lambda *a, **k: None)
    monkeypatch.setattr(deepspeed.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit, match="pip install deepspeed"):
        deepspeed.deepspeed_cmd()


def test_remap_devices_and_rank_env() -> None:
    assert deepspeed.remap_devices("0,1", "2,3") == "2,3"
    assert deepspeed.remap_devices("1", "GPU-a,GPU-b") == "GPU-b"
    assert deepspeed.remap_devices("0,5", "2,3") == "0,5"  # not indices into the node's devices: left alone
    env = {"LOCAL_SIZE": "2", "CROSS_RANK": "1", "CROSS_SIZE": "3", "CUDA_VISIBLE_DEVICES": "0,1"}
    env[deepspeed.NODE_DEVICES_ENV] = "6,7"
    deepspeed.rank_env(env)
    assert (env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("2", "1", "3")
    assert env["CUDA_VISIBLE_DEVICES"] == "6,7"


def test_rank_mode_runs_wrap_rank_with_the_rank_environment() -> None:
    code = "import os; print(*(os.environ[k] for k in ('LOCAL_WORLD_SIZE', 'GROUP_RANK', 'CUDA_VISIBLE_DEVICES')))"
    env = {**ENV, "RANK": "3", "LOCAL_SIZE": "2", "CROSS_RANK": "1", "CROSS_SIZE": "2"}
    env.update({"CUDA_VISIBLE_DEVICES": "0,1", deepspeed.NODE_DEVICES_ENV: "4,5"})
    env.pop("LOCAL_WORLD_SIZE", None)
    env.pop("GROUP_RANK", None)
    p = subprocess.run(
        [sys.executable, "-m", "launchers.deepspeed", "--rank", sys.executable, "-c", code + "; raise SystemExit(4)"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert p.returncode == 4, p.stderr
    assert p.stdout == "[rank=3] 2 1 4,5\n"


def test_signal_targets() -> None:
    tree = {10: [11], 11: [12, 13]}  # runner 10 → deepspeed.launcher.launch 11 → ranks 12, 13
    children = lambda pid: tree.get(pid, [])  # noqa: E731
    assert deepspeed.signal_targets(10, signal.SIGUSR1, children) == ([12, 13], signal.SIGUSR1)
    assert deepspeed.signal_targets(10, signal.SIGHUP, children) == ([11], signal.SIGTERM)
    assert deepspeed.signal_targets(10, signal.SIGINT, children) == ([11], signal.SIGTERM)
    assert deepspeed.signal_targets(10, signal.SIGCONT, children) == ([10], signal.SIGCONT)
    assert deepspeed.signal_targets(99, signal.SIGTERM, children) == ([99], signal.SIGTERM)


def _record(exit_dir: Path, rank: int, node: int, code: int) -> None:
    rec = {"rank": rank, "node": node, "exit_code": code, "signalled": True, "time": time.time()}
    (exit_dir / f"rank-{rank}.json").write_text(json.dumps(rec))


def test_node_stopped_cleanly(tmp_path: Path) -> None:
    _record(tmp_path, 0, 0, 0)
    _record(tmp_path, 2, 1, 0)
    assert not deepspeed.node_stopped_cleanly(tmp_path, 0, 2, wait_s=0.3)  # rank 1 never recorded
    _record(tmp_path, 1, 0, 0)
    assert deepspeed.node_stopped_cleanly(tmp_path, 0, 2, wait_s=0)
    _record(tmp_path, 3, 1, 143)
    start = time.monotonic()
    assert not deepspeed.node_stopped_cleanly(tmp_path, 1, 2, wait_s=30)  # a failure: no waiting
    assert time.monotonic() - start < 5


@pytest.fixture
def job_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An environment with a fake ``deepspeed`` first on PATH and no Slurm; os.environ restored after."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith(("SLURM_", "DET_", "NCCL_", "CUDA_")) or name in ("USE_DEEPSPEED", "FAKE_DS_EXIT"):
            del os.environ[name]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "deepspeed"
    exe.write_text(f"#!{sys.executable}\n{FAKE_DEEPSPEED}")
    exe.chmod(0o755)
    os.environ.update(
        {
            "PATH": f"{bindir}{os.pathsep}{saved.get('PATH', '')}",
            "FAKE_DS_RECORD": str(tmp_path / "record.json"),
            "DET_RUN_DIR": str(tmp_path / "run"),
            "DET_RANK_EXIT_DIR": str(tmp_path / "exits"),
            "DET_UNIQUE_PORT_OFFSET": "7",
        }
    )
    monkeypatch.setattr(deepspeed.importlib.util, "find_spec", lambda name: None)
    # The real DeepSpeed next to this Python (scripts/bootstrap.sh installs it) must not win over the fake.
    # CI puts that directory on PATH too, so it is taken out of both lookups.
    real_which, venv_bin = shutil.which, os.path.realpath(os.path.dirname(sys.executable))

    def which_but_venv(cmd: str, path: str | None = None) -> str | None:
        dirs = (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep)
        kept = [d for d in dirs if d and os.path.realpath(d) != venv_bin]
        return real_which(cmd, path=os.pathsep.join(kept)) if kept else None

    monkeypatch.setattr(deepspeed.shutil, "which", which_but_venv)
    try:
        yield tmp_path
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_main_on_one_node_runs_deepspeed_with_a_localhost_hostfile(job_env: Path) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = "2,3"
    assert deepspeed.main(["--node", "python3", "train.py", "--lr", "0.1"]) == 0
    rec = json.loads((job_env / "record.json").read_text())
    hostfile = str(job_env / "run" / "hostfile-local.txt")
    assert rec["argv"] == [
        "--hostfile", hostfile, "--no_ssh", "--node_rank", "0", "--master_addr", "127.0.0.1",
        "--master_port", "29507", *RANK_TAIL, "python3", "train.py", "--lr", "0.1",
    ]  # fmt: skip
    assert rec["hostfile"] == "localhost slots=2\n"
    env = rec["env"]
    assert env["USE_DEEPSPEED"] == "1" and env["DET_CHIEF_IP"] == "127.0.0.1"
    assert env["DET_DEEPSPEED_HOSTFILE_PATH"] == hostfile
    assert env[deepspeed.NODE_DEVICES_ENV] == "2,3"


def test_main_on_node_1_of_2_uses_the_allocations_addresses(job_env: Path) -> None:
    info = {"container_addrs": ["10.0.0.1", "10.0.0.2"], "slot_ids": [0, 1, 2, 3], "trial": None}
    os.environ.update(
        {
            "DET_CLUSTER_INFO": json.dumps(info),
            "SLURM_NODEID": "1",
            "DET_ALLOCATION_ID": "12.1",
            "CUDA_VISIBLE_DEVICES": "0,1,2,3",
            "DET_INTER_NODE_NETWORK_INTERFACE": "ib0",
            "FAKE_DS_EXIT": "3",
        }
    )
    assert deepspeed.main(["--node", "--num_gpus", "4", "--", "--trial", "model_def:MyTrial"]) == 3
    rec = json.loads((job_env / "record.json").read_text())
    hostfile = str(job_env / "run" / "hostfile-12.1.txt")
    assert rec["argv"] == [
        "--hostfile", hostfile, "--no_ssh", "--node_rank", "1", "--master_addr", "10.0.0.1",
        "--master_port", "29507", "--num_gpus", "4",
        *RANK_TAIL, sys.executable, "-m", "harness.exec.run_trial", "model_def:MyTrial",
    ]  # fmt: skip
    assert rec["hostfile"] == "10.0.0.1 slots=4\n10.0.0.2 slots=4\n"
    assert rec["env"]["DET_CHIEF_IP"] == "10.0.0.1" and rec["env"]["NCCL_SOCKET_IFNAME"] == "ib0"


def test_main_without_deepspeed_fails_before_writing_anything(job_env: Path) -> None:
    (job_env / "bin" / "deepspeed").unlink()
    with pytest.raises(SystemExit, match="pip install deepspeed"):
        deepspeed.main(["--node", "train.py"])
    assert not (job_env / "run").exists()


def test_determined_entrypoint_runs_the_launcher() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "determined.launch.deepspeed", "--autotuning", "run", "--", "train.py"],
        capture_output=True, text=True, env=ENV, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert p.returncode == 1 and "--autotuning is not supported" in p.stderr
