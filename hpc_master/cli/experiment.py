"""`det experiment` (alias `e`): create, list, describe, trials, checkpoints, logs, state changes, wait."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from hpc_master import priority
from hpc_master.cli import _follow, experiment_definition, experiment_set
from hpc_master.cli._client import UPLOAD_CHUNK_BYTES, Session, session_from_args
from hpc_master.cli._context import check_size, human_size, plan_context, read_context, warn_skipped
from hpc_master.cli._output import add_format_flags, emit, key_values, print_json, print_table, state
from hpc_master.errors import ClientError, ConfigError

PROGRESS_MIN_BYTES = 4 * 1024 * 1024


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    exp = sub.add_parser("experiment", aliases=["e"], help="manage experiments")
    exp_sub = exp.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = exp_sub.add_parser("create", help="create an experiment from a config file and a context directory")
    p.add_argument("config_file", metavar="CONFIG", help="experiment config (YAML)")
    p.add_argument("context", metavar="CONTEXT", help="context directory (model code) to upload")
    p.add_argument(
        "-f", "--follow-first-trial", action="store_true",
        help="stream the first trial's logs; exit 0 if it COMPLETED, 1 on ERROR, 4 if CANCELED, 5 otherwise",
    )  # fmt: skip
    p.add_argument("--paused", action="store_true", help="create the experiment paused")
    p.add_argument(
        "--config", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config field by dotted path; the value is read as YAML (repeatable)",
    )  # fmt: skip
    p.set_defaults(func=_create)

    p = exp_sub.add_parser("list", help="list your experiments (--all: everyone's, archived too)")
    p.add_argument("--all", "-a", action="store_true", help="all users' experiments, archived included")
    add_format_flags(p)
    p.set_defaults(func=_list)

    p = exp_sub.add_parser("describe", help="show an experiment and its trials")
    p.add_argument("experiment_id", metavar="ID", type=int)
    add_format_flags(p, csv=False)
    p.set_defaults(func=_describe)

    p = exp_sub.add_parser("list-trials", aliases=["lt"], help="list an experiment's trials")
    p.add_argument("experiment_id", metavar="ID", type=int)
    add_format_flags(p)
    p.set_defaults(func=_list_trials)

    p = exp_sub.add_parser("list-checkpoints", aliases=["lc"], help="list checkpoints, best first")
    p.add_argument("experiment_id", metavar="ID", type=int)
    p.add_argument("--best", type=int, metavar="N", help="only the N best (by the searcher metric)")
    add_format_flags(p)
    p.set_defaults(func=_list_checkpoints)

    p = exp_sub.add_parser("logs", help="the logs of the experiment's first trial")
    p.add_argument("experiment_id", metavar="ID", type=int)
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming until the trial ends")
    p.set_defaults(func=_logs)

    for name, verb, help_text in (
        ("pause", "Paused", "pause (trials checkpoint and stop; `activate` resumes them)"),
        ("activate", "Activated", "activate a paused experiment"),
        ("cancel", "Canceled", "cancel (trials checkpoint and stop for good)"),
        ("kill", "Killed", "kill (trials' jobs are cancelled at once)"),
        ("archive", "Archived", "hide a finished experiment from `list`"),
        ("unarchive", "Unarchived", "show an archived experiment again"),
    ):
        p = exp_sub.add_parser(name, help=help_text)
        p.add_argument("experiment_id", metavar="ID", type=int)
        p.set_defaults(func=_action, verb=name, past=verb)

    p = exp_sub.add_parser("delete", help="delete a finished experiment and its checkpoints")
    p.add_argument("experiment_id", metavar="ID", type=int)
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=_delete)

    p = exp_sub.add_parser(
        "wait", help="wait until the experiment ends; exit 0 COMPLETED, 1 ERROR, 4 CANCELED, 5 otherwise"
    )
    p.add_argument("experiment_id", metavar="ID", type=int)
    p.set_defaults(func=_wait)

    experiment_set.register(exp_sub)
    experiment_definition.register(exp_sub)


# ---------------------------------------------------------------- create


def apply_override(config: dict[str, Any], override: str) -> None:
    """``searcher.max_trials=4`` → ``config["searcher"]["max_trials"] = 4`` (the value read as YAML)."""
    key, sep, raw = override.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(
            f"--config {override!r}: expected KEY=VALUE with a dotted KEY (searcher.max_trials=4)"
        )
    from hpc_master.expconf import load_yaml

    try:
        value = load_yaml(raw)
    except ConfigError as err:
        raise ConfigError(f"--config {override!r}: the value is not valid YAML: {err}", field=key) from None
    parts = key.split(".")
    node: Any = config
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(
                f"--config {override!r}: `{'.'.join(parts[: i + 1])}` is not a mapping", field=key
            )
        node = child
    node[parts[-1]] = value


def load_config(path: Path, overrides: list[str]) -> tuple[str, list[str]]:
    """Read, override and validate the config locally; returns the YAML text to send and the warnings."""
    from hpc_master.expconf import YAMLConfigError, load_yaml, parse_experiment_config

    try:
        text = path.read_text()
    except OSError as err:
        raise ClientError(f"cannot read the config {str(path)!r}: {err.strerror}") from None
    try:
        data = load_yaml(text)  # as the master reads it: duplicate keys, size and alias expansion checked
    except YAMLConfigError as err:
        where = f" (line {err.line}, column {err.column})" if err.line is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {err.problem}") from None
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    if data is None:
        data = {}
    if overrides:
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the experiment config must be a YAML mapping")
        for override in overrides:
            apply_override(data, override)
        text = yaml.safe_dump(data, sort_keys=False)
    try:
        parsed = parse_experiment_config(data)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    return text, list(getattr(parsed, "warnings", []))


class Progress:
    """Upload progress on stderr: a live line on a terminal, one line per phase otherwise; silent when small."""

    def __init__(self, total_bytes: int, label: str) -> None:
        self.total = total_bytes
        self.label = label
        self.tty = sys.stderr.isatty()
        self.enabled = total_bytes > PROGRESS_MIN_BYTES
        if self.enabled and not self.tty:
            print(f"{label} {human_size(total_bytes)}...", file=sys.stderr, flush=True)

    def __call__(self, done: int) -> None:
        if self.enabled and self.tty:
            pct = 100 * done // max(self.total, 1)
            line = f"\r{self.label} {human_size(done)} / {human_size(self.total)} ({pct}%)"
            print(line, end="", file=sys.stderr, flush=True)

    def finish(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr, flush=True)


def _create(args: argparse.Namespace) -> int:
    config_path = Path(args.config_file)
    text, warnings = load_config(config_path, args.overrides)
    for warning in warnings:
        print(f"Warning: {warning}", file=sys.stderr)
    plan = plan_context(Path(args.context))
    warn_skipped(plan)
    check_size(plan)

    session = session_from_args(args)
    session.token()  # log in (and fail) before reading the files
    reading = Progress(plan.total_bytes, "Reading the context:")
    model_definition = read_context(plan, reading)
    reading.finish()
    body = json.dumps(
        {
            "config": text,
            "modelDefinition": model_definition,
            "activate": not args.paused,
            "projectId": 1,
        }
    ).encode()
    del model_definition
    uploading = Progress(len(body), "Uploading:")

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), UPLOAD_CHUNK_BYTES):
            yield body[start : start + UPLOAD_CHUNK_BYTES]
            uploading(min(start + UPLOAD_CHUNK_BYTES, len(body)))

    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    response = session.call("POST", "/api/v1/experiments", content=chunks, headers=headers)
    uploading.finish()
    # `configWarnings`: the master's own (Determined's `warnings` holds only its fixed enum values).
    for warning in [*(response.get("configWarnings") or []), *(response.get("warnings") or [])]:
        message = warning.get("message") if isinstance(warning, dict) else warning
        if message and message not in warnings:
            print(f"Warning: {message}", file=sys.stderr)
    experiment_id = int(response["experiment"]["id"])
    print(f"Created experiment {experiment_id}")
    if args.follow_first_trial:
        return _follow.follow_first_trial(session, experiment_id)
    return 0


# ---------------------------------------------------------------- queries

EXPERIMENT_HEADERS = ["ID", "Owner", "Name", "State", "Progress", "Archived", "Start Time", "End Time",
                      "Resource Pool"]  # fmt: skip


def _experiment_row(e: dict[str, Any]) -> list[Any]:
    progress = e.get("progress")
    return [
        e.get("id"),
        e.get("username"),
        e.get("name"),
        state(e.get("state")),
        f"{100 * progress:.1f}%" if isinstance(progress, int | float) else "",
        e.get("archived"),
        e.get("startTime"),
        e.get("endTime"),
        e.get("resourcePool"),
    ]


def _list(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    params: dict[str, Any] = {"limit": 200}
    if not args.all:
        params.update(users=[session.username], archived="false")
    experiments: list[dict[str, Any]] = []
    while True:
        body = session.call("GET", "/api/v1/experiments", params={**params, "offset": len(experiments)})
        page = body.get("experiments") or []
        experiments += page
        total = int((body.get("pagination") or {}).get("total", len(experiments)))
        if not page or len(experiments) >= total:
            break
    emit(args, EXPERIMENT_HEADERS, [_experiment_row(e) for e in experiments], {"experiments": experiments})
    return 0


TRIAL_HEADERS = ["Trial ID", "State", "H-Params", "Restarts", "Steps", "Searcher Metric", "Start Time",
                 "End Time", "Checkpoints"]  # fmt: skip


def trial_row(t: dict[str, Any]) -> list[Any]:
    return [
        t.get("id"),
        state(t.get("state")),
        t.get("hparams"),
        t.get("restarts"),
        t.get("stepsCompleted"),
        t.get("searcherMetricValue"),
        t.get("startTime"),
        t.get("endTime"),
        f"{t.get('checkpointCount') or 0} ({human_size(int(t.get('totalCheckpointSize') or 0))})",
    ]


def _trials(session: Session, experiment_id: int) -> list[dict[str, Any]]:
    body = session.call("GET", f"/api/v1/experiments/{experiment_id}/trials")
    trials: list[dict[str, Any]] = body["trials"]
    return trials


def _describe(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    body = session.call("GET", f"/api/v1/experiments/{args.experiment_id}")
    trials = _trials(session, args.experiment_id)
    if args.json:
        print_json({**body, "trials": trials})
        return 0
    e = body["experiment"]
    print(
        key_values(
            [
                ("Experiment", e.get("id")),
                ("Name", e.get("name")),
                ("Owner", e.get("username")),
                ("State", state(e.get("state"))),
                ("Archived", e.get("archived")),
                ("Searcher", f"{e.get('searcherType')} ({e.get('searcherMetric')})"),
                ("Resource pool", e.get("resourcePool")),
                ("Priority", priority.describe(_resources(e).get("priority"))),
                ("Start time", e.get("startTime")),
                ("End time", e.get("endTime")),
                ("Trials", body.get("trialCounts") or len(trials)),
                ("Checkpoints", storage_text(e)),
                ("GC policy", gc_policy_text(e.get("config") or {})),
            ]
        )
    )
    print()
    if _model_proposals(e, trials):
        # Where each trial's hyperparameters came from (`proposals: model`): the model, or a random sample.
        print_table([*TRIAL_HEADERS, "Proposal"], [[*trial_row(t), t.get("proposal") or ""] for t in trials])
    else:
        print_table(TRIAL_HEADERS, [trial_row(t) for t in trials])
    waiting = _waiting_trials(session, trials)
    if waiting:
        print()
        print("Waiting:")
        for trial_id, text in waiting:
            print(f"  trial {trial_id}: {text}")
    return 0


def _model_proposals(e: dict[str, Any], trials: list[dict[str, Any]]) -> bool:
    config = e.get("config")
    searcher = config.get("searcher") if isinstance(config, dict) else None
    wanted = isinstance(searcher, dict) and searcher.get("proposals") == "model"
    return wanted or any(t.get("proposal") == "model" for t in trials)


def _resources(e: dict[str, Any]) -> dict[str, Any]:
    config = e.get("config")
    resources = config.get("resources") if isinstance(config, dict) else None
    return resources if isinstance(resources, dict) else {}


def storage_text(e: dict[str, Any]) -> str:
    """ "3 kept (1.2 GB); 7 deleted (2.9 GB freed)" from Determined's ``checkpointSize``/``checkpointCount``."""
    kept = f"{e.get('checkpointCount') or 0} kept ({human_size(int(e.get('checkpointSize') or 0))})"
    deleted = int(e.get("deletedCheckpointCount") or 0)
    if not deleted:
        return kept
    return f"{kept}; {deleted} deleted ({human_size(int(e.get('deletedCheckpointSize') or 0))} freed)"


def gc_policy_text(config: dict[str, Any]) -> str:
    storage = config.get("checkpoint_storage")
    if not isinstance(storage, dict):
        return ""
    names = ("save_experiment_best", "save_trial_best", "save_trial_latest")
    return ", ".join(f"{n} {storage[n]}" for n in names if n in storage)


WAITING_SHOWN = 50
"""`e describe` asks for the runs of at most this many active trials, to say why they wait."""


def _waiting_trials(session: Session, trials: list[dict[str, Any]]) -> list[tuple[int, str]]:
    from hpc_master.cli.trial import waiting_text

    out: list[tuple[int, str]] = []
    for t in [t for t in trials if state(t.get("state")) == "ACTIVE"][:WAITING_SHOWN]:
        runs = session.call("GET", f"/api/v1/trials/{t['id']}")["trial"].get("runs") or []
        text = waiting_text(runs[-1]) if runs else None
        if text:
            out.append((int(t["id"]), text))
    return out


def _list_trials(args: argparse.Namespace) -> int:
    trials = _trials(session_from_args(args), args.experiment_id)
    emit(args, TRIAL_HEADERS, [trial_row(t) for t in trials], {"trials": trials})
    return 0


CHECKPOINT_HEADERS = ["Trial ID", "Steps", "UUID", "Searcher Metric", "State", "Report Time", "Size"]


def checkpoint_row(c: dict[str, Any]) -> list[Any]:
    training = c.get("training") or {}
    resources = c.get("resources") or {}
    size = sum(v for v in resources.values() if isinstance(v, int)) if isinstance(resources, dict) else 0
    size = int(c.get("size") or size)
    return [
        training.get("trialId"),
        c.get("stepsCompleted"),
        c.get("uuid"),
        training.get("searcherMetric"),
        state(c.get("state")),
        c.get("reportTime"),
        human_size(size) if resources else "",
    ]


def _list_checkpoints(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    params = {"limit": args.best} if args.best else None
    if args.best is not None and args.best < 1:
        raise ClientError("--best must be at least 1")
    body = session.call("GET", f"/api/v1/experiments/{args.experiment_id}/checkpoints", params=params)
    checkpoints = body.get("checkpoints") or []
    emit(args, CHECKPOINT_HEADERS, [checkpoint_row(c) for c in checkpoints], {"checkpoints": checkpoints})
    return 0


def _logs(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    experiment = _follow.get_experiment(session, args.experiment_id)
    trial_ids = experiment.get("trialIds") or []
    if not trial_ids:
        raise ClientError(f"experiment {args.experiment_id} has no trials yet")
    _follow.print_logs(session, int(trial_ids[0]), follow=args.follow)
    return 0


# ---------------------------------------------------------------- actions


def _action(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    session.call("POST", f"/api/v1/experiments/{args.experiment_id}/{args.verb}")
    print(f"{args.past} experiment {args.experiment_id}")
    return 0


def _delete(args: argparse.Namespace) -> int:
    if not args.yes:
        if not sys.stdin.isatty():
            raise ClientError("refusing to delete without confirmation: pass --yes")
        answer = input(f"Delete experiment {args.experiment_id} and all its checkpoints? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("Not deleted.")
            return 1
    session = session_from_args(args)
    session.call("DELETE", f"/api/v1/experiments/{args.experiment_id}")
    print(f"Deleted experiment {args.experiment_id}")
    return 0


def _wait(args: argparse.Namespace) -> int:
    end = _follow.wait_experiment(session_from_args(args), args.experiment_id)
    print(f"Experiment {args.experiment_id} ended: {end}")
    return _follow.exit_status(end)
