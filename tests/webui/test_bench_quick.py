"""``bench/webui_curves.py --quick`` runs end to end (100 trials × 1,000 points; about 10 s): the database is
written, the curves request answers every trial and the page draws them in Chromium."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require

pytestmark = [pytest.mark.browser]
ROOT = Path(__file__).resolve().parents[2]


def test_quick_benchmark_runs(tmp_path: Path) -> None:
    require(Path("/usr/bin/chromium").exists(), "chromium")
    out = tmp_path / "results.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench/webui_curves.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = out.read_text()
    assert "100 trials × 1,000 points (102,010 metric rows)" in text
    assert "| 100 trials, warm (median of 5) |" in text and "| 1 trial, warm (median) |" in text
