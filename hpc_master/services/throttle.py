"""Slowing down password guessing: failed logins counted per (user, client address) and per address, in
memory, per master.

The first failures of a key cost nothing (typos: `FREE_FAILURES` for a user from one address,
`FREE_ADDRESS_FAILURES` for an address over all users, which slows spraying many names); after that each
further attempt must wait ``2 ** (failures - free)`` seconds (at most `MAX_WAIT_S`) after the key's last
failure, or it is refused without checking the password. There is no key for a user alone: failures from
elsewhere never slow a user down (on a shared login node everybody has the same address, so the address
budget is large). A successful login clears its user's key; a key is forgotten `FORGET_AFTER_S` after its last
failure.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from hpc_master.errors import TooManyRequestsError

FREE_FAILURES = 5
FREE_ADDRESS_FAILURES = 50
MAX_WAIT_S = 60.0
FORGET_AFTER_S = 15 * 60.0
MAX_KEYS = 100_000


class TooManyAttemptsError(TooManyRequestsError):
    default_code = "too_many_attempts"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, retry_after_s=retry_after_s)


@dataclass
class _Failures:
    count: int
    last: float


def wait_after(failures: int, free: int) -> float:
    """How long after the last failure the next attempt must come."""
    if failures < free:
        return 0.0
    return min(MAX_WAIT_S, 2.0 ** (failures - free))


class LoginThrottle:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failures: dict[str, _Failures] = {}
        self._lock = threading.Lock()

    @staticmethod
    def keys(username: str, address: str) -> tuple[tuple[str, int], tuple[str, int]]:
        return (f"user:{address}:{username}", FREE_FAILURES), (f"addr:{address}", FREE_ADDRESS_FAILURES)

    def check(self, username: str, address: str) -> None:
        """Raise `TooManyAttemptsError` if this user or this address must wait before trying again."""
        now = self._clock()
        with self._lock:
            for key, free in self.keys(username, address):
                entry = self._failures.get(key)
                if entry is None:
                    continue
                if now - entry.last > FORGET_AFTER_S:
                    del self._failures[key]
                    continue
                remaining = entry.last + wait_after(entry.count, free) - now
                if remaining > 0:
                    who = "this user" if key.startswith("user:") else "this address"
                    raise TooManyAttemptsError(
                        f"too many failed logins for {who}: try again in {remaining:.0f} s", remaining
                    )

    def failed(self, username: str, address: str) -> None:
        now = self._clock()
        with self._lock:
            if len(self._failures) >= MAX_KEYS:
                self._forget_old(now)
            for key, _ in self.keys(username, address):
                entry = self._failures.setdefault(key, _Failures(0, now))
                entry.count += 1
                entry.last = now

    def succeeded(self, username: str, address: str) -> None:
        """Clears the user's count from this address (not the address's: a valid login of one's own between
        guesses at others' passwords must not reset it)."""
        with self._lock:
            self._failures.pop(self.keys(username, address)[0][0], None)

    def _forget_old(self, now: float) -> None:
        stale = [k for k, e in self._failures.items() if now - e.last > FORGET_AFTER_S]
        for key in stale:
            del self._failures[key]
        if len(self._failures) >= MAX_KEYS:  # a flood of distinct keys: start over rather than grow
            self._failures.clear()
