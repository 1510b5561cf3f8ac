from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launchers import mpi, torch_distributed
from launchers._common import first_failure
from launchers.wrap_rank import prefix_lines, resolve_rank

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def test_torchrun_argv_golden() -> None:
    assert torch_distributed.build_torchrun_cmd(
        nnodes=2,
        node_rank=1,
        nproc_per_node=4,
        rdzv_host="10.0.0.1",
        rdzv_port=29400,
        override_args=["--log-dir", "/tmp/l"],
        script=["python3", "train.py", "--lr", "0.1"],
    ) == [
        "torchrun", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "4",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29400", "--max-restarts", "0",
        "--log-dir", "/tmp/l",
        "--module", "launchers.wrap_rank", "RANK", "--", "python3", "train.py", "--lr", "0.1",
    ]  # fmt: skip


def test_srun_argv_golden() -> None:
    assert torch_distributed.build_srun_cmd(nnodes=3, override_args=[], script=["python3", "train.py"]) == [
        "srun", "--nodes=3", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
        "python3", "-m", "launchers.torch_distributed", "--node", "python3", "train.py",
    ]  # fmt: skip
    assert torch_distributed.build_srun_cmd(
        nnodes=1, override_args=["--master-port", "1"], script=["s.py"], extra_srun_args=["--gpus-per-task=4"]
    ) == [
        "srun", "--nodes=1", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--gpus-per-task=4",
        "python3", "-m", "launchers.torch_distributed", "--node", "--master-port", "1", "--", "s.py",
    ]  # fmt: skip


def test_mpi_argv_golden() -> None:
    assert mpi.build_srun_cmd(slots_per_node=8, script=["python3", "hvd.py"]) == [
        "srun", "--mpi=pmix", "--ntasks-per-node=8", "--kill-on-bad-exit=1",
        "python3", "-m", "launchers.wrap_rank", "SLURM_PROCID,PMIX_RANK,OMPI_COMM_WORLD_RANK", "--",
        "python3", "hvd.py",
    ]  # fmt: skip


def test_parse_args_forms() -> None:
    assert torch_distributed.parse_args(["a.py", "x"]) == (False, [], ["a.py", "x"])
    assert torch_distributed.parse_args(["--node", "--nproc-per-node", "2", "--", "a.py"]) == (
        True, ["--nproc-per-node", "2"], ["a.py"],
    )  # fmt: skip
    _node, _ov, script = torch_distributed.parse_args(["--trial", "model_def:MyTrial"])
    assert script[1:] == ["-m", "harness.exec.run_trial", "model_def:MyTrial"]
    with pytest.raises(SystemExit):
        torch_distributed.parse_args([])


def test_node_facts_from_cluster_info(monkeypatch: pytest.MonkeyPatch) -> None:
    ci = {"container_addrs": ["10.1.0.5", "10.1.0.6"], "slot_ids": [0, 1, 2], "trial": None}
    monkeypatch.setenv("DET_CLUSTER_INFO", json.dumps(ci))
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.delenv("DET_CHIEF_IP", raising=False)
    assert torch_distributed.node_facts() == (2, 1, 3, "10.1.0.5")


def _run_pipe(data: list[bytes]) -> bytes:
    r, w = os.pipe()
    out_r, out_w = os.pipe()
    for chunk in data:
        os.write(w, chunk)
    os.close(w)
    prefix_lines(r, out_w, b"[rank=3] ")
    os.close(out_w)
    out = b""
    while chunk := os.read(out_r, 65536):
        out += chunk
    return out


def test_prefix_lines_edge_cases() -> None:
    assert _run_pipe([b"a\nb\r\nc"]) == b"[rank=3] a\n[rank=3] b\n[rank=3] c\n"
    assert _run_pipe([b"10%\r20%\r", b"\ndone\n"]) == b"[rank=3] 10%\n[rank=3] 20%\n[rank=3] done\n"
    assert _run_pipe([b"par", b"tial", b" line"]) == b"[rank=3] partial line\n"
    assert _run_pipe([]) == b""


def test_resolve_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("SLURM_PROCID", "5")
    assert resolve_rank("7") == 7
    assert resolve_rank("RANK,SLURM_PROCID") == 5


def test_wrap_rank_prefixes_both_streams_and_propagates_exit() -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.stdout.write('tail'); sys.exit(7)"
    p = subprocess.run(
        [sys.executable, "-m", "launchers.wrap_rank", "2", "--", sys.executable, "-c", code],
        capture_output=True, env=ENV, cwd=REPO,
    )  # fmt: skip
    assert p.returncode == 7
    assert p.stdout == b"[rank=2] out\n[rank=2] tail\n"
    assert p.stderr == b"[rank=2] err\n"


def test_wrap_rank_forwards_signals_and_records_exit(tmp_path: Path) -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda *a: print('got usr1', flush=True))\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('got term', flush=True), sys.exit(3)))\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(0.01)\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-m", "launchers.wrap_rank", "1", "--", sys.executable, "-c", code],
        stdout=subprocess.PIPE, env={**ENV, "DET_RANK_EXIT_DIR": str(tmp_path)}, cwd=REPO,
    )  # fmt: skip
    assert p.stdout is not None
    assert p.stdout.readline() == b"[rank=1] ready\n"
    p.send_signal(signal.SIGUSR1)
    assert p.stdout.readline() == b"[rank=1] got usr1\n"
    p.send_signal(signal.SIGTERM)
    assert p.stdout.readline() == b"[rank=1] got term\n"
    assert p.wait(10) == 3
    rec = first_failure(tmp_path)
    assert rec is not None and rec["rank"] == 1 and rec["exit_code"] == 3 and rec["signalled"] is True


def test_killed_child_exit_code() -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    p = subprocess.run(
        [sys.executable, "-m", "launchers.wrap_rank", "0", sys.executable, "-c", code], env=ENV, cwd=REPO
    )
    assert p.returncode == 128 + 9


def test_first_failure_prefers_the_rank_that_failed_on_its_own(tmp_path: Path) -> None:
    now = time.time()
    for rank, code, sig, t in [(0, 143, True, now - 5), (1, 0, False, now), (2, 3, False, now - 1)]:
        (tmp_path / f"rank-{rank}.json").write_text(
            json.dumps({"rank": rank, "exit_code": code, "signalled": sig, "time": t})
        )
    rec = first_failure(tmp_path)
    assert rec is not None and rec["rank"] == 2


@pytest.mark.slow
def test_torch_distributed_local_failure_stops_others_with_rank_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(
        "import os, sys, time\nr = int(os.environ['RANK'])\nprint('hello', r, flush=True)\n"
        "if r == 1:\n    time.sleep(1); sys.exit(5)\ntime.sleep(120)\n"
    )
    env = {k: v for k, v in ENV.items() if not k.startswith("SLURM_") and k != "DET_CLUSTER_INFO"}
    env["DET_UNIQUE_PORT_OFFSET"] = str(os.getpid() % 1000 + 500)
    start = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "launchers.torch_distributed", "--nproc-per-node", "2", "--", sys.executable, str(script)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=90,
    )  # fmt: skip
    assert p.returncode == 5, p.stdout + p.stderr
    assert time.monotonic() - start < 60
    assert "[rank=0] hello 0" in p.stdout and "[rank=1] hello 1" in p.stdout
