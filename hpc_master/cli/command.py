"""`det command` (alias `cmd`): run a command as a Slurm job; and `det task`: every task of yours.

    det cmd run [-c DIR] [--config-file F] [--config K=V]... [-d] CMD [ARG...]

streams the command's output and exits with its exit code (Determined's `det cmd run` streams only); `-d`
prints the task id and returns at once. One word is a shell command line (`det cmd run 'nvidia-smi; hostname'`),
several run as they are. `--context` (`-c`) uploads a directory (honouring `.detignore`) that the command runs in.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hpc_master.cli._client import Session, session_from_args
from hpc_master.cli._context import check_size, plan_context, read_context, warn_skipped
from hpc_master.cli._follow import log_entries
from hpc_master.cli._output import add_format_flags, emit, key_values, print_json, state
from hpc_master.errors import ClientError, ConfigError, ServerError

KILLED_EXIT = 137  # what a shell reports for a command killed by SIGKILL: the task was killed
LOST_EXIT = 1  # the task ended with no exit code of its command (refused, never started)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    cmd = sub.add_parser("command", aliases=["cmd"], help="run commands as Slurm jobs")
    cmd_sub = cmd.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = cmd_sub.add_parser("run", help="run a command as a Slurm job, stream its output, exit with its code")
    p.add_argument(
        "entrypoint", nargs=argparse.REMAINDER, metavar="CMD", help="the command and its arguments"
    )
    add_launch_flags(p)
    p.set_defaults(func=_run, plural="commands", key="command")

    add_common(cmd_sub, "commands", "command")

    task = sub.add_parser("task", help="every task of yours: commands, notebooks, shells, TensorBoards")
    task_sub = task.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = task_sub.add_parser("list", aliases=["ls"], help="tasks that have not ended")
    add_format_flags(p)
    p.set_defaults(func=_task_list)
    p = task_sub.add_parser("logs", help="print a task's output")
    p.add_argument("task_id", metavar="ID")
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming until the task ends")
    p.set_defaults(func=_logs)


def add_common(sub: argparse._SubParsersAction, plural: str, key: str) -> None:  # type: ignore[type-arg]
    """list, describe, config, logs and kill: the same for commands, notebooks, shells and TensorBoards."""
    p = sub.add_parser("list", aliases=["ls"], help=f"list your {plural} (--all: everyone's, for admins)")
    p.add_argument("-a", "--all", action="store_true", help=f"every user's {plural} (admins)")
    p.add_argument("-q", "--quiet", action="store_true", help="only the ids")
    add_format_flags(p)
    p.set_defaults(func=_list, plural=plural)

    p = sub.add_parser("describe", help=f"show a {key}")
    p.add_argument("task_id", metavar="ID")
    add_format_flags(p, csv=False)
    p.set_defaults(func=_describe, plural=plural, key=key)

    p = sub.add_parser("config", help=f"print a {key}'s config (YAML)")
    p.add_argument("task_id", metavar="ID")
    p.set_defaults(func=_config, plural=plural)

    p = sub.add_parser("logs", help=f"print a {key}'s output")
    p.add_argument("task_id", metavar="ID")
    p.add_argument("-f", "--follow", action="store_true", help=f"keep streaming until the {key} ends")
    p.set_defaults(func=_logs)

    p = sub.add_parser("kill", help=f"kill {plural} (their Slurm jobs are cancelled)")
    p.add_argument("task_ids", metavar="ID", nargs="+")
    p.add_argument("-f", "--force", action="store_true", help="go on past errors")
    p.set_defaults(func=_kill, plural=plural, key=key)


# ---------------------------------------------------------------- run


def add_launch_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config-file", type=Path, metavar="FILE", help="task config (YAML)")
    p.add_argument(
        "--config", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="set a config field by dotted path (resources.slots=0); the value is read as YAML (repeatable)",
    )  # fmt: skip
    p.add_argument("-v", "--volume", action="append", default=[], metavar="HOST:CONTAINER", help="bind mount")
    p.add_argument("-c", "--context", type=Path, metavar="DIR", help="directory to upload and start in")
    p.add_argument("-d", "--detach", action="store_true", help="print the task id and return at once")


def launch(
    args: argparse.Namespace, entrypoint: list[str] | None = None, extra: dict[str, Any] | None = None
) -> tuple[Session, dict[str, Any]]:
    from hpc_master.expconf.tasks import TaskType, parse_task_config

    config = task_config(args.config_file, args.overrides, args.volume, entrypoint or [])
    parse_task_config(config, TaskType(args.key.upper()))
    files: list[dict[str, Any]] = []
    if args.context is not None:
        plan = plan_context(args.context)
        warn_skipped(plan)
        check_size(plan)
        files = read_context(plan)
    session = session_from_args(args)
    body = {"config": config, "files": files, **(extra or {})}
    answer = session.call("POST", f"/api/v1/{args.plural}", json=body)
    return session, answer[args.key]


def task_config(
    config_file: Path | None, overrides: list[str], volumes: list[str], entrypoint: list[str]
) -> dict[str, Any]:
    """The config to send, built as Determined's client builds it (file, then overrides, volumes, command)."""
    from hpc_master.cli.experiment import apply_override

    config: dict[str, Any] = {} if config_file is None else _load_config_file(config_file)
    for override in overrides:
        apply_override(config, override)
    for volume in volumes:
        mount = _bind_mount(volume)
        config.setdefault("bind_mounts", []).append(mount)
    if not config.get("entrypoint") and entrypoint:
        config["entrypoint"] = entrypoint
    return config


def _load_config_file(config_file: Path) -> dict[str, Any]:
    """The task config file `config_file`, a mapping (empty for an empty file)."""
    from hpc_master.expconf import load_yaml

    try:
        loaded = load_yaml(config_file.read_text())
    except OSError as err:
        raise ClientError(f"cannot read the config {str(config_file)!r}: {err.strerror}") from None
    except ConfigError as err:
        raise ConfigError(f"{config_file}: {err}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{config_file}: the config must be a mapping of fields")
    return dict(loaded or {})


def _bind_mount(volume: str) -> dict[str, str]:
    """``--volume HOST:CONTAINER`` as a ``bind_mounts`` entry."""
    host, sep, container = volume.partition(":")
    if not sep or not host or not container:
        raise ConfigError(f"--volume {volume!r}: expected HOST_PATH:CONTAINER_PATH")
    return {"host_path": host, "container_path": container}


def _run(args: argparse.Namespace) -> int:
    entrypoint = (
        [a for a in args.entrypoint if a != "--"] if args.entrypoint[:1] == ["--"] else args.entrypoint
    )
    session, command = launch(args, entrypoint)
    if args.detach:
        print(command["id"])
        return 0
    print(f"Launched command {command['id']} ({command['description']})", file=sys.stderr)
    try:
        print_task_logs(session, command["id"], follow=True)
    except KeyboardInterrupt:
        print(
            f"\nThe command goes on: `det cmd logs -f {command['id']}` follows it again, "
            f"`det cmd kill {command['id']}` ends it.",
            file=sys.stderr,
        )
        return 130
    return exit_code_of(session, command["id"])


def exit_code_of(session: Session, task_id: str) -> int:
    """The command's exit code, once the master has recorded its end (the log stream ends just after)."""
    command = _wait_terminated(session, task_id)
    code = command.get("exitCode")
    if command.get("exitCode") != 0 or "killed" in str(command.get("exitStatus") or ""):
        print(f"Command {task_id} ended: {command.get('exitStatus')}", file=sys.stderr)
    if isinstance(code, int):
        return code if 0 <= code <= 255 else LOST_EXIT
    return KILLED_EXIT if "killed" in str(command.get("exitStatus") or "") else LOST_EXIT


def _wait_terminated(session: Session, task_id: str) -> dict[str, Any]:
    """The command once terminated, polled for up to a minute; a :class:`ServerError` if it has not ended."""
    import time

    deadline = time.monotonic() + 60
    while True:
        command: dict[str, Any] = session.call("GET", f"/api/v1/commands/{task_id}")["command"]
        if command["state"] == "STATE_TERMINATED" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if command["state"] != "STATE_TERMINATED":
        raise ServerError(f"command {task_id} has not ended yet: `det cmd describe {task_id}`")
    return command


def print_task_logs(session: Session, task_id: str, *, follow: bool) -> int:
    """Stream a task's output to stdout (the job entry's own ``[job_entry]`` lines to stderr)."""
    printed = 0
    for entry in log_entries(session, f"/api/v1/tasks/{task_id}/logs", follow=follow):
        message = str(entry.get("message") or "")
        out = sys.stderr if message.startswith("[job_entry] ") else sys.stdout
        out.write(message if message.endswith("\n") else message + "\n")
        out.flush()
        printed += 1
    return printed


# ---------------------------------------------------------------- queries

HEADERS = ["ID", "Owner", "Description", "State", "Exit", "Slurm job", "Node", "Started"]


def _row(c: dict[str, Any]) -> list[Any]:
    exit_code = c.get("exitCode")
    return [
        c["id"], c["username"], c["description"], state(c["state"]),
        "" if exit_code is None else exit_code, c.get("slurmJobId") or "", c.get("nodeList") or "",
        c.get("startTime"),
    ]  # fmt: skip


def _list(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    params = {} if args.all else {"users": session.username}
    commands = session.call("GET", f"/api/v1/{args.plural}", params=params)[args.plural]
    if args.quiet:
        for c in commands:
            print(c["id"])
        return 0
    emit(args, HEADERS, [_row(c) for c in commands], commands)
    return 0


def _describe(args: argparse.Namespace) -> int:
    answer = session_from_args(args).call("GET", f"/api/v1/{args.plural}/{args.task_id}")
    if args.json:
        print_json(answer)
        return 0
    c = answer[args.key]
    pairs = list(zip(HEADERS, _row(c), strict=True))
    pairs += [("Exit status", c.get("exitStatus") or ""), ("Waiting for", c.get("pendingReason") or "")]
    if c.get("serviceAddress"):
        pairs.append(("URL", f"{session_from_args(args).master}{c['serviceAddress']}"))
    print(key_values(pairs))
    return 0


def _config(args: argparse.Namespace) -> int:
    from hpc_master.cli._output import print_document

    print_document(session_from_args(args).call("GET", f"/api/v1/{args.plural}/{args.task_id}")["config"])
    return 0


def _logs(args: argparse.Namespace) -> int:
    print_task_logs(session_from_args(args), args.task_id, follow=args.follow)
    return 0


def _kill(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    failed = 0
    for task_id in args.task_ids:
        try:
            c = session.call("POST", f"/api/v1/{args.plural}/{task_id}/kill")[args.key]
        except ClientError as err:
            if not args.force:
                raise
            print(f"Skipping {task_id}: {err}", file=sys.stderr)
            failed += 1
            continue
        print(f"Killed {args.key} {task_id} ({state(c['state'])})")
    return 1 if failed else 0


def _task_list(args: argparse.Namespace) -> int:
    summaries = session_from_args(args).call("GET", "/api/v1/tasks")["allocationIdToSummary"]
    rows = [
        [s["taskId"], s["taskType"], s["username"], s["name"], state(s["state"]), s.get("slurmJobId") or "",
         s["slotsNeeded"], s["resourcePool"]]
        for s in summaries.values()
    ]  # fmt: skip
    emit(args, ["Task ID", "Type", "Owner", "Name", "State", "Slurm job", "Slots", "Pool"], rows, summaries)
    return 0
