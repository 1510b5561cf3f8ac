"""Determined 0.38.1's own client, unmodified, on checkpoints: ``det e list-checkpoints`` (``--best``,
``--csv``), ``det checkpoint describe|download|delete``, ``det e download``, ``det t describe``, and in the SDK
``Experiment.list_checkpoints()`` / ``top_checkpoint()`` / ``top_n_checkpoints()``, ``client.get_checkpoint``,
``Checkpoint.download()`` / ``delete()``, ``Trial.list_checkpoints()`` / ``top_checkpoint()``.

Checkpoints are real directories under the experiment's storage, written as the harness writes them (its
files, ``metadata.json``, ``resources`` from ``list_resources``) and registered as it registers them; the
client downloads them from the shared filesystem (``shared_fs``: the storage in
``training.experimentConfig``), as Determined's client does. Deletion goes through the master, which removes
the files as the owner's Unix account when it runs as root (``nobody`` here)."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, update
from sqlalchemy.orm import Session

from harness.core._checkpoint import list_resources
from hpc_master.db.models import ExperimentModel, MetricModel, TrialModel, TrialRunModel
from hpc_master.services.checkpoints.records import CheckpointReport, report_checkpoint
from tests.cli.conftest import Master
from tests.determined_client.conftest import DeterminedClient, OurApi

pytestmark = pytest.mark.determined_client

PASSWORD = "Secret123pw"
CONFIG = """\
name: NAME
entrypoint: python3 train.py
searcher:
  name: grid
  metric: validation_loss
  smaller_is_better: true
  max_length:
    batches: 150
hyperparameters:
  lr:
    type: categorical
    vals: [0.01, 0.1]
environment:
  environment_variables:
    - WANDB_API_KEY=abc123secret
"""
AS_ROOT = os.geteuid() == 0


def as_user(name: str) -> dict[str, str]:
    return {"DET_USER": name, "DET_PASS": PASSWORD}


def create_user(our_api: OurApi, prefix: str) -> str:
    """A user with a password; as root, with ``nobody`` as Unix account (a root master removes checkpoint
    files as the owner's account, never as root)."""
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    user: dict[str, object] = {"username": name}
    if AS_ROOT:
        user["unixUsername"] = "nobody"
    r = httpx.post(
        f"{our_api.master.url}/api/v1/users", json={"user": user, "password": PASSWORD}, headers=our_api.admin
    )
    assert r.status_code == 200, r.text
    return name


def create_experiment(our_api: OurApi, user: str, storage: str = "") -> int:
    config = CONFIG.replace("NAME", f"ckpt-{user}") + storage
    train = {"path": "train.py", "type": 48, "content": "cHJpbnQoJ2hpJykK", "mode": 0o644}
    body = {"config": config, "modelDefinition": [train], "activate": True}
    headers = our_api.login(user, PASSWORD)
    r = httpx.post(f"{our_api.master.url}/api/v1/experiments", json=body, headers=headers)
    assert r.status_code == 200, r.text
    return int(r.json()["experiment"]["id"])


@dataclass(frozen=True)
class Seeded:
    trial_ids: list[int]
    uuids: list[list[str]]
    """Each trial's checkpoints, in step order (and report order: trial by trial)."""


def seed(master: Master, experiment_id: int, root: Path, trials: list[dict[int, float | None]]) -> Seeded:
    """Finished trials, each with a checkpoint directory per step under `root` (as the harness writes them)
    and, where the loss is not None, the validation at that step."""
    t0 = dt.datetime.now(dt.UTC)
    trial_ids, uuids = [], []
    with Session(create_engine(master.db_url)) as session, session.begin():
        for i, steps in enumerate(trials):
            trial = TrialModel(experiment_id=experiment_id, request_id=f"r{i}", hparams={"lr": [0.01, 0.1][i]},
                               state="COMPLETED", steps_completed=max(steps))  # fmt: skip
            session.add(trial)
            session.flush()
            session.add(TrialRunModel(trial_id=trial.id, run_number=1, state="COMPLETED", slurm_job_id="7"))
            ckpts = []
            for step, loss in steps.items():
                if loss is not None:
                    session.add(MetricModel(trial_id=trial.id, trial_run_id=1, group="validation",
                                            steps_completed=step, metrics={"validation_loss": loss}))  # fmt: skip
                ckpt = str(uuid.uuid4())
                write_checkpoint(root / ckpt, step)
                report = CheckpointReport(
                    uuid=ckpt, trial_id=trial.id, trial_run_id=1, steps_completed=step,
                    resources=list_resources(root / ckpt), metadata={"steps_completed": step},
                    report_time=t0 + dt.timedelta(seconds=len(ckpts) + 10 * i),
                )  # fmt: skip
                report_checkpoint(session, report)
                ckpts.append(ckpt)
            trial_ids.append(int(trial.id))
            uuids.append(ckpts)
    return Seeded(trial_ids, uuids)


def write_checkpoint(path: Path, steps: int) -> None:
    (path / "sub").mkdir(parents=True)
    (path / "model.pt").write_bytes(os.urandom(1000 + steps))
    (path / "sub" / "optimizer.json").write_text(json.dumps({"steps": steps}))
    (path / "metadata.json").write_text(json.dumps({"steps_completed": steps}, indent=2, sort_keys=True))
    if AS_ROOT:  # the owner's files (the job wrote them as the owner's account)
        for p in [path, *path.rglob("*")]:
            shutil.chown(p, "nobody", "nogroup")


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def shared_storage() -> Iterator[Path]:
    """A storage root outside pytest's private temp directory (mode 0700), so that an owner's account can
    remove what it wrote there, as on a real shared filesystem (1777, like a scratch directory)."""
    root = Path(tempfile.mkdtemp(prefix="hpc-det-ckpt-"))
    root.chmod(0o1777)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_cli_lists_describes_and_downloads(
    determined: DeterminedClient, our_api: OurApi, tmp_path: Path
) -> None:
    master = our_api.master
    name = create_user(our_api, "ckcli")
    who = as_user(name)
    experiment_id = create_experiment(our_api, name)  # the master's default storage
    seeded = seed(
        master, experiment_id, master.checkpoint_root, [{50: 0.5, 100: 0.3}, {50: 0.4, 100: 0.2, 150: None}]
    )
    (a50, a100), (b50, b100, b150) = seeded.uuids

    r = determined.det("e", "list-checkpoints", str(experiment_id), "--csv", env=who)
    assert r.rc == 0, r.err
    rows = list(csv.reader(io.StringIO(r.out)))
    assert rows[0] == ["Trial ID", "# of Batches", "State", "Validation Metric", "UUID", "Resources", "Size"]
    assert [row[4] for row in rows[1:]] == [a50, a100, b50, b100, b150]  # by report time
    row = next(row for row in rows if row[4] == b100)
    assert row[:4] == [str(seeded.trial_ids[1]), "100", "COMPLETED", "0.2"]
    assert row[5].split("\n") == ["metadata.json", "model.pt", "sub/", "sub/optimizer.json"]
    assert next(row for row in rows if row[4] == b150)[3] == ""  # no validation at its steps

    r = determined.det("e", "lc", str(experiment_id), "--best", "2", env=who)
    assert r.rc == 0, r.err
    shown = [line for line in r.out.splitlines() if a100 in line or b100 in line]
    assert len(shown) == 2 and b100 in shown[0] and a100 in shown[1]  # best first (smaller is better)
    assert a50 not in r.out and b150 not in r.out

    r = determined.det("checkpoint", "describe", b100, env=who)
    assert r.rc == 0, r.err
    assert b100 in r.out and str(experiment_id) in r.out and "validation_loss" in r.out and "0.2" in r.out

    out = tmp_path / "one"
    r = determined.det("checkpoint", "download", b100, "-o", str(out), env=who)
    assert r.rc == 0, r.err
    assert "Local checkpoint path:" in r.out and str(out) in r.out
    assert files(out) == files(master.checkpoint_root / b100) and len(files(out)) == 3

    top = tmp_path / "top"
    r = determined.det("e", "download", str(experiment_id), "--top-n", "2", "-o", str(top), "-q", env=who)
    assert r.rc == 0, r.err
    assert r.out.split() == [str(top / b100), str(top / a100)]
    for ckpt in (b100, a100):
        assert files(top / ckpt) == files(master.checkpoint_root / ckpt)

    r = determined.det("t", "describe", str(seeded.trial_ids[1]), "--json", env=who)
    assert r.rc == 0, r.err
    checkpoints = [w["checkpoint"] for w in json.loads(r.out)["workloads"] if w.get("checkpoint")]
    assert [(c["uuid"], c["totalBatches"]) for c in checkpoints] == [(b50, 50), (b100, 100), (b150, 150)]


def test_sdk_lists_finds_the_best_and_downloads(
    determined: DeterminedClient, our_api: OurApi, tmp_path: Path
) -> None:
    master = our_api.master
    name = create_user(our_api, "cksdk")
    experiment_id = create_experiment(our_api, name)
    seeded = seed(
        master, experiment_id, master.checkpoint_root, [{50: 0.5, 100: 0.3}, {50: 0.4, 100: 0.2, 150: None}]
    )
    (a50, a100), (b50, b100, b150) = seeded.uuids
    out = tmp_path / "sdk"
    code = f"""
import json, warnings
warnings.simplefilter("ignore")
from determined.experimental import client
from determined.experimental.client import CheckpointSortBy, OrderBy
client.login(master={master.url!r}, user={name!r}, password={PASSWORD!r})
exp = client.get_experiment({experiment_id})
ckpt = client.get_checkpoint({b100!r})
path = ckpt.download({str(out)!r})
trial = client.get_trial({seeded.trial_ids[0]})
print(json.dumps({{
    "listed": [c.uuid for c in exp.list_checkpoints()],
    "by_steps": [c.uuid for c in exp.list_checkpoints(sort_by=CheckpointSortBy.BATCH_NUMBER,
                                                        order_by=OrderBy.DESC)],
    "worst_two": [c.uuid for c in exp.list_checkpoints(sort_by="validation_loss", order_by=OrderBy.DESC,
                                                         max_results=2)],
    "top": exp.top_checkpoint().uuid,
    "top_n": [c.uuid for c in exp.top_n_checkpoints(2)],
    "trial": [c.uuid for c in trial.list_checkpoints()],
    "trial_latest": [c.uuid for c in trial.list_checkpoints(sort_by=CheckpointSortBy.END_TIME,
                                                              order_by=OrderBy.DESC)],
    "trial_top": trial.top_checkpoint().uuid,
    "path": path, "state": ckpt.state.value, "metadata": ckpt.metadata,
    "experiment_id": ckpt.training.experiment_id, "trial_id": ckpt.training.trial_id,
    "hparams": ckpt.training.hparams, "validation": ckpt.training.validation_metrics,
    "storage": ckpt.training.experiment_config["checkpoint_storage"],
    "env": ckpt.training.experiment_config["environment"]["environment_variables"],
}}))
"""
    got = determined.sdk(code)
    assert isinstance(got, dict)
    assert got["listed"] == [b100, a100, b50, a50, b150]  # best first, no validation last
    assert got["by_steps"] == [b150, b100, a100, b50, a50]  # ties: by trial, reversed with the order
    assert got["worst_two"] == [a50, b50]
    assert (got["top"], got["top_n"]) == (b100, [b100, a100])
    assert (got["trial"], got["trial_latest"], got["trial_top"]) == ([a100, a50], [a100, a50], a100)
    assert (got["path"], got["state"], got["metadata"]) == (
        str(out),
        "STATE_COMPLETED",
        {"steps_completed": 100},
    )
    assert (got["experiment_id"], got["trial_id"], got["hparams"]) == (
        experiment_id,
        seeded.trial_ids[1],
        {"lr": 0.1},
    )
    assert got["validation"] == {"avgMetrics": {"validation_loss": 0.2}, "batchMetrics": None}
    assert got["storage"]["type"] == "shared_fs" and got["storage"]["host_path"] == str(
        master.checkpoint_root
    )
    assert "WANDB_API_KEY=abc123secret" in str(got["env"])  # the owner sees their own config
    assert files(out) == files(master.checkpoint_root / b100)


def test_download_from_the_experiments_own_storage_and_from_a_config_without_one(
    determined: DeterminedClient, our_api: OurApi, tmp_path: Path
) -> None:
    """``host_path`` with a ``storage_path`` under it; and an experiment stored without
    ``checkpoint_storage`` (an older one): its jobs wrote under the master's root, which the master names."""
    master = our_api.master
    name = create_user(our_api, "ckstore")
    who = as_user(name)
    shared = tmp_path / "shared"
    own = create_experiment(
        our_api,
        name,
        f"checkpoint_storage:\n  type: shared_fs\n  host_path: {shared}\n  storage_path: run1\n",
    )
    ((own_ckpt,),) = seed(master, own, shared / "run1", [{10: 0.1}]).uuids
    r = determined.det("c", "download", own_ckpt, "-o", str(tmp_path / "own"), "-q", env=who)
    assert (r.rc, r.out.strip()) == (0, str(tmp_path / "own")), r.err
    assert files(tmp_path / "own") == files(shared / "run1" / own_ckpt)

    older = create_experiment(our_api, name)
    with Session(create_engine(master.db_url)) as session, session.begin():
        config = session.get(ExperimentModel, older).config  # type: ignore[union-attr]
        stored = {k: v for k, v in config.items() if k != "checkpoint_storage"}
        session.execute(update(ExperimentModel).where(ExperimentModel.id == older).values(config=stored))
    ((old_ckpt,),) = seed(master, older, master.checkpoint_root, [{10: 0.1}]).uuids
    r = determined.det("c", "download", old_ckpt, "-o", str(tmp_path / "old"), "-q", env=who)
    assert r.rc == 0, r.err
    assert files(tmp_path / "old") == files(master.checkpoint_root / old_ckpt)


def test_delete_removes_the_directory_and_others_see_masked_configs(
    determined: DeterminedClient, our_api: OurApi, shared_storage: Path
) -> None:
    master = our_api.master
    alice, bob = create_user(our_api, "ckdel"), create_user(our_api, "ckother")
    storage = f"checkpoint_storage:\n  type: shared_fs\n  host_path: {shared_storage}\n"
    experiment_id = create_experiment(our_api, alice, storage)
    ((first, second, third),) = seed(
        master, experiment_id, shared_storage, [{10: 0.3, 20: 0.2, 30: 0.1}]
    ).uuids

    code = f"""
import json
from determined.experimental import client
client.login(master={master.url!r}, user={bob!r}, password={PASSWORD!r})
ckpt = client.get_checkpoint({first!r})
listed = client.get_experiment({experiment_id}).list_checkpoints()
print(json.dumps({{"env": ckpt.training.experiment_config["environment"],
                  "listed": [c.training.experiment_config["environment"] for c in listed],
                  "storage": ckpt.training.experiment_config["checkpoint_storage"]["host_path"]}}))
"""
    theirs = determined.sdk(code)
    assert isinstance(theirs, dict)
    assert "WANDB_API_KEY=********" in str(theirs["env"]) and "abc123secret" not in json.dumps(theirs)
    assert theirs["listed"] == [theirs["env"]] * 3 and theirs["storage"] == str(shared_storage)

    refused = determined.det("checkpoint", "delete", first, "--yes", env=as_user(bob))
    assert refused.rc == 1 and "another user's experiment" in refused.err
    assert (shared_storage / first).is_dir()

    r = determined.det("checkpoint", "delete", f"{first},{second}", "--yes", env=as_user(alice))
    assert r.rc == 0, r.err
    assert r.out.strip() == f"Deletion of checkpoints {first},{second} is in progress"
    assert not (shared_storage / first).exists() and not (shared_storage / second).exists()
    assert (shared_storage / third).is_dir()

    code = f"""
import json
from determined.experimental import client
client.login(master={master.url!r}, user={alice!r}, password={PASSWORD!r})
client.get_checkpoint({third!r}).delete()
print(json.dumps([c.uuid for c in client.get_experiment({experiment_id}).list_checkpoints()]))
"""
    assert determined.sdk(code) == []  # the SDK lists COMPLETED checkpoints only
    assert not (shared_storage / third).exists()
    r = determined.det("e", "lc", str(experiment_id), "--csv", env=as_user(alice))
    assert [row[2] for row in list(csv.reader(io.StringIO(r.out)))[1:]] == ["DELETED"] * 3
    r = determined.det("c", "download", first, "-o", str(shared_storage / "again"), env=as_user(alice))
    assert r.rc == 1 and "Only COMPLETED or PARTIALLY_DELETED checkpoints can be downloaded" in r.err
