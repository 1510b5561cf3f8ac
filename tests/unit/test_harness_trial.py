from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
import toy_trial
from fake_master import FakeMaster, cluster_info

from harness import trial as det_trial
from harness.trial._data import DataLoader

REPO = Path(__file__).resolve().parents[2]
CONFIG: dict[str, Any] = {
    "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 25}},
    "min_validation_period": {"batches": 10},
    "scheduling_unit": 5,
}


def _weights(path: Path, sid: str) -> dict[str, torch.Tensor]:
    state = torch.load(path / sid / "state_dict.pth", weights_only=False)
    return dict(state["models_state_dict"][0])


def _latest(path: Path) -> str:
    dirs = [p for p in path.iterdir() if not p.name.startswith(".")]
    newest = max(dirs, key=lambda p: json.loads((p / "metadata.json").read_text())["steps_completed"])
    return newest.name


def test_preempt_then_resume_matches_uninterrupted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DET_CLUSTER_INFO", raising=False)
    hp = {"lr": 0.05, "global_batch_size": 4}
    a, b = tmp_path / "a", tmp_path / "b"
    toy_trial.SEEN.clear()
    det_trial.run(toy_trial.ToyTrial, hparams=hp, config=CONFIG, checkpoint_storage=str(a))
    straight = list(toy_trial.SEEN)
    assert len(straight) == 25

    toy_trial.SEEN.clear()
    det_trial.run(
        toy_trial.ToyTrial, hparams={**hp, "preempt_at": 13}, config=CONFIG, checkpoint_storage=str(b)
    )
    assert len(toy_trial.SEEN) == 13
    sid = _latest(b)
    assert json.loads((b / sid / "metadata.json").read_text())["steps_completed"] == 13
    det_trial.run(
        toy_trial.ToyTrial, hparams=hp, config=CONFIG, checkpoint_storage=str(b), latest_checkpoint=sid
    )
    assert straight == toy_trial.SEEN  # same batches, same order, none repeated or lost
    wa, wb = _weights(a, _latest(a)), _weights(b, _latest(b))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # RNG (dropout) and LR schedule restored too


def test_sharded_batches_equal_per_rank_and_resumable() -> None:
    ds = list(range(23))
    spec = DataLoader(ds, batch_size=2, shuffle=True)
    shards = [spec.get_data_loader(rank=r, size=3, seed=5)[1] for r in range(3)]
    assert len({len(s) for s in shards}) == 1 == 1
    flat = [i for s in shards for b in s for i in b]
    assert len(flat) == len(set(flat))
    s = shards[0]
    s.set_epoch(2)
    full = list(s)
    s.set_epoch(2)
    s.skip(2)
    assert list(s) == full[2:]
    val = [DataLoader(ds, batch_size=4).get_data_loader(rank=r, size=4, training=False)[1] for r in range(4)]
    assert len({len(v) for v in val}) == 1
    assert {i for v in val for b in v for i in b} == set(ds)


def test_on_cluster_trial_uses_searcher_ops_and_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    master = FakeMaster()
    master.ops = [6, 12]
    ci = cluster_info(
        master, config={**CONFIG, "searcher": {"metric": "val_loss", "max_length": {"batches": 12}}}
    )
    monkeypatch.setenv("DET_CLUSTER_INFO", json.dumps(ci))
    monkeypatch.setenv("DET_STORAGE_ROOT", str(tmp_path))
    monkeypatch.setenv("DET_JOB_STORAGE", str(tmp_path / "job"))
    toy_trial.SEEN.clear()
    det_trial.run(toy_trial.ToyTrial)
    assert len(toy_trial.SEEN) == 12
    assert [op for op, _ in master.completed_ops] == [6, 12]
    assert {k[3] for k in master.metrics if k[2] == "validation"} == {6, 10, 12}
    assert {k[3] for k in master.metrics if k[2] == "training"} == {5, 6, 10, 12}
    assert [c["metadata"]["steps_completed"] for c in master.checkpoints.values()] == [12]


def test_run_trial_cli_off_cluster(tmp_path: Path) -> None:
    (tmp_path / "cfg.json").write_text(json.dumps(CONFIG))
    env = {k: v for k, v in os.environ.items() if k != "DET_CLUSTER_INFO"}
    env["PYTHONPATH"] = f"{REPO}:{REPO / 'tests' / 'harness'}"
    p = subprocess.run(
        [sys.executable, "-m", "harness.exec.run_trial", "toy_trial:ToyTrial", "--config", str(tmp_path / "cfg.json"),
         "--hparams", '{"lr": 0.1, "global_batch_size": 8}', "--max-length", "3", "--checkpoint-dir", str(tmp_path / "c")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "trial finished after 3 batches" in p.stderr
