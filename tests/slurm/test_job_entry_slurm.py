"""A trial job built by build_trial_job, submitted as the researcher to the real 2-node cluster.

No master runs: DET_MASTER points at an unused loopback port, and the Core API script reports no metrics.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import tarfile
from pathlib import Path

import pytest

from harness.exec import _job_plan as run_files
from hpc_master.expconf import parse_experiment_config
from hpc_master.trialjob import JobPaths, PoolSpec, TrialJobInputs, TrialJobPlan, build_trial_job
from hpc_master.trialjob_files import write_run_dir
from tests.slurm.fixtures import REPO, Researcher, python_for_jobs, wait_job_done

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
    shared_dir: Path, researcher: Researcher, *, entrypoint: str, slots: int, files: dict[str, str]
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
    write_run_dir(plan, uid=researcher.uid, gid=researcher.gid)
    job_id = researcher.sbatch(Path(plan.run_dir) / run_files.SCRIPT_FILE)
    state = wait_job_done(job_id, timeout_s=90)
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
    node_ips = [socket.gethostbyname("node1"), socket.gethostbyname("node2")]
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
