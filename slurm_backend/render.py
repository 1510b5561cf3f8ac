"""The job script, rendered by a pure function from a JobSpec and golden-tested.

Header: one `#SBATCH --opt=value` per line. Slurm parses these lines itself (no shell): whitespace ends a value
unless it is inside double quotes, and an unquoted `#` starts a comment, so values with such characters are
double-quoted, and values with a line break, a double quote or a backslash are refused.
Body: every value is shell-quoted with `shlex.quote`; the last command is `exec`ed so that it is the batch shell's
process and receives `--signal=B:...` directly.
"""

from __future__ import annotations

import re
import shlex

from det_errors import ClientError
from slurm_backend.sbatch_args import option_name
from slurm_backend.spec import JobSpec

_PLAIN = re.compile(r"^[A-Za-z0-9_.,:=/@%+\-\[\]]*$")


def sbatch_line(option: str, value: str | int | None = None) -> str:
    if value is None:
        return f"#SBATCH --{option}"
    text = str(value)
    if any(c in text for c in '\n\r\0"\\'):
        raise ClientError(
            f"the value of --{option} may not contain a line break, a double quote or a backslash: {text!r}",
            field=option,
        )
    if not _PLAIN.match(text):
        text = f'"{text}"'
    return f"#SBATCH --{option}={text}"


def _gpu_option(spec: JobSpec) -> tuple[str, str] | None:
    if spec.gpus_per_node == 0 or spec.gpu_request_style == "none":
        return None
    if spec.gpu_request_style == "gres":
        typed = f"{spec.gpu_type}:" if spec.gpu_type else ""
        return "gres", f"gpu:{typed}{spec.gpus_per_node}"
    typed = f"{spec.gpu_type}:" if spec.gpu_type else ""
    return "gpus-per-node", f"{typed}{spec.gpus_per_node}"


def master_options(spec: JobSpec) -> list[tuple[str, str | int | None]]:
    """The options the master sets, in header order."""
    opts: list[tuple[str, str | int | None]] = [
        ("job-name", spec.job_name),
        ("comment", spec.comment),
        ("output", spec.output_path),
        ("chdir", spec.workdir),
    ]
    for option, value in (("partition", spec.partition), ("account", spec.account), ("qos", spec.qos)):
        if value:
            opts.append((option, value))
    if spec.time_limit_min is not None:
        opts.append(("time", spec.time_limit_min))
    opts += [("nodes", spec.nodes), ("ntasks-per-node", spec.ntasks_per_node)]
    if spec.cpus_per_task is not None:
        opts.append(("cpus-per-task", spec.cpus_per_task))
    gpu = _gpu_option(spec)
    if gpu:
        opts.append(gpu)
    if spec.mem_per_node_mb is not None:
        opts.append(("mem", spec.mem_per_node_mb))
    if spec.nice is not None:
        opts.append(("nice", spec.nice))
    if spec.preempt_lead_s is not None:
        opts.append(("signal", f"B:{spec.preempt_signal.removeprefix('SIG')}@{spec.preempt_lead_s}"))
    opts.append(("no-requeue", None))
    return opts


def render_sbatch_script(spec: JobSpec) -> str:
    opts = master_options(spec)
    owned = {name for name, _ in opts}
    header = ["#!/bin/bash", *(sbatch_line(name, value) for name, value in opts)]
    for arg in spec.extra_sbatch_args:
        name, eq, value = arg[2:].partition("=")
        if option_name(arg) in owned:
            raise ClientError(f"--{name} is already set by hpc-det for this job", field="slurm.sbatch_args")
        header.append(sbatch_line(name, value if eq else None))
    body = ["", "set -eu"]
    body += [f"export {key}={shlex.quote(value)}" for key, value in spec.env]
    for i, command in enumerate(spec.commands):
        line = shlex.join(command)
        body.append(f"exec {line}" if spec.exec_last and i == len(spec.commands) - 1 else line)
    return "\n".join(header + body) + "\n"
