"""Who listens on a loopback master's port, before ``det`` sends it a token, a password or an owner key.

Any account on a login node may listen on a free loopback port: while a personal master is down, another user
can take its port and wait for its owner's ``det`` to send the cached token. So, for a master on a loopback
address, ``det`` first connects and reads the uid that owns the server's end of that very connection from
``/proc/net/tcp`` / ``tcp6`` (world-readable on Linux; the kernel lists every socket of the network namespace,
so a listener cannot hide). It sends credentials only when that uid is the one it expects: its own, for the
account's personal master on that port (it holds the master's owner key); otherwise the uid seen when the token
was first cached (pinned in ``auth.json``, as SSH pins a host key). Anything else is refused, naming the uid.
"""

from __future__ import annotations

import contextlib
import ipaddress
import pwd
import socket
from pathlib import Path

PROC_NET = Path("/proc/net")


def _hex_address(addr: str, port: int, *, mapped: bool = False) -> str:
    """An address as ``/proc/net/tcp*`` writes it: the 32-bit words of the address in host order, then the port.
    `mapped`: an IPv4 address as a dual-stack (IPv6) socket holds it, ``::ffff:a.b.c.d``."""
    raw = ipaddress.IPv6Address(f"::ffff:{addr}").packed if mapped else ipaddress.ip_address(addr).packed
    words = [raw[i : i + 4][::-1].hex().upper() for i in range(0, len(raw), 4)]
    return f"{''.join(words)}:{port:04X}"


def _owner_of(table: Path, local: str, remote: str) -> int | None:
    """The uid of the socket in `table` whose local end is `local` and remote end `remote`."""
    with contextlib.suppress(OSError), open(table, encoding="ascii") as f:
        next(f, None)  # the header
        for line in f:
            fields = line.split()
            if len(fields) > 7 and fields[1] == local and fields[2] == remote:
                return int(fields[7])
    return None


def server_uid(host: str, port: int, *, timeout_s: float = 2.0) -> int | None:
    """The uid that owns the server end of a fresh TCP connection to ``host:port`` (a loopback address).

    None when it cannot be told (no ``/proc/net``: not Linux). Raises OSError when nothing listens."""
    if not (PROC_NET / "tcp").exists():
        return None
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        ours = sock.getsockname()[:2]
        theirs = sock.getpeername()[:2]
        # Over IPv4 the server's end is an IPv4 socket, or a dual-stack one holding IPv4-mapped addresses.
        v6 = sock.family == socket.AF_INET6
        tables = [("tcp6", False)] if v6 else [("tcp", False), ("tcp6", True)]
        for name, mapped in tables:
            local = _hex_address(theirs[0], theirs[1], mapped=mapped)
            remote = _hex_address(ours[0], ours[1], mapped=mapped)
            uid = _owner_of(PROC_NET / name, local, remote)
            if uid is not None:
                return uid
    return None


def user_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
