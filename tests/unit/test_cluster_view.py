"""The cluster page's Slurm view: parsers against REAL output captured from the local Slurm 22.05 cluster
(tests/unit/captured/scontrol_cluster.txt, edge cases in its comments), and the cache's one call per period."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from slurm_backend.cli import CommandResult, SlurmCli
from slurm_backend.cluster_view import (
    NODES_ARGV,
    PARTITIONS_ARGV,
    CachedClusterView,
    fetch_cluster_view,
    gres_gpus,
    parse_nodes,
    parse_partitions,
    tres_gpus,
)

CAPTURED = (Path(__file__).parent / "captured" / "scontrol_cluster.txt").read_text()
PARTITIONS = CAPTURED.split("## partitions\n")[1].split("## nodes\n")[0]
NODES = CAPTURED.split("## nodes\n")[1]


def test_nodes_from_captured_scontrol() -> None:
    node1, node2 = parse_nodes(NODES)
    assert (node1.name, node2.name) == ("node1", "node2")
    assert node1.partitions == ("batch", "short", "urgent")
    assert (node1.gpus_total, node1.gpu_type) == (2, "a100")
    assert (node1.gpus_used, node1.gpus_free) == (1, 1)  # AllocTRES=gres/gpu=1 (captured with a job on it)
    assert (node2.gpus_used, node2.gpus_free) == (0, 2)  # AllocTRES= (empty)
    assert (node1.cpus_total, node1.mem_mb, node1.state, node1.reason) == (4, 4096, "IDLE", "")
    assert node1.available


def test_partitions_from_captured_scontrol() -> None:
    nodes = parse_nodes(NODES)
    batch, short, urgent = parse_partitions(PARTITIONS, nodes)
    assert (batch.name, batch.default, batch.state, batch.max_time) == ("batch", True, "UP", "UNLIMITED")
    assert (short.default, short.max_time) == (False, "00:02:00")
    assert (urgent.priority_tier, urgent.preempt_mode) == (10, "REQUEUE")
    assert batch.nodes == ("node1", "node2")


def test_gpu_counting_edge_cases() -> None:
    assert tres_gpus("cpu=4,mem=4G,billing=4,gres/gpu=2") == 2
    assert tres_gpus("cpu=4,gres/gpu=2,gres/gpu:a100=2") == 2  # typed and untyped: counted once
    assert tres_gpus("cpu=4,gres/gpu:a100=1,gres/gpu:v100=2") == 3
    assert tres_gpus("") == 0
    assert gres_gpus("gpu:a100:2") == (2, "a100")
    assert gres_gpus("gpu:2(S:0-1)") == (2, "")
    assert gres_gpus("gpu:a100:2(S:0),gpu:v100:1(S:1)") == (3, "a100+v100")
    assert gres_gpus("(null)") == (0, "")
    down = parse_nodes(
        "NodeName=n3 CPUTot=8 State=DOWN+DRAIN Gres=gpu:4 CfgTRES=cpu=8,gres/gpu=4 AllocTRES= "
        "Reason=Not responding [slurm@2026-11-24T07:00:00] Partitions=batch"
    )[0]
    assert (down.gpus_total, down.gpus_free, down.available) == (4, 0, False)
    assert down.reason.startswith("Not responding")


class CountingRunner:
    def __init__(self, ok: bool = True) -> None:
        self.calls: list[list[str]] = []
        self.ok = ok
        self.lock = threading.Lock()

    def __call__(
        self, argv: Sequence[str], stdin: str | None, timeout_s: float, env: dict[str, str]
    ) -> CommandResult:
        with self.lock:
            self.calls.append(list(argv))
        if not self.ok:
            return CommandResult(
                1, "", "slurm_load_node error: Unable to contact slurm controller (connect failure)"
            )
        return CommandResult(0, NODES if tuple(argv) == NODES_ARGV else PARTITIONS, "")


def test_one_slurm_read_per_period_however_many_ask() -> None:
    runner = CountingRunner()
    now = [100.0]
    cache = CachedClusterView(
        SlurmCli(runner=runner, sleep=lambda s: None), ttl_s=5.0, monotonic=lambda: now[0]
    )
    views = []
    threads = [threading.Thread(target=lambda: views.append(cache.get())) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(runner.calls) == 2 and cache.fetches == 1  # scontrol show node, scontrol show partition
    assert sorted(map(tuple, runner.calls)) == sorted([NODES_ARGV, PARTITIONS_ARGV])
    assert all(v is views[0] for v in views) and len(views[0].nodes) == 2
    now[0] += 4.9
    cache.get()
    assert cache.fetches == 1
    now[0] += 0.2
    cache.get()
    assert cache.fetches == 2


def test_a_down_controller_is_an_error_in_the_view_asked_once_per_period() -> None:
    runner = CountingRunner(ok=False)
    cache = CachedClusterView(SlurmCli(runner=runner, sleep=lambda s: None), ttl_s=5.0)
    view = cache.get()
    assert "Unable to contact slurm controller" in view.error and view.nodes == ()
    cache.get()
    assert len(runner.calls) == 1  # no retries, and the failure is cached too
    assert fetch_cluster_view(SlurmCli(runner=CountingRunner())).error == ""
