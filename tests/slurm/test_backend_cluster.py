"""slurm_backend against the real local cluster (det deploy local: 2 nodes × gpu:a100:2, partitions batch,
short (MaxTime 2 min), urgent (preempts batch, GraceTime 10 s)). Jobs are submitted as the researcher."""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from slurm_backend import JobSpec, Outcome, Poller, SlurmCli, render_sbatch_script
from slurm_backend.cli import CommandResult, SubmitRefusedError, subprocess_runner
from slurm_backend.states import JobStatus
from tests.slurm.fixtures import Researcher, wait_for

pytestmark = pytest.mark.slurm


class CountingRunner:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.argvs: list[list[str]] = []
        self.submitted: list[str] = []

    def __call__(
        self, argv: Sequence[str], stdin: str | None, timeout_s: float, env: dict[str, str]
    ) -> CommandResult:
        name = argv[4] if argv[0] == "runuser" else argv[0]
        self.calls[name] += 1
        self.argvs.append(list(argv))
        result = subprocess_runner(argv, stdin, timeout_s, env)
        if name == "sbatch" and result.returncode == 0:
            self.submitted.append(result.stdout.strip().split(";")[0])
        return result


@pytest.fixture()
def runner() -> CountingRunner:
    return CountingRunner()


@pytest.fixture()
def cli(runner: CountingRunner) -> Iterator[SlurmCli]:
    cli = SlurmCli(runner=runner, retries=3, backoff_s=1.0)
    yield cli
    # Whatever this test left behind: only its own job ids (other sessions may run these tests at the same time).
    if runner.submitted:
        subprocess.run(["scancel", *runner.submitted], check=False)


def spec(d: Path, *commands: tuple[str, ...], **kw: object) -> JobSpec:
    base: dict[str, object] = {
        "job_name": "hpcdet-test",
        "comment": "hpc-det:exp=1,trial=1,run=1",
        "output_path": str(d / "slurm-%j.log"),
        "workdir": str(d),
        "commands": commands,
    }
    return JobSpec(**{**base, **kw})  # type: ignore[arg-type]


def submit(cli: SlurmCli, researcher: Researcher, s: JobSpec) -> str:
    return cli.submit(render_sbatch_script(s), as_user=researcher.name)


def wait_terminal(poller: Poller, job_ids: Sequence[str], timeout_s: float) -> dict[str, JobStatus]:
    def done() -> dict[str, JobStatus] | None:
        statuses = poller.poll()
        return statuses if all(j in statuses and statuses[j].is_terminal for j in job_ids) else None

    result: dict[str, JobStatus] = wait_for(done, timeout_s, f"jobs {job_ids} to end", interval_s=1.0)
    return result


def test_two_nodes_two_gpus_each(cli: SlurmCli, researcher: Researcher, shared_dir: Path) -> None:
    s = spec(
        shared_dir,
        ("srun", "bash", "-c", f'echo "$(hostname) $CUDA_VISIBLE_DEVICES" > {shared_dir}/node.$SLURM_NODEID'),
        ("sleep", "4"),
        nodes=2,
        gpus_per_node=2,
        gpu_type="a100",
        comment="hpc-det:exp=3,trial=7,run=2",
        job_name="hpcdet-test 2x2",
    )
    job_id = submit(cli, researcher, s)
    visible = wait_for(
        lambda: subprocess.run(
            ["squeue", "--noheader", f"--jobs={job_id}", "--states=RUNNING", "--format=%j|%k|%D"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip(),
        120,  # other sessions' jobs may hold the GPUs for a while
        "the job to run",
    )
    assert visible == "hpcdet-test 2x2|hpc-det:exp=3,trial=7,run=2|2"
    poller = Poller(cli, interval_s=1)
    poller.watch(job_id)
    status = wait_terminal(poller, [job_id], 60)[job_id]
    assert (status.outcome, status.exit_code) == (Outcome.SUCCEEDED, 0), status
    lines = sorted((shared_dir / f"node.{i}").read_text().split() for i in range(2))
    # Two of the cluster's nodes (which two is Slurm's choice), each job step seeing both of its GPUs.
    assert [gpus for _, gpus in lines] == ["0,1", "0,1"] and len({node for node, _ in lines}) == 2, lines


def test_poller_tracks_five_jobs_with_one_squeue_per_poll(
    cli: SlurmCli, runner: CountingRunner, researcher: Researcher, shared_dir: Path
) -> None:
    ok = spec(shared_dir, ("sleep", "2"))
    jobs = {
        "ok1": submit(cli, researcher, ok),
        "ok2": submit(cli, researcher, ok),
        "ok3": submit(cli, researcher, spec(shared_dir, ("true",))),
        "fail": submit(cli, researcher, spec(shared_dir, ("sleep", "2"), ("bash", "-c", "exit 3"))),
        "cancel": submit(cli, researcher, spec(shared_dir, ("sleep", "120"))),
    }
    poller = Poller(cli, interval_s=1)
    poller.watch_all(jobs.values())
    runner.calls.clear()
    wait_for(
        lambda: (c := poller.poll().get(jobs["cancel"])) is not None and c.outcome is Outcome.RUNNING,
        60,
        "the job to cancel to run",
        interval_s=1,
    )
    cli.cancel(jobs["cancel"])
    statuses = wait_terminal(poller, list(jobs.values()), 90)
    got = {name: (statuses[j].outcome, statuses[j].exit_code) for name, j in jobs.items()}
    assert got == {
        "ok1": (Outcome.SUCCEEDED, 0),
        "ok2": (Outcome.SUCCEEDED, 0),
        "ok3": (Outcome.SUCCEEDED, 0),
        "fail": (Outcome.FAILED, 3),
        "cancel": (Outcome.CANCELLED, 0),
    }, statuses
    squeue_argvs = [a for a in runner.argvs if a[0] == "squeue"]
    refreshes = runner.calls["squeue"]
    # one squeue per refresh, batching every live id; sacct at most once per refresh, never per job
    assert len(squeue_argvs) == refreshes
    assert "--jobs=" + ",".join(sorted(jobs.values(), key=int)) in squeue_argvs[0]
    assert 1 <= runner.calls["sacct"] <= refreshes
    # Exit codes come from the batched sacct; scontrol only for a job whose end slurmdbd had not recorded yet
    # (it lags behind slurmctld under load: CI saw one), once for that job, never once per job per poll.
    assert runner.calls["scontrol"] <= len(jobs)
    # terminal states are cached: polling again asks Slurm nothing
    before = sum(runner.calls.values())
    poller.poll(force=True)
    assert sum(runner.calls.values()) == before


@pytest.mark.exclusive  # an urgent job preempts every batch job on the cluster
def test_preempted_without_requeue(cli: SlurmCli, researcher: Researcher, shared_dir: Path) -> None:
    victim = submit(cli, researcher, spec(shared_dir, ("sleep", "300"), gpus_per_node=2, gpu_type="a100"))
    poller = Poller(cli, interval_s=1)
    poller.watch(victim)
    running = wait_for(
        lambda: (s := poller.poll().get(victim)) is not None and s.outcome is Outcome.RUNNING and s,
        60,
        "the victim to run",
        interval_s=1,
    )
    urgent = spec(
        shared_dir,
        ("sleep", "1"),
        partition="urgent",
        extra_sbatch_args=("--exclusive", f"--nodelist={running.node_list}"),
    )
    urgent_id = submit(cli, researcher, urgent)
    poller.watch(urgent_id)
    statuses = wait_terminal(poller, [victim, urgent_id], 90)
    assert statuses[victim].outcome is Outcome.PREEMPTED, statuses[victim]
    assert statuses[urgent_id].outcome is Outcome.SUCCEEDED
    # not requeued: Slurm kept the record of its one run and never started it again
    shown = subprocess.run(
        ["scontrol", "-o", "show", "job", victim], capture_output=True, text=True, check=False
    )
    assert (
        "JobState=PREEMPTED" in shown.stdout and "Restarts=0" in shown.stdout and "Requeue=0" in shown.stdout
    )


def test_time_limit_signals_then_times_out(cli: SlurmCli, researcher: Researcher, shared_dir: Path) -> None:
    marker = shared_dir / "got-usr1"
    s = spec(
        shared_dir,
        ("bash", "-c", f"trap 'date +%s > {marker}' USR1; while true; do sleep 1; done"),
        partition="short",
        time_limit_min=1,
        preempt_lead_s=30,
    )
    started = time.monotonic()
    job_id = submit(cli, researcher, s)
    poller = Poller(cli, interval_s=2)
    poller.watch(job_id)
    status = wait_terminal(poller, [job_id], 150)[job_id]
    assert status.outcome is Outcome.TIMED_OUT, status
    assert marker.exists(), "the batch shell never received USR1 before the time limit"
    assert status.end_time is not None and status.start_time is not None
    # slurmctld enforces limits on a periodic timer (~30 s), plus KillWait: 60-82 s seen for a 1-minute limit.
    assert 55 <= (status.end_time - status.start_time).total_seconds() <= 130
    assert int(marker.read_text()) < status.end_time.timestamp(), "USR1 came after the job ended?"
    assert time.monotonic() - started < 150


def test_unknown_partition_is_refused_at_submit(
    cli: SlurmCli, researcher: Researcher, shared_dir: Path
) -> None:
    with pytest.raises(SubmitRefusedError) as e:
        submit(cli, researcher, spec(shared_dir, ("true",), partition="nosuch"))
    assert e.value.message == "Slurm refused the job: Invalid partition name specified"


def test_time_above_partition_limit_is_unschedulable(
    cli: SlurmCli, researcher: Researcher, shared_dir: Path
) -> None:
    job_id = submit(cli, researcher, spec(shared_dir, ("true",), partition="short", time_limit_min=5))
    poller = Poller(cli, interval_s=1)
    poller.watch(job_id)
    status = wait_terminal(poller, [job_id], 30)[job_id]
    # Slurm first says PartitionConfig (at submit), then PartitionTimeLimit (after the scheduler looked at it).
    assert status.outcome is Outcome.UNSCHEDULABLE
    assert status.reason in {"PartitionConfig", "PartitionTimeLimit"}
    assert status.message == f"UNSCHEDULABLE: {status.reason}"
    cli.cancel(job_id)
