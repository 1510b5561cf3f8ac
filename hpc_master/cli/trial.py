"""`det trial` (alias `t`): describe (with metrics), logs (follow, per rank), kill, download a checkpoint."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path
from typing import Any

from hpc_master.cli import _follow, checkpoint
from hpc_master.cli._client import session_from_args
from hpc_master.cli._output import add_format_flags, key_values, print_json, print_table, state
from hpc_master.errors import ClientError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    trial = sub.add_parser("trial", aliases=["t"], help="inspect and stop trials")
    trial_sub = trial.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = trial_sub.add_parser("describe", help="show a trial (and, with --metrics, all its metrics)")
    p.add_argument("trial_id", metavar="ID", type=int)
    p.add_argument("--metrics", action="store_true", help="include every reported metric row")
    add_format_flags(p, csv=False)
    p.set_defaults(func=_describe)

    p = trial_sub.add_parser("logs", help="print a trial's logs (every run, every rank)")
    p.add_argument("trial_id", metavar="ID", type=int)
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming until the trial ends")
    p.add_argument(
        "--rank-id", type=int, metavar="N", help="only the lines of rank N (lines prefixed `[rank=N]`)"
    )
    p.set_defaults(func=_logs)

    p = trial_sub.add_parser("kill", help="kill a trial (its Slurm job is cancelled)")
    p.add_argument("trial_id", metavar="ID", type=int)
    p.set_defaults(func=_kill)

    p = trial_sub.add_parser("download", help="download one of the trial's checkpoints (Determined's flags)")
    p.add_argument("trial_id", metavar="ID", type=int)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--best", action="store_true", help="the best by the searcher metric (or --sort-by)")
    which.add_argument("--latest", action="store_true", help="the one of the most steps")
    which.add_argument("--uuid", help="this checkpoint of the trial's")
    p.add_argument("--sort-by", metavar="METRIC", help="with --best: rank by this validation metric")
    p.add_argument(
        "--smaller-is-better", action=argparse.BooleanOptionalAction, default=None,
        help="with --sort-by: whether smaller values of METRIC are better (default: the searcher's)",
    )  # fmt: skip
    p.add_argument("-o", "--output-dir", type=Path, help="where to put it (default: checkpoints/UUID)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the path")
    p.set_defaults(func=_download)


# Slurm's pending reasons (and the master's own, before sbatch) that users meet most, in words.
PENDING_REASONS = {
    "Priority": "jobs with a higher priority come first",
    "Resources": "waiting for nodes, GPUs, CPUs or memory to free up",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
    "QOSMaxJobsPerUserLimit": "the QOS's limit on your running jobs; it starts when one of them ends",
    "AssocMaxJobsLimit": "your account's limit on running jobs; it starts when one of them ends",
    "QOSGrpGRES": "the QOS's limit on GPUs in use",
    "AssocGrpGRES": "the account's limit on GPUs in use",
    "JobHeldUser": "held by its owner (scontrol release)",
    "JobHeldAdmin": "held by an administrator",
    "PartitionDown": "the partition is down",
    "BeginTime": "its start time has not come yet",
    "Dependency": "waiting for the jobs it depends on",
    "SlurmControllerUnavailable": "slurmctld does not answer; the master submits it when it does",
}
SUBMIT_LIMIT_TEXT = "Slurm's limit on your submitted jobs; the master submits it when one of them ends"


def waiting_text(run: dict[str, Any], now: dt.datetime | None = None) -> str | None:
    """`in Slurm since 2026-11-24T07:00:00Z (3m12s): QOSMaxJobsPerUserLimit (…in words) [limit]`, for a run
    that waits (``STUCK, …`` first for one that will not start until someone acts); None otherwise."""
    where = run.get("waitingIn")
    reason = run.get("pendingReason")
    if not where or not reason:
        return None
    head = reason.split(",", 1)[0]
    words = PENDING_REASONS.get(head) or (SUBMIT_LIMIT_TEXT if "Submit" in head else None)
    since = run.get("pendingSince")
    text = "in Slurm" if where == "slurm" else "in the master (not submitted yet)"
    if since:
        text += _since_text(since, now)
    text += f": {reason}"
    text = f"{text} ({words})" if words else text
    text += _class_text(run)
    return f"STUCK, it will not start until someone acts: {text}" if run.get("stuck") else text


def _class_text(run: dict[str, Any]) -> str:
    """`` [limit, 3 jobs ahead]``: the reason's class and the jobs ahead, where known."""
    if not run.get("pendingClass"):
        return ""
    ahead = run.get("jobsAhead")
    return f" [{run['pendingClass']}" + (f", {ahead} jobs ahead]" if ahead is not None else "]")


def _since_text(since: Any, now: dt.datetime | None) -> str:
    """`` since 2026-11-24 07:00:00Z (3m12s)``; `since` as it came when it is not an ISO time."""
    try:
        start = dt.datetime.fromisoformat(str(since).replace("Z", "+00:00"))
    except ValueError:
        return f" since {since}"
    seconds = int(((now or dt.datetime.now(dt.UTC)) - start).total_seconds())
    return f" since {start:%Y-%m-%d %H:%M:%S}Z ({_duration(max(seconds, 0))})"


def _duration(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _metrics_rows(metrics: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    names = sorted({k for m in metrics for k in (m.get("metrics") or {})})
    headers = ["Steps", "Group", "Run", "Report Time", *names]
    rows = [
        [m.get("stepsCompleted"), m.get("group"), m.get("trialRunId"), m.get("reportTime")]
        + [(m.get("metrics") or {}).get(n) for n in names]
        for m in metrics
    ]
    return headers, rows


def _describe(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    trial: dict[str, Any] = session.call("GET", f"/api/v1/trials/{args.trial_id}")["trial"]
    metrics: list[dict[str, Any]] = []
    if args.metrics:
        metrics = session.call("GET", f"/api/v1/trials/{args.trial_id}/metrics")["metrics"]
    if args.json:
        print_json({"trial": trial, "metrics": metrics} if args.metrics else {"trial": trial})
        return 0
    print(
        key_values(
            [
                ("Trial", trial.get("id")),
                ("Experiment", trial.get("experimentId")),
                ("State", state(trial.get("state"))),
                ("Hyperparameters", trial.get("hparams")),
                ("Restarts", trial.get("restarts")),
                ("Steps completed", trial.get("stepsCompleted")),
                ("Best validation", trial.get("bestValidationMetric")),
                ("Latest checkpoint", trial.get("latestCheckpointUuid")),
                ("Start time", trial.get("startTime")),
                ("End time", trial.get("endTime")),
                ("Message", trial.get("exitMessage")),
                *_waiting_pair(trial.get("runs") or []),
            ]
        )
    )
    runs = trial.get("runs") or []
    if runs:
        print()
        print_table(
            ["Run", "Slurm Job", "Nodes", "State", "Exit Reason", "Submitted", "Started", "Ended"],
            [
                [r.get("trialRunId"), r.get("slurmJobId"), r.get("nodeList"), r.get("state"),
                 r.get("exitReason"), r.get("submitTime"), r.get("startTime"), r.get("endTime")]
                for r in runs
            ],
        )  # fmt: skip
    if args.metrics:
        print()
        headers, rows = _metrics_rows(metrics)
        print_table(headers, rows)
    return 0


def _waiting_pair(runs: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    text = waiting_text(runs[-1]) if runs else None
    return [("Waiting", text)] if text else []


def _logs(args: argparse.Namespace) -> int:
    _follow.print_logs(session_from_args(args), args.trial_id, follow=args.follow, rank_id=args.rank_id)
    return 0


def _kill(args: argparse.Namespace) -> int:
    session_from_args(args).call("POST", f"/api/v1/trials/{args.trial_id}/kill")
    print(f"Killed trial {args.trial_id}")
    return 0


def _download(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    path = f"/api/v1/trials/{args.trial_id}/checkpoints"
    if args.uuid:
        listed = session.call("GET", path, params={"states": "STATE_COMPLETED"})["checkpoints"]
        if args.uuid not in {c.get("uuid") for c in listed}:
            raise ClientError(f"trial {args.trial_id} has no checkpoint {args.uuid} with its files")
        uuid = args.uuid
    else:
        params: dict[str, str | int] = {"states": "STATE_COMPLETED", "limit": 1}
        if args.latest:
            params.update(sortByAttr="SORT_BY_BATCH_NUMBER", orderBy="ORDER_BY_DESC")
        elif args.sort_by:
            params["sortByMetric"] = args.sort_by
            if args.smaller_is_better is not None:
                params["orderBy"] = "ORDER_BY_ASC" if args.smaller_is_better else "ORDER_BY_DESC"
        else:
            params["sortByAttr"] = "SORT_BY_SEARCHER_METRIC"  # best first (the searcher's direction)
        listed = session.call("GET", path, params=params)["checkpoints"]
        if not listed:
            raise ClientError(f"trial {args.trial_id} has no checkpoint with its files to download")
        uuid = listed[0]["uuid"]
    checkpoint.download(session, uuid, args.output_dir, quiet=args.quiet)
    return 0
