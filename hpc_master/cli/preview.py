"""`det preview CONFIG`: validate an experiment config locally and print its search plan.

Bad input exits with status 2 and the precise error (the YAML path and what is allowed); nothing is sent to a
master, so this works on a login node with no master running.

The config goes through the same pipeline as the master's create (`admission.load_experiment_config`):
the typed model, the sbatch-options policy, the master's defaults merged with Determined's eventually-required
fields checked, and a dry run of the trial's job script. With ``--master-config master.yaml`` the defaults and
the resource pool are the master's own, so preview refuses what create would. Without it the built-in defaults
and a stand-in pool are used, and the output says what was not checked (the pool's name, slots per node and
time limits; ``slots_per_trial`` is still checked against ``slurm.slots_per_node`` when the config sets it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hpc_master.admission import CheckedConfig, load_experiment_config
from hpc_master.errors import ConfigError
from hpc_master.masterconf import load_master_config
from searcher.plan import format_plan, plan_search


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("preview", help="validate an experiment config and show its search plan")
    p.add_argument("config", help="experiment config file (YAML), or - for standard input")
    p.add_argument(
        "--workers", type=int, default=None, help="slots for the simulated run (default: the search's)"
    )
    p.add_argument("--no-simulate", action="store_true", help="skip the simulated run")
    p.add_argument("--json", action="store_true", help="machine-readable plan")
    p.add_argument(
        "--master-config",
        metavar="MASTER_YAML",
        help="check against this master config's defaults and resource pools, as create will "
        "(default: the built-in defaults and a stand-in pool)",
    )
    p.set_defaults(func=run)


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None


def job_summary(checked: CheckedConfig) -> str:
    """One line about the job the first trial would be: nodes, GPUs, partition, time limit."""
    spec = checked.job.spec
    parts = [f"{spec.nodes} node{'s' if spec.nodes != 1 else ''}"]
    if spec.gpus_per_node:
        typed = f" {spec.gpu_type}" if spec.gpu_type else ""
        parts[0] += f" x {spec.gpus_per_node}{typed} GPU{'s' if spec.gpus_per_node != 1 else ''}"
    else:
        parts[0] += ", no GPUs"
    if spec.partition:
        parts.append(f"partition {spec.partition}")
    if spec.time_limit_min is not None:
        parts.append(f"time limit {spec.time_limit_min} min")
    if spec.extra_sbatch_args:
        parts.append("sbatch_args " + " ".join(spec.extra_sbatch_args))
    return f"Job per trial (resource pool {checked.pool.name!r}): " + ", ".join(parts)


def checks_summary(checked: CheckedConfig, master_config: str | None) -> str:
    if checked.pool_known:
        return (
            f"Checked against {master_config}: its defaults and resource pool {checked.pool.name!r} "
            f"({checked.pool.slots_per_node} slots per node); the job script builds."
        )
    own_shape = checked.config.slurm.slots_per_node is not None
    slots = "slots_per_trial against slurm.slots_per_node, " if own_shape else ""
    limits = "memory and time limits" if own_shape else "slots per node, memory and time limits"
    return (
        f"Checked locally: the config, sbatch_args, {slots}the built-in master defaults, and the job script "
        "for a stand-in pool.\nNot checked without the master's config (--master-config FILE): that resource "
        f"pool {checked.pool.name!r} exists, and its {limits}; the master checks them at "
        "`det experiment create`."
    )


def run(args: argparse.Namespace) -> int:
    master = load_master_config(args.master_config) if args.master_config else None
    # Seed 0 where the config sets none, so that the previewed plan is the same on every run.
    checked = load_experiment_config(_read(args.config), master, experiment_seed=0)
    cfg = checked.config
    for warning in cfg.warnings:
        print(f"Warning: {warning}", file=sys.stderr)
    searcher_cfg = cfg.searcher_dict()
    if searcher_cfg is None:
        raise ConfigError("required to preview a search", field="searcher")
    seed = cfg.reproducibility.experiment_seed or 0
    try:
        plan = plan_search(
            searcher_cfg,
            cfg.hyperparameters_dict(),
            seed=seed,
            workers=args.workers,
            simulate_run=not args.no_simulate,
        )
    except ValueError as e:
        raise ConfigError(str(e), field="searcher") from None
    if args.json:
        import dataclasses

        out = dataclasses.asdict(plan)
        out["dry_run"] = {
            "pool": checked.pool.name,
            "pool_checked": checked.pool_known,
            "nodes": checked.job.spec.nodes,
            "gpus_per_node": checked.job.spec.gpus_per_node,
            "script": checked.job.script,
        }
        print(json.dumps(out, indent=2, default=str))
    else:
        print(f"Experiment config {args.config} is valid.")
        print(checks_summary(checked, args.master_config))
        print(job_summary(checked))
        print(format_plan(plan))
    return 0
