"""The job's node addresses (``container_addrs``), from Slurm's node list. Standard library only.

A public contract: the job entry and ``launchers.torch_distributed`` (the rendezvous host) both read it.

Host names come from ``scontrol show hostnames $SLURM_JOB_NODELIST`` (Slurm's own expansion), else from
:func:`expand_nodelist` when scontrol is missing (off-cluster tests). Each name is resolved to an IPv4 address.
Overrides, for tests and for sites whose node names resolve to the wrong network:

- ``DET_NODE_ADDRS``: the addresses themselves, comma-separated, in node order (nothing is resolved);
- ``DET_RESOLVE_OVERRIDE``: ``name=addr,name=addr``, consulted before name resolution.
"""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Mapping

_GROUP = re.compile(r"([^,\[]*)(\[[^\]]*\])?(.*)")


class NodeListError(Exception):
    pass


def _split_top(text: str) -> list[str]:
    """Split at commas that are not inside brackets."""
    out, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [x for x in out if x]


def _expand_one(host: str) -> list[str]:
    m = _GROUP.fullmatch(host)
    if m is None or not m.group(2):
        return [host]
    prefix, ranges, rest = m.group(1), m.group(2)[1:-1], m.group(3)
    names = _expand_ranges(host, prefix, ranges)
    return [name + tail for name in names for tail in _expand_one(rest)] if rest else names


def _expand_ranges(host: str, prefix: str, ranges: str) -> list[str]:
    """`prefix` followed by each number of `ranges` (``1-3,05``: widths kept); `host` is for the error."""
    names: list[str] = []
    for part in ranges.split(","):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise NodeListError(f"cannot expand node list entry {host!r}")
        width = len(lo)
        for n in range(int(lo), int(hi if dash else lo) + 1):
            names.append(f"{prefix}{n:0{width}d}")
    return names


def expand_nodelist(nodelist: str) -> list[str]:
    """``node[1-2,05],login`` → ``["node1", "node2", "node05", "login"]`` (Slurm's hostlist syntax)."""
    return [name for group in _split_top(nodelist.strip()) for name in _expand_one(group)]


def hostnames(nodelist: str) -> list[str]:
    plain = nodelist.strip()
    if plain and not any(c in plain for c in "[],"):  # one node (most jobs): nothing to expand, no scontrol
        return [plain]
    import shutil  # not on the one-node path: every job imports this module

    scontrol = shutil.which("scontrol")
    if scontrol:
        proc = subprocess.run(
            [scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=60, check=False
        )
        if proc.returncode == 0 and proc.stdout.split():
            return proc.stdout.split()
    return expand_nodelist(nodelist)


def _parse_override(raw: str) -> dict[str, str]:
    out = {}
    for item in raw.split(","):
        name, eq, addr = item.strip().partition("=")
        if eq and name and addr:
            out[name] = addr
    return out


def resolve(name: str, override: Mapping[str, str]) -> str:
    if name in override:
        return override[name]
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise NodeListError(f"cannot resolve node {name!r}: {e}") from None
    return str(infos[0][4][0])


def container_addrs(env: Mapping[str, str]) -> list[str]:
    """One address per node of the job, in Slurm's node order (node 0 first)."""
    explicit = env.get("DET_NODE_ADDRS", "").strip()
    if explicit:
        return [a.strip() for a in explicit.split(",") if a.strip()]
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    if not nodelist:
        return ["127.0.0.1"]
    override = _parse_override(env.get("DET_RESOLVE_OVERRIDE", ""))
    return [resolve(name, override) for name in hostnames(nodelist)]
