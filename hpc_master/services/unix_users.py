"""Master users of Unix accounts, for the logins that prove an account rather than a master user (munge,
``services.munge_login``; LDAP, ``services.ldap_login``): the master user mapped to the account, created at
its first login where the admin's rules allow it (``ProvisioningConfig``: everyone, members of listed Unix
groups, or nobody), admin or not by membership of a Unix group. Groups are the account's on the master's host
(NSS: ``/etc/group`` or the site's directory through ``sssd``/``nslcd``), the ones Slurm sees.
"""

from __future__ import annotations

import contextlib
import grp
import pwd
import secrets
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session

from hpc_master import auth
from hpc_master.db.models import UserModel
from hpc_master.errors import ClientError
from hpc_master.masterconf_security import ProvisioningConfig
from hpc_master.services import audit

Refusal = Callable[[str], ClientError]


def account_named(name: str, refused: Refusal) -> pwd.struct_passwd:
    """The Unix account ``name`` on the master's host; never root (root logs in with a password)."""
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        raise refused(f"the account {name!r} has no Unix account on the master's host") from None
    return _not_root(account, refused)


def account_of_uid(uid: int, refused: Refusal) -> pwd.struct_passwd:
    try:
        account = pwd.getpwuid(uid)
    except KeyError:
        raise refused(f"uid {uid} has no account on the master's host") from None
    return _not_root(account, refused)


def _not_root(account: pwd.struct_passwd, refused: Refusal) -> pwd.struct_passwd:
    if account.pw_uid == 0:
        raise refused("root does not log in so; use a password")
    return account


def user_for(
    session: Session, account: pwd.struct_passwd, rules: ProvisioningConfig, refused: Refusal, how: str
) -> UserModel:
    """The master user of ``account`` (created where ``rules`` allow), active, its admin right set from
    ``rules.admin_group`` when one is configured. ``how`` names the login in messages ("munge", "LDAP")."""
    groups = groups_of(account)
    user = user_of(session, account.pw_name, refused) or _first_login(session, account.pw_name, groups, rules, refused, how)  # fmt: skip
    if not user.active:
        raise refused(f"the master user {user.username!r} is deactivated")
    if rules.admin_group is not None and user.admin != (rules.admin_group in groups):
        user.admin = rules.admin_group in groups
        audit.record(
            session, actor_id=None, actor=how.lower(), action=f"{how} login: admin set from the Unix group "
            f"{rules.admin_group}", target=f"user {user.username}", owner=user.username, as_unix=account.pw_name,
            detail={"admin": user.admin},
        )  # fmt: skip
    session.flush()
    return user


def user_of(session: Session, account: str, refused: Refusal) -> UserModel | None:
    """The master user mapped to the Unix account: the only one, or the one of the same name."""
    mapped = list(session.scalars(select(UserModel).where(UserModel.unix_username == account)))
    if len(mapped) == 1:
        return mapped[0]
    named = [u for u in mapped if u.username == account]
    if named:
        return named[0]
    if mapped:
        raise refused(
            f"several master users are mapped to the Unix account {account!r} and none is named so; "
            "log in with a master user name and password"
        )
    return None


def groups_of(account: pwd.struct_passwd) -> set[str]:
    names = {g.gr_name for g in grp.getgrall() if account.pw_name in g.gr_mem}
    with contextlib.suppress(KeyError):  # a primary group without a name
        names.add(grp.getgrgid(account.pw_gid).gr_name)
    return names


def _first_login(
    session: Session, account: str, groups: set[str], rules: ProvisioningConfig, refused: Refusal, how: str
) -> UserModel:
    allowed = rules.create_users == "everyone" or (
        rules.create_users == "groups" and groups & set(rules.user_groups)
    )
    if not allowed:
        raise refused(
            f"the Unix account {account!r} has no master user, and this master creates none at a {how} login "
            f"(create_users: {rules.create_users}); ask an admin"
        )
    if session.scalar(select(UserModel).where(UserModel.username == account)) is not None:
        raise refused(
            f"a master user named {account!r} exists and is mapped to another Unix account; ask an admin"
        )
    user = UserModel(
        username=account,
        password_hash=auth.hash_password(secrets.token_urlsafe(32)),  # nobody knows it
        admin=False,
        active=True,
        unix_username=account,
    )
    session.add(user)
    audit.record(
        session, actor_id=None, actor=how.lower(), action=f"{how} login: first login creates the user",
        target=f"user {account}", owner=account, as_unix=account, detail={"groups": sorted(groups)},
    )  # fmt: skip
    return user
