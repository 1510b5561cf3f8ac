"""One shared status poller for every job the master watches (like submitit's InfoWatcher).

Per poll, at most: ONE `squeue --jobs=<all live ids>`; ONE `sacct --jobs=<ids that just ended or that squeue no
longer knows>`; every `AHEAD_EVERY_S` while a job is pending, ONE `squeue --states=PENDING` of every user's
jobs, to count the jobs ahead of ours (`pending.jobs_ahead`); and, only on clusters without accounting (sacct unavailable), one `scontrol -o show job` per job
that has *just* ended, to read its exit code (once per job in its lifetime). Terminal states are cached and never
asked for again. When a Slurm command fails, the poller keeps its last answers and backs off exponentially;
while slurmctld rate-limits the master's account, it polls less often (`slurm_backend.cadence`).

Thread-safe: one lock guards the watch list and the cache, and polls are serialised (a second caller waits and
then gets the fresh answer or, within the interval, the cached one).

A job is *lost* only when Slurm's answers say so for a while: missing from every successful `squeue` answer for
`lost_after_s` (and at least `lost_after_polls` answers), with no accounting record of its end. A failed poll
(the controller not answering) restarts that count for every job, so nothing is declared lost while the
controller is down or in the first `lost_after_s` after it came back (a restarted slurmctld recovers its jobs
from its saved state, and nodes report theirs as they register again).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from det_errors import SlurmError
from slurm_backend import pending
from slurm_backend.cadence import PollCadence
from slurm_backend.cli import SlurmCli
from slurm_backend.states import JobStatus, Outcome

log = logging.getLogger(__name__)
AHEAD_EVERY_S = 30.0
"""How often the jobs ahead of pending ones are counted (an extra ``squeue`` of every user's pending jobs)."""


class Poller:
    def __init__(
        self,
        cli: SlurmCli,
        interval_s: float = 10.0,
        *,
        max_backoff_s: float = 60.0,
        lost_after_s: float = 120.0,
        lost_after_polls: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cli = cli
        self.lost_after_s = lost_after_s
        self.lost_after_polls = lost_after_polls
        self.clock = clock
        self.cadence = PollCadence(interval_s, max_backoff_s)
        self._lock = threading.Lock()
        self._watched: set[str] = set()
        self._latest: dict[str, JobStatus] = {}
        self._terminal: dict[str, JobStatus] = {}
        self._missing: dict[str, tuple[float, int]] = {}  # job id → (first missed at, answers missing it)
        self._next_poll_at = float("-inf")
        self._ahead: dict[str, int] = {}
        self._ahead_at = float("-inf")
        self.consecutive_failures = 0
        self.last_error: SlurmError | None = None

    def watch(self, job_id: str) -> None:
        """Watch a job and ask for a poll now: a new job is always polled promptly; a job already watched
        (the master's loop asks for all its live jobs every tick) only while Slurm answers, so a healthy
        cluster's job ends are seen within a tick, and a failing controller keeps its backoff. While Slurm
        rate-limits the master (`cadence`), nothing is polled before its time."""
        with self._lock:
            new = str(job_id) not in self._watched
            self._watched.add(str(job_id))
            if (new or self.consecutive_failures == 0) and not self.cadence.stretched:
                self._next_poll_at = min(self._next_poll_at, self.clock())

    def watch_all(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            self.watch(job_id)

    def unwatch(self, job_id: str) -> None:
        with self._lock:
            self._watched.discard(str(job_id))
            self._latest.pop(str(job_id), None)
            self._terminal.pop(str(job_id), None)
            self._missing.pop(str(job_id), None)

    def status(self, job_id: str) -> JobStatus | None:
        with self._lock:
            return self._terminal.get(job_id) or self._latest.get(job_id)

    def poll(self, *, force: bool = False) -> dict[str, JobStatus]:
        """Statuses of all watched jobs Slurm has told us about; asks Slurm at most once per interval."""
        with self._lock:
            now = self.clock()
            if force or now >= self._next_poll_at:
                try:
                    with self.cli.retries_at_most(0):  # the backoff below is the retry
                        backed_off = self._refresh()
                except SlurmError as e:
                    self.consecutive_failures += 1
                    self.last_error = e
                    self._missing.clear()  # no answer says anything about a job: start counting again
                    delay = self.cadence.failed(self.consecutive_failures)
                    log.warning("polling Slurm failed (%s); next try in %.0f s", e, delay)
                    self._next_poll_at = now + delay
                else:
                    self.consecutive_failures = 0
                    self.last_error = None
                    # From the answer on: a rate-limited squeue answers late (its client slept meanwhile).
                    self._next_poll_at = self.clock() + self._answered(backed_off)
            return {j: s for j in self._watched if (s := self._terminal.get(j) or self._latest.get(j))}

    def _answered(self, backed_off: int) -> float:
        """The delay to the next poll after an answer, saying when the cadence changes."""
        before = self.cadence.current_s
        delay = self.cadence.answered(backed_off)
        interval = self.cadence.interval_s
        if backed_off and before == interval < delay:
            log.warning(
                "slurmctld rate-limits the master's account (squeue was told to back off %d times): "
                "polling every %.0f s instead of %.0f s",
                backed_off,
                delay,
                interval,
            )
        elif before > delay == interval:
            log.info("slurmctld answers without backoff again: polling every %.0f s", delay)
        return delay

    def _refresh(self) -> int:
        """Ask Slurm about every live job; how many times squeue was told to back off."""
        live = [j for j in self._watched if j not in self._terminal]
        if not live:
            return 0
        seen, backed_off = self.cli.poll_squeue(live)
        ended = _ended_jobs(live, seen)
        final = self._final_statuses(ended, seen) if ended else {}
        now = self.clock()
        for job_id in live:
            answer = final.get(job_id) or seen.get(job_id)
            self._record(job_id, self._status(job_id, answer, in_squeue=job_id in seen, now=now))
        self._count_ahead(now)
        return backed_off

    def _count_ahead(self, now: float) -> None:
        """The jobs ahead of each pending one: one more ``squeue`` (every user's pending jobs) at most every
        ``AHEAD_EVERY_S``, never while slurmctld rate-limits the master; kept on the statuses between."""
        waiting = [j for j, s in self._latest.items() if s.outcome is Outcome.PENDING]
        if waiting and now - self._ahead_at >= AHEAD_EVERY_S and not self.cadence.stretched:
            self._ahead_at = now
            try:
                self._ahead = pending.jobs_ahead(waiting, self.cli.pending_queue())
            except SlurmError as e:
                log.info("counting the jobs ahead failed (%s); tried again later", e)
        for job_id in waiting:
            self._latest[job_id] = replace(self._latest[job_id], jobs_ahead=self._ahead.get(job_id))

    def _status(self, job_id: str, answer: JobStatus | None, *, in_squeue: bool, now: float) -> JobStatus:
        """The job's status from this poll's `answer` (sacct's or squeue's), or as a missing job."""
        if answer is not None and (in_squeue or answer.is_terminal):
            self._missing.pop(job_id, None)
            return answer
        # Not in squeue's answer, and no record of its end: missing (sacct may still say RUNNING).
        return self._missing_status(job_id, answer, now)

    def _record(self, job_id: str, status: JobStatus) -> None:
        """Keep `status`: a terminal one in the cache for good, any other as the job's latest."""
        if status.is_terminal:
            self._terminal[job_id] = status
            self._latest.pop(job_id, None)
        else:
            self._latest[job_id] = status

    def _missing_status(self, job_id: str, accounted: JobStatus | None, now: float) -> JobStatus:
        since, answers = self._missing.get(job_id, (now, 0))
        answers += 1
        self._missing[job_id] = (since, answers)
        previous = accounted or self._latest.get(job_id)
        lost = now - since >= self.lost_after_s and answers >= self.lost_after_polls
        if lost:
            reason = (
                f"Slurm no longer knows this job: missing from squeue for {now - since:.0f} s "
                f"({answers} answers) with no accounting record of its end"
            )
        else:
            reason = "missing from squeue; waiting for Slurm's accounting or a grace period"
        return JobStatus(
            job_id=job_id,
            outcome=Outcome.LOST if lost else Outcome.UNKNOWN,
            slurm_state=previous.slurm_state if previous else "",
            reason=reason,
            node_list=previous.node_list if previous else "",
            start_time=previous.start_time if previous else None,
            source="poller",
        )

    def _final_statuses(self, ended: list[str], seen: dict[str, JobStatus]) -> dict[str, JobStatus]:
        """Exit codes and authoritative end states: one sacct call; scontrol only without accounting."""
        try:
            accounted = self.cli.sacct(ended)
        except SlurmError as e:  # slurmdbd down: squeue's (or scontrol's) word, or wait
            log.warning("sacct failed (%s); using what squeue says", e)
            accounted = None
        out: dict[str, JobStatus] = {}
        for job_id in ended:
            acct = accounted.get(job_id) if accounted is not None else None
            if acct is not None and (acct.is_terminal or job_id not in seen):
                out[job_id] = acct
            elif job_id in seen:
                # sacct unavailable or not yet updated by slurmdbd: slurmctld still has the job's exit code.
                out[job_id] = self.cli.show_job(job_id) or seen[job_id]
        return out


def _ended_jobs(live: list[str], seen: dict[str, JobStatus]) -> list[str]:
    """The jobs of `live` that squeue no longer knows or says have ended.

    UNSCHEDULABLE jobs are still pending in Slurm: sacct knows no exit code, and its reason is stale
    (PartitionConfig where squeue says PartitionTimeLimit), so squeue's answer stands."""
    return [
        j
        for j in live
        if j not in seen or (seen[j].is_terminal and seen[j].outcome is not Outcome.UNSCHEDULABLE)
    ]
