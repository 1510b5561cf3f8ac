"""`det preview`: a valid config prints its plan; a broken one exits 2 naming the YAML path."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_master.cli.main import main

ASHA = """
entrypoint: python3 train.py
hyperparameters:
  lr: {type: log, minval: -4, maxval: -1}
searcher:
  name: adaptive_asha
  metric: validation_loss
  max_trials: 16
  max_length: {batches: 900}
  divisor: 3
  max_rungs: 3
  max_concurrent_trials: 4
"""


def test_preview_prints_brackets_and_rung_lengths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "asha.yaml"
    cfg.write_text(ASHA)
    assert main(["preview", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "Search method: adaptive_asha (minimise validation_loss)" in out
    # Determined's rung lengths for max_length 900 and divisor 3 with 3 rungs: 100, 300, 900.
    assert "rung 1: train to 100 batches" in out
    assert "rung 3: train to 900 batches" in out
    assert "Simulated run on synthetic curves" in out


def test_preview_rejects_a_typo_with_the_yaml_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(ASHA.replace("max_trials", "max_trails"))
    assert main(["preview", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "`searcher.max_trails`: unknown field; did you mean `max_trials`?" in err


def test_preview_of_a_missing_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["preview", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
