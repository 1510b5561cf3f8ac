"""`det master info`: the master's version and identity (no login needed)."""

from __future__ import annotations

import argparse

from hpc_master.cli._client import session_from_args
from hpc_master.cli._output import key_values, print_json


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    master = sub.add_parser("master", help="the master itself")
    master_sub = master.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = master_sub.add_parser("info", help="version, cluster id and address of the master")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_info)


def _info(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    info = session.call("GET", "/api/v1/master", auth=False)
    if args.json:
        print_json(info)
    else:
        print(key_values([("master", session.master), *info.items()]))
    return 0
