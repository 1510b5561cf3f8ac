"""`det master info`: the master's version and identity (no login needed); `det master config`: its effective
configuration, secrets masked (admins)."""

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
    if args.output == "json":
        print_json(config)
    else:
        import yaml

        print(yaml.safe_dump(config, sort_keys=False, default_flow_style=False), end="")
    return 0
