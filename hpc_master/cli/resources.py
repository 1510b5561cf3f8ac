"""`det resources raw|aggregated|allocations`: usage (slot-seconds of trial runs), as Determined's CLI has them
(``hpc_master/services/usage.py``): a user's own, an admin's everyone's. Without ``--json``, a table (ours) where
Determined prints CSV; ``--csv`` prints CSV."""

from __future__ import annotations

import argparse
from typing import Any

from hpc_master.cli._client import session_from_args
from hpc_master.cli._output import emit

DEFAULT = "(default)"  # a job charged to the user's default association
PERIODS = {False: "RESOURCE_ALLOCATION_AGGREGATION_PERIOD_DAILY", True: "RESOURCE_ALLOCATION_AGGREGATION_PERIOD_MONTHLY"}  # fmt: skip


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("resources", aliases=["res"], help="usage: slot-seconds of trial runs")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, aliases, helptext in (
        ("raw", [], "each trial run that held slots between two times"),
        ("allocations", ["alloc"], "the same, one line per run (Determined's allocations CSV)"),
    ):
        q = actions.add_parser(name, aliases=aliases, help=helptext)
        q.add_argument("timestamp_after", help="from (2026-12-01T00:00:00Z)")
        q.add_argument("timestamp_before", help="to (2026-12-02T00:00:00Z)")
        _formats(q)
        q.set_defaults(func=_raw)
    q = actions.add_parser("aggregated", aliases=["agg"], help="slot-seconds per day or month, by user, ...")
    q.add_argument("start_date", help="first day to include (2026-12-01)")
    q.add_argument("end_date", help="last day to include")
    q.add_argument("--monthly", action="store_true", help="aggregate by month rather than by day")
    _formats(q)
    q.set_defaults(func=_aggregated)


def _formats(p: argparse.ArgumentParser) -> None:
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print JSON")
    form.add_argument("--csv", action="store_true", help="print CSV")


def _raw(args: argparse.Namespace) -> int:
    params = {"timestamp_after": args.timestamp_after, "timestamp_before": args.timestamp_before}
    answer = session_from_args(args).call("GET", "/api/v1/resources/allocation/raw", params=params)
    entries: list[dict[str, Any]] = answer["resourceEntries"]
    headers = [
        "Experiment",
        "Trial",
        "Run",
        "Slurm job",
        "User",
        "Start",
        "End",
        "Slots",
        "Slot-hours",
        "Account",
    ]
    rows = [[e["experimentId"], e["trialId"], e["trialRunId"], e["slurmJobId"], e["username"], e["startTime"],
             e["endTime"], e["slots"], round(e["slotSeconds"] / 3600, 3), e["slurmAccount"]] for e in entries]  # fmt: skip
    emit(args, headers, rows, answer)
    return 0


def _aggregated(args: argparse.Namespace) -> int:
    params = {"start_date": args.start_date, "end_date": args.end_date, "period": PERIODS[args.monthly]}
    answer = session_from_args(args).call("GET", "/api/v1/resources/allocation/aggregated", params=params)
    rows: list[list[Any]] = []
    for entry in answer["resourceEntries"]:
        rows.append([entry["periodStart"], "total", "", round(entry["seconds"] / 3600, 3)])
        for key, kind in (("byUsername", "user"), ("bySlurmAccount", "slurm account"),
                          ("byResourcePool", "pool"), ("byExperimentLabel", "label"), ("byWorkspace", "workspace")):  # fmt: skip
            rows += [
                [entry["periodStart"], kind, name or DEFAULT, round(s / 3600, 3)]
                for name, s in entry[key].items()
            ]
    emit(args, ["Period", "By", "Name", "Slot-hours"], rows, answer)
    return 0
