"""`det preview CONFIG`: validate an experiment config locally and print its search plan.

Bad input exits with status 2 and the precise error (the YAML path and what is allowed); nothing is sent to a
master, so this works on a login node with no master running.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hpc_master.errors import ConfigError
from hpc_master.expconf import parse_experiment_config
from searcher.plan import format_plan, plan_search


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("preview", help="validate an experiment config and show its search plan")
    p.add_argument("config", help="experiment config file (YAML), or - for standard input")
    p.add_argument(
        "--workers", type=int, default=None, help="slots for the simulated run (default: the search's)"
    )
    p.add_argument("--no-simulate", action="store_true", help="skip the simulated run")
    p.add_argument("--json", action="store_true", help="machine-readable plan")
    p.set_defaults(func=run)


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None


def run(args: argparse.Namespace) -> int:
    cfg = parse_experiment_config(_read(args.config))
    for warning in cfg.warnings:
        print(f"Warning: {warning}", file=sys.stderr)
    searcher_cfg = cfg.searcher_dict()
    if searcher_cfg is None:
        raise ConfigError("required to preview a search", field="searcher")
    seed = cfg.reproducibility.experiment_seed if cfg.reproducibility else None
    try:
        plan = plan_search(
            searcher_cfg,
            cfg.hyperparameters_dict(),
            seed=seed or 0,
            workers=args.workers,
            simulate_run=not args.no_simulate,
        )
    except ValueError as e:
        raise ConfigError(str(e), field="searcher") from None
    if args.json:
        import dataclasses

        print(json.dumps(dataclasses.asdict(plan), indent=2, default=str))
    else:
        print(f"Experiment config {args.config} is valid.")
        print(format_plan(plan))
    return 0
