from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
from parallel import free_port, run_ranks

from harness.core import DistributedContext, DummyDistributedContext

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("size", [1, 2, 4])
def test_collectives_threads(size: int) -> None:
    def fn(d: DistributedContext) -> tuple[object, ...]:
        g = d.gather(d.rank * 10)
        ag = d.allgather({"r": d.rank})
        b = d.broadcast("from-chief" if d.rank == 0 else "ignored")
        return g, ag, b

    out = run_ranks(size, fn)
    for rank, (g, ag, b) in enumerate(out):
        assert g == ([r * 10 for r in range(size)] if rank == 0 else None)
        assert ag == [{"r": r} for r in range(size)]
        assert b == "from-chief"


def test_local_collectives_two_fake_nodes() -> None:
    def fn(d: DistributedContext) -> tuple[object, ...]:
        return (
            d.allgather_local(d.rank),
            d.gather_local(d.rank),
            d.broadcast_local(f"node{d.cross_rank}" if d.local_rank == 0 else None),
            d.allgather(d.rank),
        )

    out = run_ranks(4, fn, local_size=2)
    for rank, (agl, gl, bl, ag) in enumerate(out):
        node = rank // 2
        assert agl == [node * 2, node * 2 + 1]
        assert gl == ([node * 2, node * 2 + 1] if rank % 2 == 0 else None)
        assert bl == f"node{node}"
        assert ag == [0, 1, 2, 3]


def test_many_rounds_and_big_payload() -> None:
    big = b"x" * 3_000_000

    def fn(d: DistributedContext) -> int:
        total = 0
        for i in range(200):
            total += sum(d.allgather(i + d.rank))
        assert d.broadcast(big if d.rank == 0 else None) == big
        return total

    out = run_ranks(3, fn)
    assert len(set(out)) == 1


def test_dummy_and_validation() -> None:
    d = DummyDistributedContext()
    assert (d.gather(1), d.allgather(2), d.broadcast(3)) == ([1], [2], 3)
    assert (d.gather_local(1), d.allgather_local(2), d.broadcast_local(3)) == ([1], [2], 3)
    assert (d.rank, d.size, d.get_num_agents()) == (0, 1, 1)
    with pytest.raises(ValueError, match="chief_ip"):
        DistributedContext(rank=0, size=2, local_rank=0, local_size=1, cross_rank=0, cross_size=2)


def test_wrong_secret_is_rejected() -> None:
    import socket

    from harness.core._star import StarServer

    server = StarServer(1, "127.0.0.1", 0, b"secret")
    with socket.create_connection(("127.0.0.1", server.port)) as bad:
        bad.sendall(b"\0" * 40)
        with pytest.raises(TimeoutError):
            server.accept_all(0.5)
    server.close()


WORKER = textwrap.dedent(
    """
    import json, os, sys
    from harness.core import DistributedContext
    rank = int(sys.argv[1])
    d = DistributedContext(rank=rank, size=4, local_rank=rank % 2, local_size=2, cross_rank=rank // 2,
                           cross_size=2, chief_ip="127.0.0.1", pub_port=int(sys.argv[2]))
    out = {"ag": d.allgather(rank * rank), "agl": d.allgather_local(rank), "b": d.broadcast(os.getpid())}
    out["g"] = d.gather(rank)
    d.close()
    print(json.dumps(out))
    """
)


def test_collectives_four_processes(tmp_path: Path) -> None:
    script = tmp_path / "w.py"
    script.write_text(WORKER)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, str(script), str(r), str(port)], stdout=subprocess.PIPE, env=env)
        for r in range(4)
    ]
    import json

    outs = [json.loads(p.communicate(timeout=30)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    chief_pid = procs[0].pid
    for r, o in enumerate(outs):
        assert o["ag"] == [0, 1, 4, 9]
        assert o["agl"] == ([0, 1] if r < 2 else [2, 3])
        assert o["b"] == chief_pid
        assert o["g"] == ([0, 1, 2, 3] if r == 0 else None)


def test_dead_worker_raises_instead_of_hanging(tmp_path: Path) -> None:
    port = free_port()
    code = (
        "import sys, os\nfrom harness.core import DistributedContext\n"
        f"d = DistributedContext(rank=1, size=2, local_rank=1, local_size=2, cross_rank=0, cross_size=1, pub_port={port})\n"
        "os._exit(3)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)})
    d = DistributedContext(
        rank=0, size=2, local_rank=0, local_size=2, cross_rank=0, cross_size=1, pub_port=port
    )
    with pytest.raises(ConnectionError):
        d.allgather(1)
    d.close()
    assert p.wait(10) == 3
