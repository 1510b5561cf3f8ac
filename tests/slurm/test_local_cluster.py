"""The local cluster behaves like a real multi-node GPU cluster: hosts, GPUs, MPI and preemption."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.slurm.fixtures import (
    Researcher,
    python_for_jobs,
    wait_for,
    wait_job_done,
    write_script,
)

pytestmark = pytest.mark.slurm

REPORT = r"""
import json, os, socket, sys
print(json.dumps({
    "host": socket.gethostname(),
    "ip": socket.gethostbyname(socket.gethostname()),
    "rank": int(os.environ["SLURM_PROCID"]),
    "node_id": int(os.environ["SLURM_NODEID"]),
    "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "step_gpus": os.environ.get("SLURM_STEP_GPUS"),
    "job_gpus": os.environ.get("SLURM_JOB_GPUS"),
    "uid": os.getuid(),
}), flush=True)
"""


def test_two_nodes_two_tasks_see_distinct_hosts_and_their_gpus(
    researcher: Researcher, shared_dir: Path
) -> None:
    probe = write_script(shared_dir / "probe.py", REPORT, researcher)
    out = shared_dir / "out.txt"
    script = write_script(
        shared_dir / "job.sh",
        f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=2 --gres=gpu:2 --output={out}
srun {python_for_jobs()} {probe}
""",
        researcher,
    )
    job = researcher.sbatch(script)
    assert wait_job_done(job) == "COMPLETED", out.read_text() if out.exists() else "no output"
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in rows) == [0, 1, 2, 3]
    by_node = {r["node_id"]: r for r in rows}
    assert len(by_node) == 2
    hosts = {r["host"] for r in rows}
    ips = {r["ip"] for r in rows}
    assert len(hosts) == 2 and len(ips) == 2, rows
    for r in rows:
        assert r["cuda"] == "0,1", r
        assert r["step_gpus"] == "0,1", r
        assert r["job_gpus"] == "0,1", r  # batch-job variable, inherited by the step
        assert r["uid"] == researcher.uid


def test_gres_type_and_count_are_enforced(researcher: Researcher, shared_dir: Path) -> None:
    out = shared_dir / "one.txt"
    script = write_script(
        shared_dir / "one.sh",
        f"""#!/bin/bash
#SBATCH --nodes=1 --gres=gpu:a100:1 --output={out}
echo "CVD=$CUDA_VISIBLE_DEVICES"
""",
        researcher,
    )
    assert wait_job_done(researcher.sbatch(script)) == "COMPLETED"
    # One GPU of the node's two, whichever other tests' jobs left free: exactly one index is visible.
    assert re.fullmatch(r"CVD=[01]\n", out.read_text()), out.read_text()
    # More GPUs than a node has is refused at submission, as on a real cluster.
    too_many = researcher.run(["sbatch", "--parsable", "--gres=gpu:99", str(script)], check=False)
    assert too_many.returncode != 0
    assert "Requested node configuration is not available" in too_many.stderr


@pytest.mark.exclusive  # an urgent job preempts every batch job on the cluster
def test_urgent_partition_preempts_batch_job_with_sigterm_then_requeue(
    researcher: Researcher, shared_dir: Path
) -> None:
    log = shared_dir / "victim.log"
    victim = write_script(
        shared_dir / "victim.sh",
        f"""#!/bin/bash
#SBATCH --partition=batch --nodelist=node1,node2 --exclusive --output={log} --open-mode=append --requeue
echo "start restart=${{SLURM_RESTART_COUNT:-0}}"
trap 'echo "SIGTERM restart=${{SLURM_RESTART_COUNT:-0}}"; exit 0' TERM
if [ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ]; then exit 0; fi
for i in $(seq 1200); do sleep 0.1; done
echo "not preempted"
""",
        researcher,
    )
    urgent_out = shared_dir / "urgent.txt"
    urgent = write_script(
        shared_dir / "urgent.sh",
        f"""#!/bin/bash
#SBATCH --partition=urgent --nodelist=node1,node2 --exclusive --output={urgent_out}
echo urgent-ran
""",
        researcher,
    )
    victim_id = researcher.sbatch(victim)
    wait_for(lambda: log.exists() and "start restart=0" in log.read_text(), 60, "the victim to start")
    urgent_id = researcher.sbatch(urgent)
    # Both jobs want the same two whole nodes: the urgent one can only run by preempting the victim.
    assert wait_job_done(urgent_id, timeout_s=90) == "COMPLETED"
    assert "urgent-ran" in urgent_out.read_text()
    # The victim saw SIGTERM (the grace period), then Slurm requeued it and it started again.
    wait_for(lambda: "start restart=1" in log.read_text(), 120, "the requeued victim to restart")
    lines = log.read_text().splitlines()
    assert "SIGTERM restart=0" in lines, lines
    assert lines.index("SIGTERM restart=0") < lines.index("start restart=1")
    assert "not preempted" not in lines
    wait_job_done(victim_id)


def test_mpi4py_allreduce_across_two_nodes_through_pmix(researcher: Researcher, shared_dir: Path) -> None:
    prog = write_script(
        shared_dir / "allreduce.py",
        """
import socket
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1)
print(f"RESULT rank={comm.rank} size={comm.size} sum={total} host={socket.gethostname()}", flush=True)
""",
        researcher,
    )
    out = shared_dir / "mpi.txt"
    script = write_script(
        shared_dir / "mpi.sh",
        f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=2 --output={out}
srun --mpi=pmix {python_for_jobs()} {prog}
""",
        researcher,
    )
    assert wait_job_done(researcher.sbatch(script)) == "COMPLETED", out.read_text()
    results = [line.split() for line in out.read_text().splitlines() if line.startswith("RESULT")]
    assert len(results) == 4
    assert {r[3] for r in results} == {"sum=10"}  # 1 + 2 + 3 + 4
    assert {r[2] for r in results} == {"size=4"}
    assert len({r[4] for r in results}) == 2


def test_accounting_knows_finished_jobs_and_memory_limits_are_enforced(
    researcher: Researcher, shared_dir: Path
) -> None:
    """sacct (slurmdbd) reports how jobs ended long after slurmctld forgot them; --mem is a real limit."""
    import subprocess

    ok = write_script(shared_dir / "ok.sh", "#!/bin/bash\nexit 0\n", researcher)
    bad = write_script(shared_dir / "bad.sh", "#!/bin/bash\nexit 3\n", researcher)
    hog = write_script(
        shared_dir / "hog.sh",
        f"#!/bin/bash\n{python_for_jobs()} -c 'import time; b = bytearray(400 << 20); "
        "b[::4096] = bytes(len(b[::4096])); time.sleep(60)'\n",
        researcher,
    )
    ids = {
        "ok": researcher.sbatch(ok, "--output=/dev/null"),
        "bad": researcher.sbatch(bad, "--output=/dev/null"),
        "hog": researcher.sbatch(hog, f"--output={shared_dir}/hog.txt", "--mem=100"),
    }
    for job in ids.values():
        wait_job_done(job, timeout_s=90)

    def sacct_states() -> dict[str, tuple[str, str]] | None:
        out = subprocess.run(
            ["sacct", "-X", "-n", "--parsable2", "--format=JobIDRaw,State,ExitCode", "-j", ",".join(ids.values())],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        rows = {line.split("|")[0]: (line.split("|")[1], line.split("|")[2]) for line in out.splitlines()}
        return rows if len(rows) == 3 else None

    rows = wait_for(sacct_states, 30, "sacct to record the three jobs")
    assert rows[ids["ok"]] == ("COMPLETED", "0:0")
    assert rows[ids["bad"]] == ("FAILED", "3:0")
    assert rows[ids["hog"]][1] == "0:9"  # killed by Slurm, not finished
    assert "Exceeded job memory limit" in (shared_dir / "hog.txt").read_text()
