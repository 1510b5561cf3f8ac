"""Researcher accounts made by `det deploy local up --create-user`, and what `down` leaves of them.

`down` removes an account `up` created, but its home only when it holds nothing but what `useradd` copied there
(`cleanup.extra_entries`): a researcher's files are never deleted. A later `up` that creates the account again
finds the kept home and gives the account the home's owner uid (when no other account has it), so the researcher
owns their files again.
"""

from __future__ import annotations

import logging
import pwd
from dataclasses import dataclass
from pathlib import Path

from local_cluster import cleanup, system

log = logging.getLogger(__name__)

MAIL_DIR = Path("/var/mail")


@dataclass(frozen=True)
class NewAccount:
    name: str
    home: str
    # What `useradd --create-home` put in the home (`cleanup.manifest`); None when the home was already there.
    skeleton: dict[str, str] | None


def default_home(name: str) -> Path:
    """Where `useradd --create-home` puts the home of a new account (`useradd -D`: HOME=/home by default)."""
    out = system.run(["useradd", "-D"], check=False).stdout
    base = next((line.split("=", 1)[1] for line in out.splitlines() if line.startswith("HOME=")), "/home")
    return Path(base.strip() or "/home") / name


def ensure(name: str) -> NewAccount | None:
    """Create a plain (non-root) account unless it exists; returns what was created, None if nothing was."""
    try:
        pwd.getpwnam(name)
        return None
    except KeyError:
        pass
    home = default_home(name)
    cmd = ["useradd", "--create-home", "--shell", "/bin/bash"]
    home_existed = home.exists() or home.is_symlink()
    if home_existed:
        cmd += _reuse_owner_uid(name, home)
    system.run([*cmd, name])
    home = Path(pwd.getpwnam(name).pw_dir)
    return NewAccount(name, str(home), None if home_existed else cleanup.manifest(home))


def _reuse_owner_uid(name: str, home: Path) -> list[str]:
    """A home kept by an earlier `down`: give the new account its owner's uid, unless another account has it."""
    uid = home.lstat().st_uid
    try:
        other = pwd.getpwuid(uid).pw_name
    except KeyError:
        log.info(
            "%s already exists (kept by an earlier `down`?): the account %s gets its owner uid %d",
            home,
            name,
            uid,
        )
        return ["--uid", str(uid)]
    log.warning(
        "%s already exists and belongs to %s (uid %d): the new account %s does not own it",
        home,
        other,
        uid,
        name,
    )
    return []


def remove(name: str, skeletons: dict[str, dict[str, str]] | None) -> list[cleanup.Kept]:
    """Delete an account `up` created (never with `userdel --remove`) and its home if nothing but the skeleton.

    `skeletons` maps each home `up` created to what `useradd` put there; None for a state file written before
    homes were recorded: then the home is compared with /etc/skel as it is now.
    """
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return []
    home = Path(pw.pw_dir)
    kept = [k for k in [_remove_empty_mail_spool(name, pw.pw_uid)] if k]
    proc = system.run(["userdel", name], check=False)
    if proc.returncode != 0:
        why = f"`userdel {name}` failed: {proc.stderr.strip() or proc.stdout.strip()}"
        return [*kept, cleanup.Kept(f"the account {name}", why)]
    kept_home = _remove_home(name, home, skeletons)
    if kept_home is None:
        return kept
    return [*kept, kept_home]


def _remove_home(name: str, home: Path, skeletons: dict[str, dict[str, str]] | None) -> cleanup.Kept | None:
    """The removed account's home is deleted when it holds nothing but its skeleton (see `remove`); what is kept,
    and why, otherwise (None when there is no home directory)."""
    if not home.is_dir() or home.is_symlink():
        return None
    if skeletons is None:
        skeleton: dict[str, str] | None = cleanup.manifest(Path("/etc/skel"))
    else:
        skeleton = skeletons.get(str(home))
    if skeleton is None:
        return cleanup.Kept(str(home), f"the home of the removed account {name} existed before `up`")
    extra = cleanup.extra_entries(home, skeleton)
    if extra:
        why = f"the home of the removed account {name} holds files `up` did not put there: {', '.join(extra)}"
        return cleanup.Kept(str(home), why)
    cleanup.remove_own_dir(home)
    return None


def _remove_empty_mail_spool(name: str, uid: int) -> cleanup.Kept | None:
    """The account's mail spool (useradd makes an empty one where CREATE_MAIL_SPOOL=yes): removed while empty."""
    spool = MAIL_DIR / name
    try:
        st = spool.lstat()
    except OSError:
        return None
    if not spool.is_file() or spool.is_symlink() or st.st_uid != uid:
        return None
    if st.st_size:
        return cleanup.Kept(str(spool), f"the mail spool of the removed account {name} holds mail")
    spool.unlink()
    return None
