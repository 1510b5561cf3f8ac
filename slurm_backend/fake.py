"""A scripted Slurm cluster at `SlurmCli`'s runner boundary: tests of the master's lifecycle need no root,
no cluster, and run in milliseconds.

`FakeCluster` is a `Runner` (`SlurmCli(runner=FakeCluster())`). It answers the argv lists `SlurmCli` runs
(sbatch, squeue, sacct, scontrol, scancel, each maybe behind `runuser -u USER --`) in the formats Slurm 22.05
prints them, and fails them with the words it uses; every such text was recorded on the local cluster
(tests/unit/captured/, checked against this module by tests/unit/test_slurm_fake.py).

Jobs move only when a test says so (`start`, `complete`, `fail`, `preempt`, `time_out`, `node_fail`, `oom`,
`cancel`) or through `schedule()`, which starts pending jobs as a FIFO scheduler would and gives the others
Slurm's pending reasons (Resources, Priority, AssocMaxJobsLimit, QOSMaxJobsPerUserLimit). Knobs for the faults
a real cluster has:

- `controller_up = False`: every command but sacct fails as with slurmctld down (slurmdbd still answers);
  `restart_controller(forget_recent_s=...)` brings it back as a real restart does, with jobs started in the
  last seconds back to PENDING (their start was never saved) and run again.
- `hide_from_squeue_once(job_id)`: the job is missing from the next squeue answer.
- `forget(job_id)`: slurmctld no longer knows the job (lost state); sacct may still know it.
- `max_submit_jobs[user]` / `qos_max_submit_per_user[qos]`: sbatch refuses over the limit, as
  `AccountingStorageEnforce=limits` does; `max_running_jobs[user]` keeps jobs pending (AssocMaxJobsLimit).
- `latency_s`: every command takes that long (a controller answering under load).
- `lose_next_submit_answer()`: sbatch creates the job, but the answer is lost ("Socket timed out").
- `accounting = False`: a cluster without slurmdbd.
- `rate_limit = RpcRateLimit(...)`: slurmctld's per-user RPC rate limit of Slurm ≥ 23.02, with the client's
  sleep-and-ask-again (`slurm_backend.fake_ratelimit`); the sleeps go through `sleep`.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from slurm_backend.cli import CommandResult
from slurm_backend.fake_ratelimit import LIMITED, RpcRateLimit, backoff_line

# ---- recorded texts (Slurm 22.05.8, `det deploy local` cluster; tests/unit/captured/) ----------------------
UNREACHABLE = "Unable to contact slurm controller (connect failure)"
SBATCH_UNREACHABLE = f"sbatch: error: Batch job submission failed: {UNREACHABLE}\n"
LOAD_JOBS_UNREACHABLE = f"slurm_load_jobs error: {UNREACHABLE}\n"
SCANCEL_UNREACHABLE = "scancel: error: Kill job error on job id {job_id}: " + UNREACHABLE + "\n"
SCANCEL_INVALID = "scancel: error: Kill job error on job id {job_id}: Invalid job id specified\n"
SBATCH_TIMED_OUT = "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation\n"
POLICY = "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)"
SBATCH_LIMIT = "sbatch: error: {limit}\nsbatch: error: Batch job submission failed: " + POLICY + "\n"
SBATCH_BAD_PARTITION = "sbatch: error: Batch job submission failed: Invalid partition name specified\n"
SBATCH_BAD_ACCOUNT = (
    "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified\n"
)
INVALID_JOB_ID = "slurm_load_jobs error: Invalid job id specified\n"
RULE = "-" * 29  # around the options `squeue -v` prints
ACCOUNTING_DISABLED = "sacct: error: Slurm accounting storage is disabled\n"

ENDED = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "DEADLINE"}
)
ACTIVE = frozenset({"PENDING", "RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING"})
EPOCH = datetime(2026, 11, 24, 7, 0, 0)


def _ts(value: datetime | None, none: str) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S") if value is not None else none


@dataclass
class FakeJob:
    job_id: str
    user: str
    script: str
    name: str = ""
    comment: str = ""
    partition: str = "batch"
    account: str | None = None
    qos: str = "normal"
    state: str = "PENDING"
    reason: str = "None"
    node_list: str = ""
    submit_time: datetime = EPOCH
    start_time: datetime | None = None
    end_time: datetime | None = None
    exit_code: int = 0
    exit_signal: int = 0
    batch_state: str | None = None  # the batch step's state in sacct; None: no step yet
    batch_signal: int = 0
    cancelled_by: int | None = None  # the uid sacct names ("CANCELLED by 1001")
    in_controller: bool = True  # False: slurmctld lost it
    in_accounting: bool = True
    starts: int = 0  # how many times it was started (a controller restart can run a job again)
    signals: list[str] = field(default_factory=list)  # scancel --signal=... received
    nice: int = 0  # sbatch --nice, or the last `scontrol update JobId=... Nice=...`

    @property
    def ended(self) -> bool:
        return self.state in ENDED


@dataclass(frozen=True)
class Call:
    argv: tuple[str, ...]
    user: str | None  # from `runuser -u USER --`
    returncode: int


class FakeCluster:
    """A Slurm cluster in memory, answering `SlurmCli`'s commands; thread-safe."""

    def __init__(
        self,
        *,
        slots: int = 4,
        partitions: Sequence[str] = ("batch", "short", "urgent"),
        master_user: str = "root",
        uid: Callable[[str], int] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        min_job_age_s: float = 300.0,
        first_job_id: int = 1,
    ) -> None:
        self.slots = slots
        self.partitions = set(partitions)
        self.master_user = master_user
        self.uid = uid or (lambda user: 0 if user == "root" else 1001)
        self.sleep = sleep
        self.min_job_age_s = min_job_age_s
        self.jobs: dict[str, FakeJob] = {}
        self.calls: list[Call] = []
        self.now = EPOCH
        self.controller_up = True
        self.accounting = True
        self.latency_s = 0.0
        self.in_flight = 0  # commands spending `latency_s` right now
        self.auto_schedule = False
        self.max_submit_jobs: dict[str, int] = {}
        self.qos_max_submit_per_user: dict[str, int] = {}
        self.max_running_jobs: dict[str, int] = {}
        self.qos_max_running_per_user: dict[str, int] = {}
        self.accounts: set[str] | None = None  # None: any account is valid
        self.rate_limit: RpcRateLimit | None = None
        self._next_id = first_job_id
        self._hidden_once: set[str] = set()
        self._lose_answer = False
        self._down_after_lost_answer = False
        self._lock = threading.RLock()

    # ---- time -------------------------------------------------------------------------------------------
    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += timedelta(seconds=seconds)
            self._purge()

    def monotonic(self) -> float:
        """Seconds on the fake clock (a `clock` for `Poller` and `JobDriver`)."""
        return (self.now - EPOCH).total_seconds()

    # ---- the Runner -------------------------------------------------------------------------------------
    def __call__(
        self, argv: Sequence[str], stdin: str | None, timeout_s: float, env: dict[str, str]
    ) -> CommandResult:
        args = list(argv)
        user = self.master_user
        if args[:2] == ["runuser", "-u"] and len(args) > 4 and args[3] == "--":
            user, args = args[2], args[4:]
        if self.latency_s:
            with self._lock:
                self.in_flight += 1
            try:
                self.sleep(self.latency_s)
            finally:
                with self._lock:
                    self.in_flight -= 1
        told = self._through_rate_limit(args, user)
        with self._lock:
            handler = {
                "sbatch": self._sbatch,
                "squeue": self._squeue,
                "sacct": self._sacct,
                "scontrol": self._scontrol,
                "scancel": self._scancel,
            }.get(args[0])
            if handler is None:
                raise FileNotFoundError(args[0])
            result = handler(args[1:], stdin or "", user)
            if told:
                result = CommandResult(result.returncode, result.stdout, told + result.stderr)
            self.calls.append(Call(tuple(argv), user, result.returncode))
            return result

    def _through_rate_limit(self, args: list[str], user: str) -> str:
        """Wait as Slurm's client does while slurmctld tells it to back off; what it printed meanwhile."""
        limit = self.rate_limit
        if limit is None or not args or args[0] not in LIMITED or not self.controller_up:
            return ""
        times, printed = 0, ""
        while not limit.take(self.uid(user), self.monotonic()):
            times += 1
            if "-v" in args:
                printed += backoff_line(args[0], times)
            self.sleep(times)
        return printed

    def count(self, command: str) -> int:
        """How many times `command` ran (whoever ran it)."""
        return sum(1 for c in self.calls if command in c.argv[:5])

    # ---- faults -----------------------------------------------------------------------------------------
    def kill_controller(self) -> None:
        with self._lock:
            self.controller_up = False

    def restart_controller(self, *, forget_recent_s: float = 0.0) -> None:
        """slurmctld comes back with its saved state: jobs it started in the last `forget_recent_s` seconds
        are PENDING again (their processes are killed on the node and the job runs again, as observed)."""
        with self._lock:
            self.controller_up = True
            for job in self.jobs.values():
                recent = job.start_time is not None and self.now - job.start_time < timedelta(
                    seconds=forget_recent_s
                )
                if job.state == "RUNNING" and recent:
                    job.state, job.reason, job.node_list, job.start_time = "PENDING", "None", "", None

    def hide_from_squeue_once(self, job_id: str) -> None:
        with self._lock:
            self._hidden_once.add(str(job_id))

    def forget(self, job_id: str, *, accounting: bool = True) -> None:
        """slurmctld loses the job (and, with `accounting=False`, slurmdbd never heard of it)."""
        with self._lock:
            job = self.jobs[str(job_id)]
            job.in_controller = False
            job.in_accounting = accounting

    def lose_next_submit_answer(self, *, then_controller_down: bool = False) -> None:
        """The next sbatch creates its job but its answer is lost ("Socket timed out"); with
        `then_controller_down`, slurmctld stops answering right after (until `restart_controller`)."""
        with self._lock:
            self._lose_answer = True
            self._down_after_lost_answer = then_controller_down

    # ---- moving jobs ------------------------------------------------------------------------------------
    def job(self, job_id: str) -> FakeJob:
        return self.jobs[str(job_id)]

    def by_comment(self, comment: str) -> list[FakeJob]:
        with self._lock:
            return [j for j in self.jobs.values() if j.comment == comment]

    def active(self) -> list[FakeJob]:
        with self._lock:
            return [j for j in self.jobs.values() if j.state in ACTIVE and j.in_controller]

    def start(self, job_id: str, nodes: str = "node1") -> FakeJob:
        with self._lock:
            job = self.jobs[str(job_id)]
            assert job.state == "PENDING", f"job {job_id} is {job.state}"
            job.state, job.reason, job.node_list = "RUNNING", "None", nodes
            job.start_time, job.batch_state = self.now, "RUNNING"
            job.starts += 1
            return job

    def finish(
        self, job_id: str, state: str, *, exit_code: int = 0, signal: int = 0, batch: str | None = None
    ) -> FakeJob:
        with self._lock:
            job = self.jobs[str(job_id)]
            assert job.state in ACTIVE, f"job {job_id} already ended ({job.state})"
            if job.start_time is None and state != "CANCELLED":
                self.start(job_id)
            job.state, job.exit_code, job.exit_signal = state, exit_code, signal
            job.reason = "NonZeroExitCode" if state == "FAILED" and exit_code else "None"
            job.end_time = self.now
            if job.start_time is not None:
                job.batch_state = batch or state
            return job

    def complete(self, job_id: str) -> FakeJob:
        return self.finish(job_id, "COMPLETED")

    def fail(self, job_id: str, exit_code: int = 1) -> FakeJob:
        return self.finish(job_id, "FAILED", exit_code=exit_code)

    def preempt(self, job_id: str) -> FakeJob:
        """Preempted with --no-requeue: PREEMPTED, its batch step CANCELLED by SIGTERM (as captured)."""
        job = self.finish(job_id, "PREEMPTED", batch="CANCELLED")
        job.batch_signal = 15
        return job

    def time_out(self, job_id: str) -> FakeJob:
        job = self.finish(job_id, "TIMEOUT", batch="CANCELLED")
        job.batch_signal = 15
        return job

    def node_fail(self, job_id: str) -> FakeJob:
        return self.finish(job_id, "NODE_FAIL", exit_code=0, signal=9)

    def oom(self, job_id: str) -> FakeJob:
        return self.finish(job_id, "OUT_OF_MEMORY", exit_code=0, signal=9)

    def cancel(self, job_id: str, *, by_user: str = "root") -> FakeJob:
        with self._lock:
            job = self.jobs[str(job_id)]
            if job.state in ACTIVE:
                job.cancelled_by = self.uid(by_user)
                job.state, job.end_time = "CANCELLED", self.now
                if job.start_time is not None:
                    job.batch_state, job.batch_signal = "CANCELLED", 15
            return job

    def schedule(self) -> list[str]:
        """Start pending jobs in priority order (submission order, less their nice) while slots and per-user limits allow; give the rest
        Slurm's reasons. Returns the ids started."""
        with self._lock:
            started: list[str] = []
            running = [j for j in self.active() if j.state == "RUNNING"]
            free = self.slots - len(running)
            blocked_by_resources = False
            # priority/basic: each job's priority is one below the previous one's, less its nice.
            for job in sorted(self.active(), key=lambda j: (int(j.job_id) + j.nice, int(j.job_id))):
                if job.state != "PENDING":
                    continue
                limit = self._running_limit(job, running)
                if limit is not None:
                    job.reason = limit
                elif free <= 0:
                    job.reason = "Priority" if blocked_by_resources else "Resources"
                    blocked_by_resources = True
                else:
                    self.start(job.job_id, nodes=f"node{len(running) % 2 + 1}")
                    running.append(job)
                    started.append(job.job_id)
                    free -= 1
            return started

    def _running_limit(self, job: FakeJob, running: list[FakeJob]) -> str | None:
        """The pending reason of a per-user limit on running jobs that holds `job` back, or None."""
        mine = sum(1 for j in running if j.user == job.user)
        mine_qos = sum(1 for j in running if j.user == job.user and j.qos == job.qos)
        if job.user in self.max_running_jobs and mine >= self.max_running_jobs[job.user]:
            return "AssocMaxJobsLimit"
        if job.qos in self.qos_max_running_per_user and mine_qos >= self.qos_max_running_per_user[job.qos]:
            return "QOSMaxJobsPerUserLimit"
        return None

    # ---- commands ---------------------------------------------------------------------------------------
    def _sbatch(self, args: list[str], script: str, user: str) -> CommandResult:
        if not self.controller_up:
            return CommandResult(1, "", SBATCH_UNREACHABLE)
        opts = _sbatch_options(script)
        partition = opts.get("partition", "batch")
        account = opts.get("account")
        qos = opts.get("qos", "normal")
        refusal = self._sbatch_invalid(partition, account) or self._submit_limit(user, qos)
        if refusal is not None:
            return CommandResult(1, "", refusal)
        job_id = str(self._next_id)
        self._next_id += 1
        self.jobs[job_id] = FakeJob(
            job_id=job_id,
            user=user,
            script=script,
            name=opts.get("job-name", "sbatch"),
            comment=opts.get("comment", ""),
            partition=partition,
            account=account,
            qos=qos,
            submit_time=self.now,
            nice=int(opts.get("nice", "0")),
        )
        if self.auto_schedule:
            self.schedule()
        if self._lose_answer:
            self._lose_answer = False
            self.controller_up = not self._down_after_lost_answer
            return CommandResult(1, "", SBATCH_TIMED_OUT)
        return CommandResult(0, f"{job_id}\n", "")

    def _sbatch_invalid(self, partition: str, account: str | None) -> str | None:
        """sbatch's stderr for a partition or account the cluster does not have, or None."""
        if partition not in self.partitions:
            return SBATCH_BAD_PARTITION
        if self.accounts is not None and account is not None and account not in self.accounts:
            return SBATCH_BAD_ACCOUNT
        return None

    def _submit_limit(self, user: str, qos: str) -> str | None:
        """sbatch's stderr when `user` is at a limit on submitted jobs (of theirs, or theirs in `qos`), or None."""
        queued = [j for j in self.active() if j.user == user]
        if user in self.max_submit_jobs and len(queued) >= self.max_submit_jobs[user]:
            return SBATCH_LIMIT.format(limit="AssocMaxSubmitJobLimit")
        if (
            qos in self.qos_max_submit_per_user
            and len([j for j in queued if j.qos == qos]) >= self.qos_max_submit_per_user[qos]
        ):
            return SBATCH_LIMIT.format(limit="QOSMaxSubmitJobPerUserLimit")
        return None

    def _squeue(self, args: list[str], _stdin: str, _user: str) -> CommandResult:
        if not self.controller_up:
            return CommandResult(1, "", LOAD_JOBS_UNREACHABLE)
        if self.auto_schedule:
            self.schedule()
        opts = _long_options(args)
        fmt = opts.get("format", "%A|%T|%r|%N|%S|%e")
        jobs = self._squeue_jobs(opts)
        if jobs is None:
            return CommandResult(1, "", INVALID_JOB_ID)
        jobs = _squeue_filter(jobs, opts)
        hidden = {j.job_id for j in jobs} & self._hidden_once
        self._hidden_once -= hidden
        lines = [_squeue_line(j, fmt) for j in jobs if j.job_id not in hidden]
        out = "".join(f"{line}\n" for line in lines)
        if "-v" in args:
            out = self._squeue_verbose(opts, len(jobs)) + out
        return CommandResult(0, out, "")

    def _squeue_jobs(self, opts: dict[str, str]) -> list[FakeJob] | None:
        """The jobs `--jobs` names that slurmctld knows (all without it); None for one it does not know."""
        known = {j.job_id: j for j in self.jobs.values() if j.in_controller}
        if "jobs" not in opts:
            return list(known.values())
        ids = opts["jobs"].split(",")
        if len(ids) == 1 and ids[0] not in known:
            return None
        return [known[i] for i in ids if i in known]

    def _squeue_verbose(self, opts: dict[str, str], records: int) -> str:
        """What `squeue -v` prints before its answer: its options, then when the answer was made
        (tests/unit/captured/squeue_verbose.txt)."""
        options = f"{RULE}\njobs        = {opts.get('jobs', '(null)')}\nverbose     = 1\n{RULE}\n\n\n"
        return f"{options}last_update_time={int(self.monotonic())} records={records}\n"

    def _sacct(self, args: list[str], _stdin: str, _user: str) -> CommandResult:
        if not self.accounting:
            return CommandResult(1, "", ACCOUNTING_DISABLED)
        opts = _long_options(args)
        ids = opts.get("jobs", "").split(",")
        lines: list[str] = []
        for job_id in ids:
            job = self.jobs.get(job_id)
            if job is not None and job.in_accounting:
                lines += self._sacct_lines(job)
        return CommandResult(0, "".join(f"{line}\n" for line in lines), "")

    def _sacct_lines(self, job: FakeJob) -> list[str]:
        state = job.state
        if state == "CANCELLED" and job.cancelled_by is not None:
            state = f"CANCELLED by {job.cancelled_by}"
        nodes = job.node_list or "None assigned"
        start = _ts(job.start_time, "Unknown")
        end = _ts(job.end_time, "Unknown")
        reason = job.reason if job.state == "PENDING" else "None"
        lines = [f"{job.job_id}|{state}|{job.exit_code}:{job.exit_signal}|0:0|{reason}|{nodes}|{start}|{end}"]
        if job.batch_state is not None:
            lines.append(
                f"{job.job_id}.batch|{job.batch_state}|{job.exit_code}:{job.batch_signal or job.exit_signal}"
                f"|||{job.node_list.split(',')[0]}|{start}|{end}"
            )
        return lines

    def _scontrol(self, args: list[str], _stdin: str, _user: str) -> CommandResult:
        if not self.controller_up:
            return CommandResult(1, "", LOAD_JOBS_UNREACHABLE)
        if args[:1] == ["update"]:  # scontrol update JobId=ID Nice=N (prints nothing when it works)
            fields = dict(a.split("=", 1) for a in args[1:])
            job = self.jobs.get(fields.get("JobId", ""))
            if job is None or not job.in_controller:
                return CommandResult(1, "", INVALID_JOB_ID)
            job.nice = int(fields["Nice"])
            return CommandResult(0, "", "")
        job_id = args[-1]
        job = self.jobs.get(job_id)
        if job is None or not job.in_controller:
            return CommandResult(1, "", INVALID_JOB_ID)
        uid = self.uid(job.user)
        line = (
            f"JobId={job.job_id} JobName={job.name} UserId={job.user}({uid}) GroupId={job.user}({uid}) "
            f"Priority=4294901758 Nice={job.nice} Account={job.account or '(null)'} QOS={job.qos} "
            f"JobState={job.state} Reason={job.reason.replace(', ', ',_')} Dependency=(null) Requeue=0 "
            f"Restarts=0 BatchFlag=1 Reboot=0 ExitCode={job.exit_code}:{job.exit_signal} "
            f"SubmitTime={_ts(job.submit_time, 'Unknown')} StartTime={_ts(job.start_time, 'Unknown')} "
            f"EndTime={_ts(job.end_time, 'Unknown')} Partition={job.partition} "
            f"NodeList={job.node_list or '(null)'} Comment={job.comment} Power= "
        )
        return CommandResult(0, line + "\n", "")

    def _scancel(self, args: list[str], _stdin: str, user: str) -> CommandResult:
        job_id = args[-1]
        if not self.controller_up:
            return CommandResult(8, "", SCANCEL_UNREACHABLE.format(job_id=job_id))
        job = self.jobs.get(job_id)
        signal = next((a.split("=", 1)[1] for a in args if a.startswith("--signal=")), None)
        if job is None or not job.in_controller:
            # A plain scancel of an id Slurm does not know exits 0 silently; with --signal it is an error.
            return (
                CommandResult(1, "", SCANCEL_INVALID.format(job_id=job_id))
                if signal
                else CommandResult(0, "", "")
            )
        if signal is not None:
            job.signals.append(signal)
        else:
            self.cancel(job_id, by_user=user)
        return CommandResult(0, "", "")

    def _purge(self) -> None:
        """Ended jobs leave slurmctld's memory after MinJobAge (sacct still knows them)."""
        for job in self.jobs.values():
            age = (self.now - job.end_time).total_seconds() if job.end_time is not None else 0.0
            if job.ended and age >= self.min_job_age_s:
                job.in_controller = False


def _long_options(args: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for arg in args:
        if arg.startswith("--"):
            key, _, value = arg[2:].partition("=")
            out[key] = value
    return out


def _sbatch_options(script: str) -> dict[str, str]:
    """`#SBATCH --key=value` header lines, as Slurm reads them (double quotes around a value dropped)."""
    opts: dict[str, str] = {}
    for line in script.splitlines():
        if not line.startswith("#SBATCH "):
            if line.strip() and not line.startswith("#"):
                break
            continue
        (word,) = shlex.split(line[len("#SBATCH ") :])[:1] or [""]
        if word.startswith("--"):
            key, _, value = word[2:].partition("=")
            opts[key] = value
    return opts


def _squeue_filter(jobs: list[FakeJob], opts: dict[str, str]) -> list[FakeJob]:
    """The jobs `--user` and `--states` let through (without ``--states=all``, only the active ones)."""
    if "user" in opts:
        jobs = [j for j in jobs if j.user == opts["user"]]
    states = opts.get("states")
    if states in ("PENDING", "PD"):
        jobs = [j for j in jobs if j.state == "PENDING"]
    elif states != "all":
        jobs = [j for j in jobs if j.state in ACTIVE]
    return jobs


# squeue's format codes (`%A` ...) the fake knows, and what each prints of a job.
_SQUEUE_FIELDS: dict[str, Callable[[FakeJob], str]] = {
    "A": lambda job: job.job_id,
    "T": lambda job: job.state,
    "r": lambda job: job.reason,
    "N": lambda job: job.node_list,
    "S": lambda job: _ts(job.start_time, "N/A"),
    "e": lambda job: _ts(job.end_time, "NONE" if job.state == "RUNNING" else "N/A"),
    "k": lambda job: job.comment or "(null)",
    "j": lambda job: job.name,
    "u": lambda job: job.user,
    "i": lambda job: job.job_id,
    "P": lambda job: job.partition,
    # priority/basic, as `schedule` orders jobs: each job one below the one submitted before it, less its nice.
    "Q": lambda job: str(4_294_901_758 - int(job.job_id) - job.nice),
}


def _squeue_field(job: FakeJob, code: str) -> str:
    field = _SQUEUE_FIELDS.get(code)
    if field is None:
        raise ValueError(f"the fake squeue does not know %{code}")
    return field(job)


def _squeue_line(job: FakeJob, fmt: str) -> str:
    out, i = [], 0
    while i < len(fmt):
        if fmt[i] == "%" and i + 1 < len(fmt):
            out.append(_squeue_field(job, fmt[i + 1]))
            i += 2
        else:
            out.append(fmt[i])
            i += 1
    return "".join(out)
