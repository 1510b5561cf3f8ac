"""Parsers of Slurm's machine-readable output (22.05). Each has a captured real line in tests/unit/captured/.

- `sbatch --parsable`: `123` or `123;cluster`.
- `squeue --noheader --states=all --jobs=... --format=SQUEUE_FORMAT`: `|`-separated; the reason is the only
  free-text field (e.g. `ReqNodeNotAvail, UnavailableNodes:node3`) and never contains `|`. `squeue --json` exists in
  Debian's 22.05 build but ignores `--jobs` (it returns every job, ~3.7 KB each), so we do not use it.
- `sacct --parsable2 --noheader --jobs=... --format=SACCT_FIELDS`: one line per job and per step (`123.batch`,
  `123.extern`, `123.0`); states like `CANCELLED by 1001`.
- `scontrol -o show job ID`: one line of `Key=Value` pairs, values may contain spaces (Command=, JobName=).
"""

from __future__ import annotations

import re
from datetime import datetime

from det_errors import SlurmError
from slurm_backend.states import JobStatus, Outcome, base_state, outcome_for

# %A job id (no array formatting), %T long state, %r reason, %N nodes, %S start, %e end.
SQUEUE_FORMAT = "%A|%T|%r|%N|%S|%e"
SACCT_FIELDS = ("JobIDRaw", "State", "ExitCode", "DerivedExitCode", "Reason", "NodeList", "Start", "End")
_NO_TIME = {"", "N/A", "NONE", "None", "Unknown", "(null)"}
_JOB_ID = re.compile(r"^\d+$")


def parse_sbatch_parsable(stdout: str) -> str:
    """`sbatch --parsable` prints `JOBID` or `JOBID;CLUSTER` (federated/multi-cluster)."""
    lines = [line for line in stdout.strip().splitlines() if line.strip()]
    if not lines:
        raise SlurmError("sbatch printed no job id", stderr=stdout)
    job_id = lines[-1].strip().split(";", 1)[0]
    if not _JOB_ID.match(job_id):
        raise SlurmError(f"sbatch printed {lines[-1]!r}, not a job id", stderr=stdout)
    return job_id


def parse_time(value: str) -> datetime | None:
    value = value.strip()
    if value in _NO_TIME:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def parse_exit_code(value: str) -> tuple[int | None, int | None]:
    """`3:0` → (3, None); `0:15` → (0, 15); empty → (None, None)."""
    value = value.strip()
    if not value:
        return None, None
    code, _, sig = value.partition(":")
    try:
        return int(code), (int(sig) or None) if sig else None
    except ValueError:
        return None, None


def _ended(outcome: Outcome) -> bool:
    return outcome.is_terminal and outcome is not Outcome.UNSCHEDULABLE


def _reason(value: str) -> str | None:
    value = value.strip()
    return None if value in {"", "None", "(null)"} else value


def parse_squeue(stdout: str) -> dict[str, JobStatus]:
    """Lines of `squeue --format=SQUEUE_FORMAT`; blank lines ignored, malformed lines are an error."""
    out: dict[str, JobStatus] = {}
    for line in stdout.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 6:
            raise SlurmError(f"unexpected squeue line {line!r}", stderr=stdout)
        job_id, state, reason, nodes, start, end = (p.strip() for p in parts)
        out[job_id] = JobStatus(
            job_id=job_id,
            outcome=outcome_for(state, reason),
            slurm_state=base_state(state),
            reason=_reason(reason),
            node_list=nodes,
            start_time=parse_time(start),
            end_time=parse_time(end),
            source="squeue",
        )
    return out


def parse_sacct(stdout: str) -> dict[str, JobStatus]:
    """Lines of `sacct --parsable2 --noheader --format=SACCT_FIELDS`, steps folded into their job.

    The job's own line (`123`) gives state, exit code and times. Steps only refine it: a job whose step died
    OUT_OF_MEMORY is reported as OOM even when the job line says FAILED or CANCELLED.
    """
    jobs, step_states = _sacct_rows(stdout)
    return {
        job_id: _sacct_status(job_id, parts, step_states.get(job_id, set())) for job_id, parts in jobs.items()
    }


def _sacct_rows(stdout: str) -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """sacct's lines split into fields: {job id: its own line} and {job id: the base states of its steps}."""
    jobs: dict[str, list[str]] = {}
    step_states: dict[str, set[str]] = {}
    for line in stdout.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != len(SACCT_FIELDS):
            raise SlurmError(f"unexpected sacct line {line!r}", stderr=stdout)
        raw_id = parts[0].strip()
        job_id, dot, _step = raw_id.partition(".")
        if dot:
            step_states.setdefault(job_id, set()).add(base_state(parts[1]))
        else:
            jobs[job_id] = parts  # with --duplicates absent, the latest run of the id
    return jobs, step_states


def _sacct_status(job_id: str, parts: list[str], step_states: set[str]) -> JobStatus:
    """The status of the job whose own sacct line is `parts`, refined by its steps' states."""
    _, state, exit_code, derived, reason, nodes, start, end = parts
    state_word = base_state(state)
    outcome = outcome_for(state, reason)
    if outcome in {Outcome.FAILED, Outcome.CANCELLED} and "OUT_OF_MEMORY" in step_states:
        outcome = Outcome.OOM
    code, sig = parse_exit_code(exit_code)
    derived_code, _ = parse_exit_code(derived)
    if not code and derived_code:
        code = derived_code  # the batch script exited 0 but a step failed
    if not _ended(outcome):
        code = sig = None  # sacct prints 0:0 for jobs that have not ended
    return JobStatus(
        job_id=job_id,
        outcome=outcome,
        slurm_state=state_word,
        reason=_reason(reason),
        exit_code=code,
        exit_signal=sig,
        node_list=nodes.strip() if nodes.strip() != "None assigned" else "",
        start_time=parse_time(start),
        end_time=parse_time(end),
        source="sacct",
    )


_SCONTROL_KEY = re.compile(r"(?:^| )([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_scontrol_fields(line: str) -> dict[str, str]:
    """`scontrol -o show job` → {key: value}. A value runs to the next ` Key=`; values may hold spaces.

    Edge case: a free-text value containing ` word=` (a JobName or Command argument like `lr=0.1`) splits there;
    we read only JobId, JobState, Reason, ExitCode, NodeList, StartTime, EndTime, which never do.
    """
    line = line.rstrip("\n")
    matches = list(_SCONTROL_KEY.finditer(line))
    fields: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields.setdefault(m.group(1), line[m.end() : end].strip())
    return fields


def parse_scontrol_job(stdout: str) -> JobStatus:
    lines = [line for line in stdout.splitlines() if line.strip()]
    if len(lines) != 1:
        raise SlurmError(f"expected one line from `scontrol -o show job`, got {len(lines)}", stderr=stdout)
    f = parse_scontrol_fields(lines[0])
    if "JobId" not in f or "JobState" not in f:
        raise SlurmError(f"unexpected scontrol line {lines[0][:200]!r}", stderr=stdout)
    code, sig = parse_exit_code(f.get("ExitCode", ""))
    reason = _reason(f.get("Reason", "").replace(",_", ", "))
    state = f["JobState"]
    outcome = outcome_for(state, reason)
    return JobStatus(
        job_id=f["JobId"],
        outcome=outcome,
        slurm_state=base_state(state),
        reason=reason,
        exit_code=code if _ended(outcome) else None,
        exit_signal=sig,
        node_list=f.get("NodeList", "").replace("(null)", ""),
        start_time=parse_time(f.get("StartTime", "")),
        end_time=parse_time(f.get("EndTime", "")),
        source="scontrol",
    )
