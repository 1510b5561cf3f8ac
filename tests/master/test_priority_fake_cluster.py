"""``resources.priority`` and ``max_slots`` in the lifecycle loop, on the scripted Slurm (``slurm_backend.fake``,
which orders pending jobs as priority/basic does: submission order less the nice). The same behaviours on the
real cluster: tests/e2e/test_priority.py."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import TrialModel, TrialRunModel
from hpc_master.masterconf import MasterConfig
from tests.master.helpers import create_experiment
from tests.master.test_lifecycle_fake_cluster import FOUR, World


@pytest.fixture
def world(client: TestClient, sessions: sessionmaker[Session], config: MasterConfig) -> World:
    return World(client, sessions, config)


def _jobs(world: World, exp_id: int) -> list[str]:
    with transaction(world.sessions) as s:
        rows = s.scalars(
            select(TrialRunModel.slurm_job_id)
            .join(TrialModel, TrialModel.id == TrialRunModel.trial_id)
            .where(TrialModel.experiment_id == exp_id, TrialRunModel.slurm_job_id.is_not(None))
            .order_by(TrialRunModel.id)
        )
        return [str(j) for j in rows]


def test_max_slots_caps_the_experiment_s_concurrent_jobs(world: World) -> None:
    exp_id = create_experiment(world.client, world.headers, FOUR + "resources: {max_slots: 2}\n")
    world.tick(times=2)
    assert len(world.trials(exp_id)) == 4  # the searcher wants four at once
    first = _jobs(world, exp_id)
    assert len(first) == 2  # max_slots 2 / 1 slot a trial
    reads = world.jobs.knobs.reads
    world.tick(times=3)  # two trials wait for room: the ticks check it without reading the config again
    assert (len(_jobs(world, exp_id)), world.jobs.knobs.reads) == (2, reads)
    (done, _) = first
    trial_id = next(t.id for t in world.trials(exp_id) if world.job(t.id) == done)
    world.cluster.start(done)
    world.tick()
    world.finish_trial(exp_id, trial_id, 1)
    assert len(_jobs(world, exp_id)) == 3  # a slot freed: one more
    r = world.client.patch(
        f"/api/v1/experiments/{exp_id}", headers=world.headers, json={"resources": {"maxSlots": None}}
    )
    assert r.status_code == 200, r.text
    world.tick()
    assert len(_jobs(world, exp_id)) == 4  # the cap lifted


def test_priority_orders_pending_jobs_and_set_priority_renices_them(world: World) -> None:
    world.cluster.slots = 0  # a full cluster: everything waits
    low = create_experiment(world.client, world.headers, FOUR.replace("max_trials: 4", "max_trials: 2")
                            + "resources: {priority: 50}\n")  # fmt: skip
    world.tick(times=2)
    high = create_experiment(world.client, world.headers, FOUR.replace("max_trials: 4", "max_trials: 2")
                             + "resources: {priority: 5}\n")  # fmt: skip
    world.tick(times=2)
    low_jobs, high_jobs = _jobs(world, low), _jobs(world, high)
    assert [world.cluster.job(j).nice for j in low_jobs + high_jobs] == [80, 80, 0, 0]

    world.cluster.slots = 2
    assert world.cluster.schedule() == high_jobs  # submitted later, started first

    r = world.client.patch(
        f"/api/v1/experiments/{low}", headers=world.headers, json={"resources": {"priority": 1}}
    )
    assert r.status_code == 200, r.text
    world.tick()
    assert [world.cluster.job(j).nice for j in low_jobs] == [0, 0]  # re-niced while pending
    assert world.cluster.count("scontrol") >= 2
