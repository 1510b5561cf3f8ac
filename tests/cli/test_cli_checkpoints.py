"""`det e set gc-policy`, `det checkpoint delete`, `det checkpoint download` and the storage totals of
`det e describe`, against a real master (the API alone: the rows a finished search leaves are seeded)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from sqlalchemy import func, select

from hpc_master.db.models import (
    CheckpointGCRequestModel,
    CheckpointModel,
    ExperimentModel,
    MetricModel,
    TrialModel,
)
from tests.cli.conftest import Det, Master
from tests.cli.test_cli import CONFIG, MakeUser, create, db, write_context


def seed_checkpoints(master: Master, experiment_id: int, losses: dict[int, float]) -> list[str]:
    """A COMPLETED trial with one checkpoint (and validation) per step: their uuids, in step order."""
    uuids = []
    with db(master) as session, session.begin():
        trial = TrialModel(experiment_id=experiment_id, request_id=f"r-{uuid.uuid4().hex[:6]}", hparams={},
                           state="COMPLETED", steps_completed=max(losses))  # fmt: skip
        session.add(trial)
        session.flush()
        for steps, loss in losses.items():
            ckpt = str(uuid.uuid4())
            session.add(MetricModel(trial_id=trial.id, trial_run_id=1, group="validation", steps_completed=steps,
                                    metrics={"avgMetrics": {"validation_loss": loss}}))  # fmt: skip
            session.add(CheckpointModel(uuid=ckpt, trial_id=trial.id, trial_run_id=1, steps_completed=steps,
                                        resources={"model.pt": 1000 * steps}, size_bytes=1000 * steps,
                                        metadata_={"steps_completed": steps}))  # fmt: skip
            uuids.append(ckpt)
        trial.latest_checkpoint = uuids[-1]
    return uuids


def checkpoint_states(master: Master, uuids: list[str]) -> list[str]:
    with db(master) as session:
        return [session.get(CheckpointModel, u).state for u in uuids]  # type: ignore[union-attr]


def test_set_gc_policy_previews_asks_and_sets(
    det: Det, master: Master, make_user: MakeUser, tmp_path: Path
) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    experiment_id = create(det, alice, *write_context(tmp_path))
    five, ten, fifteen = seed_checkpoints(master, experiment_id, {5: 0.5, 10: 0.2, 15: 0.4})
    argv = ("e", "set", "gc-policy", str(experiment_id), "--save-experiment-best", "0", "--save-trial-best", "1",
            "--save-trial-latest", "0")  # fmt: skip

    r = det(*argv, env=alice)  # no TTY and no --yes: the preview, then a refusal
    assert r.rc == 1 and "pass --yes" in r.err
    assert five in r.out and fifteen in r.out and ten not in r.out  # 10 is the trial's best
    assert "This policy deletes 2 checkpoints (19.5 KB)." in r.out
    with db(master) as session:
        config = session.get(ExperimentModel, experiment_id).config  # type: ignore[union-attr]
        assert config["checkpoint_storage"]["save_trial_latest"] == 1  # unchanged

    r = det(*argv, "--yes", env=bob)
    assert r.rc == 1 and "permission_denied" in r.err
    r = det(*argv, "--yes", env=alice)
    assert r.rc == 0, r.err
    assert "save_trial_latest: 0" in r.out
    with db(master) as session:
        config = session.get(ExperimentModel, experiment_id).config  # type: ignore[union-attr]
        assert (
            config["checkpoint_storage"]["save_trial_best"],
            config["checkpoint_storage"]["save_trial_latest"],
        ) == (1, 0)
        requests = select(func.count()).where(CheckpointGCRequestModel.experiment_id == experiment_id)
        assert session.scalar(requests) == 1  # the master's loop collects under it
    shown = det("e", "describe", str(experiment_id), env=alice).out
    assert "save_experiment_best 0, save_trial_best 1, save_trial_latest 0" in shown
    assert det("e", "set", "gc-policy", str(experiment_id), "--save-trial-best", "-1", "--save-experiment-best",
               "0", "--save-trial-latest", "0", env=alice).rc == 2  # fmt: skip


def test_checkpoint_delete_and_the_totals_describe_shows(
    det: Det, master: Master, make_user: MakeUser, tmp_path: Path
) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    experiment_id = create(det, alice, *write_context(tmp_path))
    uuids = seed_checkpoints(master, experiment_id, {1: 0.5, 2: 0.4, 3: 0.3})
    assert "3 kept (5.9 KB)" in det("e", "describe", str(experiment_id), env=alice).out

    r = det("c", "delete", uuids[0], env=alice)
    assert r.rc == 1 and "pass --yes" in r.err
    r = det("c", "delete", uuids[0], "--yes", env=bob)
    assert r.rc == 1 and "permission_denied" in r.err
    r = det("checkpoint", "delete", f"{uuids[0]},{uuids[1]}", uuids[1], "--yes", env=alice)
    assert (r.rc, r.out.strip()) == (0, "Deleted 2 checkpoints"), r.err
    assert checkpoint_states(master, uuids) == ["DELETED", "DELETED", "COMPLETED"]

    shown = det("e", "describe", str(experiment_id), env=alice).out
    assert "1 kept (2.9 KB); 2 deleted (2.9 KB freed)" in shown
    body = json.loads(det("e", "describe", str(experiment_id), "--json", env=alice).out)
    assert (body["experiment"]["checkpointCount"], body["experiment"]["checkpointSize"]) == (1, 3000)
    assert body["trials"][0]["totalCheckpointSize"] == 3000
    listed = json.loads(det("e", "lc", str(experiment_id), "--json", env=alice).out)["checkpoints"]
    assert sorted(c["state"] for c in listed) == ["STATE_COMPLETED", "STATE_DELETED", "STATE_DELETED"]
    r = det("c", "download", uuids[0], "-o", str(tmp_path / "gone"), env=alice)
    assert r.rc == 1 and "DELETED" in r.err


def test_download_keeps_file_metadata_checks_sizes_and_writes_metadata_json(
    det: Det, master: Master, make_user: MakeUser, tmp_path: Path
) -> None:
    who = make_user("dl")
    storage = tmp_path / "shared-storage"
    # The experiment's own storage (as a shared filesystem the login node mounts), not the master's root.
    config = CONFIG + f"checkpoint_storage: {{type: shared_fs, host_path: {storage}}}\n"
    experiment_id = create(det, who, *write_context(tmp_path, config))
    (ckpt,) = seed_checkpoints(master, experiment_id, {7: 0.1})
    source = storage / ckpt
    (source / "sub").mkdir(parents=True)
    (source / "model.pt").write_bytes(b"w" * 7000)
    (source / "model.pt").chmod(0o640)
    os.utime(source / "model.pt", (1_600_000_000, 1_600_000_000))
    (source / "sub" / "link").symlink_to("/etc/passwd")  # copied as a link, never followed

    out = tmp_path / "out"
    r = det("c", "download", ckpt, "-o", str(out), "-q", env=who)
    assert (r.rc, r.out.strip()) == (0, str(out)), r.err
    got = out / "model.pt"
    assert got.read_bytes() == b"w" * 7000 and (got.stat().st_mode & 0o777) == 0o640
    assert got.stat().st_mtime == 1_600_000_000
    assert (out / "sub" / "link").is_symlink() and os.readlink(out / "sub" / "link") == "/etc/passwd"
    assert json.loads((out / "metadata.json").read_text()) == {"steps_completed": 7}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.partial")]

    (source / "model.pt").write_bytes(b"short")  # not what the checkpoint recorded: refused, nothing left
    r = det("c", "download", ckpt, "-o", str(tmp_path / "bad"), env=who)
    assert r.rc == 1 and "model.pt has 5 bytes, 7000 recorded" in r.err
    assert not (tmp_path / "bad").exists()
    assert not [p for p in tmp_path.iterdir() if ".partial" in p.name]
