"""The shared poller against a fake SlurmCli: one squeue per interval, one sacct for ended jobs, cached
terminal states, backoff on failures."""

from __future__ import annotations

from collections.abc import Iterable

from hpc_master.errors import SlurmError
from slurm_backend.cli import SlurmCli
from slurm_backend.poller import Poller
from slurm_backend.states import JobStatus, Outcome, outcome_for


def st(job_id: str, state: str, *, exit_code: int | None = None, source: str = "squeue") -> JobStatus:
    return JobStatus(job_id, outcome_for(state), state, exit_code=exit_code, source=source)


class FakeCli(SlurmCli):
    def __init__(self) -> None:
        super().__init__()
        self.queue: dict[str, JobStatus] = {}
        self.acct: dict[str, JobStatus] | None = {}
        self.calls: list[tuple[str, list[str]]] = []
        self.fail = False

    def poll_squeue(self, job_ids: Iterable[str]) -> tuple[dict[str, JobStatus], int]:
        return self.squeue(job_ids), 0

    def squeue(self, job_ids: Iterable[str]) -> dict[str, JobStatus]:
        ids = sorted(job_ids)
        self.calls.append(("squeue", ids))
        if self.fail:
            raise SlurmError("squeue failed: Socket timed out")
        return {j: self.queue[j] for j in ids if j in self.queue}

    def sacct(self, job_ids: Iterable[str]) -> dict[str, JobStatus] | None:
        ids = sorted(job_ids)
        self.calls.append(("sacct", ids))
        return None if self.acct is None else {j: self.acct[j] for j in ids if j in self.acct}

    def show_job(self, job_id: str) -> JobStatus | None:
        self.calls.append(("scontrol", [job_id]))
        s = self.queue.get(job_id)
        return s and JobStatus(s.job_id, s.outcome, s.slurm_state, exit_code=7, source="scontrol")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make() -> tuple[Poller, FakeCli, Clock]:
    cli, clock = FakeCli(), Clock()
    return Poller(cli, interval_s=10, max_backoff_s=60, clock=clock), cli, clock


def test_one_squeue_for_all_jobs_and_one_sacct_for_ended_ones() -> None:
    poller, cli, clock = make()
    poller.watch_all(["1", "2", "3", "4"])
    cli.queue = {"1": st("1", "RUNNING"), "2": st("2", "PENDING"), "3": st("3", "FAILED")}  # 4: purged
    cli.acct = {
        "3": st("3", "FAILED", exit_code=3, source="sacct"),
        "4": st("4", "COMPLETED", exit_code=0, source="sacct"),
    }
    result = poller.poll()
    assert cli.calls == [("squeue", ["1", "2", "3", "4"]), ("sacct", ["3", "4"])]
    assert {j: (s.outcome, s.exit_code) for j, s in result.items()} == {
        "1": (Outcome.RUNNING, None),
        "2": (Outcome.PENDING, None),
        "3": (Outcome.FAILED, 3),
        "4": (Outcome.SUCCEEDED, 0),
    }
    # Within the interval: cached, no Slurm call.
    clock.now = 5
    assert poller.poll() == result and len(cli.calls) == 2
    # Next interval: terminal jobs are never asked about again.
    clock.now = 10
    cli.queue["1"] = st("1", "COMPLETED")
    cli.acct["1"] = st("1", "COMPLETED", exit_code=0, source="sacct")
    poller.poll()
    assert cli.calls[2:] == [("squeue", ["1", "2"]), ("sacct", ["1"])]


def test_without_accounting_scontrol_reads_the_exit_code_once() -> None:
    poller, cli, clock = make()
    poller.watch("5")
    cli.acct = None
    cli.queue = {"5": st("5", "FAILED")}
    assert poller.poll()["5"].exit_code == 7
    assert [c[0] for c in cli.calls] == ["squeue", "sacct", "scontrol"]
    clock.now = 100
    poller.poll()
    assert len(cli.calls) == 3  # terminal: cached


def test_job_unknown_everywhere_is_unknown_not_terminal() -> None:
    poller, _cli, _ = make()
    poller.watch("9")
    status = poller.poll()["9"]
    assert status.outcome is Outcome.UNKNOWN and not status.is_terminal


def test_backs_off_exponentially_and_keeps_last_answers() -> None:
    poller, cli, clock = make()
    poller.watch("1")
    cli.queue = {"1": st("1", "RUNNING")}
    first = poller.poll()
    cli.fail = True
    clock.now = 10
    assert poller.poll() == first  # failure: last answer kept
    assert poller.consecutive_failures == 1 and poller.last_error is not None
    clock.now = 29  # next try at 10 + 20
    poller.poll()
    assert len(cli.calls) == 2
    clock.now = 30
    poller.poll()  # fails again: next at 30 + 40
    clock.now = 69
    poller.poll()
    assert len(cli.calls) == 3
    cli.fail = False
    clock.now = 70
    poller.poll()
    assert poller.consecutive_failures == 0 and len(cli.calls) == 4


def test_watch_triggers_a_prompt_poll_and_unwatch_forgets() -> None:
    poller, cli, clock = make()
    poller.watch("1")
    cli.queue = {"1": st("1", "RUNNING"), "2": st("2", "PENDING")}
    poller.poll()
    clock.now = 1
    poller.watch("2")
    assert set(poller.poll()) == {"1", "2"}
    poller.unwatch("1")
    assert set(poller.poll(force=True)) == {"2"}
    assert poller.status("1") is None and poller.status("2") is not None


def test_watching_again_polls_at_once_while_slurm_answers_but_not_during_a_backoff() -> None:
    """The loop re-watches its live jobs every tick: a job's end is seen within a tick on a healthy cluster
    (not after `interval_s`), while a failing controller is not asked again before its backoff ends."""
    poller, cli, clock = make()
    poller.watch("1")
    cli.queue = {"1": st("1", "RUNNING")}
    poller.poll()
    clock.now = 2  # one loop tick later, well within the 10 s interval
    poller.watch_all(["1"])
    poller.poll()
    assert len(cli.calls) == 2
    cli.fail = True
    clock.now = 4
    poller.watch_all(["1"])
    poller.poll()  # fails: next try at 4 + 20
    clock.now = 6
    poller.watch_all(["1"])
    poller.poll()
    assert len(cli.calls) == 3 and poller.consecutive_failures == 1
