"""Who the master is: a personal master (its owner's account, which runs every job), or a shared one that acts
for its users — as its service account, doing everything in a user's name through the per-user helper under
``sudo`` — or, deprecated, as root (the helper through ``runuser``).

A master started as root with a service account (``service_account``, or the default ``hpc-det`` where that
account exists) switches to it before it opens its database or a socket: `become` sets its groups, gid and
uid for good. It keeps ``HOME`` (its default directories stay where they were) and names the account in
``USER``/``LOGNAME``. `sudoers` writes the one rule the service account needs: the helper's exact command
line, as the members of one group, without a password, a shell or the caller's environment.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import sys
from dataclasses import dataclass
from pathlib import Path

from hpc_master.errors import ConfigError
from hpc_master.helper_client import helper_command
from hpc_master.masterconf import MasterConfig

log = logging.getLogger(__name__)

DEFAULT_ACCOUNT = "hpc-det"
DEFAULT_USERS_GROUP = "hpc-det-users"
SUDOERS_FILE = "/etc/sudoers.d/hpc-det"


@dataclass(frozen=True)
class Identity:
    """`acts_for_users`: jobs run as their owners' accounts; `via`: how the helper becomes one (``sudo`` from
    the service `account`, ``runuser`` from root); `switch`: the master is root now and becomes `account`."""

    acts_for_users: bool
    via: str = "sudo"
    account: str | None = None
    switch: bool = False


def identity_for(config: MasterConfig, euid: int | None = None) -> Identity:
    euid = os.geteuid() if euid is None else euid
    named = config.service_account
    if euid == 0:
        account = named or (DEFAULT_ACCOUNT if _exists(DEFAULT_ACCOUNT) else None)
        if account is None:
            return Identity(acts_for_users=True, via="runuser")
        pw = _account(account)
        return Identity(acts_for_users=True, via="sudo", account=pw.pw_name, switch=True)
    me = pwd.getpwuid(euid).pw_name
    if named is None:
        return Identity(acts_for_users=False)
    if named != me:
        raise ConfigError(
            f"the master runs as {me!r}, not as its service account {named!r}: start it as root (it "
            f"switches) or as {named!r}",
            field="service_account",
        )
    return Identity(acts_for_users=True, via="sudo", account=me)


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _account(name: str) -> pwd.struct_passwd:
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise ConfigError(
            f"no account {name!r} on this host: create it (useradd --system {name}, docs/admin.md)",
            field="service_account",
        ) from None
    if pw.pw_uid == 0:
        raise ConfigError("the service account must not be root", field="service_account")
    return pw


def become(identity: Identity, writable: list[Path]) -> None:
    """Switch a root master to its service account (no way back), or say that it stays root; then check that
    it can write its own directories (an upgrade from a root master: `docs/admin.md` says to chown them)."""
    if identity.acts_for_users and identity.via == "runuser":
        log.warning(
            "running as root: create the service account %r and install the sudoers rule of "
            "`det-master --print-sudoers` to serve without root (docs/admin.md)", DEFAULT_ACCOUNT,
        )  # fmt: skip
        return
    if not identity.acts_for_users:
        return  # a personal master
    assert identity.account is not None
    if _no_new_privileges():
        raise ConfigError(
            f"the master would serve as {identity.account!r}, but the no-new-privileges flag is set (the systemd "
            "unit's NoNewPrivileges=yes): sudo could not run the per-user helper. Add the drop-in of "
            "docs/admin.md (A service account: User=, NoNewPrivileges=no)",
            field="service_account",
        )
    if not identity.switch:
        _check_helper(identity.account)
        log.info("serving as the service account %s; users' work goes through sudo", identity.account)
        return
    pw = pwd.getpwnam(identity.account)
    os.initgroups(pw.pw_name, pw.pw_gid)
    os.setresgid(pw.pw_gid, pw.pw_gid, pw.pw_gid)
    os.setresuid(pw.pw_uid, pw.pw_uid, pw.pw_uid)
    os.environ["USER"] = os.environ["LOGNAME"] = pw.pw_name
    _check_helper(pw.pw_name)
    log.info(
        "serving as the service account %s (uid %d); users' work goes through sudo", pw.pw_name, pw.pw_uid
    )
    blocked = [str(p) for p in writable if p.exists() and not os.access(p, os.W_OK | os.X_OK)]
    if blocked:
        raise ConfigError(
            f"the service account {pw.pw_name!r} cannot write {', '.join(blocked)}: as root, run "
            f"`chown -R {pw.pw_name}: {' '.join(blocked)}` once (docs/admin.md, upgrading a root master)",
            field="service_account",
        )


def _check_helper(account: str) -> None:
    """Refuse to serve where the service account could change the helper it runs as every user."""
    from hpc_master import helper_integrity

    found = helper_integrity.check(account, os.geteuid(), [*os.getgroups(), os.getegid()])
    if found:
        raise ConfigError(
            "the per-user helper must be root's and not writable by the service account: "
            + "; ".join(found[:5])
            + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
            + " (install the software as root, docs/admin.md)",
            field="service_account",
        )


def _no_new_privileges() -> bool:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return False
    return any(line.split() == ["NoNewPrivs:", "1"] for line in status.splitlines())


def sudoers(config: MasterConfig, *, account: str, users_group: str, python: str = sys.executable) -> str:
    """The sudoers drop-in of a shared master: `account` may run the helper's exact command line (its roots
    this config's) as any member of `users_group`, and nothing else."""
    roots = [str(config.job_storage_dir()), str(config.checkpoint_dir())]
    command = " ".join(_sudoers_escape(a) for a in helper_command(roots, python))
    # Aliases are global to all of sudoers' files: one named for this rule keeps two masters' drop-ins on one
    # host (a test's beside the admin's) from defining it twice, which makes sudo refuse every rule.
    digest = hashlib.sha256(f"{account} {users_group} {command}".encode()).hexdigest()[:8].upper()
    alias = f"HPC_DET_HELPER_{digest}"
    return "\n".join([
        f"# {SUDOERS_FILE}: the hpc-det master's service account runs its per-user helper as a member of",
        f"# {users_group}, nothing else (written by `det-master --print-sudoers`; install with",
        f"# `visudo -cf FILE && install -m 0440 FILE {SUDOERS_FILE}`). No password, no shell, the caller's",
        "# environment reset; every run is logged by sudo (add `Defaults:ACCOUNT log_output` for its output).",
        f"Cmnd_Alias {alias} = {command}",
        f"Defaults!{alias} !requiretty, env_reset, !use_pty",
        f"{account} ALL=(%{users_group}) NOPASSWD: {alias}",
        "",
    ])  # fmt: skip


def _sudoers_escape(arg: str) -> str:
    """A command-line argument as sudoers matches it literally (its special characters escaped)."""
    if any(c.isspace() for c in arg):
        raise ConfigError(f"a path with white space cannot be named in a sudoers rule: {arg!r}")
    return "".join("\\" + c if c in '\\,:=*?[]!"' else c for c in arg)
