"""TensorBoard scalars written by the harness: the event-file format, read back by TensorBoard's own reader."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
from fake_master import FakeMaster, cluster_info

from harness import core
from harness._http import MasterSession
from harness.core._metrics import MetricsShipper
from harness.core._tfevents import EventsWriter, crc32c, masked_crc32c
from harness.core._train import TrainContext

REPO = Path(__file__).resolve().parents[2]


def _scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in ``directory`` as TensorBoard reads it: tag -> [(step, value)]."""
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="tensorboard is not installed: cannot read event files back with TensorBoard's reader",
    )
    acc = accumulator.EventAccumulator(str(directory))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _f32(x: float) -> float:
    out: float = struct.unpack("<f", struct.pack("<f", x))[0]
    return out


def test_crc32c_known_vectors() -> None:
    assert crc32c(b"") == 0
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720, B.4
    assert crc32c(b"\xff" * 32) == 0x62A8AB43


def test_masked_crc_matches_tensorboard() -> None:
    stub = pytest.importorskip(
        "tensorboard.compat.tensorflow_stub.pywrap_tensorflow", reason="tensorboard is not installed"
    )
    for data in (b"", b"123456789", struct.pack("<Q", 61), bytes(range(256)) * 3):
        assert masked_crc32c(data) == stub.masked_crc32c(data)


def test_events_file_read_back_by_tensorboard(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "b"
    writer = EventsWriter(directory)
    assert not directory.exists()  # nothing is created before the first write
    writer.add_scalars(
        1, {"loss": 0.1, "acc": 1, "flag": True, "name": "x", "vec": [1.0], "nested": {"a": 1}}
    )
    writer.add_scalars(2, {"loss": 0.05, "nan": float("nan"), "inf": float("-inf"), "big": 1e40})
    writer.add_scalars(3, {"only": "strings"})  # no numbers: no event
    writer.add_scalars(2**40, {"loss": -7.25})
    writer.close()
    assert directory.stat().st_mode & 0o777 == 0o750
    [name] = [p.name for p in directory.iterdir()]
    assert name.startswith("events.out.tfevents.") and writer.path is not None and name in writer.path
    got = _scalars(directory)
    assert sorted(got) == ["acc", "big", "inf", "loss", "nan"]
    assert got["loss"] == [(1, _f32(0.1)), (2, _f32(0.05)), (2**40, -7.25)]
    assert got["acc"] == [(1, 1.0)]
    assert got["inf"] == [(2, -math.inf)] and got["big"] == [(2, math.inf)]
    assert len(got["nan"]) == 1 and math.isnan(got["nan"][0][1])


def _train(master: FakeMaster, tmp_path: Path) -> tuple[TrainContext, MetricsShipper]:
    session = MasterSession(master.url, master.token, timeout_s=5)
    shipper = MetricsShipper(session, 7, flush_interval_s=0.02, spill_dir=tmp_path / "spill")
    return TrainContext(session, 7, 1, 3, shipper), shipper


def test_train_context_writes_determined_tags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tb = tmp_path / "tensorboard" / "experiment" / "3" / "trial" / "7"
    monkeypatch.setenv("DET_TENSORBOARD_PATH", str(tb))
    master = FakeMaster()
    train, shipper = _train(master, tmp_path)
    assert train.get_tensorboard_path() == tb and tb.is_dir()
    for step in (10, 20):
        train.report_training_metrics(step, {"loss": 1.0 / step, "note": "text"})
    train.report_validation_metrics(20, {"loss": 0.25, "validation_accuracy": 0.75})
    train.report_metrics("inference", 20, {"latency": 3.0})
    assert train.flush(10)
    assert _scalars(tb) == {
        "Determined/loss": [(10, _f32(0.1)), (20, _f32(0.05))],
        "Determined/validation_loss": [(20, 0.25)],
        "Determined/validation_accuracy": [(20, 0.75)],
        "Determined/inference/latency": [(20, 3.0)],
    }
    assert len(master.metrics) == 4  # the master still gets everything
    train.close()
    shipper.close(5)


def test_only_with_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    master = FakeMaster()
    monkeypatch.chdir(tmp_path)
    for env in (None, str(tmp_path / "tb")):
        if env is None:
            monkeypatch.delenv("DET_TENSORBOARD_PATH", raising=False)
        else:
            monkeypatch.setenv("DET_TENSORBOARD_PATH", env)
        train, shipper = _train(master, tmp_path)
        assert train.get_tensorboard_path() == (env and Path(env))
        train.report_training_metrics(1, {"loss": 1.0})
        assert train.flush(10)
        train.close()
        shipper.close(5)
        files = list(tmp_path.rglob("events.out.tfevents.*"))
        assert [f.parent for f in files] == ([] if env is None else [tmp_path / "tb"])


def test_context_close_writes_scalars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    master = FakeMaster()
    tb = tmp_path / "tb"
    monkeypatch.setenv("DET_CLUSTER_INFO", json.dumps(cluster_info(master)))
    monkeypatch.setenv("DET_STORAGE_ROOT", str(tmp_path / "ckpts"))
    monkeypatch.setenv("DET_JOB_STORAGE", str(tmp_path / "job"))
    monkeypatch.setenv("DET_TENSORBOARD_PATH", str(tb))
    with core.init() as ctx:
        ctx.train.report_training_metrics(5, {"loss": 0.5})  # no flush: closing the context writes it
    assert _scalars(tb) == {"Determined/loss": [(5, 0.5)]}


def test_trial_context_tensorboard_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch.utils.tensorboard", reason="torch's SummaryWriter needs tensorboard")
    from harness.trial._context import PyTorchTrialContext

    monkeypatch.setenv("DET_TENSORBOARD_PATH", str(tmp_path / "tb"))
    master = FakeMaster()
    train, shipper = _train(master, tmp_path)
    ctx = PyTorchTrialContext(
        core.Context(
            checkpoint=core.DummyCheckpointContext(core.DummyDistributedContext(), tmp_path), train=train
        ),
        hparams={},
        config={},
    )
    writer = ctx.get_tensorboard_writer()
    assert writer is not None and writer is ctx.get_tensorboard_writer()
    writer.add_scalar("custom", 2.0, 3)
    writer.flush()
    train.report_training_metrics(3, {"loss": 1.0})
    train.close()
    shipper.close(5)
    assert _scalars(tmp_path / "tb") == {"custom": [(3, 2.0)], "Determined/loss": [(3, 1.0)]}

    monkeypatch.delenv("DET_TENSORBOARD_PATH")
    off = PyTorchTrialContext(core._dummy_init(checkpoint_storage=str(tmp_path / "c")), hparams={}, config={})
    assert off.get_tensorboard_writer() is None


def test_writer_on_import_path_is_light() -> None:
    code = (
        "import sys, harness.core; "
        "print('harness.core._tfevents' in sys.modules, [m for m in ('tensorboard', 'google.protobuf') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "True []"
