"""Validation of users' `slurm.sbatch_args`: options the master owns are refused, by name.

Tokens follow sbatch's getopt rules: `--opt=value`, `--opt value`, `-Xvalue`, `-X value`, and unambiguous
abbreviations of long options (`--part=x` is `--partition`), so abbreviations are resolved before checking.
The result is a tuple of normalised `--opt=value` / `--flag` strings, each rendered on its own `#SBATCH` line
(never through a shell).

This is the one sbatch-options policy: the experiment config calls `validate_sbatch_args` when it is parsed (so
`det preview` and create refuse what submission would), and `JobSpec` calls it again for every job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from det_errors import ClientError

FIELD = "slurm.sbatch_args"
Arg = Literal["yes", "no", "optional"]

# sbatch 22.05 long options (`sbatch --help`, sbatch(1)) → whether they take an argument.
LONG_OPTIONS: dict[str, Arg] = {
    **dict.fromkeys(
        [
            "account",
            "acctg-freq",
            "array",
            "batch",
            "bb",
            "bbf",
            "begin",
            "chdir",
            "cluster-constraint",
            "clusters",
            "comment",
            "constraint",
            "core-spec",
            "cores-per-socket",
            "cpu-freq",
            "cpus-per-gpu",
            "cpus-per-task",
            "deadline",
            "delay-boot",
            "dependency",
            "distribution",
            "error",
            "export-file",
            "extra-node-info",
            "gid",
            "gpu-bind",
            "gpu-freq",
            "gpus",
            "gpus-per-node",
            "gpus-per-socket",
            "gpus-per-task",
            "gres",
            "gres-flags",
            "hint",
            "input",
            "job-name",
            "kill-on-invalid-dep",
            "licenses",
            "mail-type",
            "mail-user",
            "mcs-label",
            "mem",
            "mem-bind",
            "mem-per-cpu",
            "mem-per-gpu",
            "mincpus",
            "network",
            "nodefile",
            "nodelist",
            "nodes",
            "ntasks",
            "ntasks-per-core",
            "ntasks-per-gpu",
            "ntasks-per-node",
            "ntasks-per-socket",
            "open-mode",
            "output",
            "partition",
            "power",
            "priority",
            "profile",
            "qos",
            "reservation",
            "signal",
            "sockets-per-node",
            "switches",
            "thread-spec",
            "threads-per-core",
            "time",
            "time-min",
            "tmp",
            "tres-per-task",
            "uid",
            "wckey",
            "exclude",
            "container",
        ],
        "yes",
    ),
    **dict.fromkeys(
        [
            "contiguous",
            "hold",
            "ignore-pbs",
            "no-requeue",
            "overcommit",
            "oversubscribe",
            "parsable",
            "quiet",
            "reboot",
            "requeue",
            "spread-job",
            "test-only",
            "use-min-nodes",
            "verbose",
            "wait",
            "help",
            "usage",
            "version",
        ],
        "no",
    ),
    **dict.fromkeys(
        ["exclusive", "export", "get-user-env", "nice", "no-kill", "propagate", "wrap"], "optional"
    ),
}
SHORT_OPTIONS: dict[str, str] = {
    "a": "array", "A": "account", "b": "begin", "B": "extra-node-info", "c": "cpus-per-task", "C": "constraint",
    "d": "dependency", "D": "chdir", "e": "error", "F": "nodefile", "G": "gpus", "H": "hold", "i": "input",
    "J": "job-name", "k": "no-kill", "L": "licenses", "m": "distribution", "M": "clusters", "n": "ntasks",
    "N": "nodes", "o": "output", "O": "overcommit", "p": "partition", "q": "qos", "Q": "quiet",
    "s": "oversubscribe", "S": "core-spec", "t": "time", "v": "verbose", "V": "version", "w": "nodelist",
    "W": "wait", "x": "exclude", "h": "help",
}  # fmt: skip

_DEDICATED = "set by hpc-det"
# Options the master owns → why (shown to the user).
REFUSED: dict[str, str] = {
    **dict.fromkeys(
        ["requeue", "no-requeue"], f"{_DEDICATED}: jobs never requeue; the master resubmits trials"
    ),
    "array": f"{_DEDICATED}: each trial is one job",
    "wrap": f"{_DEDICATED}: the master writes the job script",
    "parsable": f"{_DEDICATED}: the master reads sbatch's output",
    **dict.fromkeys(
        ["output", "error", "input", "open-mode"], f"{_DEDICATED}: trial logs are collected by the master"
    ),
    **dict.fromkeys(["job-name", "comment"], f"{_DEDICATED}: they identify the experiment and trial"),
    "signal": f"{_DEDICATED}: the preemption signal comes from the master config",
    **dict.fromkeys(
        [
            "nodes",
            "ntasks",
            "ntasks-per-node",
            "gres",
            "gpus",
            "gpus-per-node",
            "gpus-per-task",
            "gpus-per-socket",
        ],
        f"{_DEDICATED} from resources.slots_per_trial and slurm.gpu_type",
    ),
    **dict.fromkeys(["uid", "gid"], f"{_DEDICATED}: jobs run as the user's own account"),
    "chdir": f"{_DEDICATED}: jobs run in the trial's directory",
    **dict.fromkeys(
        ["export", "export-file", "get-user-env"], f"{_DEDICATED}: use environment_variables instead"
    ),
    "partition": f"{_DEDICATED}: use slurm.partition instead",
    "account": f"{_DEDICATED}: use slurm.account instead",
    "qos": f"{_DEDICATED}: use slurm.qos instead",
    "time": f"{_DEDICATED}: use slurm.time_limit instead",
    "clusters": f"{_DEDICATED}: the master watches jobs on its own cluster",
    **dict.fromkeys(["wait", "test-only", "hold"], f"{_DEDICATED}: the master needs a job it can watch"),
    **dict.fromkeys(["help", "usage", "version"], "not a job option"),
}


class SbatchArgError(ClientError):
    """A refused argument; `index` is its position in the list (the experiment config names
    `slurm.sbatch_args[index]`)."""

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message, field=FIELD)
        self.index = index


def _resolve(name: str, token: str, index: int) -> str:
    """getopt_long's rule: an exact name, else the one long option `name` abbreviates."""
    if name in LONG_OPTIONS:
        return name
    matches = [opt for opt in LONG_OPTIONS if opt.startswith(name)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise SbatchArgError(
            f"{token!r} is ambiguous: it could be {', '.join('--' + m for m in sorted(matches))}", index
        )
    raise SbatchArgError(f"{token!r} is not an sbatch option", index)


def _check_value(option: str, value: str, index: int) -> None:
    if any(c in value for c in "\n\r\0"):
        raise SbatchArgError(f"the value of --{option} may not contain a line break", index)
    if any(c in value for c in HEADER_FORBIDDEN):  # render.sbatch_line could not write it
        raise SbatchArgError(
            f"the value of --{option} may not contain a double quote or a backslash (an #SBATCH line cannot "
            "carry them)",
            index,
        )


def validate_sbatch_args(args: Sequence[str]) -> tuple[str, ...]:
    """Return `args` normalised to `--opt=value`/`--flag`, or raise SbatchArgError (a ClientError whose field
    is ``slurm.sbatch_args`` and whose `index` is the refused element's) naming the refused option."""
    if isinstance(args, str):
        raise ClientError("must be a list of arguments, not one string", field=FIELD)
    out: list[str] = []
    i = 0
    while i < len(args):
        at = i
        token = args[i]
        if not isinstance(token, str):
            raise SbatchArgError(f"every argument must be a string, not {token!r}", at)
        i += 1
        option, value = _split_option(token, at)
        _check_option(option, value, at)
        if LONG_OPTIONS[option] == "yes" and value is None:
            if i >= len(args):
                raise SbatchArgError(f"--{option} needs a value", at)
            value = args[i]
            if not isinstance(value, str):
                raise SbatchArgError(f"every argument must be a string, not {value!r}", i)
            i += 1
        out.append(_normalised(option, value, at))
    return tuple(out)


def _split_option(token: str, index: int) -> tuple[str, str | None]:
    """The long option `token` names (abbreviation and short letter resolved) and the value it carries itself
    (`--opt=value`, `-Xvalue`), None without one; a token that is not an option is refused."""
    if token.startswith("--") and len(token) > 2:
        name, eq, value = token[2:].partition("=")
        return _resolve(name, token, index), (value if eq else None)
    if token.startswith("-") and len(token) >= 2 and token[1] != "-":
        option = SHORT_OPTIONS.get(token[1], "")
        if not option:
            raise SbatchArgError(f"{token!r} is not an sbatch option", index)
        return option, token[2:].removeprefix("=") or None
    raise SbatchArgError(
        f"{token!r} is not an option; sbatch_args may hold only options (the master writes the script)",
        index,
    )


def _check_option(option: str, value: str | None, index: int) -> None:
    """Refuse an option the master owns, and a value given to an option that takes none."""
    if option in REFUSED:
        raise SbatchArgError(f"--{option} is {REFUSED[option]}", index)
    if LONG_OPTIONS[option] == "no" and value is not None:
        raise SbatchArgError(f"--{option} takes no value", index)


def _normalised(option: str, value: str | None, index: int) -> str:
    """`--option` or `--option=value`, its value checked."""
    if value is None:
        return f"--{option}"
    _check_value(option, value, index)
    return f"--{option}={value}"


# What a `#SBATCH --opt=value` line cannot carry (render.sbatch_line refuses the same).
HEADER_FORBIDDEN = '\n\r\0"\\'


def check_header_value(value: str) -> str | None:
    """Why `value` (a partition, account or QOS name) cannot be written on an `#SBATCH` line, or None."""
    if any(c in value for c in HEADER_FORBIDDEN):
        return "may not contain a line break, a double quote or a backslash"
    if not value.strip():
        return "must not be empty"
    return None


def option_name(arg: str) -> str:
    """`--mem=4G` → `mem` (for a normalised argument from `validate_sbatch_args`)."""
    return arg[2:].partition("=")[0]
