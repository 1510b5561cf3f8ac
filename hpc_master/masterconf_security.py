"""The master configuration's base model and its security section (``master.yaml``'s ``security``), apart from
``masterconf`` so that each stays readable in one sitting; ``masterconf`` re-exports them."""

from __future__ import annotations

import importlib.util
import ipaddress
from typing import Literal
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, model_validator

from hpc_master.expconf._base import StrictModel as ConfigModel


class StrictModel(ConfigModel):
    """The config models' one base (``expconf._base``: unknown keys refused with the closest valid key), made
    immutable, and lax about types: environment overrides arrive as strings (``DET_LISTEN_PORT=8080``). A
    ``null`` is kept (it is not "the default" here, as it is in an experiment config)."""

    model_config = ConfigDict(extra="forbid", strict=False, frozen=True, populate_by_name=False)
    keep_none = True


class ProvisioningConfig(StrictModel):
    """What a login that proves a Unix account (munge, LDAP) does with an account the master has not seen, and
    who is admin (``services.unix_users``)."""

    enabled: bool = False
    create_users: Literal["nobody", "everyone", "groups"] = "nobody"
    """Whether a Unix account's first login this way creates its master user (mapped to that account): for
    ``everyone``, for members of ``user_groups``, or for ``nobody`` (an admin creates users)."""
    user_groups: list[str] = Field(default_factory=list)
    """The Unix groups whose members' first login creates their master user (``create_users: groups``)."""
    admin_group: str | None = None
    """Members of this Unix group are admins, set at each login this way (others are not); unset: admin rights
    are given with ``det user edit``."""


class MungeLoginConfig(ProvisioningConfig):
    enabled: bool = False
    """``det user login`` with no user name logs a Unix account in with a munge credential (the site's munge,
    which Slurm uses), with no password: ``docs/security.md``, "Munge login"."""
    names: list[str] = Field(default_factory=list)
    """More host names this master is reached by (``listen.host`` and ``external_url``'s are known, and on a
    master listening on every address loopback and this machine's names): a credential names the URL ``det``
    used, and one for another address is refused."""
    unmunge: str = "unmunge"
    """The ``unmunge`` command (a path where it is not on ``PATH``)."""


class LdapLoginConfig(ProvisioningConfig):
    enabled: bool = False
    """A user name and password that are not a master user's are checked against the site's directory
    (search, then bind as the entry found), in the web UI and in ``det user login NAME``; the entry names a
    Unix account, whose master user logs in: ``docs/security.md``, "LDAP login"."""
    url: str = ""
    """The directory server: ``ldaps://HOST[:PORT]``, ``ldap://HOST`` with ``start_tls``, or ``ldapi://``.
    Plain ``ldap://`` without ``start_tls`` only to loopback (passwords cross the network)."""
    start_tls: bool = False
    """Upgrade an ``ldap://`` connection with StartTLS before sending anything."""
    ca_file: str | None = None
    """The CA certificates (PEM) that the server's certificate must chain to; unset: the system's
    (``/etc/ssl/certs``). The server's certificate is always verified."""
    bind_dn: str | None = None
    """The account that searches for the user's entry; unset: an anonymous search."""
    bind_password: str | None = Field(default=None, repr=False)
    """``bind_dn``'s password (prefer the environment variable ``DET_LDAP_BIND_PASSWORD`` to a file)."""
    base_dn: str = ""
    """Where user entries are searched (the whole subtree)."""
    user_filter: str = "(&(objectClass=posixAccount)(uid={username}))"
    """The search for the entry of the name typed at login, ``{username}`` replaced by it (escaped); exactly
    one entry must match."""
    unix_attribute: str = "uid"
    """The entry's attribute that names its Unix account on the master's host (``posixAccount``'s ``uid``)."""
    timeout_s: float = Field(default=10.0, gt=0, le=300)
    """How long one login waits for the directory (connecting, each operation)."""

    @model_validator(mode="after")
    def _complete(self) -> LdapLoginConfig:
        if self.enabled:
            _check_ldap(self)
        return self


def _check_ldap(c: LdapLoginConfig) -> None:
    needed = {
        "url": (c.url, "the directory server (ldaps://HOST) is needed when enabled"),
        "base_dn": (c.base_dn, "where user entries are searched is needed when enabled"),
        "user_filter": ("{username}" in c.user_filter, "must contain {username}, the name typed at login"),
        "bind_password": (
            (c.bind_dn is None) == (c.bind_password is None),
            "set it (or DET_LDAP_BIND_PASSWORD) with bind_dn, or neither (an anonymous search)",
        ),
    }
    for key, (ok, why) in needed.items():
        if not ok:
            raise ValueError(f"{key}: {why}")
    _check_ldap_url(c.url, c.start_tls)
    if importlib.util.find_spec("ldap") is None:
        raise ValueError("enabled: needs python-ldap, which is not installed (pip install 'hpc-det[ldap]')")


def _check_ldap_url(url: str, start_tls: bool) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("ldaps", "ldap", "ldapi"):
        raise ValueError(f"url: {url!r} is not ldaps://, ldap:// or ldapi://")
    if parts.scheme == "ldap" and not start_tls and not _loopback(parts.hostname or ""):
        raise ValueError(f"url: {url!r} would send passwords in clear; use ldaps:// or set start_tls: true")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class SecurityConfig(StrictModel):
    require_passwords: bool = False
    """Passwords for every login even on loopback (always so when ``listen.host`` is not loopback)."""
    token_ttl_hours: float = Field(default=24 * 7, gt=0)
    """How long a login (CLI token, web UI session) lasts."""
    munge: MungeLoginConfig = MungeLoginConfig()
    """Logins of Unix accounts with the site's munge (``det user login`` with no user name)."""
    ldap: LdapLoginConfig = LdapLoginConfig()
    """Logins with the password of the site's directory (LDAP), mapped to Unix accounts."""
    admin_password: str | None = Field(default=None, repr=False)
    """The ``admin`` user's password at the first start of a master that requires passwords (then it is
    stored hashed, and changed with ``det user change-password``). Prefer the environment variable to a file."""
    max_streams_per_user: int = Field(default=64, ge=1, le=1_000_000)
    """How many streams one user may have open at once: log follows (``det trial logs -f``, ``det task logs
    -f``, ``det master logs -f``), metric streams (the web UI's charts, Determined's SDK's ``iter_metrics``),
    the web UI's change streams (one per open page) and long polls made with the user's own token. One more is
    refused with HTTP 429 ``too_many_streams`` and a ``Retry-After`` until one of them ends
    (``docs/security.md``)."""
    max_long_polls_per_trial: int = Field(default=256, ge=1, le=1_000_000)
    """How many long polls (``signals/preemption``, ``searcher/operation``) one trial's harness may have open
    at once with its per-trial token, counted per trial and not against its owner's streams: one or two per
    trial, but one per rank in Determined's ``WORKERS_ASK_MASTER`` preemption mode, so keep it above the
    ranks of the largest such job."""
