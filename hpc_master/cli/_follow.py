"""Shared by `det experiment` and `det trial`: log streaming, waiting, and exit statuses for how things ended.

Exit statuses of ``det e create -f``, ``det e wait`` (and ``det t logs -f`` does not change its status):

====== =====================================================
0      COMPLETED
1      ERROR (or any error of the CLI itself, e.g. HTTP 4xx)
4      CANCELED (canceled or killed)
5      ended some other way (e.g. deleted while waiting)
====== =====================================================

(2 is a bad config or usage, 3 a failure on the master's side, 130 Ctrl-C: see ``det --help``.)
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from hpc_master.cli._client import Session
from hpc_master.cli._output import state
from hpc_master.errors import ServerError

END_STATUS = {"COMPLETED": 0, "ERROR": 1, "CANCELED": 4}
OTHER_END_STATUS = 5
TERMINAL_STATES = {"COMPLETED", "CANCELED", "ERROR", "DELETED"}
POLL_MIN_S = 0.5
POLL_MAX_S = 5.0


def exit_status(end_state: str) -> int:
    return END_STATUS.get(state(end_state), OTHER_END_STATUS)


def log_entries(session: Session, path: str, *, follow: bool = False) -> Iterator[dict[str, Any]]:
    """The entries of a log stream (``{"result": {...}}`` lines: trials' and tasks' logs alike)."""
    params = {"follow": "true"} if follow else None
    with session.stream_lines(path, params) as lines:
        for raw in lines:
            if not raw.strip():
                continue
            try:
                item: Any = json.loads(raw)
            except ValueError:
                continue
            if isinstance(item, dict) and "error" in item:
                raise ServerError(f"the log stream failed: {item['error']}")
            entry = item.get("result", item) if isinstance(item, dict) else {}
            yield entry


def print_logs(session: Session, trial_id: int, *, follow: bool = False, rank_id: int | None = None) -> int:
    """Stream a trial's logs to stdout; returns the number of lines printed."""
    printed = 0
    for entry in log_entries(session, f"/api/v1/trials/{trial_id}/logs", follow=follow):
        if rank_id is not None and entry.get("rankId") != rank_id:
            continue
        message = str(entry.get("message") or (str(entry.get("log", "")) + "\n"))
        sys.stdout.write(message if message.endswith("\n") else message + "\n")
        sys.stdout.flush()
        printed += 1
    return printed


def poll_until(
    fetch: Callable[[], Any], done: Callable[[Any], bool], *, timeout_s: float | None = None
) -> Any:
    """Call `fetch` with a growing interval until `done(result)`; returns the last result."""
    interval = POLL_MIN_S
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        result = fetch()
        if done(result):
            return result
        if deadline is not None and time.monotonic() >= deadline:
            return result
        time.sleep(interval)
        interval = min(POLL_MAX_S, interval * 1.5)


def get_experiment(session: Session, experiment_id: int) -> dict[str, Any]:
    body = session.call("GET", f"/api/v1/experiments/{experiment_id}")
    experiment: dict[str, Any] = body["experiment"]
    return experiment


def wait_experiment(session: Session, experiment_id: int) -> str:
    final = poll_until(
        lambda: get_experiment(session, experiment_id), lambda e: state(e.get("state")) in TERMINAL_STATES
    )
    return state(final.get("state"))


def follow_first_trial(session: Session, experiment_id: int) -> int:
    """Wait for the experiment's first trial, stream its logs to the end, return its exit status."""
    experiment = poll_until(
        lambda: get_experiment(session, experiment_id),
        lambda e: bool(e.get("trialIds")) or state(e.get("state")) in TERMINAL_STATES,
    )
    trial_ids = experiment.get("trialIds") or []
    if not trial_ids:
        end = state(experiment.get("state"))
        print(f"Experiment {experiment_id} ended ({end}) before any trial started", file=sys.stderr)
        return exit_status(end)
    trial_id = int(trial_ids[0])
    print(f"Following the logs of trial {trial_id}", file=sys.stderr)
    print_logs(session, trial_id, follow=True)
    trial = poll_until(
        lambda: session.call("GET", f"/api/v1/trials/{trial_id}")["trial"],
        lambda t: state(t.get("state")) in TERMINAL_STATES,
    )
    end = state(trial.get("state"))
    print(f"Trial {trial_id} ended: {end}", file=sys.stderr)
    return exit_status(end)
