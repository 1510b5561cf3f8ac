"""Asynchronous checkpoints (``CheckpointContext.save_state(asynchronous=True)``), on real torch, files and processes.

A save is kept in flight for as long as a test needs by a ``Gate`` in the state: a plain user object whose
pickling (in the writer thread) waits for the test to open it. Nothing in the harness is patched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
import toy_trial
from fake_master import FakeMaster
from parallel import run_ranks

from harness import core
from harness import trial as det_trial
from harness._http import MasterSession
from harness.core import CheckpointContext, DistributedContext, DummyDistributedContext

REPO = Path(__file__).resolve().parents[2]


class Gate:
    """Unpickles as 0; pickling waits until the gate opens (at most 30 s)."""

    def __init__(self) -> None:
        self.opened = threading.Event()

    def __deepcopy__(self, memo: Any) -> Gate:
        return self  # staged as itself, so the test still holds it

    def __reduce__(self) -> Any:
        self.opened.wait(30)
        return (int, (0,))

    def open_later(self, delay_s: float) -> None:
        threading.Timer(delay_s, self.opened.set).start()


def visible(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


def hidden(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def make_ctx(tmp_path: Path) -> tuple[CheckpointContext, FakeMaster]:
    master = FakeMaster()
    session = MasterSession(master.url, master.token)
    return CheckpointContext(DummyDistributedContext(), tmp_path, session, 7, 1), master


def test_async_save_returns_before_durable_and_saves_the_staged_snapshot(tmp_path: Path) -> None:
    ctx, master = make_ctx(tmp_path)
    gate = Gate()
    w = torch.arange(1000, dtype=torch.float32)
    sid = ctx.save_state({"w": w, "gate": gate, "step": 3}, {"steps_completed": 3}, asynchronous=True)
    # returned while the writer is still blocked: nothing visible, nothing registered, only the incomplete name
    assert visible(tmp_path) == [] and sid not in master.checkpoints
    assert hidden(tmp_path) == [f".{sid}.tmp"]
    w.add_(1)  # training goes on and changes the live tensor
    gate.opened.set()
    assert ctx.wait() == sid
    assert visible(tmp_path) == [sid] and hidden(tmp_path) == []
    assert master.checkpoints[sid]["metadata"] == {"steps_completed": 3}
    assert master.checkpoints[sid]["resources"]["state_dict.pth"] > 4000
    saved = torch.load(tmp_path / sid / "state_dict.pth", weights_only=False)
    assert torch.equal(saved["w"], torch.arange(1000, dtype=torch.float32))  # the values at the call
    assert saved["step"] == 3 and saved["gate"] == 0


def test_staging_buffer_is_allocated_once_reused_and_one_copy(tmp_path: Path) -> None:
    ctx, _ = make_ctx(tmp_path)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "opt": opt.state_dict()}
    nbytes = sum(t.numel() * t.element_size() for t in _tensors(state))
    ctx.save_state(state, {"steps_completed": 1}, asynchronous=True)
    staging = ctx._staging
    assert staging is not None and staging.nbytes == nbytes and staging.allocated_bytes == nbytes
    first = staging.allocations
    for step in (2, 3):
        opt.step()
        ctx.save_state(
            {"model": model.state_dict(), "opt": opt.state_dict()},
            {"steps_completed": step},
            asynchronous=True,
        )
        assert staging.allocations == first and staging.allocated_bytes == 0  # reused
        assert staging.nbytes == nbytes  # at most one copy of the state
    sid = ctx.wait()
    assert sid is not None
    saved = torch.load(tmp_path / sid / "state_dict.pth", weights_only=False)
    assert all(torch.equal(saved["model"][k], v) for k, v in model.state_dict().items())
    ctx.save_state({"only": torch.zeros(3)}, {"steps_completed": 4}, asynchronous=True)
    assert staging.nbytes == 12  # buffers of tensors that left the state are freed
    ctx.wait()


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


def test_final_save_with_no_step_since_is_the_save_in_flight(tmp_path: Path) -> None:
    ctx, master = make_ctx(tmp_path)
    gate = Gate()
    sid = ctx.save_state({"w": torch.ones(3), "g": gate}, {"steps_completed": 5}, asynchronous=True)
    gate.open_later(0.3)
    final = ctx.save_state({"w": torch.ones(3)}, {"steps_completed": 5})  # the preemption's save
    assert final == sid
    assert sid in master.checkpoints  # durable and registered when the final save returned
    assert visible(tmp_path) == [sid] and list(master.checkpoints) == [sid]


def test_final_save_after_a_step_abandons_the_save_in_flight(tmp_path: Path) -> None:
    ctx, master = make_ctx(tmp_path)
    gate = Gate()
    stale = ctx.save_state({"w": torch.ones(3), "g": gate}, {"steps_completed": 5}, asynchronous=True)
    gate.open_later(0.3)
    final = ctx.save_state({"w": torch.full((3,), 6.0)}, {"steps_completed": 6})
    assert final != stale
    assert list(master.checkpoints) == [final]  # the stale one was never registered
    assert visible(tmp_path) == [final] and hidden(tmp_path) == []  # its incomplete directory removed
    assert master.checkpoints[final]["metadata"]["steps_completed"] == 6
    assert ctx.wait() is None


def test_once_preempted_an_asynchronous_request_is_a_final_save(tmp_path: Path) -> None:
    ckpt, master = make_ctx(tmp_path)
    with core.Context(checkpoint=ckpt) as ctx:
        ctx.checkpoint.save_state({"w": torch.ones(2)}, {"steps_completed": 1}, asynchronous=True)
        ctx.preempt._trigger_local()
        assert ctx.preempt.should_preempt()
        sid = ctx.checkpoint.save_state({"w": torch.ones(2)}, {"steps_completed": 2}, asynchronous=True)
        assert sid in master.checkpoints  # durable when it returned
        assert ctx.checkpoint._inflight is None


def test_one_save_in_flight_the_next_waits_and_close_completes_the_last(tmp_path: Path) -> None:
    ckpt, master = make_ctx(tmp_path)
    gate = Gate()
    with core.Context(checkpoint=ckpt) as ctx:
        first = ctx.checkpoint.save_state({"g": gate}, {"steps_completed": 1}, asynchronous=True)
        gate.open_later(0.3)
        second = ctx.checkpoint.save_state({"w": torch.ones(2)}, {"steps_completed": 2}, asynchronous=True)
        assert first in master.checkpoints  # the second waited for the first to be durable
        assert ctx.checkpoint._inflight is not None and ctx.checkpoint._inflight.storage_id == second
    assert list(master.checkpoints) == [first, second]  # closing the context completed the second


def test_writer_failure_is_raised_and_leaves_nothing(tmp_path: Path) -> None:
    ctx, master = make_ctx(tmp_path)

    class Unpicklable:
        def __deepcopy__(self, memo: Any) -> Unpicklable:
            return self

        def __reduce__(self) -> Any:
            raise OSError("disk full")

    sid = ctx.save_state({"x": Unpicklable()}, {"steps_completed": 1}, asynchronous=True)
    with pytest.raises(RuntimeError, match=f"asynchronous checkpoint {sid} failed: OSError: disk full"):
        ctx.wait()
    assert os.listdir(tmp_path) == [] and master.checkpoints == {}


def test_killed_mid_async_save_registers_nothing(tmp_path: Path) -> None:
    master = FakeMaster()
    code = (
        "import os, signal, threading, torch\n"
        "from harness._http import MasterSession\n"
        "from harness.core import CheckpointContext, DummyDistributedContext\n"
        "class Stuck:\n"
        "    def __deepcopy__(self, memo): return self\n"
        "    def __reduce__(self): threading.Event().wait(60)\n"
        f"s = MasterSession({master.url!r}, {master.token!r})\n"
        f"ctx = CheckpointContext(DummyDistributedContext(), {str(tmp_path)!r}, s, 7, 1)\n"
        "ctx.save_state({'w': torch.ones(1 << 20), 's': Stuck()}, {'steps_completed': 1}, asynchronous=True)\n"
        "print('staged', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == -9 and "staged" in out.stdout
    assert visible(tmp_path) == [] and master.checkpoints == {}


def test_refusals_name_what_is_wrong(tmp_path: Path) -> None:
    ctx, _ = make_ctx(tmp_path)
    with pytest.raises(ValueError, match=r"shard=True.*DeepSpeed.*async_save"):
        ctx.save_state({}, {"steps_completed": 1}, asynchronous=True, shard=True)
    with pytest.raises(ValueError, match="filename"):
        ctx.save_state({}, {"steps_completed": 1}, asynchronous=True, filename="../x")
    with pytest.raises(TypeError, match=r"model is a Linear; pass its state_dict\(\)"):
        ctx.save_state({"model": torch.nn.Linear(2, 2)}, {"steps_completed": 1}, asynchronous=True)
    with pytest.raises(ValueError, match="steps_completed"):
        ctx.save_state({}, {}, asynchronous=True)
    assert os.listdir(tmp_path) == []

    def fn(d: DistributedContext) -> str:
        c = CheckpointContext(d, tmp_path)
        try:
            c.save_state({"w": torch.ones(1)}, {"steps_completed": 1}, asynchronous=True)
        except RuntimeError as e:
            return str(e)
        c.wait()
        return "ok"

    out = run_ranks(2, fn)
    assert out[0] == "ok" and "only be called on the chief" in out[1]


def test_sharded_synchronous_save_state_still_works(tmp_path: Path) -> None:
    def fn(d: DistributedContext) -> str:
        c = CheckpointContext(d, tmp_path)
        return c.save_state(
            {"r": torch.tensor(d.rank)}, {"steps_completed": 1}, shard=True, filename=f"p{d.rank}.pt"
        )

    sids = run_ranks(2, fn)
    assert sids[0] == sids[1] and sorted(os.listdir(tmp_path / sids[0])) == [
        "metadata.json",
        "p0.pt",
        "p1.pt",
    ]


CONFIG: dict[str, Any] = {
    "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 25}},
    "min_validation_period": {"batches": 10},
    "min_checkpoint_period": {"batches": 4},
    "scheduling_unit": 5,
}


def _run(storage: Path, hp: dict[str, Any], latest: str | None = None) -> CheckpointContext:
    ctx = core._dummy_init(checkpoint_storage=str(storage))
    with ctx:
        trial, context = det_trial._trainer.build_trial(toy_trial.ToyTrial, ctx, hparams=hp, config=CONFIG)
        det_trial.Trainer(trial, context).fit(latest_checkpoint=latest)
    return ctx.checkpoint


def test_trial_periodic_checkpoints_are_asynchronous_and_resume_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DET_CLUSTER_INFO", raising=False)
    monkeypatch.setenv("DET_ASYNC_CHECKPOINTS", "1")
    hp = {"lr": 0.05, "global_batch_size": 4}
    toy_trial.SEEN.clear()
    _run(tmp_path / "a", hp)
    straight = list(toy_trial.SEEN)
    toy_trial.SEEN.clear()
    ckpt = _run(tmp_path / "b", {**hp, "preempt_at": 14})
    assert ckpt._staging is not None and ckpt._staging.allocations > 0  # periodic saves were staged
    saved = _by_steps(tmp_path / "b")
    # the periodic ones, then the final one (the save at 12 may have been in flight at 14: then abandoned)
    assert {4, 8, 14} <= set(saved) <= {4, 8, 12, 14}
    assert hidden(tmp_path / "b") == []
    _run(tmp_path / "b", hp, saved[14].name)
    assert straight == toy_trial.SEEN  # same batches, same order, none repeated or lost
    wa = torch.load(_by_steps(tmp_path / "a")[25] / "state_dict.pth", weights_only=False)
    wb = torch.load(_by_steps(tmp_path / "b")[25] / "state_dict.pth", weights_only=False)
    assert all(torch.equal(wa["models_state_dict"][0][k], v) for k, v in wb["models_state_dict"][0].items())


def _by_steps(root: Path) -> dict[int, Path]:
    out = {}
    for p in root.iterdir():
        if not p.name.startswith("."):
            out[json.loads((p / "metadata.json").read_text())["steps_completed"]] = p
    return out


def test_async_checkpoints_off_by_default_and_bad_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DET_CLUSTER_INFO", raising=False)
    monkeypatch.delenv("DET_ASYNC_CHECKPOINTS", raising=False)
    ckpt = _run(tmp_path / "a", {"lr": 0.05, "global_batch_size": 4})
    assert ckpt._staging is None  # synchronous unless asked for (until measured on an idle machine)
    monkeypatch.setenv("DET_ASYNC_CHECKPOINTS", "0")
    ckpt = _run(tmp_path / "c", {"lr": 0.05, "global_batch_size": 4})
    assert ckpt._staging is None
    monkeypatch.setenv("DET_ASYNC_CHECKPOINTS", "maybe")
    with pytest.raises(ValueError, match="DET_ASYNC_CHECKPOINTS"):
        _run(tmp_path / "b", {"lr": 0.05, "global_batch_size": 4})
