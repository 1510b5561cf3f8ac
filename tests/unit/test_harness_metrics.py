from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
from fake_master import FakeMaster

from harness._http import MasterSession
from harness.core._metrics import MetricsShipper
from harness.core._train import TrainContext


def _train(master: FakeMaster, tmp_path: Path, **kw: float) -> tuple[TrainContext, MetricsShipper]:
    session = MasterSession(master.url, master.token, timeout_s=5)
    shipper = MetricsShipper(
        session,
        7,
        flush_interval_s=0.02,
        backoff_base_s=0.02,
        backoff_cap_s=0.1,
        spill_dir=tmp_path,
        **kw,  # type: ignore[arg-type]
    )
    return TrainContext(session, 7, 1, 3, shipper), shipper


def test_batches_not_one_call_per_step(tmp_path: Path) -> None:
    master = FakeMaster()
    train, shipper = _train(master, tmp_path)
    for step in range(1, 501):
        train.report_training_metrics(step, {"loss": 1.0 / step}, batch_metrics=[{"loss": 1.0}])
    train.report_validation_metrics(500, {"loss": 0.1})
    assert shipper.close(10)
    assert len(master.metrics) == 501
    assert master.batches < 100
    item = master.metrics[(7, 1, "training", 3)]
    assert item["metrics"]["avgMetrics"] == {"loss": 1.0 / 3}
    assert item["metrics"]["batchMetrics"] == [{"loss": 1.0}]


def test_outage_then_recovery_no_loss_no_dup(tmp_path: Path) -> None:
    master = FakeMaster()
    master.fail_until = time.monotonic() + 0.5  # 503s, like a restarting master
    train, shipper = _train(master, tmp_path)
    for step in range(300):
        train.report_training_metrics(step, {"loss": float(step)})
        if step == 150:
            port = master.url.rsplit(":", 1)[1]
            master.stop()  # then connection refused
            time.sleep(0.3)
            master._port = int(port)
            master.start()
    assert shipper.close(20)
    assert sorted(k[3] for k in master.metrics) == list(range(300))
    assert shipper.failures > 0
    # Retries may re-send a batch the master already took; the master counts those as duplicates, stores once.
    assert len(master.metrics) == 300


def test_bounded_queue_spills_to_disk_and_resends(tmp_path: Path) -> None:
    master = FakeMaster()
    master.fail_until = time.monotonic() + 0.6
    train, shipper = _train(master, tmp_path, max_queue_items=20, batch_size=7)
    for step in range(200):
        train.report_metrics("custom", step, {"x": step})
    assert len(list(tmp_path.glob("*.jsonl*"))) >= 1
    assert shipper.close(20)
    assert sorted(k[3] for k in master.metrics) == list(range(200))
    assert not list(tmp_path.glob("*.jsonl*"))


def test_close_timeout_keeps_metrics_for_next_run(tmp_path: Path) -> None:
    master = FakeMaster()
    master.fail_until = time.monotonic() + 3600
    train, shipper = _train(master, tmp_path)
    for step in range(10):
        train.report_training_metrics(step, {"loss": 1.0})
    assert not shipper.close(0.3)
    assert len(master.metrics) == 0
    master.fail_until = 0
    # The next run of the same trial sends what the last one could not.
    _, shipper2 = _train(master, tmp_path)
    assert shipper2.flush(10)
    shipper2.close(5)
    assert sorted(k[3] for k in master.metrics) == list(range(10))


def test_progress_and_status_coalesced(tmp_path: Path) -> None:
    master = FakeMaster()
    train, shipper = _train(master, tmp_path)
    for i in range(100):
        train.report_progress(i / 100)
    train.set_status("validating")
    assert shipper.close(5)
    assert master.progress[-1] == 0.99
    assert len(master.progress) < 100
    assert train.get_experiment_best_validation() == 0.5


def test_tensor_metrics_become_floats(tmp_path: Path) -> None:
    import torch

    master = FakeMaster()
    train, shipper = _train(master, tmp_path)
    train.report_training_metrics(1, {"loss": torch.tensor(0.5), "acc": torch.tensor([1.0, 2.0])})
    assert shipper.close(5)
    assert master.metrics[(7, 1, "training", 1)]["metrics"]["avgMetrics"] == {"loss": 0.5, "acc": [1.0, 2.0]}
