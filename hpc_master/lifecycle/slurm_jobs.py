"""The one way trials' and tasks' jobs reach Slurm: submit through the gate, adopt by comment, cancel, poll.

Both drivers (`hpc_master.lifecycle.jobs` for trial runs, `hpc_master.tasks.driver` for commands, notebooks,
shells and TensorBoards) hand their built job to `SlurmJobs.submit` and act on what it answers; the answers are
the error ladder that `hpc_master.lifecycle.jobs` describes:

- `Submitted`: sbatch gave a job id (or, after a lost answer, Slurm had the job by its comment: `adopted`);
- `Waits`: ask again later, with the reason to show (`SLURM_UNAVAILABLE` while the controller does not answer,
  with a backoff shared by everything the master submits; a submit limit's name, held per (Unix account,
  account, QOS, partition) until a job ends or `limit_retry_s` passed). `check_comment`: the controller may
  have created the job although its answer was lost, so look for it by comment before the next sbatch;
- `Refused`: Slurm will never run what the job asks for (an unknown partition, a limit the job is over);
- `Lost`: sbatch answered with an error nobody knows.

Adoption after a master restart asks once per Unix account for all jobs by comment (`jobs_by_comment`), never
once per job. One instance serves the whole master (one gate: an outage seen by the trials' driver also holds
the tasks' submissions back).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hpc_master.errors import ClientError, SlurmError
from hpc_master.lifecycle.waiting import SLURM_UNAVAILABLE, LimitKey, SubmitGate
from slurm_backend import JobStatus, Poller, SlurmCli
from slurm_backend.cli import SlurmUnavailableError, SubmitLimitError
from slurm_backend.states import Outcome

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobToSubmit:
    """A built job, its run directory written: what sbatch needs and how to find it again."""

    script: str
    comment: str
    """Names the job and its master: how a lost sbatch answer, or a restart, finds the job again."""
    as_user: str | None
    """The Unix account to submit as (a root master), or None: the master's own."""
    limit_key: LimitKey
    """Whose submit limit applies: (Unix account, account, QOS, partition)."""


@dataclass(frozen=True)
class Submitted:
    job_id: str
    adopted: bool = False


@dataclass(frozen=True)
class Waits:
    reason: str
    check_comment: bool = False


@dataclass(frozen=True)
class Refused:
    message: str


@dataclass(frozen=True)
class Lost:
    message: str


SubmitResult = Submitted | Waits | Refused | Lost
ByComment = dict[str | None, dict[str, list[str]]]
"""Unix account (None: the master's own) → job comment → the ids of Slurm's jobs carrying it."""


class SlurmJobs:
    """Submit, adopt, cancel and poll jobs for the lifecycle loop's one thread."""

    def __init__(
        self,
        cli: SlurmCli,
        poller: Poller,
        *,
        limit_retry_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cli = cli
        self.poller = poller
        self.gate = SubmitGate(poller, limit_retry_s=limit_retry_s, clock=clock)

    # ---- submit -----------------------------------------------------------------------------------------
    def unavailable(self) -> bool:
        """The controller did not answer lately (our last try, or the poller's): nothing is asked of it."""
        return self.gate.slurm_unavailable()

    def submit(self, job: JobToSubmit) -> SubmitResult:
        """sbatch `job` unless Slurm said to wait; the only sbatch of the master's jobs."""
        if self.unavailable():
            return Waits(SLURM_UNAVAILABLE)
        held = self.gate.held(job.limit_key)
        if held is not None:
            return Waits(held)
        try:
            with self.cli.retries_at_most(0):  # our backoff is the retry
                job_id = self.cli.submit(job.script, as_user=job.as_user)
        except SubmitLimitError as e:
            self.gate.hold(job.limit_key, e.reason)
            return Waits(e.reason)
        except SlurmUnavailableError as e:
            if e.ambiguous:
                found = self._find(job)
                if found:
                    log.info(
                        "sbatch's answer was lost, but Slurm has job %s for %s: adopting it",
                        found,
                        job.comment,
                    )
                    return Submitted(found, adopted=True)
                self.gate.note_unavailable(e)
                return Waits(SLURM_UNAVAILABLE, check_comment=found is None)
            self.gate.note_unavailable(e)
            return Waits(SLURM_UNAVAILABLE)
        except ClientError as e:  # SubmitRefusedError: what the job asks for can never run here
            return Refused(str(e))
        except SlurmError as e:
            return Lost(f"sbatch failed: {e}")
        self.gate.note_submitted(job.limit_key)
        return Submitted(job_id)

    def _find(self, job: JobToSubmit) -> str | None:
        """The job carrying `job`'s comment ("" when Slurm has none), or None when Slurm cannot say now."""
        try:
            with self.cli.retries_at_most(0):
                found = self.cli.find_by_comment(job.comment, user=job.as_user)
        except SlurmError:
            return None
        return found[0] if found else ""

    def jobs_by_comment(self, users: Iterable[str | None]) -> ByComment | None:
        """Slurm's jobs by comment, one squeue per Unix account in `users`; None when the controller does not
        answer (then nothing is submitted that might exist already)."""
        wanted = set(users)
        if not wanted:
            return {}
        if self.unavailable():
            return None
        known: ByComment = {}
        try:
            with self.cli.retries_at_most(0):  # our backoff is the retry
                for user in sorted(wanted, key=lambda u: u or ""):
                    known[user] = self.cli.jobs_by_comment(user=user)
        except SlurmUnavailableError as e:
            self.gate.note_unavailable(e)
            return None
        return known

    # ---- cancel -----------------------------------------------------------------------------------------
    def cancel(self, job_id: str, as_user: str | None = None) -> bool:
        """scancel (as the job's owner `as_user`, where the master acts for its users); False when the
        controller did not answer (the caller stops asking it for now). Any other failure is logged, and the
        caller asks again next tick while the job lives."""
        try:
            with self.cli.retries_at_most(0):  # tried again next tick, or after the backoff
                self.cli.cancel(job_id, as_user=as_user)
        except SlurmUnavailableError as e:
            self.gate.note_unavailable(e)
            return False
        except SlurmError as e:
            log.warning("scancel %s failed: %s", job_id, e)
        return True

    def still_pending(self, job_id: str) -> bool:
        """Asked of Slurm right before a cancel of a job believed pending: the poller's answer may be a poll
        old, and a job that started meanwhile must not be killed for it."""
        try:
            with self.cli.retries_at_most(0):
                status = self.cli.squeue([job_id]).get(job_id)
        except SlurmError:
            return False  # asked again next tick
        return status is not None and status.outcome is Outcome.PENDING

    # ---- poll -------------------------------------------------------------------------------------------
    def poll(self, job_ids: Iterable[str]) -> dict[str, JobStatus]:
        """What Slurm says of `job_ids` (and of every other job watched): one batched poll per interval,
        shared by all callers."""
        self.poller.watch_all(job_ids)
        return self.poller.poll()

    def watch(self, job_id: str) -> None:
        self.poller.watch(job_id)

    def status(self, job_id: str) -> JobStatus | None:
        """The poller's last word on the job, without asking Slurm."""
        return self.poller.status(job_id)

    def unwatch(self, job_id: str) -> None:
        """A job that ended and was recorded: no longer polled."""
        self.poller.unwatch(job_id)

    def jobs_ended(self) -> None:
        """Jobs ended: a place under a submit limit may be free, so held submissions are tried again."""
        self.gate.jobs_ended()
