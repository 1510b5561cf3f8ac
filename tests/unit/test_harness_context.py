from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
from fake_master import FakeMaster, cluster_info
from parallel import run_ranks

from harness import core
from harness.core import DistributedContext
from harness.core._searcher import DummySearcherContext

REPO = Path(__file__).resolve().parents[2]


def test_import_is_light() -> None:
    code = (
        "import sys, harness, harness.core; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


def test_off_cluster_falls_back_to_dummies(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DET_CLUSTER_INFO", raising=False)
    with core.init(checkpoint_storage=str(tmp_path)) as ctx:
        assert isinstance(ctx.train, core.DummyTrainContext)
        assert isinstance(ctx.checkpoint, core.DummyCheckpointContext)
        assert isinstance(ctx.preempt, core.DummyPreemptContext)
        assert ctx.info is None and core.get_cluster_info() is None
        ctx.train.report_training_metrics(1, {"loss": 1.0})
        assert ctx.train.history == [("training", 1, {"loss": 1.0})]  # type: ignore[attr-defined]
        assert not ctx.preempt.should_preempt()
        lengths = []
        for op in ctx.searcher.operations():
            lengths.append(op.length)
            op.report_completed(0.1)
        assert lengths == [1]
        with ctx.checkpoint.store_path({"steps_completed": 1}) as (p, sid):
            (p / "x").write_text("1")
        assert (tmp_path / sid / "x").exists()


def test_on_cluster_end_to_end(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    master = FakeMaster()
    master.ops = [4, 8]
    info_path = tmp_path / "cluster_info.json"
    info_path.write_text(json.dumps(cluster_info(master)))
    monkeypatch.setenv("DET_CLUSTER_INFO", str(info_path))
    monkeypatch.setenv("DET_STORAGE_ROOT", str(tmp_path / "ckpts"))
    monkeypatch.setenv("DET_JOB_STORAGE", str(tmp_path / "job"))
    info = core.get_cluster_info()
    assert info is not None
    assert info.trial.trial_id == 7 and info.trial.hparams["lr"] == 0.1 and info.trial.experiment_id == 3
    assert info.container_addrs == ["127.0.0.1"] and info.slot_ids == [0] and info.user_data == {"owner": "x"}
    with core.init() as ctx:
        assert ctx.info is not None
        steps = 0
        for op in ctx.searcher.operations():
            while steps < op.length:
                steps += 1
                ctx.train.report_training_metrics(steps, {"loss": 1 / steps})
                op.report_progress(steps)
            ctx.train.report_validation_metrics(steps, {"loss": 0.5})
            op.report_completed(0.5)
        with ctx.checkpoint.store_path({"steps_completed": steps}) as (p, sid):
            (p / "w").write_text("w")
        assert ctx.train.get_experiment_best_validation() == 0.5
    assert master.completed_ops == [(4, 0.5), (8, 0.5)]
    assert (7, 1, "validation", 4) in master.metrics and (7, 1, "validation", 8) in master.metrics
    assert len([k for k in master.metrics if k[2] == "training"]) == 8
    assert sid in master.checkpoints


@pytest.mark.parametrize("answer_next", [False, True])
def test_a_completion_that_brings_the_next_operation_saves_asking(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, answer_next: bool
) -> None:
    master = FakeMaster()
    master.ops, master.answer_next = [4, 8], answer_next
    monkeypatch.setenv("DET_CLUSTER_INFO", json.dumps(cluster_info(master)))
    monkeypatch.setenv("DET_STORAGE_ROOT", str(tmp_path))
    with core.init() as ctx:
        lengths = []
        for op in ctx.searcher.operations():
            lengths.append(op.length)
            ctx.train.report_validation_metrics(op.length, {"loss": 0.5})
            op.report_completed(0.5)
    assert lengths == [4, 8] and master.completed_ops == [(4, 0.5), (8, 0.5)]
    asked = [p for m, p, _ in master.requests if m == "GET" and p.endswith("/searcher/operation")]
    # The first operation is always asked for; after each completion only when the master did not say.
    # (Without `next`, each completion is answered "pending" once, as the real master's is.)
    assert len(asked) == (1 if answer_next else 5)


def test_invalid_hp_exits_zero_and_reports(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    master = FakeMaster()
    info_path = tmp_path / "ci.json"
    info_path.write_text(json.dumps(cluster_info(master)))
    monkeypatch.setenv("DET_CLUSTER_INFO", str(info_path))
    monkeypatch.setenv("DET_STORAGE_ROOT", str(tmp_path))
    with pytest.raises(SystemExit) as e, core.init():
        raise core.InvalidHP("lr too big")
    assert e.value.code == 0
    assert any(p.endswith("/early_exit") for _, p, _ in master.requests)


def test_multi_slot_without_distributed_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    master = FakeMaster()
    ci = cluster_info(master)
    ci["slot_ids"] = [0, 1]
    monkeypatch.setenv("DET_CLUSTER_INFO", json.dumps(ci))
    monkeypatch.setenv("DET_STORAGE_ROOT", str(tmp_path))
    for var in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="DistributedContext"):
        core.init()


def test_slurm_nodeid_sets_container_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    master = FakeMaster()
    ci = cluster_info(master)
    ci["container_addrs"] = ["10.0.0.1", "10.0.0.2"]
    monkeypatch.setenv("DET_CLUSTER_INFO", json.dumps(ci))
    monkeypatch.setenv("SLURM_NODEID", "1")
    info = core.get_cluster_info()
    assert info is not None and info.container_rank == 1


def test_dummy_searcher_collective() -> None:
    def fn(d: DistributedContext) -> list[int]:
        s = DummySearcherContext(d, length=5)
        out = []
        for op in s.operations():
            out.append(op.length)
            if d.rank == 0:
                op.report_completed(1.0)
        return out

    assert run_ranks(3, fn) == [[5], [5], [5]]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_checkpoint_is_registered_only_after_the_metrics_before_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, asynchronous: bool
) -> None:
    """A trial resumed from a checkpoint continues after its steps; metrics reported before the checkpoint and
    still queued when the job died would be lost for good. So registering waits for them (the shipper here
    would otherwise hold them for a minute)."""
    from harness._http import MasterSession
    from harness.core._metrics import MetricsShipper
    from harness.core._train import TrainContext

    master = FakeMaster()
    monkeypatch.setenv("DET_CLUSTER_INFO", json.dumps(cluster_info(master)))
    session = MasterSession(master.url, master.token, timeout_s=5)
    shipper = MetricsShipper(session, 7, flush_interval_s=60, spill_dir=tmp_path / "spill")
    ctx = core.Context(
        checkpoint=core.CheckpointContext(core.DummyDistributedContext(), tmp_path, session, 7, 1),
        train=TrainContext(session, 7, 1, 3, shipper),
        _shipper=shipper,
    )
    with ctx:
        for step in (1, 2, 3):
            ctx.train.report_training_metrics(step, {"loss": 1 / step})
        sid = ctx.checkpoint.save_state({"w": 1}, {"steps_completed": 3}, asynchronous=asynchronous)
        ctx.checkpoint.wait()
        order = [p for m, p, _ in master.requests if m == "POST"]
        assert sid in master.checkpoints
        first_checkpoint = order.index("/api/v1/checkpoints")
        assert "/api/v1/trials/7/metrics/batch" in order[:first_checkpoint], order
