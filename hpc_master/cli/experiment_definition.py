"""`det experiment config | label add|remove | download-model-def`: what an experiment was created from, as
Determined's commands of those names show and change it.

``config`` prints the stored config (YAML; ``--json``); ``label`` reads the labels and writes them back with
``PATCH /api/v1/experiments/{id}``; ``download-model-def`` writes the uploaded context as
``experiment_{id}_model_def.tgz`` (``GET /api/v1/experiments/{id}/model_def``).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import os
from pathlib import Path

from hpc_master.cli._client import session_from_args
from hpc_master.cli._output import print_document
from hpc_master.errors import ClientError, ServerError


def register(exp_sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = exp_sub.add_parser("config", help="print the experiment's config (YAML; --json)")
    p.add_argument("experiment_id", metavar="ID", type=int)
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", dest="output", action="store_const", const="json", help="print JSON")
    form.add_argument(
        "--yaml", dest="output", action="store_const", const="yaml", help="print YAML (default)"
    )
    p.set_defaults(func=_config, output="yaml")

    p = exp_sub.add_parser("label", help="add or remove an experiment's labels")
    label_sub = p.add_subparsers(dest="label_action", metavar="ACTION", required=True)
    for action, help_text in (("add", "add a label"), ("remove", "remove a label")):
        q = label_sub.add_parser(action, help=help_text)
        q.add_argument("experiment_id", metavar="ID", type=int)
        q.add_argument("label")
        q.set_defaults(func=_label, add=action == "add")

    p = exp_sub.add_parser(
        "download-model-def", help="download the experiment's context (model definition) as a .tgz"
    )
    p.add_argument("experiment_id", metavar="ID", type=int)
    p.add_argument(
        "--output-dir", type=Path, default=Path("."), help="directory to write experiment_ID_model_def.tgz in"
    )
    p.set_defaults(func=_download_model_def)


def _config(args: argparse.Namespace) -> int:
    config = session_from_args(args).call("GET", f"/api/v1/experiments/{args.experiment_id}")["experiment"][
        "config"
    ]
    print_document(config, args.output)
    return 0


def _label(args: argparse.Namespace) -> int:
    label = args.label.strip()
    if not label:  # the master checks the rest (services.experiment_patch.check_labels)
        raise ClientError("a label must not be blank")
    session = session_from_args(args)
    path = f"/api/v1/experiments/{args.experiment_id}"
    labels = list(session.call("GET", path)["experiment"].get("labels") or [])
    wanted = [*labels, label] if args.add and label not in labels else labels
    if not args.add:
        wanted = [x for x in labels if x != label]
    if wanted != labels:
        session.call("PATCH", path, json={"labels": wanted})
    if args.add:
        print(f"Added label '{label}' to experiment {args.experiment_id}")
    else:
        print(f"Removed label '{label}' from experiment {args.experiment_id}")
    return 0


def _download_model_def(args: argparse.Namespace) -> int:
    if not args.output_dir.is_dir():
        raise ClientError(f"--output-dir {str(args.output_dir)!r} is not a directory")
    answer = session_from_args(args).call("GET", f"/api/v1/experiments/{args.experiment_id}/model_def")
    try:
        data = base64.b64decode(answer["b64Tgz"], validate=True)
    except (KeyError, TypeError, binascii.Error):
        raise ServerError("the master's answer has no valid b64Tgz") from None
    dest = args.output_dir / f"experiment_{args.experiment_id}_model_def.tgz"
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, dest)  # never a half-written file under the final name
    finally:
        tmp.unlink(missing_ok=True)
    print(f"Wrote {dest} ({len(data)} bytes)")
    return 0
