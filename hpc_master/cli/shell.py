"""`det shell`: a shell on a compute node, Slurm-native: the task's job holds the allocation and
`det shell open` attaches to it with ``srun --jobid=JOB --overlap --pty`` from the login node, as you (no SSH
keys, no sshd). Run it as the Unix account your master user maps to: Slurm lets only the job's owner in.

    det shell start [-c DIR] [--config K=V]... [-d]      # waits for the node, then opens the shell
    det shell open ID [CMD [ARG...]]                      # another shell (or one command) in the same job
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from hpc_master.cli._client import session_from_args
from hpc_master.cli.command import add_common, add_launch_flags, launch
from hpc_master.cli.notebook import wait_ready
from hpc_master.errors import ClientError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sh = sub.add_parser("shell", help="a shell on a compute node (srun into the task's job)")
    sh_sub = sh.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sh_sub.add_parser("start", help="allocate a node and open a shell on it")
    add_launch_flags(p)
    p.set_defaults(func=_start, plural="shells", key="shell", what="Shell")
    p = sh_sub.add_parser("open", help="open a shell (or run a command) in a running shell task's job")
    p.add_argument("task_id", metavar="ID")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD", help="a command instead of a shell")
    p.set_defaults(func=_open, plural="shells", key="shell")
    add_common(sh_sub, "shells", "shell")


def srun_argv(job_id: str, workdir: str | None, command: list[str], *, tty: bool) -> list[str]:
    argv = ["srun", f"--jobid={job_id}", "--overlap", "--nodes=1", "--ntasks=1", "--quiet"]
    if tty:
        argv.append("--pty")
    if workdir:
        argv.append(f"--chdir={workdir}")
    return [*argv, *(command or [os.environ.get("SHELL") or "/bin/bash", "-l"])]


def _attach(job_id: str, workdir: str | None, command: list[str]) -> int:
    if shutil.which("srun") is None:
        raise ClientError(
            "`det shell open` runs srun, which is not on PATH: run it on a login node of the cluster"
        )
    argv = srun_argv(job_id, workdir, command, tty=sys.stdin.isatty() and not command)
    sys.stdout.flush()
    os.execvp(argv[0], argv)


def _start(args: argparse.Namespace) -> int:
    session, task = launch(args)
    if args.detach:
        print(task["id"])
        return 0
    print(f"Launched shell {task['id']}", file=sys.stderr)
    ready = wait_ready(session, args.plural, args.key, task["id"], args.what)
    return _attach(str(ready["slurmJobId"]), ready.get("workDir"), [])


def _open(args: argparse.Namespace) -> int:
    task = session_from_args(args).call("GET", f"/api/v1/shells/{args.task_id}")["shell"]
    if not task.get("isReady") or not task.get("slurmJobId"):
        raise ClientError(
            f"shell {args.task_id} is {task['state'].removeprefix('STATE_').lower()}, not running"
        )
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    return _attach(str(task["slurmJobId"]), task.get("workDir"), command)
