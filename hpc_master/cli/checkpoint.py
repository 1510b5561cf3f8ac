"""`det checkpoint` (alias `c`): describe, download and delete.

The master does not stream checkpoint files: ``download`` copies the checkpoint's directory where it is
readable, on the shared filesystem (a login node mounts it as the compute nodes do). It looks for ``<uuid>``
under the experiment's ``checkpoint_storage`` (``host_path/storage_path``, ``storage_path``, ``host_path``) and
then under the master's default checkpoint root (``DET_CHECKPOINT_ROOT``, default ``~/hpc-det/checkpoints``).
The copy keeps the files' modes and times and never follows a link, is checked against the sizes the
checkpoint recorded (``resources``), gets the master's ``metadata.json`` (as Determined's download does), and
appears under its name only once complete.

``delete`` is Determined's ``DELETE /api/v1/checkpoints``: the master removes the files as the owner's account.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import shutil
import sys
from pathlib import Path
from typing import Any

from hpc_master import paths
from hpc_master.cli._client import Session, session_from_args
from hpc_master.cli._context import human_size
from hpc_master.cli._output import key_values, print_json, state
from hpc_master.errors import ClientError

METADATA_FILE = "metadata.json"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ckpt = sub.add_parser("checkpoint", aliases=["c"], help="inspect and download checkpoints")
    ckpt_sub = ckpt.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = ckpt_sub.add_parser("describe", help="show a checkpoint")
    p.add_argument("uuid", metavar="UUID")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_describe)

    p = ckpt_sub.add_parser("download", help="copy a checkpoint's files from the shared filesystem")
    p.add_argument("uuid", metavar="UUID")
    p.add_argument("-o", "--output-dir", type=Path, help="where to put it (default: checkpoints/UUID)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the path")
    p.set_defaults(func=_download)

    p = ckpt_sub.add_parser("delete", help="delete checkpoints (their files too)")
    p.add_argument("uuids", metavar="UUID", nargs="+", help="checkpoint uuids (or comma-separated lists)")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=_delete)


def _get(session: Session, uuid: str) -> dict[str, Any]:
    checkpoint: dict[str, Any] = session.call("GET", f"/api/v1/checkpoints/{uuid}")["checkpoint"]
    return checkpoint


def _describe(args: argparse.Namespace) -> int:
    c = _get(session_from_args(args), args.uuid)
    if args.json:
        print_json(c)
        return 0
    training = c.get("training") or {}
    resources = c.get("resources") or {}
    size = sum(v for v in resources.values() if isinstance(v, int)) if isinstance(resources, dict) else 0
    print(
        key_values(
            [
                ("UUID", c.get("uuid")),
                ("Experiment", training.get("experimentId")),
                ("Trial", training.get("trialId")),
                ("Run", training.get("trialRunId")),
                ("State", state(c.get("state"))),
                ("Steps completed", c.get("stepsCompleted")),
                ("Report time", c.get("reportTime")),
                ("Hyperparameters", training.get("hparams")),
                ("Validation metrics", avg_metrics(training.get("validationMetrics"))),
                ("Files", f"{len(resources)} ({human_size(size)})" if resources else ""),
                ("Metadata", c.get("metadata")),
                ("Deletion", _deletion_text(c.get("deletion"))),
            ]
        )
    )
    return 0


def avg_metrics(metrics: Any) -> Any:
    """The numbers of Determined's ``v1Metrics`` (``{"avgMetrics": {...}}``), as the master answers them."""
    if isinstance(metrics, dict) and isinstance(metrics.get("avgMetrics"), dict):
        return metrics["avgMetrics"]
    return metrics


def _deletion_text(deletion: Any) -> str:
    """A deletion that is wanted and not done: the last failure and when the master tries again."""
    if not isinstance(deletion, dict):
        return ""
    if not deletion.get("error"):
        return f"in progress (retried at {deletion.get('retryAt')} if it does not finish)"
    retry = f"; retried at {deletion['retryAt']}" if deletion.get("retryAt") else "; not retried"
    return f"failed {deletion.get('attempts', 0)} times: {deletion.get('error')}{retry}"


def candidate_dirs(uuid: str, experiment_config: dict[str, Any]) -> list[Path]:
    """Where the checkpoint may be on this machine, most specific first."""
    bases: list[str] = []
    storage = experiment_config.get("checkpoint_storage")
    if isinstance(storage, dict):
        host, sub = storage.get("host_path"), storage.get("storage_path")
        if isinstance(host, str) and isinstance(sub, str):
            bases.append(posixpath.join(host, sub))
        if isinstance(sub, str) and posixpath.isabs(sub):
            bases.append(sub)
        if isinstance(host, str):
            bases.append(host)
    bases.append(str(paths.get_checkpoint_root()))
    out: list[Path] = []
    for base in bases:
        path = Path(base).expanduser() / uuid
        if path not in out:
            out.append(path)
    return out


def _download(args: argparse.Namespace) -> int:
    download(session_from_args(args), args.uuid, args.output_dir, quiet=args.quiet)
    return 0


def download(session: Session, uuid: str, output_dir: Path | None, *, quiet: bool = False) -> Path:
    """Copy checkpoint `uuid` from the shared filesystem to `output_dir` (default ``checkpoints/UUID``)."""
    c = _get(session, uuid)
    if state(c.get("state")) in ("DELETED", "PARTIALLY_DELETED"):
        raise ClientError(f"checkpoint {uuid} is {state(c.get('state'))}; its files are gone")
    source = _readable_source(uuid, _experiment_config(session, c))
    target: Path = output_dir or Path("checkpoints") / uuid
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ClientError(f"{target} already exists and is not an empty directory")
    copy_checkpoint(source, target, c.get("resources") or {}, c.get("metadata") or {})
    if quiet:
        print(target)
    else:
        print(f"Downloaded checkpoint {uuid} to {target}")
    return target


def _experiment_config(session: Session, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The config of the checkpoint's experiment: sent with the checkpoint, else asked of the master."""
    training = checkpoint.get("training") or {}
    config: dict[str, Any] = training.get("experimentConfig") or {}
    if not config and training.get("experimentId") is not None:  # a master that does not send it
        experiment = session.call("GET", f"/api/v1/experiments/{training['experimentId']}")["experiment"]
        config = experiment.get("config") or {}
    return config


def _readable_source(uuid: str, experiment_config: dict[str, Any]) -> Path:
    """The first of :func:`candidate_dirs` that is a directory here."""
    candidates = candidate_dirs(uuid, experiment_config)
    source = next((p for p in candidates if p.is_dir()), None)
    if source is None:
        tried = ", ".join(str(p) for p in candidates)
        raise ClientError(
            f"checkpoint {uuid} is not readable on this machine (looked in {tried}); the master cannot "
            "stream checkpoint files yet: run this where the checkpoint storage is mounted"
        )
    return source


def copy_checkpoint(source: Path, target: Path, resources: dict[str, Any], metadata: dict[str, Any]) -> None:
    """Copy `source` into `target` through a hidden sibling renamed into place once complete: files keep
    their modes and times (``copy2``), links are copied as links (never followed), every file the checkpoint
    recorded must be there with its recorded size, and ``metadata.json`` is the master's record."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    if partial.exists():
        shutil.rmtree(partial)
    try:
        shutil.copytree(source, partial, symlinks=True)
        problems = check_copy(partial, resources)
        if problems:
            shown = "; ".join(problems[:5]) + (
                f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            )
            raise ClientError(f"the checkpoint's files in {source} are not what it recorded: {shown}")
        (partial / METADATA_FILE).write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n")
        if target.is_dir():
            target.rmdir()  # empty (checked by the caller)
        partial.rename(target)
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)


def check_copy(root: Path, resources: dict[str, Any]) -> list[str]:
    """Recorded files missing from the copy or of another size (``resources``: relative path → bytes;
    directories end with ``/``). ``metadata.json`` is rewritten anyway and not checked."""
    problems = []
    for rel, size in sorted(resources.items()):
        if rel.endswith("/") or rel == METADATA_FILE or not isinstance(size, int):
            continue
        path = root / rel
        if posixpath.isabs(rel) or ".." in Path(rel).parts or not path.is_file():
            problems.append(f"{rel} is missing")
        elif path.stat().st_size != size:
            problems.append(f"{rel} has {path.stat().st_size} bytes, {size} recorded")
    return problems


def _confirm_delete(count: int) -> bool:
    """Ask on a terminal whether to delete `count` checkpoints; refuse outright without one."""
    if not sys.stdin.isatty():
        raise ClientError("refusing to delete checkpoints without confirmation: pass --yes")
    answer = input(f"Delete {count} checkpoints and their files for good? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def _delete(args: argparse.Namespace) -> int:
    uuids = [u for arg in args.uuids for u in arg.split(",") if u.strip()]
    uuids = list(dict.fromkeys(u.strip() for u in uuids))
    if not args.yes and not _confirm_delete(len(uuids)):
        print("Not deleted.")
        return 1
    body = session_from_args(args).call("DELETE", "/api/v1/checkpoints", json={"checkpointUuids": uuids})
    failed = body.get("failed") or []
    for item in failed:
        print(f"Could not delete checkpoint {item.get('uuid')}: {item.get('error')}", file=sys.stderr)
    if failed:
        print(
            "The master records the failures and retries them; `det c describe UUID` shows them.",
            file=sys.stderr,
        )
        return 1
    print(f"Deleted {len(uuids)} checkpoints")
    return 0
