"""Runs the Slurm commands: argv lists only (never a shell), timeouts, retries on transient controller errors.

`SlurmCli` is the only place a Slurm binary is executed. Tests inject a `Runner` to fake or count calls
(`slurm_backend.fake.FakeCluster` is a scripted cluster at that boundary).

Slurm says "wait" more often than "no". What a failed command means:
- the controller did not answer (down, restarting, overloaded): `SlurmUnavailableError`, wait and ask again;
- `sbatch` refused for a *submit-count* limit (MaxSubmitJobs, GrpSubmitJobs, a QOS's MaxSubmitJobsPerUser):
  `SubmitLimitError`, submit again when some of the user's jobs have ended;
- `sbatch` refused for what the job asks (a partition, account or QOS that does not exist, a per-job limit
  with DenyOnLimit): `SubmitRefusedError`, retrying cannot help;
- anything else: `SlurmError`.
"""

from __future__ import annotations

import collections
import getpass
import logging
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from det_errors import ClientError, ConfigError, SlurmError
from slurm_backend import cadence, parse, pending
from slurm_backend.spec import NICE_MAX
from slurm_backend.states import JobStatus

log = logging.getLogger(__name__)

# Errors where the controller was unreachable or busy: the same command may well succeed a moment later.
TRANSIENT_ERRORS = (
    "Socket timed out",
    "Unable to contact slurm controller",
    "Slurm temporarily unable to accept job",
    "Resource temporarily unavailable",
    "Connection refused",
    "Zero Bytes were transmitted or received",
)
# sbatch may have created the job before one of these: never blindly resubmit after them.
AMBIGUOUS_SUBMIT_ERRORS = ("Socket timed out", "Zero Bytes were transmitted or received")
# squeue --jobs=ID for a single id Slurm no longer knows exits 1 with this (several unknown ids: exit 0, empty).
UNKNOWN_JOB = "Invalid job id specified"
# sacct on a cluster without slurmdbd.
ACCOUNTING_DISABLED = "accounting storage is disabled"
# sbatch refusals caused by what the user asked for (partition, account, QOS, GPUs, constraints, limits):
# retrying cannot help, and the user must see Slurm's words.
SUBMIT_REFUSALS = (
    "Invalid partition name specified",
    "Invalid account",
    "Invalid qos specification",
    "Requested node configuration is not available",
    "Invalid feature specification",
    "Invalid generic resource (gres) specification",
    "Requested time limit is invalid",
    "More processors requested than permitted",
    "Node count specification invalid",
    "Requested partition configuration not available now",
    "Access/permission denied",
    "Invalid node name specified",
    "Invalid account or account/partition combination specified",  # no association (limits enforced)
)
# ESLURM_ACCOUNTING_POLICY, for submit-count limits and for per-job limits with DenyOnLimit alike. Slurm
# 22.05's sbatch names the limit on the line before (tests/unit/captured/sbatch_refusals.txt):
#   sbatch: error: AssocMaxSubmitJobLimit
#   sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, ...)
ACCOUNTING_POLICY = "Job violates accounting/QOS policy"
# The named limits that free up as the user's (or account's) jobs end: AssocMaxSubmitJobLimit,
# AssocGrpSubmitJobsLimit, QOSMaxSubmitJobPerUserLimit, QOSMaxSubmitJobPerAccountLimit, QOSGrpSubmitJobsLimit.
SUBMIT_LIMIT_REASON = re.compile(r"^(Assoc|QOS)\w*Submit\w*Limit$")
_LIMIT_NAME = re.compile(r"^sbatch: error: ((?:Assoc|QOS)\w+)\s*$", re.MULTILINE)
# Environment passed to Slurm commands: the master's own environment (database URL, tokens) must not leak into
# users' jobs, which inherit sbatch's environment.
SAFE_ENV_KEYS = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "TZ",
    "SLURM_CONF",
)  # runuser resets HOME/USER
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


class SubmitRefusedError(ClientError):
    """Slurm refused the job for what it asks (unknown partition, too many GPUs, ...): fail the trial, do not retry."""

    default_code = "slurm_refused"

    def __init__(self, message: str, *, stderr: str) -> None:
        super().__init__(message, field="slurm")
        self.stderr = stderr


class SlurmUnavailableError(SlurmError):
    """The controller did not answer (down, restarting, or too busy), even after retries: ask again later.

    `ambiguous`: a submission may have reached the controller before the answer was lost, so the job may
    exist; find it by its comment before submitting again.
    """

    def __init__(
        self, message: str, *, command: list[str] | None = None, stderr: str = "", ambiguous: bool = False
    ) -> None:
        super().__init__(message, command=command, stderr=stderr)
        self.ambiguous = ambiguous


class SubmitLimitError(SlurmError):
    """sbatch refused the job for a submit-count limit (`reason`, e.g. AssocMaxSubmitJobLimit): the same job
    is accepted once some of the user's jobs have ended. Wait; never fail the trial for it."""

    def __init__(self, message: str, *, reason: str, stderr: str, command: list[str] | None = None) -> None:
        super().__init__(message, command=command, stderr=stderr)
        self.reason = reason


def classify_policy_refusal(stderr: str) -> str | None:
    """The limit behind an "accounting/QOS policy" refusal when it is a submit-count limit (or unnamed, as
    older Slurm prints it), else None: a named per-job limit (QOSMaxWallDurationPerJobLimit, ...) never
    frees up by waiting."""
    named = _LIMIT_NAME.findall(stderr)
    if not named:
        return "AccountingPolicy"
    return next((n for n in named if SUBMIT_LIMIT_REASON.match(n)), None)


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str], str | None, float, dict[str, str]], CommandResult]
UserRunner = Callable[[str, Sequence[str], str | None, float], CommandResult]
"""Runs a command as another account (the master's per-user helper): (user, argv, stdin, timeout)."""


def subprocess_runner(
    argv: Sequence[str], stdin: str | None, timeout_s: float, env: dict[str, str]
) -> CommandResult:
    proc = subprocess.run(
        list(argv),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        cwd="/",
        check=False,
    )
    return CommandResult(proc.returncode, proc.stdout, proc.stderr)


# What `squeue -v` adds to its stdout (squeue/opts.c, squeue.c; the same from 22.05 to 25.x): its options between
# two rules of dashes before it asks, then "last_update_time=N records=N" (tests/unit/captured/squeue_verbose.txt).
_VERBOSE_STDOUT = re.compile(
    r"^-{20,}\n.*?^-{20,}\n|^last_update_time=\d+ records=\d+\n", re.MULTILINE | re.DOTALL
)


def without_verbose(stdout: str) -> str:
    """`squeue -v`'s stdout without what `-v` added: its answer alone."""
    return _VERBOSE_STDOUT.sub("", stdout)


def is_transient(stderr: str) -> bool:
    return any(marker in stderr for marker in TRANSIENT_ERRORS)


def _failure(argv: list[str], last: str) -> SlurmError:
    """The error for `argv` that failed with `last`: SlurmUnavailableError when Slurm did not answer."""
    message = f"{' '.join(argv[:2])} failed: {last}"
    if is_transient(last):
        return SlurmUnavailableError(
            message,
            command=argv,
            stderr=last,
            ambiguous=any(m in last for m in AMBIGUOUS_SUBMIT_ERRORS),
        )
    return SlurmError(message, command=argv, stderr=last)


_CALLS: collections.Counter[str] = collections.Counter()
_CALLS_LOCK = threading.Lock()


def count_call(argv: Sequence[str]) -> None:
    """One more run of a Slurm command (one RPC to slurmctld or slurmdbd, or a few: ``sbatch``), by name."""
    args = list(argv)
    if "--" in args and args[0] in ("runuser", "sudo"):
        args = args[args.index("--") + 1 :]
    name = os.path.basename(args[0]) if args else "?"
    with _CALLS_LOCK:
        _CALLS[name] += 1


def calls_by_command() -> dict[str, int]:
    """How many times each Slurm command ran in this process (tries included): the master's ``/metrics``."""
    with _CALLS_LOCK:
        return dict(_CALLS)


class SlurmCli:
    """sbatch/squeue/sacct/scontrol/scancel with retries. Stateless apart from its settings: thread-safe."""

    def __init__(
        self,
        *,
        runner: Runner = subprocess_runner,
        user_runner: UserRunner | None = None,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.runner = runner
        self.user_runner = user_runner
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.sleep = sleep
        self._local = threading.local()

    @contextmanager
    def retries_at_most(self, retries: int) -> Iterator[None]:
        """In this thread, retry transient failures at most `retries` times: for callers with a backoff of
        their own (the poller, the job driver). A Slurm command already retries internally while the
        controller does not answer (squeue for 18 s, sbatch for 9 s), so three more tries kept the
        lifecycle loop away from its other work for over a minute per command."""
        local = self.__dict__.setdefault("_local", threading.local())
        previous = getattr(local, "cap", None)
        local.cap = retries if previous is None else min(previous, retries)
        try:
            yield
        finally:
            local.cap = previous

    # -- plumbing --------------------------------------------------------------------------------------------

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: str | None = None,
        ok_stderr: Iterable[str] = (),
        retry: bool = True,
        as_user: str | None = None,
    ) -> CommandResult:
        """Run `argv` (as `as_user`: see `_as_user`); retry transient failures with exponential backoff;
        SlurmError with stderr otherwise.

        A non-zero exit whose stderr contains one of `ok_stderr` is returned, not raised.
        """
        env = _command_env()
        argv, user = self._argv_as(list(argv), as_user)
        attempts = 1 + (self._retries() if retry else 0)
        last = ""
        for attempt in range(attempts):
            result = self._run_once(argv, stdin, env, user)
            if result.returncode == 0 or any(s in result.stderr for s in ok_stderr):
                return result
            last = result.stderr.strip() or without_verbose(result.stdout).strip()
            if not is_transient(last) or attempt == attempts - 1:
                break
            delay = self.backoff_s * 2**attempt
            log.warning("%s failed transiently (%s); retrying in %.1f s", argv[0], last, delay)
            self.sleep(delay)
        raise _failure(argv, last)

    def _argv_as(self, argv: list[str], as_user: str | None) -> tuple[list[str], str | None]:
        """`argv` to run and the account `user_runner` runs it as (None: run it directly). Without the helper,
        another account's command goes through ``runuser``."""
        user = self._as_user(as_user)
        if user is not None and self.user_runner is None:
            return ["runuser", "-u", user, "--", *argv], None
        return argv, user

    def _retries(self) -> int:
        """`retries`, capped in this thread by `retries_at_most`."""
        cap = getattr(self.__dict__.get("_local"), "cap", None)
        return self.retries if cap is None else min(self.retries, cap)

    def _run_once(
        self, argv: list[str], stdin: str | None, env: dict[str, str], user: str | None
    ) -> CommandResult:
        """One try of `argv` (through `user_runner` when `user` is set); a timeout is a transient failure."""
        count_call(argv)
        try:
            if user is not None and self.user_runner is not None:
                return self.user_runner(user, argv, stdin, self.timeout_s)
            return self.runner(argv, stdin, self.timeout_s, env)
        except subprocess.TimeoutExpired:
            return CommandResult(124, "", f"Socket timed out: {argv[0]} ran longer than {self.timeout_s} s")
        except FileNotFoundError as e:
            raise SlurmError(f"{argv[0]} not found: is Slurm installed?", command=argv) from e

    def _as_user(self, as_user: str | None) -> str | None:
        """The account to run a command as: None for the master's own. Another account's needs the per-user
        helper (`user_runner`) or, without one, a root master (``runuser``)."""
        if as_user is None or as_user == getpass.getuser():
            return None
        if self.user_runner is None and os.geteuid() != 0:
            raise ConfigError(
                f"the master runs as {getpass.getuser()!r} and cannot submit jobs as {as_user!r}; "
                "run it as root or let each user run a personal master",
                field="user",
            )
        return as_user

    # -- commands --------------------------------------------------------------------------------------------

    def submit(self, script_text: str, *, as_user: str | None = None) -> str:
        """Submit a job script (on stdin) and return its job id.

        `as_user`: the Unix account the job runs as. When it is not the master's own account the master must be
        root (``runuser -u USER -- sbatch``) or have the per-user helper (`user_runner`). A submission that failed ambiguously (the controller
        may have accepted it) is not retried blindly: the caller reconciles by comment (see `find_by_comment`).

        Raises `SlurmUnavailableError` (ask again later), `SubmitLimitError` (submit again as jobs end),
        `SubmitRefusedError` (never) or `SlurmError`.
        """
        argv = ["sbatch", "--parsable"]
        try:
            result = self.run(argv, stdin=script_text, retry=False, as_user=as_user)
        except SlurmUnavailableError as e:
            if e.ambiguous:
                raise
            result = self.run(
                argv, stdin=script_text, as_user=as_user
            )  # never reached the controller: safe to retry
        except SlurmError as e:
            if ACCOUNTING_POLICY in e.stderr:
                limit = classify_policy_refusal(e.stderr)
                if limit is not None:
                    raise SubmitLimitError(
                        f"Slurm holds off more jobs for now ({limit}): {_last_error_line(e.stderr)}",
                        reason=limit,
                        stderr=e.stderr,
                        command=argv,
                    ) from e
                named = ", ".join(_LIMIT_NAME.findall(e.stderr))
                raise SubmitRefusedError(
                    f"Slurm refused the job ({named}): {_last_error_line(e.stderr)}", stderr=e.stderr
                ) from e
            if any(m in e.stderr for m in SUBMIT_REFUSALS):
                raise SubmitRefusedError(
                    f"Slurm refused the job: {_last_error_line(e.stderr)}", stderr=e.stderr
                ) from e
            raise
        return parse.parse_sbatch_parsable(result.stdout)

    def cancel(self, job_id: str, *, signal: str | None = None, as_user: str | None = None) -> None:
        """scancel the job (SIGKILL after Slurm's KillWait), or only send `signal` to all its processes; as its
        owner `as_user` when given."""
        argv = ["scancel", *([f"--signal={signal}", "--full"] if signal else []), _job_id(job_id)]
        self.run(argv, as_user=as_user)

    def set_nice(self, job_id: str, nice: int, *, as_user: str | None = None) -> None:
        """``scontrol update JobId=ID Nice=N``: re-order a pending job (N ≥ 0 needs no operator; its owner or
        root may set it)."""
        if not 0 <= nice <= NICE_MAX:
            raise ValueError(f"nice must be 0 to {NICE_MAX}, not {nice}")
        self.run(["scontrol", "update", f"JobId={_job_id(job_id)}", f"Nice={nice}"], as_user=as_user)

    def signal(self, job_id: str, sig: str, *, batch_only: bool = True) -> None:
        """Send `sig` (e.g. "USR1") to the batch shell only (`--batch`) or to every process (`--full`)."""
        self.run(["scancel", f"--signal={sig}", "--batch" if batch_only else "--full", _job_id(job_id)])

    def pending_queue(self) -> list[pending.Queued]:
        """Every user's pending jobs (one ``squeue``): what is ahead of ours. Under ``PrivateData=jobs`` an
        account other than root, SlurmUser or an operator sees only its own, and the figure is too low."""
        argv = ["squeue", "--noheader", "--states=PENDING", f"--format={pending.QUEUE_FORMAT}"]
        return pending.parse_queue(self.run(argv).stdout)

    def squeue(self, job_ids: Iterable[str]) -> dict[str, JobStatus]:
        """One `squeue` call for all `job_ids` (any state Slurm still remembers, MinJobAge after the end)."""
        return self.poll_squeue(job_ids)[0]

    def poll_squeue(self, job_ids: Iterable[str]) -> tuple[dict[str, JobStatus], int]:
        """`squeue` for the poller: its answer, and how many times slurmctld told it to back off on the way
        (its RPC rate limit; `cadence.backoffs`), which only ``-v`` prints."""
        ids = sorted({_job_id(j) for j in job_ids}, key=int)
        if not ids:
            return {}, 0
        argv = [
            "squeue",
            "-v",
            "--noheader",
            "--states=all",
            f"--jobs={','.join(ids)}",
            f"--format={parse.SQUEUE_FORMAT}",
        ]
        result = self.run(argv, ok_stderr=[UNKNOWN_JOB])
        told = cadence.backoffs(result.stderr)
        if result.returncode != 0:
            return {}, told
        answer = parse.parse_squeue(without_verbose(result.stdout))
        return {k: v for k, v in answer.items() if k in ids}, told

    def sacct(self, job_ids: Iterable[str]) -> dict[str, JobStatus] | None:
        """One `sacct` call for all `job_ids`; None when the cluster keeps no accounting (no slurmdbd)."""
        ids = sorted({_job_id(j) for j in job_ids}, key=int)
        if not ids:
            return {}
        argv = [
            "sacct",
            "--parsable2",
            "--noheader",
            f"--jobs={','.join(ids)}",
            f"--format={','.join(parse.SACCT_FIELDS)}",
        ]
        result = self.run(argv, ok_stderr=[ACCOUNTING_DISABLED])
        if result.returncode != 0 or ACCOUNTING_DISABLED in result.stderr + result.stdout:
            return None
        return {k: v for k, v in parse.parse_sacct(result.stdout).items() if k in ids}

    def show_job(self, job_id: str) -> JobStatus | None:
        """`scontrol -o show job ID`, or None when slurmctld no longer knows the job."""
        result = self.run(["scontrol", "-o", "show", "job", _job_id(job_id)], ok_stderr=[UNKNOWN_JOB])
        if result.returncode != 0:
            return None
        return parse.parse_scontrol_job(result.stdout)

    def find_by_comment(self, comment: str, *, user: str | None = None) -> list[str]:
        """Ids of jobs Slurm still knows whose comment is exactly `comment` (reconciling a lost submit)."""
        return self.jobs_by_comment(user=user).get(comment, [])

    def jobs_by_comment(self, *, user: str | None = None) -> dict[str, list[str]]:
        """Comment → ids of the jobs Slurm still knows (of `user`), in one squeue call."""
        argv = ["squeue", "--noheader", "--states=all", "--format=%A|%k"]
        if user:
            argv.append(f"--user={user}")
        out = self.run(argv).stdout
        found: dict[str, list[str]] = {}
        for line in out.splitlines():
            job_id, _, job_comment = line.partition("|")
            found.setdefault(job_comment, []).append(job_id.strip())
        return found


def _last_error_line(stderr: str) -> str:
    """`sbatch: error: Batch job submission failed: Invalid partition name specified` → the part after it."""
    line = [x for x in stderr.strip().splitlines() if x.strip()][-1]
    return line.split("Batch job submission failed: ", 1)[-1].removeprefix("sbatch: error: ")


def _job_id(job_id: str) -> str:
    job_id = str(job_id).strip()
    if not job_id.isdigit():
        raise SlurmError(f"not a Slurm job id: {job_id!r}")
    return job_id


def _command_env() -> dict[str, str]:
    env = {k: os.environ[k] for k in SAFE_ENV_KEYS if k in os.environ}
    env.setdefault("PATH", DEFAULT_PATH)
    return env
