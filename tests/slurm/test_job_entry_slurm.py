"""A trial job built by build_trial_job, submitted as the researcher to the real 2-node cluster.

No master runs: DET_MASTER points at an unused loopback port, and the Core API script reports no metrics.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.exec import job_plan as run_files
from hpc_master.expconf import parse_experiment_config
from hpc_master.trialjob import JobPaths, PoolSpec, TrialJobInputs, TrialJobPlan, build_trial_job
from hpc_master.trialjob_files import write_run_dir
from tests.slurm.fixtures import REPO, Researcher, python_for_jobs, wait_for, wait_job_done

pytestmark = pytest.mark.slurm

CORE_SCRIPT = r"""
import json, os, socket
import determined as det

info = det.get_cluster_info()
with det.core.init() as core:
    d = core.distributed
    seen = d.allgather({"rank": d.rank, "host": socket.gethostname()})
    print("RESULT " + json.dumps({
        "rank": d.rank,
        "host": socket.gethostname(),
        "size": d.size,
        "container_addrs": info.container_addrs,
        "container_rank": info.container_rank,
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "hparams": info.trial.hparams,
        "gathered": sorted(x["rank"] for x in seen),
    }), flush=True)
"""


def _context(path: Path, files: dict[str, str], owner: Researcher) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    os.chown(path, owner.uid, owner.gid)
    return path


def _submit(
    shared_dir: Path,
    researcher: Researcher,
    *,
    entrypoint: str,
    slots: int,
    files: dict[str, str],
    while_running: Callable[[str, TrialJobPlan], None] | None = None,
) -> tuple[TrialJobPlan, str, str]:
    cfg = parse_experiment_config(
        {
            "entrypoint": entrypoint,
            "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 1}},
            "hyperparameters": {"lr": 0.5},
            "resources": {"slots_per_trial": slots},
        }
    )
    archive = _context(shared_dir / "context.tar.gz", files, researcher)
    paths = JobPaths(str(shared_dir / "jobs"), str(shared_dir / "ck"), str(REPO), python_for_jobs())
    trial = TrialJobInputs(
        experiment_id=1,
        trial_id=1,
        trial_run_id=1,
        hparams={"lr": 0.5},
        trial_seed=7,
        owner=researcher.name,
        context_archive=str(archive),
    )
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    plan = build_trial_job(
        cfg,
        PoolSpec(partition="batch", slots_per_node=2, preempt_lead_s=None),
        trial,
        paths,
        master_url=f"http://127.0.0.1:{port}",
        session_token="test-token",
    )
    write_run_dir(plan, paths.job_storage_root, uid=researcher.uid, gid=researcher.gid)
    job_id = researcher.sbatch(Path(plan.run_dir) / run_files.SCRIPT_FILE)
    try:
        if while_running is not None:
            while_running(job_id, plan)
        state = wait_job_done(job_id, timeout_s=90)
    except BaseException:
        subprocess.run(["scancel", job_id], check=False)  # never leave a stuck job holding the nodes
        raise
    output = Path(plan.output_path).read_text() if Path(plan.output_path).exists() else "no output"
    return plan, state, output


def _exit_record(plan: TrialJobPlan) -> dict[str, object]:
    return dict(json.loads((Path(plan.run_dir) / run_files.EXIT_FILE).read_text()))


def test_four_slot_core_api_trial_on_two_nodes(researcher: Researcher, shared_dir: Path) -> None:
    plan, state, output = _submit(
        shared_dir,
        researcher,
        entrypoint="python3 -m determined.launch.torch_distributed python3 core_script.py",
        slots=4,
        files={"core_script.py": CORE_SCRIPT},
    )
    assert state == "COMPLETED", output
    rows = {}
    for line in output.splitlines():
        m = re.match(r"^\[rank=(\d)\] RESULT (.*)$", line)
        if m:
            rows[int(m.group(1))] = json.loads(m.group(2))
    assert sorted(rows) == [0, 1, 2, 3], output
    # The job's two nodes (which two of the cluster's is Slurm's choice), in rank order.
    node_ips = [socket.gethostbyname(rows[0]["host"]), socket.gethostbyname(rows[2]["host"])]
    for prefix_rank, row in rows.items():
        assert row["rank"] == prefix_rank and row["size"] == 4
        assert row["container_addrs"] == node_ips
        assert row["container_rank"] == prefix_rank // 2
        assert row["cuda"] == "0,1"
        assert row["gathered"] == [0, 1, 2, 3]
        assert row["hparams"] == {"lr": 0.5}
    record = _exit_record(plan)
    assert record["exitCode"] == 0 and record["preempted"] is False and record["reason"] == "completed"
    assert "test-token" not in (Path(plan.run_dir) / run_files.SCRIPT_FILE).read_text()


def test_failing_startup_hook_fails_the_job(researcher: Researcher, shared_dir: Path) -> None:
    hook = "echo 'hook: cannot fetch the dataset' >&2\nexit 4\n"
    plan, state, output = _submit(
        shared_dir,
        researcher,
        entrypoint="python3 train.py",
        slots=1,
        files={"train.py": "print('TRAINING')\n", "startup-hook.sh": hook},
    )
    assert state == "FAILED", output
    assert "hook: cannot fetch the dataset" in output
    assert "[job_entry] error: startup-hook.sh failed with exit code 4" in output
    assert "TRAINING" not in output
    record = _exit_record(plan)
    assert record["stage"] == "startup_hook" and record["exitCode"] == 1


PREEMPT_SCRIPT = r"""
import pathlib, time
import determined as det

with det.core.init() as core:
    pathlib.Path(f"ready-{core.distributed.rank}").touch()
    for step in range(1200):
        # auto_ack=False: acknowledging would retry against the absent master for 30 s
        if core.preempt.should_preempt(auto_ack=False):
            print(f"PREEMPTED rank={core.distributed.rank}", flush=True)
            break
        time.sleep(0.1)
"""


# USR1 reaches each rank twice (slurmstepd's killpg and wrap_rank's forwarding): the harness's signal handler
# takes no lock, so this no longer hangs (it did while the handler called Event.set).
def test_preemption_signal_reaches_every_rank_and_counts_as_a_pause(
    researcher: Researcher, shared_dir: Path
) -> None:
    def on_ready(job_id: str, plan: TrialJobPlan) -> None:
        work = Path(plan.workdir)
        wait_for(lambda: (work / "ready-0").exists() and (work / "ready-1").exists(), 60, "both ranks")
        # What `--signal=B:USR1@lead` does before the time limit: USR1 to the batch shell (the job entry).
        subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], check=True)

    plan, state, output = _submit(
        shared_dir,
        researcher,
        entrypoint="python3 preempt_script.py",
        slots=2,
        files={"preempt_script.py": PREEMPT_SCRIPT},
        while_running=on_ready,
    )
    assert state == "COMPLETED", output
    assert "[rank=0] PREEMPTED rank=0" in output and "[rank=1] PREEMPTED rank=1" in output, output
    record = _exit_record(plan)
    assert record["preempted"] is True and record["signal"] == "SIGUSR1" and record["exitCode"] == 0
