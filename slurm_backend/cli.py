"""Runs the Slurm commands: argv lists only (never a shell), timeouts, retries on transient controller errors.

`SlurmCli` is the only place a Slurm binary is executed. Tests inject a `Runner` to fake or count calls.
"""

from __future__ import annotations

import getpass
import logging
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from hpc_master.errors import ClientError, ConfigError, SlurmError
from slurm_backend import parse
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
    "Job violates accounting/QOS policy",
    "More processors requested than permitted",
    "Node count specification invalid",
    "Requested partition configuration not available now",
    "Access/permission denied",
)
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


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str], str | None, float, dict[str, str]], CommandResult]


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


def is_transient(stderr: str) -> bool:
    return any(marker in stderr for marker in TRANSIENT_ERRORS)


class SlurmCli:
    """sbatch/squeue/sacct/scontrol/scancel with retries. Stateless apart from its settings: thread-safe."""

    def __init__(
        self,
        *,
        runner: Runner = subprocess_runner,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.runner = runner
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.sleep = sleep

    # -- plumbing --------------------------------------------------------------------------------------------

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: str | None = None,
        ok_stderr: Iterable[str] = (),
        retry: bool = True,
    ) -> CommandResult:
        """Run `argv`; retry transient failures with exponential backoff; SlurmError with stderr otherwise.

        A non-zero exit whose stderr contains one of `ok_stderr` is returned, not raised.
        """
        argv = list(argv)
        env = _command_env()
        attempts = 1 + (self.retries if retry else 0)
        last = ""
        for attempt in range(attempts):
            try:
                result = self.runner(argv, stdin, self.timeout_s, env)
            except subprocess.TimeoutExpired:
                result = CommandResult(
                    124, "", f"Socket timed out: {argv[0]} ran longer than {self.timeout_s} s"
                )
            except FileNotFoundError as e:
                raise SlurmError(f"{argv[0]} not found: is Slurm installed?", command=argv) from e
            if result.returncode == 0 or any(s in result.stderr for s in ok_stderr):
                return result
            last = result.stderr.strip() or result.stdout.strip()
            if not is_transient(last) or attempt == attempts - 1:
                break
            delay = self.backoff_s * 2**attempt
            log.warning("%s failed transiently (%s); retrying in %.1f s", argv[0], last, delay)
            self.sleep(delay)
        raise SlurmError(f"{' '.join(argv[:2])} failed: {last}", command=argv, stderr=last)

    # -- commands --------------------------------------------------------------------------------------------

    def submit(self, script_text: str, *, as_user: str | None = None) -> str:
        """Submit a job script (on stdin) and return its job id.

        `as_user`: the Unix account the job runs as. When it is not the master's own account the master must be
        root and submits with `runuser -u USER -- sbatch`. A submission that failed ambiguously (the controller
        may have accepted it) is not retried blindly: the caller reconciles by comment (see `find_by_comment`).
        """
        argv = [*_as_user_prefix(as_user), "sbatch", "--parsable"]
        try:
            result = self.run(argv, stdin=script_text, retry=False)
        except SlurmError as e:
            if is_transient(e.stderr) and not any(m in e.stderr for m in AMBIGUOUS_SUBMIT_ERRORS):
                result = self.run(argv, stdin=script_text)  # never reached the controller: safe to retry
            elif any(m in e.stderr for m in SUBMIT_REFUSALS):
                raise SubmitRefusedError(
                    f"Slurm refused the job: {_last_error_line(e.stderr)}", stderr=e.stderr
                ) from e
            else:
                raise
        return parse.parse_sbatch_parsable(result.stdout)

    def cancel(self, job_id: str, *, signal: str | None = None) -> None:
        """scancel the job (SIGKILL after Slurm's KillWait), or only send `signal` to all its processes."""
        argv = ["scancel", *([f"--signal={signal}", "--full"] if signal else []), _job_id(job_id)]
        self.run(argv)

    def signal(self, job_id: str, sig: str, *, batch_only: bool = True) -> None:
        """Send `sig` (e.g. "USR1") to the batch shell only (`--batch`) or to every process (`--full`)."""
        self.run(["scancel", f"--signal={sig}", "--batch" if batch_only else "--full", _job_id(job_id)])

    def squeue(self, job_ids: Iterable[str]) -> dict[str, JobStatus]:
        """One `squeue` call for all `job_ids` (any state Slurm still remembers, MinJobAge after the end)."""
        ids = sorted({_job_id(j) for j in job_ids}, key=int)
        if not ids:
            return {}
        argv = [
            "squeue",
            "--noheader",
            "--states=all",
            f"--jobs={','.join(ids)}",
            f"--format={parse.SQUEUE_FORMAT}",
        ]
        result = self.run(argv, ok_stderr=[UNKNOWN_JOB])
        if result.returncode != 0:
            return {}
        return {k: v for k, v in parse.parse_squeue(result.stdout).items() if k in ids}

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
        argv = ["squeue", "--noheader", "--states=all", "--format=%A|%k"]
        if user:
            argv.append(f"--user={user}")
        out = self.run(argv).stdout
        ids = []
        for line in out.splitlines():
            job_id, _, job_comment = line.partition("|")
            if job_comment == comment:
                ids.append(job_id.strip())
        return ids


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


def _as_user_prefix(as_user: str | None) -> list[str]:
    if as_user is None or as_user == getpass.getuser():
        return []
    if os.geteuid() != 0:
        raise ConfigError(
            f"the master runs as {getpass.getuser()!r} and cannot submit jobs as {as_user!r}; "
            "run it as root or let each user run a personal master",
            field="user",
        )
    return ["runuser", "-u", as_user, "--"]
