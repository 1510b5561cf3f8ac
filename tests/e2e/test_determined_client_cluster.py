"""Determined 0.38.1's own CLI and SDK, unmodified, against a real master running a real experiment on the local
cluster: ``det e create`` uploads the context, the trial runs as the researcher's Slurm job, and ``det e wait``,
``t logs``, ``e list-checkpoints``, ``checkpoint download`` and the SDK's ``top_checkpoint().download()`` and
``Trial.iter_metrics`` see what the job did (the fast tests in tests/determined_client seed rows instead)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from tests.determined_client.conftest import DeterminedClient, client_venv_or_skip
from tests.e2e.conftest import CONTEXT, Master

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.determined_client]
CONST = """
name: e2e-determined-client
entrypoint: python3 train.py
hyperparameters: {increment_by: 2, sleep_s: 0.02}
searcher: {name: single, metric: validation_loss, smaller_is_better: true, max_length: {batches: 20}}
max_restarts: 0
"""
ALICE = {"DET_USER": "alice", "DET_PASS": "alice-pw"}


def test_determined_s_client_runs_and_reads_a_real_experiment(
    master: Master, alice: dict[str, str], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    client = DeterminedClient(client_venv_or_skip(), master, home)  # type: ignore[arg-type]
    config = tmp_path / "const.yaml"
    config.write_text(CONST)

    r = client.det("e", "create", str(config), str(CONTEXT), env=ALICE)
    assert r.rc == 0, r.err
    experiment_id = int(r.out.split("Created experiment ")[1].split()[0])
    # A real trial on the shared cluster lane: 60 s was too short once, with the CPUs 96 % busy (CI-8).
    r = client.det("e", "wait", str(experiment_id), env=ALICE, timeout_s=300)
    assert r.rc == 0, (r.out, r.err, master.diagnose(experiment_id))
    assert master.experiment(alice, experiment_id)["state"] == "STATE_COMPLETED"

    (trial,) = master.trials(alice, experiment_id)
    logs = client.det("t", "logs", str(trial["id"]), env=ALICE)
    assert logs.rc == 0 and "done: x=40 steps=20" in logs.out, logs.err

    listed = client.det("e", "list-checkpoints", str(experiment_id), "--csv", env=ALICE)
    assert listed.rc == 0, listed.err
    rows = list(csv.reader(io.StringIO(listed.out)))
    uuids = [row[4] for row in rows[1:]]
    assert [row[1] for row in rows[1:]][:4] == ["5", "10", "15", "20"]  # checkpointed every 5 steps
    kept = [row[4] for row in rows[1:] if row[2] == "COMPLETED" and row[1] == "20"]  # GC keeps the last
    out = tmp_path / "ckpt"
    r = client.det("checkpoint", "download", kept[0], "-o", str(out), env=ALICE)
    assert r.rc == 0, r.err
    assert json.loads((out / "state.json").read_text()) == {"x": 40, "steps": 20}

    code = f"""
import json, pathlib
from determined.experimental import client
client.login(master={master.url!r}, user="alice", password="alice-pw")
exp = client.get_experiment({experiment_id})
best = exp.top_checkpoint()
path = best.download({str(tmp_path / "sdk")!r})
trial = exp.list_trials()[0]
validation = [m.metrics for m in trial.iter_metrics("validation")]
training = [m.steps_completed for m in trial.iter_metrics("training")]
print(json.dumps({{"state": json.loads((pathlib.Path(path) / "state.json").read_text()),
                  "validation": validation, "training": training}}))
"""
    got = client.sdk(code, env={})
    assert isinstance(got, dict)
    assert got["state"] == {"x": 40, "steps": 20}  # the best (and only validated) checkpoint: the last
    assert got["validation"] == [{"validation_loss": pytest.approx(1 / 41)}]
    assert got["training"] == list(range(1, 21))
    print(
        f"Determined 0.38.1 client: experiment {experiment_id} created, waited, logs, {len(uuids)} checkpoints"
    )
