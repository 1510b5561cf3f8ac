"""`det user` (alias `u`): login, logout, whoami, list, create, change-password, activate, deactivate."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from typing import Any

from hpc_master.cli._client import (
    ApiError,
    Session,
    cached_token,
    drop_token,
    session_from_args,
)
from hpc_master.cli._output import add_format_flags, emit
from hpc_master.errors import ClientError, NotFoundError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    user = sub.add_parser("user", aliases=["u"], help="log in and manage users")
    user_sub = user.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = user_sub.add_parser(
        "login",
        help="log in (the password is prompted, or read from DET_PASS); with no user name, as this Unix "
        "account by munge where the master allows it",
    )
    p.add_argument("username", metavar="USERNAME", nargs="?")
    p.set_defaults(func=_login)

    p = user_sub.add_parser("logout", help="log out and forget the cached token")
    p.set_defaults(func=_logout)

    p = user_sub.add_parser("whoami", help="which user you act as on this master")
    p.set_defaults(func=_whoami)

    p = user_sub.add_parser("list", help="list users")
    add_format_flags(p, csv=False)
    p.set_defaults(func=_list)

    p = user_sub.add_parser("create", help="create a user (admin only)")
    p.add_argument("username", metavar="USERNAME")
    p.add_argument("--admin", action="store_true", help="give the user admin rights")
    p.add_argument("--unix-username", metavar="U", help="the Unix account the user's jobs run as")
    p.add_argument("--password", help="initial password (default: blank, if the master allows it)")
    p.set_defaults(func=_create)

    p = user_sub.add_parser("change-password", help="set a password (yours, or any user's as admin)")
    p.add_argument("username", metavar="USERNAME", nargs="?")
    p.set_defaults(func=_change_password)

    p = user_sub.add_parser(
        "edit", help="change a user's Unix account, display name or admin flag (admin only)"
    )
    p.add_argument("username", metavar="USERNAME")
    p.add_argument("--unix-username", metavar="U", help="the Unix account the user's jobs run as")
    p.add_argument("--display-name", metavar="NAME")
    admin = p.add_mutually_exclusive_group()
    admin.add_argument("--admin", dest="admin", action="store_true", default=None, help="make an admin")
    admin.add_argument("--no-admin", dest="admin", action="store_false", help="remove admin rights")
    p.set_defaults(func=_edit)

    for name, active in (("activate", True), ("deactivate", False)):
        p = user_sub.add_parser(name, help=f"{name} a user (admin only)")
        p.add_argument("username", metavar="USERNAME")
        p.set_defaults(func=_set_active, active=active)


def _login(args: argparse.Namespace) -> int:
    username = args.username or args.user
    if not username:  # this Unix account, by munge, where the master takes it (security.munge)
        by_munge = Session(args.master, None).munge_login()
        if by_munge is not None:
            print(f"Logged in as {by_munge!r} on {args.master} (munge: this Unix account)")
            return 0
        if not sys.stdin.isatty():
            raise ClientError("give the user name: det user login USERNAME")
        username = input("Username: ").strip()
    session = Session(args.master, username)
    session.check_peer()  # before asking for a password that would not be sent
    password = os.environ.get("DET_PASS")
    if password is None:
        if not sys.stdin.isatty():
            raise ClientError(f"no password for {username!r}: type it at a terminal, or set DET_PASS")
        password = getpass.getpass(f"Password for user '{username}': ")
    session.login(username, password)
    print(f"Logged in as {username!r} on {session.master}")
    return 0


def _logout(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    username = session.username
    token = cached_token(session.master, username)
    if token is None:
        print(f"Not logged in as {username!r} on {session.master}")
        drop_token(session.master, username)
        return 0
    try:
        session.call("POST", "/api/v1/auth/logout", headers={"Authorization": f"Bearer {token}"}, auth=False)
    except ApiError as err:
        if err.http_status != 401:  # an expired token is as good as logged out
            raise
    finally:
        drop_token(session.master, username)
    print(f"Logged out {username!r} from {session.master}")
    return 0


def _whoami(args: argparse.Namespace) -> int:
    me = session_from_args(args).call("GET", "/api/v1/me")["user"]
    print(f"You are logged in as user {me['username']!r}")
    return 0


def _users(session: Session) -> list[dict[str, Any]]:
    users: list[dict[str, Any]] = session.call("GET", "/api/v1/users")["users"]
    return users


def _find(session: Session, username: str) -> dict[str, Any]:
    for user in _users(session):
        if user.get("username") == username:
            return user
    raise NotFoundError(f"user {username!r} not found", field="username")


def _list(args: argparse.Namespace) -> int:
    users = _users(session_from_args(args))
    rows = [
        [u.get("id"), u.get("username"), u.get("admin"), u.get("active"), u.get("unixUsername"),
         u.get("displayName")]
        for u in users
    ]  # fmt: skip
    emit(args, ["ID", "Username", "Admin", "Active", "Unix User", "Display Name"], rows, {"users": users})
    return 0


def _create(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    new: dict[str, Any] = {"username": args.username, "admin": args.admin, "active": True}
    if args.unix_username:
        new["unixUsername"] = args.unix_username
        new["agentUserGroup"] = {"agentUser": args.unix_username}
    body = session.call("POST", "/api/v1/users", json={"user": new, "password": args.password or ""})
    print(f"Created user {body['user']['username']!r} (id {body['user']['id']})")
    return 0


def _change_password(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    username = args.username or session.username
    target = _find(session, username)
    password = getpass.getpass(f"New password for user '{username}': ")
    if getpass.getpass("Confirm password: ") != password:
        raise ClientError("the passwords do not match; nothing changed")
    session.call("PATCH", f"/api/v1/users/{target['id']}", json={"password": password})
    print(f"Password changed for user {username!r}")
    return 0


def _set_active(args: argparse.Namespace) -> int:
    session = session_from_args(args)
    target = _find(session, args.username)
    session.call("PATCH", f"/api/v1/users/{target['id']}", json={"active": args.active})
    print(f"{'Activated' if args.active else 'Deactivated'} user {args.username!r}")
    return 0


def _edit(args: argparse.Namespace) -> int:
    patch: dict[str, Any] = {}
    if args.unix_username:
        patch.update(unixUsername=args.unix_username, agentUserGroup={"agentUser": args.unix_username})
    if args.display_name is not None:
        patch["displayName"] = args.display_name
    if args.admin is not None:
        patch["admin"] = args.admin
    if not patch:
        raise ClientError("nothing to change: give --unix-username, --display-name, --admin or --no-admin")
    session = session_from_args(args)
    target = _find(session, args.username)
    session.call("PATCH", f"/api/v1/users/{target['id']}", json=patch)
    print(f"Updated user {args.username!r}")
    return 0
