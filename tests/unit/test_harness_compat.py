from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
from fake_master import FakeMaster, cluster_info

REPO = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DET_"))}
    env["PYTHONPATH"] = f"{REPO / 'determined_compat'}:{REPO}"
    env.update(extra)
    return env


DET_SCRIPT = textwrap.dedent(
    """
    import logging, sys
    import determined as det
    from determined import core

    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    assert issubclass(det.InvalidHP, Exception)
    assert det.core.PreemptMode.WorkersAskChief.value == "WORKERS_ASK_CHIEF"
    dist = det.core.DistributedContext(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1)
    with det.core.init(distributed=dist, preempt_mode=det.core.PreemptMode.WorkersAskChief) as ctx:
        hp = info.trial.hparams if info else {"lr": 1}
        for op in ctx.searcher.operations():
            for step in range(1, op.length + 1):
                ctx.train.report_training_metrics(steps_completed=step, metrics={"loss": hp["lr"] / step})
                if ctx.preempt.should_preempt():
                    sys.exit(0)
            ctx.train.report_validation_metrics(steps_completed=op.length, metrics={"loss": 0.1})
            op.report_completed(0.1)
        with ctx.checkpoint.store_path({"steps_completed": 3}) as (path, storage_id):
            (path / "w").write_text("x")
        print("CKPT", storage_id, info.trial.trial_id if info else None)
    """
)


def test_determined_script_runs_unmodified_on_cluster(tmp_path: Path) -> None:
    master = FakeMaster()
    master.ops = [3]
    (tmp_path / "ci.json").write_text(json.dumps(cluster_info(master)))
    (tmp_path / "train.py").write_text(DET_SCRIPT)
    p = subprocess.run(
        [sys.executable, "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env=_env(DET_CLUSTER_INFO=str(tmp_path / "ci.json"), DET_STORAGE_ROOT=str(tmp_path / "ck")),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    sid = p.stdout.split()[1]
    assert sid in master.checkpoints and master.completed_ops == [(3, 0.1)]
    assert len([k for k in master.metrics if k[2] == "training"]) == 3


def test_determined_script_runs_off_cluster(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(DET_SCRIPT)
    p = subprocess.run(
        [sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env=_env(XDG_DATA_HOME=str(tmp_path / "xdg")),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "xdg" / "determined" / p.stdout.split()[1] / "w").exists()


def test_pytorch_names() -> None:
    code = (
        "import determined as det\nfrom determined import pytorch\n"
        "assert det.pytorch.PyTorchTrial and pytorch.PyTorchTrialContext and pytorch.DataLoader\n"
        "assert pytorch.LRScheduler.StepMode.STEP_EVERY_EPOCH\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=_env(), timeout=60)


TORCHRUN_SCRIPT = textwrap.dedent(
    """
    import json, torch, torch.distributed as tdist
    import determined as det
    tdist.init_process_group("gloo")
    dist = det.core.DistributedContext.from_torch_distributed()
    with det.core.init(distributed=dist) as ctx:
        gathered = ctx.distributed.allgather(ctx.distributed.rank * 10)
        local = ctx.distributed.allgather_local(ctx.distributed.local_rank)
        t = torch.tensor([float(dist.rank + 1)])
        tdist.all_reduce(t)
        stop = ctx.preempt.should_preempt()
    print(json.dumps({"rank": dist.rank, "size": dist.size, "gathered": gathered, "local": local,
                      "sum": t.item(), "stop": stop}))
    tdist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_torchrun_two_procs_core_api_allgather(tmp_path: Path) -> None:
    (tmp_path / "s.py").write_text(TORCHRUN_SCRIPT)
    p = subprocess.run(
        [sys.executable, "-m", "determined.launch.torch_distributed", "--nproc-per-node", "2", "--",
         sys.executable, "s.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env=_env(DET_UNIQUE_PORT_OFFSET=str(os.getpid() % 1000 + 1500), XDG_DATA_HOME=str(tmp_path)),
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("[rank=") and "{" in ln]
    outs = {int(ln[6]): json.loads(ln.split("] ", 1)[1]) for ln in lines}
    assert sorted(outs) == [0, 1]
    for r, o in outs.items():
        assert o == {"rank": r, "size": 2, "gathered": [0, 10], "local": [0, 1], "sum": 3.0, "stop": False}
