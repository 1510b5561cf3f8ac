"""`det master info`: the master's version and identity (no login needed); `det master config`: its effective
configuration, secrets masked (admins); `det master logs`: its recent log (admins); `det version`: this client's
version and the master's."""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import PackageNotFoundError, version

from hpc_master.cli._client import session_from_args
from hpc_master.cli._output import key_values, print_document, print_json
from hpc_master.errors import ClientError, DetError, ServerError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    master = sub.add_parser("master", help="the master itself")
    master_sub = master.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = master_sub.add_parser("info", help="version, cluster id and address of the master")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_info)
    p = master_sub.add_parser(
        "config", help="the master's effective configuration, secrets masked (admins only)"
    )
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", dest="output", action="store_const", const="json", help="print JSON")
    form.add_argument(
        "--yaml", dest="output", action="store_const", const="yaml", help="print YAML (default)"
    )
    form.add_argument("-o", "--output", choices=("yaml", "json"), help="output format (as Determined's CLI)")
    p.set_defaults(func=_config, output="yaml")
    p = master_sub.add_parser("logs", help="the master's recent log (admins only)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new entries")
    p.add_argument("--tail", type=int, metavar="N", help="only the last N entries")
    p.set_defaults(func=_logs)

    p = sub.add_parser("version", help="this client's version and the master's")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_version)


def _info(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    info = session.call("GET", "/api/v1/master", auth=False)
    if args.json:
        print_json(info)
    else:
        print(key_values([("master", session.master), *info.items()]))
    return 0


def _config(args: argparse.Namespace) -> int:
    config = session_from_args(args).call("GET", "/api/v1/master/config")["config"]
    print_document(config, args.output)
    return 0


def _logs(args: argparse.Namespace) -> int:
    if args.tail is not None and args.tail < 1:
        raise ClientError("--tail takes a number of entries, 1 or more")
    params: dict[str, str | int] = {"follow": "true" if args.follow else "false"}
    if args.tail:
        params["offset"] = -args.tail
    with session_from_args(args).stream_lines("/api/v1/master/logs", params) as lines:
        for raw in lines:
            if not raw.strip():
                continue
            item = json.loads(raw)
            if "error" in item:
                raise ServerError(f"the log stream failed: {item['error']}")
            entry = item["result"]["logEntry"]
            level = str(entry.get("level", "")).removeprefix("LOG_LEVEL_")
            print(f"{entry['timestamp']} [{level}]: {entry['message']}", flush=True)
    return 0


def client_version() -> str:
    try:
        return version("hpc-det")
    except PackageNotFoundError:  # a checkout run without installing it
        return "unknown (not installed)"


def _version(args: argparse.Namespace) -> int:
    """As Determined's ``det version``: the client's version, the master's info and address (YAML or JSON)."""
    session = session_from_args(args)
    info: dict[str, object] = {"client": {"version": client_version()}, "master": {}, "master_address": ""}
    try:
        info["master"] = session.call("GET", "/api/v1/master", auth=False)
    except DetError as err:  # say so, and still print the client's
        print(f"Master not found at {session.master}: {err}", file=sys.stderr)
    info["master_address"] = session.master
    print_document(info, "json" if args.json else "yaml")
    return 0
