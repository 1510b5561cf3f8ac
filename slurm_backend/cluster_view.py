"""What the cluster looks like: partitions and nodes with their GPUs used and free, for the web UI's
cluster page.

Read from ``scontrol show partition -o`` and ``scontrol show node -o`` (one line per partition or node, ``Key=Value``
fields; the parsers are pure functions, tested on a captured real answer in
``tests/unit/captured/scontrol_cluster.txt``). GPUs come from the TRES strings: ``CfgTRES=...,gres/gpu=2`` (the
node's GPUs) and ``AllocTRES=...,gres/gpu=1`` (those held by jobs), so typed (``gres/gpu:a100=2``) and untyped GPUs
are counted once. ``CachedClusterView`` asks Slurm at most once per ``ttl_s`` however many callers ask, and
remembers a failure for as long, so a down controller is not asked again by every browser.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from det_errors import SlurmError
from slurm_backend.cli import SlurmCli
from slurm_backend.parse import parse_scontrol_fields

PARTITIONS_ARGV = ("scontrol", "show", "partition", "-o")
NODES_ARGV = ("scontrol", "show", "node", "-o")
DEFAULT_TTL_S = 5.0


@dataclass(frozen=True)
class NodeView:
    name: str
    state: str
    """Slurm's node state as printed: IDLE, MIXED, ALLOCATED, DOWN*, IDLE+DRAIN, ..."""
    partitions: tuple[str, ...]
    cpus_total: int
    cpus_alloc: int
    mem_mb: int
    mem_alloc_mb: int
    gpus_total: int
    gpus_used: int
    gpu_type: str
    """The GPU model from ``Gres=gpu:a100:2`` ("a100"), or "" when untyped or none."""
    reason: str
    """Why a node is down or drained (``Reason=``), else ""."""

    @property
    def gpus_free(self) -> int:
        return max(0, self.gpus_total - self.gpus_used) if self.available else 0

    @property
    def available(self) -> bool:
        """Jobs can start here: not down, drained, draining, failed or powered off."""
        flags = set(re.split(r"[+*]", self.state.upper())) - {""}
        return not flags & {
            "DOWN",
            "DRAIN",
            "DRAINED",
            "DRAINING",
            "FAIL",
            "FAILING",
            "POWERED_DOWN",
            "NOT_RESPONDING",
        }


@dataclass(frozen=True)
class PartitionView:
    name: str
    default: bool
    state: str
    """UP, DOWN, DRAIN or INACTIVE."""
    max_time: str
    """``MaxTime=`` as Slurm prints it: UNLIMITED, 00:02:00, 1-00:00:00."""
    priority_tier: int
    preempt_mode: str
    nodes: tuple[str, ...] = ()
    """Its nodes (from each node's ``Partitions=``, so no host list needs expanding)."""


@dataclass(frozen=True)
class ClusterView:
    partitions: tuple[PartitionView, ...]
    nodes: tuple[NodeView, ...]
    fetched_at: float
    """``time.time()`` when Slurm answered (or failed)."""
    error: str = ""
    """Why Slurm could not be read ("" when it was)."""

    def partition_gpus(self, name: str) -> tuple[int, int, int]:
        """(total, used, free) GPUs over the partition's nodes (nodes shared by partitions count in each)."""
        nodes = [n for n in self.nodes if name in n.partitions]
        return (
            sum(n.gpus_total for n in nodes),
            sum(n.gpus_used for n in nodes),
            sum(n.gpus_free for n in nodes),
        )


def _int(value: str | None, default: int = 0) -> int:
    try:
        return int(value or "")
    except ValueError:
        return default


def tres_gpus(tres: str) -> int:
    """GPUs in a TRES string (``cpu=4,mem=4G,billing=4,gres/gpu=2``): the untyped ``gres/gpu`` count, which
    Slurm prints alongside any typed ``gres/gpu:a100`` one; the typed ones summed when it is missing."""
    untyped = 0
    typed = 0
    found = False
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpu":
            untyped += _int(value)
            found = True
        elif key.startswith("gres/gpu:"):
            typed += _int(value)
    return untyped if found else typed


def gres_gpus(gres: str) -> tuple[int, str]:
    """(count, type) from ``Gres=``: ``gpu:a100:2`` → (2, "a100"); ``gpu:2(S:0-1)`` → (2, ""); several entries
    (``gpu:a100:2,gpu:v100:1``) add up, the type joined with "+"; "(null)" → (0, "")."""
    count = 0
    types: list[str] = []
    for entry in re.split(r",(?![^(]*\))", gres):
        parts = re.sub(r"\(.*\)$", "", entry.strip()).split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        count += _int(parts[-1], 1) if parts[-1].isdigit() else 1
        if len(parts) >= 3 and parts[1] not in types:
            types.append(parts[1])
    return count, "+".join(types)


def _lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.strip() and not line.startswith("#")]


def parse_nodes(stdout: str) -> list[NodeView]:
    """``scontrol show node -o`` → one ``NodeView`` per line (unknown fields ignored)."""
    nodes = []
    for line in _lines(stdout):
        f = parse_scontrol_fields(line)
        if "NodeName" not in f:
            continue
        gres_count, gpu_type = gres_gpus(f.get("Gres", ""))
        cfg = tres_gpus(f.get("CfgTRES", ""))
        reason = f.get("Reason", "")
        nodes.append(
            NodeView(
                name=f["NodeName"],
                state=f.get("State", "UNKNOWN"),
                partitions=tuple(p for p in f.get("Partitions", "").split(",") if p),
                cpus_total=_int(f.get("CPUTot")),
                cpus_alloc=_int(f.get("CPUAlloc")),
                mem_mb=_int(f.get("RealMemory")),
                mem_alloc_mb=_int(f.get("AllocMem")),
                gpus_total=cfg or gres_count,
                gpus_used=tres_gpus(f.get("AllocTRES", "")),
                gpu_type=gpu_type,
                reason="" if reason in ("(null)", "none", "None") else reason,
            )
        )
    return nodes


def parse_partitions(stdout: str, nodes: list[NodeView] | None = None) -> list[PartitionView]:
    """``scontrol show partition -o`` → one ``PartitionView`` per line, with its nodes from ``nodes``."""
    out = []
    for line in _lines(stdout):
        f = parse_scontrol_fields(line)
        if "PartitionName" not in f:
            continue
        name = f["PartitionName"]
        out.append(
            PartitionView(
                name=name,
                default=f.get("Default", "NO").upper() == "YES",
                state=f.get("State", "UNKNOWN"),
                max_time=f.get("MaxTime", ""),
                priority_tier=_int(f.get("PriorityTier"), 1),
                preempt_mode=f.get("PreemptMode", ""),
                nodes=tuple(n.name for n in nodes or [] if name in n.partitions),
            )
        )
    return out


def fetch_cluster_view(cli: SlurmCli, *, clock: Callable[[], float] = time.time) -> ClusterView:
    """Ask Slurm (two commands, no retries: the page asks again soon); a failure is a view with ``error``."""
    try:
        with cli.retries_at_most(0):
            node_out = cli.run(list(NODES_ARGV)).stdout
            partition_out = cli.run(list(PARTITIONS_ARGV)).stdout
    except SlurmError as e:
        return ClusterView((), (), clock(), error=str(e))
    nodes = parse_nodes(node_out)
    return ClusterView(tuple(parse_partitions(partition_out, nodes)), tuple(nodes), clock())


@dataclass
class CachedClusterView:
    """``fetch_cluster_view`` at most once per ``ttl_s``: callers arriving while a fetch runs wait for it and
    share its answer (one Slurm call per period however many browsers look)."""

    cli: SlurmCli
    ttl_s: float = DEFAULT_TTL_S
    monotonic: Callable[[], float] = time.monotonic
    fetches: int = 0
    """How many times Slurm was asked (for tests)."""
    _view: ClusterView | None = None
    _at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self) -> ClusterView:
        with self._lock:
            now = self.monotonic()
            if self._view is None or now - self._at >= self.ttl_s:
                self._view = fetch_cluster_view(self.cli)
                self._at = self.monotonic()
                self.fetches += 1
            return self._view
