"""`det notebook`: JupyterLab as a Slurm job, reached through the master's proxy at ``/proxy/<id>/``.

    det notebook start [-c DIR] [--config-file F] [--config K=V]... [--no-browser] [-d]

waits until JupyterLab answers, prints its address and opens it in a browser (log in to the web UI in that
browser: the proxy takes its session). Determined's flags; `-d` prints the id and returns at once.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from hpc_master.cli._client import Session, session_from_args
from hpc_master.cli._output import state
from hpc_master.cli.command import add_common, add_launch_flags, launch
from hpc_master.errors import ServerError

READY_POLL_S = 1.0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    nb = sub.add_parser("notebook", help="JupyterLab on a compute node, through the master")
    nb_sub = nb.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = nb_sub.add_parser("start", help="start JupyterLab as a Slurm job and open it")
    add_launch_flags(p)
    p.add_argument("--no-browser", action="store_true", help="print the address only")
    p.set_defaults(func=start_task, plural="notebooks", key="notebook", what="JupyterLab")
    p = nb_sub.add_parser("open", help="open a running notebook in a browser")
    p.add_argument("task_id", metavar="ID")
    p.set_defaults(func=open_task, plural="notebooks", key="notebook")
    add_common(nb_sub, "notebooks", "notebook")


def wait_ready(session: Session, plural: str, key: str, task_id: str, what: str) -> dict[str, Any]:
    said = ""
    while True:
        task = session.call("GET", f"/api/v1/{plural}/{task_id}")[key]
        if task.get("isReady"):
            return dict(task)
        if task["state"] == "STATE_TERMINATED":
            raise ServerError(f"{what} {task_id} ended before it answered: {task.get('exitStatus')}")
        words = f"{what} {task_id}: {state(task['state']).lower()}"
        if task.get("slurmJobId"):
            words += f" (Slurm job {task['slurmJobId']}{', ' + task['pendingReason'] if task.get('pendingReason') else ''})"
        if words != said:
            print(words, file=sys.stderr)
            said = words
        time.sleep(READY_POLL_S)


def show(session: Session, task: dict[str, Any], *, browser: bool) -> None:
    url = f"{session.master}{task['serviceAddress']}"
    print(url)
    if browser:
        import webbrowser

        webbrowser.open(url)


def start_task(args: argparse.Namespace, extra: dict[str, Any] | None = None) -> int:
    session, task = launch(args, extra=extra)
    if args.detach:
        print(task["id"])
        return 0
    print(f"Launched {args.what} {task['id']}", file=sys.stderr)
    ready = wait_ready(session, args.plural, args.key, task["id"], args.what)
    show(session, ready, browser=not args.no_browser)
    return 0


def open_task(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    task = session.call("GET", f"/api/v1/{args.plural}/{args.task_id}")[args.key]
    if not task.get("isReady"):
        raise ServerError(f"{args.key} {args.task_id} is {state(task['state']).lower()}, not answering yet")
    show(session, task, browser=True)
    return 0
