"""`det checkpoint` (alias `c`): describe and download.

The master does not stream checkpoint files (yet): ``download`` copies the checkpoint's directory when it is
readable here, on the shared filesystem. It looks for ``<uuid>`` under the experiment's ``checkpoint_storage``
(``host_path/storage_path``, ``storage_path``, ``host_path``) and then under the master's default checkpoint
root (``DET_CHECKPOINT_ROOT``, default ``~/hpc-det/checkpoints``).
"""

from __future__ import annotations

import argparse
import posixpath
import shutil
from pathlib import Path
from typing import Any

from hpc_master import paths
from hpc_master.cli._client import Session, session_from_args
from hpc_master.cli._context import human_size
from hpc_master.cli._output import key_values, print_json, state
from hpc_master.errors import ClientError


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
    p.set_defaults(func=_download)


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
                ("Validation metrics", training.get("validationMetrics")),
                ("Files", f"{len(resources)} ({human_size(size)})" if resources else ""),
                ("Metadata", c.get("metadata")),
            ]
        )
    )
    return 0


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
    session = session_from_args(args)
    c = _get(session, args.uuid)
    if state(c.get("state")) in ("DELETED", "PARTIALLY_DELETED"):
        raise ClientError(f"checkpoint {args.uuid} is {state(c.get('state'))}; its files are gone")
    experiment_id = (c.get("training") or {}).get("experimentId")
    config: dict[str, Any] = {}
    if experiment_id is not None:
        experiment = session.call("GET", f"/api/v1/experiments/{experiment_id}")["experiment"]
        config = experiment.get("config") or {}
    candidates = candidate_dirs(args.uuid, config)
    source = next((p for p in candidates if p.is_dir()), None)
    if source is None:
        tried = ", ".join(str(p) for p in candidates)
        raise ClientError(
            f"checkpoint {args.uuid} is not readable on this machine (looked in {tried}); the master cannot "
            "stream checkpoint files yet: run this where the checkpoint storage is mounted"
        )
    target: Path = args.output_dir or Path("checkpoints") / args.uuid
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ClientError(f"{target} already exists and is not an empty directory")
    shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
    print(f"Downloaded checkpoint {args.uuid} to {target}")
    return 0
