"""`det experiment set ...`: change an experiment after it was created (Determined's command and flags).

``det e set gc-policy ID --save-experiment-best N --save-trial-best N --save-trial-latest N [--yes]`` shows what
the policy would delete (``GET /api/v1/experiments/{id}/preview_gc``), asks, and sets it
(``PATCH /api/v1/experiments/{id}`` with ``checkpointStorage``); the master deletes the files in the background.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hpc_master.cli._client import session_from_args
from hpc_master.cli._context import human_size
from hpc_master.cli._output import print_table
from hpc_master.errors import ClientError

PREVIEW_HEADERS = ["Trial ID", "Steps", "State", "Validation Metric", "UUID", "Size"]


def register(exp_sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = exp_sub.add_parser("set", help="set experiment attributes")
    set_sub = p.add_subparsers(dest="attribute", metavar="ATTRIBUTE", required=True)

    g = set_sub.add_parser("gc-policy", help="set the checkpoint GC policy and collect under it")
    g.add_argument("experiment_id", metavar="ID", type=int)
    for flag, what in (
        ("--save-experiment-best", "number of best checkpoints per experiment to keep"),
        ("--save-trial-best", "number of best checkpoints per trial to keep"),
        ("--save-trial-latest", "number of latest checkpoints per trial to keep"),
    ):
        g.add_argument(flag, type=_count, required=True, metavar="N", help=what)
    g.add_argument("--yes", "-y", action="store_true", help="do not show the preview nor ask")
    g.set_defaults(func=_gc_policy)

    d = set_sub.add_parser("description", help="set the experiment's description")
    d.add_argument("experiment_id", metavar="ID", type=int)
    d.add_argument("description")
    d.set_defaults(func=_patch_field, field="description")

    n = set_sub.add_parser("name", help="set the experiment's name")
    n.add_argument("experiment_id", metavar="ID", type=int)
    n.add_argument("name")
    n.set_defaults(func=_patch_field, field="name")

    # Determined's `det e set priority|weight|max-slots`: the experiment's `resources`, applied to its trials'
    # Slurm jobs (docs/priority.md); max-slots "none" lifts the cap.
    for attribute, kind, what in (
        ("priority", _priority, "scheduling priority (1 highest … 99 lowest; Determined's default 42)"),
        ("weight", _weight, "fair-share weight"),
        ("max-slots", _max_slots, "most slots (GPUs) the experiment's trials use at once, or 'none'"),
    ):
        r = set_sub.add_parser(attribute, help=f"set the experiment's {what}")
        r.add_argument("experiment_id", metavar="ID", type=int)
        r.add_argument("value", metavar=attribute.upper().replace("-", "_"), type=kind)
        r.set_defaults(func=_patch_resources, field=attribute)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value <= 2**31 - 1:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to {2**31 - 1}, got {value}")
    return value


def _policy(args: argparse.Namespace) -> dict[str, int]:
    return {
        "save_experiment_best": args.save_experiment_best,
        "save_trial_best": args.save_trial_best,
        "save_trial_latest": args.save_trial_latest,
    }


def preview_rows(checkpoints: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            c.get("TrialID"),
            c.get("StepsCompleted"),
            c.get("State"),
            c.get("SearcherMetric"),
            c.get("UUID"),
            human_size(int(c.get("Size") or 0)),
        ]
        for c in checkpoints
    ]


def _gc_policy(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    policy = _policy(args)
    if not args.yes:
        preview = session.call("GET", f"/api/v1/experiments/{args.experiment_id}/preview_gc", params=policy)
        checkpoints = preview.get("checkpoints") or []
        if checkpoints:
            metric = preview.get("metric_name") or "searcher metric"
            print(f"Applying this GC policy deletes these checkpoints (validation metric: {metric}):")
            print_table(PREVIEW_HEADERS, preview_rows(checkpoints))
        total = sum(int(c.get("Size") or 0) for c in checkpoints)
        print(f"This policy deletes {len(checkpoints)} checkpoints ({human_size(total)}).")
        if not sys.stdin.isatty():
            raise ClientError("refusing to change the GC policy without confirmation: pass --yes")
        answer = input(
            "Changing the checkpoint GC policy of an experiment deletes those checkpoints for good. "
            "Proceed? [y/N] "
        )
        if answer.strip().lower() not in ("y", "yes"):
            print("Aborting.")
            return 1
    body = {
        "checkpointStorage": {
            "saveExperimentBest": args.save_experiment_best,
            "saveTrialBest": args.save_trial_best,
            "saveTrialLatest": args.save_trial_latest,
        }
    }
    session.call("PATCH", f"/api/v1/experiments/{args.experiment_id}", json=body)
    shown = ", ".join(f"{k}: {v}" for k, v in policy.items())
    print(
        f"Set the GC policy of experiment {args.experiment_id} to {shown}; the master deletes in the background"
    )
    return 0


def _patch_field(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    value = getattr(args, args.field)
    session.call("PATCH", f"/api/v1/experiments/{args.experiment_id}", json={args.field: value})
    print(f"Set the {args.field} of experiment {args.experiment_id} to {value!r}")
    return 0


def _priority(text: str) -> int:
    value = _count(text)
    if not 1 <= value <= 99:
        raise argparse.ArgumentTypeError(f"a priority is 1 (highest) to 99 (lowest), got {value}")
    return value


def _weight(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value <= 1e6:
        raise argparse.ArgumentTypeError(f"a weight is 0 to 1,000,000, got {text}")
    return value


def _max_slots(text: str) -> int | None:
    return None if text.strip().lower() == "none" else _count(text)


RESOURCE_FIELDS = {"priority": "priority", "weight": "weight", "max-slots": "maxSlots"}


def _patch_resources(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    body = {"resources": {RESOURCE_FIELDS[args.field]: args.value}}
    session.call("PATCH", f"/api/v1/experiments/{args.experiment_id}", json=body)
    print(f"Set `{args.field.replace('-', '_')}` of experiment {args.experiment_id} to {args.value}")
    return 0
