from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
from fake_master import FakeMaster
from parallel import free_port, run_ranks

from harness._http import MasterSession
from harness.core import (
    DistributedContext,
    DummyDistributedContext,
    DummyPreemptContext,
    PreemptContext,
    PreemptMode,
)
from harness.core._preempt import get_preempt_signals

REPO = Path(__file__).resolve().parents[2]


def test_one_rank_signal_all_ranks_same_step() -> None:
    def fn(d: DistributedContext) -> int:
        with PreemptContext(None, "", d, watch_signals=False) as p:
            for step in range(100):
                if d.rank == 2 and step == 17:
                    p._trigger_local()
                if p.should_preempt():
                    return step
        return -1

    assert run_ranks(4, fn) == [17, 17, 17, 17]


def test_dummy_keeps_collective_pattern() -> None:
    def fn(d: DistributedContext) -> list[bool]:
        with DummyPreemptContext(d) as p:
            return [p.should_preempt() for _ in range(5)]

    assert run_ranks(3, fn) == [[False] * 5] * 3


def test_chief_only_mode_refuses_workers() -> None:
    def fn(d: DistributedContext) -> str:
        with PreemptContext(None, "", d, PreemptMode.ChiefOnly, watch_signals=False) as p:
            try:
                return str(p.should_preempt())
            except RuntimeError:
                return "refused"

    assert run_ranks(2, fn) == ["False", "refused"]


def test_master_signal_reaches_every_rank_and_is_acked() -> None:
    master = FakeMaster()
    session = MasterSession(master.url, master.token)

    def fn(d: DistributedContext) -> int:
        with PreemptContext(session, "7.1", d, longpoll_s=1) as p:
            for step in range(10_000):
                if d.rank == 0 and step == 5:
                    master.preempt.set()
                if p.should_preempt():
                    return step
                time.sleep(0.002)
        return -1

    steps = run_ranks(3, fn)
    assert len(set(steps)) == 1 and steps[0] >= 5
    assert master.acks == 1


def test_a_stop_requested_before_the_job_started_is_seen_by_the_first_long_poll() -> None:
    master = FakeMaster()
    master.preempt.set()
    session = MasterSession(master.url, master.token)
    with PreemptContext(session, "7.1", DummyDistributedContext(), longpoll_s=60) as p:
        deadline = time.monotonic() + 5
        while not p.should_preempt() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.should_preempt()
    polls = [path for _, path, _ in master.requests if "/signals/preemption" in path]
    assert polls == [
        "/api/v1/allocations/7.1/signals/preemption?timeoutSeconds=60"
    ]  # one request, a long poll


def test_signal_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DET_PREEMPT_SIGNAL", raising=False)
    assert get_preempt_signals() == [signal.SIGTERM, signal.SIGUSR1]
    monkeypatch.setenv("DET_PREEMPT_SIGNAL", "USR2")
    assert get_preempt_signals() == [signal.SIGTERM, signal.SIGUSR2]
    monkeypatch.setenv("DET_PREEMPT_SIGNAL", "none")
    assert get_preempt_signals() == [signal.SIGTERM]


WORKER = textwrap.dedent(
    """
    import json, sys, time
    from harness.core import DistributedContext, PreemptContext
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    d = DistributedContext(rank=rank, size=4, local_rank=rank, local_size=4, cross_rank=0, cross_size=1,
                           pub_port=port)
    with PreemptContext(None, "", d) as p:
        print("ready", flush=True)
        step = 0
        while not p.should_preempt():
            step += 1
            time.sleep(0.005)
    print(json.dumps({"rank": rank, "step": step}), flush=True)
    d.close()
    """
)


def test_sigterm_to_one_process_preempts_all(tmp_path: Path) -> None:
    script = tmp_path / "w.py"
    script.write_text(WORKER)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), str(port)], stdout=subprocess.PIPE, env=env, text=True
        )
        for r in range(4)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    procs[2].send_signal(signal.SIGTERM)
    outs = [json.loads(p.communicate(timeout=20)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0]
    assert len({o["step"] for o in outs}) == 1
