"""`det e create -f` on a real Slurm cluster: the exit status says how the first trial ended.

Needs the local Slurm cluster (``det deploy local up``) and a master whose lifecycle loop submits trials. Until
the loop exists, the master never creates trials: the test then skips, saying so.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.cli.conftest import Det
from tests.conftest import require

LIFECYCLE_WAIT_S = 20.0

FAILING_CONFIG = """\
name: cli-follow-failing
entrypoint: python3 fail.py
max_restarts: 0
searcher:
  name: single
  metric: validation_loss
  max_length:
    batches: 1
resources:
  slots_per_trial: 0
"""


@pytest.mark.slurm
def test_follow_first_trial_exit_status_for_a_failing_trial(det: Det, tmp_path: Path) -> None:
    require(shutil.which("sbatch") is not None, "Slurm (sbatch)")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "fail.py").write_text("import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n")
    cfg = tmp_path / "fail.yaml"
    cfg.write_text(FAILING_CONFIG)

    # Does this master run trials at all? Probe with a real experiment first.
    probe = det("e", "create", str(cfg), str(ctx))
    assert probe.rc == 0, probe.err
    probe_id = int(probe.out.split()[-1])
    deadline = time.monotonic() + LIFECYCLE_WAIT_S
    while time.monotonic() < deadline:
        described = json.loads(det("e", "describe", str(probe_id), "--json").out)
        if described["experiment"].get("trialIds"):
            break
        time.sleep(0.5)
    else:
        det("e", "kill", str(probe_id))
        pytest.skip(
            f"the master created no trial within {LIFECYCLE_WAIT_S:.0f} s: it has no lifecycle loop yet "
            "(searcher → Slurm), so `det e create -f` has nothing to follow"
        )
    det("e", "kill", str(probe_id))

    r = det("e", "create", str(cfg), str(ctx), "-f")
    assert "Created experiment" in r.out
    assert "about to fail" in r.out
    assert r.rc == 1, r.err  # 1: the trial ended in ERROR
    assert "ended: ERROR" in r.err
