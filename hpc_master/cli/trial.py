"""`det trial` (alias `t`): describe (with metrics), logs (follow, per rank), kill."""

from __future__ import annotations

import argparse
from typing import Any

from hpc_master.cli import _follow
from hpc_master.cli._client import session_from_args
from hpc_master.cli._output import add_format_flags, key_values, print_json, print_table, state


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


def _logs(args: argparse.Namespace) -> int:
    _follow.print_logs(session_from_args(args), args.trial_id, follow=args.follow, rank_id=args.rank_id)
    return 0


def _kill(args: argparse.Namespace) -> int:
    session_from_args(args).call("POST", f"/api/v1/trials/{args.trial_id}/kill")
    print(f"Killed trial {args.trial_id}")
    return 0
