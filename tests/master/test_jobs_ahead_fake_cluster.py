"""The jobs ahead of each pending trial run (issue 37), on the scripted Slurm (``slurm_backend.fake``: priority/basic
order, every user's jobs): counted with one extra ``squeue`` of the pending queue at most every
``AHEAD_EVERY_S``, recorded on the runs, shown by the API and ``det e describe``'s waiting lines. On the real
cluster: tests/e2e/test_slurm_faults.py (a held job)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.cli import trial as cli_trial
from hpc_master.masterconf import MasterConfig
from slurm_backend.cli import SlurmCli
from slurm_backend.poller import AHEAD_EVERY_S
from tests.master.helpers import create_experiment
from tests.master.test_lifecycle_fake_cluster import FOUR, POLL_S, World

SCRIPT = "#!/bin/bash\n#SBATCH --partition=batch\nsleep 100\n"


@pytest.fixture
def world(client: TestClient, sessions: sessionmaker[Session], config: MasterConfig) -> World:
    return World(client, sessions, config)


def _pending_queries(world: World) -> int:
    return sum(1 for c in world.cluster.calls if "squeue" in c.argv[:5] and "--states=PENDING" in c.argv)


def test_each_pending_run_says_how_many_jobs_are_ahead(world: World) -> None:
    other = SlurmCli(runner=world.cluster, sleep=lambda _s: None)
    other.run(["runuser", "-u", "someone-else", "--", "sbatch", "--parsable"], stdin=SCRIPT)  # first in line
    exp_id = create_experiment(world.client, world.headers, FOUR)
    world.tick(times=2)
    runs = []
    for trial in world.trials(exp_id):
        shown = world.client.get(f"/api/v1/trials/{trial.id}", headers=world.headers).json()["trial"]["runs"][
            -1
        ]
        runs.append(shown)
    assert sorted(r["jobsAhead"] for r in runs) == [1, 2, 3, 4], runs  # someone else's job, then each other
    assert "jobs ahead]" in str(
        cli_trial.waiting_text(runs[0] | {"pendingReason": "Priority", "pendingClass": "priority"})
    )

    asked = _pending_queries(world)
    world.tick(advance_s=POLL_S, times=2)  # within AHEAD_EVERY_S: not asked again
    assert _pending_queries(world) == asked
    world.tick(advance_s=AHEAD_EVERY_S, times=1)
    assert _pending_queries(world) == asked + 1

    first = min(world.trials(exp_id), key=lambda t: t.id)
    world.cluster.start(world.job(first.id))
    world.tick(advance_s=AHEAD_EVERY_S)
    (run,) = world.runs(first.id)
    assert (run.state, run.jobs_ahead) == ("RUNNING", None)  # running: nothing ahead any more
