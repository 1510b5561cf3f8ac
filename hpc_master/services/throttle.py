"""Slowing down password guessing without letting anyone lock other users out: failed logins counted in
memory, per master.

- **Per user name, from everywhere.** The first `FREE_FAILURES` failures for a name cost nothing (typos);
  after that each attempt at that name must wait ``2 ** (failures - FREE_FAILURES)`` seconds (at most
  `MAX_WAIT_S`) after the name's last failure, or it is refused (HTTP 429 with ``Retry-After``) without its
  password being checked. This is what stops a brute force on one account, from one address or from many.
  Failures at other names, real or made up, never delay a user.
- **Per user name from an address it logged in from** (a *trusted* pair, for `TRUSTED_FOR_S` after its last
  success): from there only the failures from that same address count, so guesses made elsewhere cannot keep
  a user out of the login node or laptop they log in from. Guesses from the same address (a shared login
  node) delay its attempts from there too, at most `MAX_WAIT_S` after each.
- **Per client address, for names that do not exist** (`FREE_ADDRESS_FAILURES`; an IPv6 address by its /64):
  after that many, a failed login from that address that comes sooner than ``2 ** (failures - free)`` seconds
  (at most `MAX_WAIT_S`) after its last is answered 429 with ``Retry-After`` (a sprayer of made-up names is
  told to wait). Correct passwords are still checked and let in, so a login node's users are never locked
  out by it; and until the address may try again, a wrong password for a real name counts and is answered as
  a made-up name is, after the same work, so that neither the answer nor its timing tells which names exist.

Names that do not exist are counted like real ones (in a table of their own, so that a flood of made-up
names cannot push a real name's count out). An attempt counts from the moment it is let through until it
ends, so a burst of parallel guesses gets no more through than the same guesses one after another. A success
clears its name's count; a count is forgotten `FORGET_AFTER_S` after its last failure. The log says when a
real name or an address starts to be slowed, with the address (for fail2ban or a firewall).
"""

from __future__ import annotations

import ipaddress
import logging
import math
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from hpc_master.errors import TooManyRequestsError

log = logging.getLogger(__name__)

FREE_FAILURES = 5
"""Failures of one user name (or of one name from one trusted address) before its attempts must wait."""
FREE_ADDRESS_FAILURES = 50
"""Failures on names that do not exist from one address before its failures must be spaced out."""
MAX_WAIT_S = 60.0
FORGET_AFTER_S = 15 * 60.0
TRUSTED_FOR_S = 30 * 24 * 3600.0
"""How long an address a user logged in from stays one of theirs (the master forgets on restart)."""
MAX_KEYS = 100_000
"""Per table; past it, the longest quiet keys are forgotten first."""
IPV6_GROUP_PREFIX = 64
"""An IPv6 address counts as its /64: one host commonly holds a whole /64."""


class TooManyAttemptsError(TooManyRequestsError):
    default_code = "too_many_attempts"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, retry_after_s=retry_after_s)

    @property
    def retry_after(self) -> str:
        """The ``Retry-After`` header's value: whole seconds, rounded up, at least 1."""
        return str(max(1, math.ceil(self.retry_after_s)))


def wait_after(failures: int, free: int) -> float:
    """How long after the last failure the next attempt must come."""
    if failures < free:
        return 0.0
    return min(MAX_WAIT_S, 2.0 ** (failures - free))


def address_group(address: str) -> str:
    """What an address is counted as: an IPv6 address's /64, an IPv4 address (also IPv4-mapped) itself,
    anything that is not an address as given."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{ip}/{IPV6_GROUP_PREFIX}", strict=False))
    return str(ip)


@dataclass
class _Failures:
    count: int
    last: float


class _Counts:
    """Failures by key, each forgotten `FORGET_AFTER_S` after its last. Ordered by last failure, so that past
    `MAX_KEYS` the longest quiet key goes first."""

    def __init__(self, free: int) -> None:
        self.free = free
        self._entries: dict[Hashable, _Failures] = {}

    def wait_s(self, key: Hashable, now: float, in_flight: int = 0) -> float:
        """How long an attempt at `key` must wait, counting the `in_flight` attempts as failures now."""
        entry = self._entries.get(key)
        if entry is not None and now - entry.last > FORGET_AFTER_S:
            del self._entries[key]
            entry = None
        count = (entry.count if entry is not None else 0) + in_flight
        if count < self.free:
            return 0.0
        last = now if in_flight or entry is None else entry.last
        return max(0.0, last + wait_after(count, self.free) - now)

    def add(self, key: Hashable, now: float) -> int:
        """Count a failure; the key's count."""
        entry = self._entries.pop(key, None)
        if entry is None or now - entry.last > FORGET_AFTER_S:
            entry = _Failures(0, now)
        entry.count += 1
        entry.last = now
        self._entries[key] = entry
        while len(self._entries) > MAX_KEYS:
            del self._entries[next(iter(self._entries))]
        return entry.count

    def clear(self, key: Hashable) -> None:
        self._entries.pop(key, None)


class LoginAttempt:
    """One login let through by `LoginThrottle.attempt`: say how it ended."""

    def __init__(self, throttle: LoginThrottle, username: str, address: str) -> None:
        self._throttle = throttle
        self.username = username
        self.address = address

    def failed(self, *, user_exists: bool) -> TooManyAttemptsError | None:
        """Count the failure; the refusal to answer with instead of the failure's own (the address has failed
        on too many names that do not exist), or None."""
        return self._throttle.failed(self.username, self.address, user_exists=user_exists)

    def succeeded(self) -> None:
        self._throttle.succeeded(self.username, self.address)


class LoginThrottle:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._names = _Counts(FREE_FAILURES)  # names that exist, failures from everywhere
        self._unknown_names = _Counts(FREE_FAILURES)  # names that do not exist
        self._pairs = _Counts(FREE_FAILURES)  # (name, address), while trusted
        self._addresses = _Counts(FREE_ADDRESS_FAILURES)  # address groups (see `failed`)
        self._trusted: dict[tuple[str, str], float] = {}  # (name, address) -> last success
        self._in_flight: dict[tuple[str, ...], int] = {}

    @contextmanager
    def attempt(self, username: str, address: str) -> Iterator[LoginAttempt]:
        """Let a login attempt through, or raise `TooManyAttemptsError` before its password is checked."""
        key = self._begin(username, address)
        try:
            yield LoginAttempt(self, username, address)
        finally:
            with self._lock:
                left = self._in_flight.pop(key) - 1
                if left:
                    self._in_flight[key] = left

    def _begin(self, username: str, address: str) -> tuple[str, ...]:
        now = self._clock()
        with self._lock:
            if self._is_trusted(username, address, now):
                key: tuple[str, ...] = ("pair", username, address)
                wait = self._pairs.wait_s((username, address), now, self._in_flight.get(key, 0))
            else:
                key = ("name", username)
                in_flight = self._in_flight.get(key, 0)
                wait = max(
                    self._names.wait_s(username, now, in_flight),
                    self._unknown_names.wait_s(username, now, in_flight),
                )
            if wait <= 0:
                self._in_flight[key] = self._in_flight.get(key, 0) + 1
                return key
        raise TooManyAttemptsError(
            f"too many failed logins for this user name: try again in {math.ceil(wait)} s", wait
        )

    def failed(self, username: str, address: str, *, user_exists: bool) -> TooManyAttemptsError | None:
        """Count a failed login (``LoginAttempt.failed``)."""
        now = self._clock()
        group = address_group(address)
        with self._lock:
            too_soon = self._addresses.wait_s(group, now) > 0
            if user_exists:
                count = self._names.add(username, now)
                if self._is_trusted(username, address, now):
                    self._pairs.add((username, address), now)
                if count >= FREE_FAILURES:
                    log.warning(
                        "failed login for user %r from %s: %d in a row, the next attempts at this name wait "
                        "%.0f s",
                        username,
                        address,
                        count,
                        wait_after(count, FREE_FAILURES),
                    )
            else:
                self._unknown_names.add(username, now)
            if too_soon or not user_exists:  # while it must wait, an address's failures all count alike
                count = self._addresses.add(group, now)
                if count % FREE_ADDRESS_FAILURES == 0:  # made-up names are not logged: one may be a password
                    log.warning(
                        "%d failed logins from %s on user names that do not exist or while it had to wait",
                        count,
                        group,
                    )
            wait = self._addresses.wait_s(group, now) if too_soon else 0.0
        if wait <= 0:
            return None
        return TooManyAttemptsError(
            f"invalid credentials, and too many failed logins from this address: wait {math.ceil(wait)} s "
            "before the next attempt",
            wait,
        )

    def succeeded(self, username: str, address: str) -> None:
        """Clears the name's counts (not the address's: a valid login of one's own between guesses at made-up
        names must not reset it) and trusts the address for the name."""
        now = self._clock()
        with self._lock:
            self._names.clear(username)
            self._pairs.clear((username, address))
            self._trusted.pop((username, address), None)
            self._trusted[(username, address)] = now
            while len(self._trusted) > MAX_KEYS:
                del self._trusted[next(iter(self._trusted))]

    def _is_trusted(self, username: str, address: str, now: float) -> bool:
        since = self._trusted.get((username, address))
        if since is None:
            return False
        if now - since > TRUSTED_FOR_S:
            del self._trusted[(username, address)]
            return False
        return True
