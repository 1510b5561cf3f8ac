"""LDAP login (``security.ldap``): a user name and password that are not a master user's are checked against the
site's directory, as sites check them for their login nodes: search for the name's entry (as ``bind_dn``, or
anonymously), then bind as that entry with the password. The entry names a Unix account (``unix_attribute``),
and that account's master user logs in (``services.unix_users``: created at a first login where allowed,
admin by group).

The library is python-ldap, the binding of OpenLDAP's own client library (``libldap``): the same TLS and
protocol code as the site's ``ldapsearch`` and ``sssd``, maintained with OpenLDAP; the pure-Python ``ldap3``
has had no release since 2021. Its calls block: the login route runs in the threads of the synchronous routes,
and each connection has a timeout.

The server's certificate is always verified (``ca_file``, else the system's CAs); the configuration refuses a
plain ``ldap://`` URL beyond loopback. An empty password is refused here: LDAP takes a bind with a DN and no
password as an anonymous ("unauthenticated") bind, which succeeds. A name the directory does not know still
costs a bind (refused), so that the answer's time does not tell which names exist.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from hpc_master.errors import PermissionDeniedError
from hpc_master.masterconf import LdapLoginConfig
from hpc_master.services.users import LoginFailedError

log = logging.getLogger(__name__)
INVALID = "invalid credentials"  # what a local password that does not match says: names are not revealed


class DirectoryUnavailableError(PermissionDeniedError):
    """The directory could not be asked (down, TLS refused, the search account refused): HTTP 503."""

    http_status = 503
    default_code = "ldap_unavailable"


def refused(why: str) -> PermissionDeniedError:
    return PermissionDeniedError(f"LDAP login refused: {why}", code="ldap_refused")


@dataclass(frozen=True)
class DirectoryUser:
    dn: str
    account: str
    """The Unix account the entry names (its ``unix_attribute``)."""


def authenticate(config: LdapLoginConfig, username: str, password: str) -> DirectoryUser:
    """The directory's entry for ``username`` once ``password`` binds as it; ``LoginFailedError`` when there is
    no such entry or the password is wrong, ``DirectoryUnavailableError`` when the directory cannot say."""
    if not password or not username or "\x00" in username + password:
        raise LoginFailedError(INVALID, user_exists=False)
    import ldap  # the optional `ldap` extra, imported only where LDAP logins are enabled

    try:
        try:
            found = _find(config, username)
        except LoginFailedError:
            _decoy_bind(config, username, password)  # an unknown name takes as long as a wrong password
            raise
        _bind_as(config, found.dn, password)
    except ldap.INVALID_CREDENTIALS:
        raise LoginFailedError(INVALID, user_exists=True) from None
    except ldap.LDAPError as e:
        log.warning("LDAP login: the directory %s failed: %s", config.url, _describe(e))
        raise DirectoryUnavailableError(
            f"the site's directory ({config.url}) could not check the password: {_describe(e)}"
        ) from None
    return found


def _connect(config: LdapLoginConfig) -> Any:
    import ldap

    conn = ldap.initialize(config.url)
    conn.set_option(ldap.OPT_PROTOCOL_VERSION, 3)
    conn.set_option(ldap.OPT_REFERRALS, 0)
    conn.set_option(ldap.OPT_NETWORK_TIMEOUT, config.timeout_s)
    conn.set_option(ldap.OPT_TIMEOUT, config.timeout_s)
    conn.set_option(ldap.OPT_X_TLS_REQUIRE_CERT, ldap.OPT_X_TLS_DEMAND)
    if config.ca_file:
        conn.set_option(ldap.OPT_X_TLS_CACERTFILE, config.ca_file)
    conn.set_option(ldap.OPT_X_TLS_NEWCTX, 0)  # the TLS options above take effect (libldap: set last)
    if config.start_tls:
        conn.start_tls_s()
    return conn


def _find(config: LdapLoginConfig, username: str) -> DirectoryUser:
    entries = _search(config, username)
    if len(entries) != 1:
        if entries:
            log.warning(
                "LDAP login: %d entries match the name %r; its login is refused", len(entries), username
            )
        raise LoginFailedError(INVALID, user_exists=bool(entries))
    dn, attrs = entries[0]
    values = attrs.get(config.unix_attribute) or []
    if len(values) != 1:
        raise refused(f"the directory's entry has no single {config.unix_attribute!r} (its Unix account)")
    return DirectoryUser(dn, values[0].decode(errors="replace"))


def _search(config: LdapLoginConfig, username: str) -> list[tuple[str, dict[str, list[bytes]]]]:
    """The entries ``user_filter`` finds for ``username`` (up to 2: more is as ambiguous as 2)."""
    import ldap
    from ldap.filter import escape_filter_chars

    conn = _connect(config)
    try:
        try:
            conn.simple_bind_s(config.bind_dn or "", config.bind_password or "")
        except ldap.INVALID_CREDENTIALS:  # the search account's password: the admin's to fix, not the user's
            raise ldap.LDAPError({"desc": "the search account (bind_dn) was refused"}) from None
        query = config.user_filter.replace("{username}", escape_filter_chars(username))
        try:
            found = conn.search_ext_s(
                config.base_dn, ldap.SCOPE_SUBTREE, query, [config.unix_attribute], sizelimit=2
            )
        except ldap.SIZELIMIT_EXCEEDED:
            return [("", {}), ("", {})]
        except ldap.NO_SUCH_OBJECT:
            raise ldap.LDAPError({"desc": f"base_dn {config.base_dn!r} does not exist"}) from None
    finally:
        conn.unbind_s()
    return [(dn, attrs) for dn, attrs in found if dn is not None]  # a None DN is a referral


def _decoy_bind(config: LdapLoginConfig, username: str, password: str) -> None:
    """A bind the directory refuses, so that a name it does not know answers as slowly as a wrong password
    (else the time of the answer tells which names exist)."""
    import ldap
    from ldap.dn import escape_dn_chars

    with contextlib.suppress(ldap.LDAPError):
        _bind_as(config, f"{config.unix_attribute}={escape_dn_chars(username)},{config.base_dn}", password)


def _bind_as(config: LdapLoginConfig, dn: str, password: str) -> None:
    conn = _connect(config)
    try:
        conn.simple_bind_s(dn, password)
    finally:
        conn.unbind_s()


def _describe(e: Exception) -> str:
    info = e.args[0] if e.args and isinstance(e.args[0], dict) else {}
    words = [str(info.get("desc", type(e).__name__)), str(info.get("info", ""))]
    return "; ".join(w for w in words if w)[:300]
