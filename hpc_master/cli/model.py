"""`det model` (alias `m`): the model registry, with Determined's commands and flags.

``create NAME [--description]``, ``list [--sort-by] [--order-by] [-w]``, ``describe NAME [--version N]``,
``register-version NAME UUID``, ``list-versions NAME``, ``delete NAME``; ``--json`` where Determined has it
(``list``, ``create`` and ``describe`` print the model objects; ``register-version`` and ``list-versions`` the
master's whole answer). NAME is a model's name, or its id. A registered checkpoint is never
garbage-collected; deleting the model makes its versions' checkpoints collectible again.
"""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from hpc_master.cli._client import Session, session_from_args
from hpc_master.cli._output import key_values, print_json, print_table

SORT_FIELDS = ("name", "description", "creation_time", "last_updated_time")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    model = sub.add_parser("model", aliases=["m"], help="manage models (the model registry)")
    model_sub = model.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = model_sub.add_parser("list", aliases=["ls"], help="list all models in the registry")
    p.add_argument("-w", "--workspace-names", help="list models in given list of comma-separated workspaces")
    p.add_argument(
        "--sort-by", choices=SORT_FIELDS, default="last_updated_time", help="sort models by the given field"
    )
    p.add_argument(
        "--order-by",
        choices=("asc", "desc"),
        default="asc",
        help="order models in either ascending or descending order",
    )
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=_list)

    p = model_sub.add_parser("create", help="create model")
    p.add_argument("name", help="unique name of the model")
    p.add_argument("-w", "--workspace-name", help="workspace (only the default one, Uncategorized, here)")
    p.add_argument("--description", default="", help="description of the model")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=_create)

    p = model_sub.add_parser("describe", help="describe model")
    p.add_argument("name", help="name (or id) of model to describe")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.add_argument(
        "--version",
        type=int,
        default=-1,
        help="model version information to include in output (default: the latest)",
    )
    p.set_defaults(func=_describe)

    p = model_sub.add_parser("register-version", help="register a new version of a model")
    p.add_argument("name", help="name (or id) of the model")
    p.add_argument("uuid", help="uuid to register as the next version of the model")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=_register_version)

    p = model_sub.add_parser("list-versions", help="list the versions of a model")
    p.add_argument("name", help="unique name (or id) of the model")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=_list_versions)

    p = model_sub.add_parser("delete", help="delete model (its checkpoints become collectible again)")
    p.add_argument("name", help="unique name (or id) of the model")
    p.set_defaults(func=_delete)


def _path(name: str, *rest: str) -> str:
    return "/".join(["/api/v1/models", quote(name, safe=""), *rest])


def _get_model(session: Session, name: str) -> dict[str, Any]:
    model: dict[str, Any] = session.call("GET", _path(name))["model"]
    return model


def render_model(model: dict[str, Any]) -> None:
    print(
        key_values(
            [
                ("ID", model.get("id")),
                ("Name", model.get("name")),
                ("Description", model.get("description")),
                ("Owner", model.get("username")),
                ("Workspace ID", model.get("workspaceId")),
                ("Creation Time", model.get("creationTime")),
                ("Last Updated Time", model.get("lastUpdatedTime")),
                ("Versions", model.get("numVersions")),
                ("Labels", ", ".join(model.get("labels") or [])),
                ("Archived", model.get("archived")),
                ("Metadata", model.get("metadata") or {}),
            ]
        )
    )


def render_versions(versions: list[dict[str, Any]]) -> None:
    rows = []
    for v in versions:
        ckpt = v.get("checkpoint") or {}
        training = ckpt.get("training") or {}
        validation = training.get("validationMetrics")
        if isinstance(validation, dict) and isinstance(validation.get("avgMetrics"), dict):
            validation = validation["avgMetrics"]
        rows.append(
            [
                v.get("version"),
                training.get("trialId"),
                ckpt.get("stepsCompleted", (ckpt.get("metadata") or {}).get("steps_completed")),
                ckpt.get("uuid"),
                validation,
                ckpt.get("metadata"),
            ]
        )
    print_table(
        ["Version #", "Trial ID", "Batch #", "Checkpoint UUID", "Validation Metrics", "Metadata"], rows
    )


def _list(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {
        "sortBy": f"SORT_BY_{args.sort_by.upper()}",
        "orderBy": f"ORDER_BY_{args.order_by.upper()}",
    }
    if args.workspace_names is not None:
        params["workspaceNames"] = [w.strip() for w in args.workspace_names.split(",") if w.strip()]
    models: list[dict[str, Any]] = session_from_args(args).call("GET", "/api/v1/models", params=params)[
        "models"
    ]
    if args.json:
        print_json(models)
        return 0
    headers = ["ID", "Name", "Workspace ID", "Creation Time", "Last Updated Time", "Metadata"]
    print_table(
        headers,
        [
            [m.get("id"), m.get("name"), m.get("workspaceId"), m.get("creationTime"), m.get("lastUpdatedTime"),
             m.get("metadata") or {}]
            for m in models
        ],
    )  # fmt: skip
    return 0


def _create(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"name": args.name, "description": args.description}
    if args.workspace_name:
        body["workspaceName"] = args.workspace_name
    model = session_from_args(args).call("POST", "/api/v1/models", json=body)["model"]
    if args.json:
        print_json(model)
    else:
        render_model(model)
    return 0


def _describe(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    model = _get_model(session, args.name)
    if args.json:
        print_json(model)
        return 0
    if args.version == -1:
        params = {"limit": 1, "sortBy": "SORT_BY_VERSION", "orderBy": "ORDER_BY_DESC"}
        versions = session.call("GET", _path(args.name, "versions"), params=params)["modelVersions"]
    else:
        versions = [session.call("GET", _path(args.name, "versions", str(args.version)))["modelVersion"]]
    render_model(model)
    if versions:
        print()
        render_versions(versions)
    return 0


def _register_version(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    answer = session.call("POST", _path(args.name, "versions"), json={"checkpointUuid": args.uuid})
    if args.json:
        print_json(answer)
        return 0
    version = answer["modelVersion"]
    render_model(version["model"])
    print()
    render_versions([version])
    return 0


def _list_versions(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    if args.json:  # the master's answer as it comes (oldest first), as Determined's
        print_json(session.call("GET", _path(args.name, "versions")))
        return 0
    params = {"sortBy": "SORT_BY_VERSION", "orderBy": "ORDER_BY_DESC"}  # newest first, as Determined's
    answer = session.call("GET", _path(args.name, "versions"), params=params)
    render_model(answer["model"])
    print()
    render_versions(answer["modelVersions"])
    return 0


def _delete(args: argparse.Namespace) -> int:
    session_from_args(args).call("DELETE", _path(args.name))
    print(f"Deleted model {args.name}")
    return 0
