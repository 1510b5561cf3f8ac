"""The commands our ``det`` gained to match Determined's (issue 21): ``e config``, ``e label add|remove``,
``e set priority|weight|max-slots``, ``e download-model-def``, ``t download --best|--latest|--uuid``, against a
real master (the API alone; finished trials' rows are seeded)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import yaml
from sqlalchemy import select

from hpc_master.db.models import TrialModel
from tests.cli.conftest import Det, Master
from tests.cli.test_cli import CONFIG, MakeUser, create, db, write_context
from tests.cli.test_cli_checkpoints import seed_checkpoints


def test_config_and_labels(det: Det, master: Master, make_user: MakeUser, tmp_path: Path) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    experiment_id = create(det, alice, *write_context(tmp_path))
    r = det("e", "config", str(experiment_id), env=alice)
    assert r.rc == 0, r.err
    shown = yaml.safe_load(r.out)
    assert shown["name"] == "cli-test" and shown["searcher"]["name"] == "random"
    assert json.loads(det("e", "config", str(experiment_id), "--json", env=alice).out) == shown

    for label in ("baseline", "resnet", "baseline"):
        r = det("e", "label", "add", str(experiment_id), label, env=alice)
        assert (r.rc, r.out.strip()) == (0, f"Added label '{label}' to experiment {experiment_id}"), r.err
    labels = json.loads(det("e", "describe", str(experiment_id), "--json", env=alice).out)["experiment"][
        "labels"
    ]
    assert labels == ["baseline", "resnet"]  # added once each, in order
    assert det("e", "label", "remove", str(experiment_id), "baseline", env=alice).rc == 0
    described = json.loads(det("e", "describe", str(experiment_id), "--json", env=alice).out)
    assert described["experiment"]["labels"] == ["resnet"]
    r = det("e", "label", "add", str(experiment_id), "mine-now", env=bob)
    assert r.rc == 1 and ("permission_denied" in r.err or "not found" in r.err)
    assert det("e", "label", "add", str(experiment_id), "   ", env=alice).rc == 1


def test_set_priority_weight_max_slots(det: Det, master: Master, make_user: MakeUser, tmp_path: Path) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    experiment_id = create(det, alice, *write_context(tmp_path))
    for argv, said in (
        (["priority", "10"], "Set `priority` of experiment {} to 10"),
        (["weight", "2.5"], "Set `weight` of experiment {} to 2.5"),
        (["max-slots", "4"], "Set `max_slots` of experiment {} to 4"),
    ):
        r = det("e", "set", argv[0], str(experiment_id), argv[1], env=alice)
        assert (r.rc, r.out.strip()) == (0, said.format(experiment_id)), r.err
    resources = yaml.safe_load(det("e", "config", str(experiment_id), env=alice).out)["resources"]
    assert (resources["priority"], resources["weight"], resources["max_slots"]) == (10, 2.5, 4)
    assert det("e", "set", "max-slots", str(experiment_id), "none", env=alice).rc == 0
    assert (
        yaml.safe_load(det("e", "config", str(experiment_id), env=alice).out)["resources"].get("max_slots")
        is None
    )
    assert det("e", "set", "priority", str(experiment_id), "0", env=alice).rc == 2  # 1..99
    assert det("e", "set", "priority", str(experiment_id), "100", env=alice).rc == 2
    r = det("e", "set", "priority", str(experiment_id), "1", env=bob)
    assert r.rc == 1 and ("permission_denied" in r.err or "not found" in r.err)


def test_download_model_def(det: Det, master: Master, make_user: MakeUser, tmp_path: Path) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    cfg, ctx = write_context(tmp_path)
    (ctx / "pkg").mkdir()
    (ctx / "pkg" / "model.py").write_text("WIDTH = 3\n")
    experiment_id = create(det, alice, cfg, ctx)
    out = tmp_path / "out"
    out.mkdir()
    r = det("e", "download-model-def", str(experiment_id), "--output-dir", str(out), env=alice)
    assert r.rc == 0, r.err
    tgz = out / f"experiment_{experiment_id}_model_def.tgz"
    with tarfile.open(fileobj=io.BytesIO(tgz.read_bytes()), mode="r:gz") as tar:
        files = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isfile()}
        assert set(files) >= {"train.py", "pkg/model.py"}
        got = tar.extractfile(files["pkg/model.py"])
        assert got is not None and got.read() == b"WIDTH = 3\n"
    r = det("e", "download-model-def", str(experiment_id), "--output-dir", str(out), env=bob)
    assert r.rc == 1 and ("permission_denied" in r.err or "not found" in r.err)
    assert (
        det("e", "download-model-def", str(experiment_id), "--output-dir", str(tmp_path / "no"), env=alice).rc
        == 1
    )


def test_trial_download_best_latest_uuid(
    det: Det, master: Master, make_user: MakeUser, tmp_path: Path
) -> None:
    who = make_user("tdl")
    storage = tmp_path / "shared-storage"
    config_text = CONFIG + f"checkpoint_storage: {{type: shared_fs, host_path: {storage}}}\n"
    experiment_id = create(det, who, *write_context(tmp_path, config_text))
    uuids = seed_checkpoints(master, experiment_id, {5: 0.5, 10: 0.2, 15: 0.4})  # best: 10; latest: 15
    for steps, u in zip((5, 10, 15), uuids, strict=True):
        (storage / u).mkdir(parents=True)
        (storage / u / "model.pt").write_bytes(b"x" * 1000 * steps)
    with db(master) as session:
        trial_id = session.scalar(select(TrialModel.id).where(TrialModel.experiment_id == experiment_id))
    for flag, expected in (
        (["--best"], uuids[1]),
        (["--latest"], uuids[2]),
        (["--uuid", uuids[0]], uuids[0]),
    ):
        out = tmp_path / f"out{flag[0]}"
        r = det("t", "download", str(trial_id), *flag, "-o", str(out), "-q", env=who)
        assert (r.rc, r.out.strip()) == (0, str(out)), r.err
        assert (
            json.loads((out / "metadata.json").read_text())["steps_completed"]
            == {uuids[0]: 5, uuids[1]: 10, uuids[2]: 15}[expected]
        )
    r = det("t", "download", str(trial_id), "--uuid", "00000000-0000-0000-0000-000000000000", env=who)
    assert r.rc == 1 and "has no checkpoint" in r.err
    assert det("t", "download", str(trial_id), env=who).rc == 2  # one of --best, --latest, --uuid
