"""Determined 0.38.1's own client, unmodified, on experiments: ``det e create`` (``--paused``; the context
upload), ``e config``, ``e set description|name|priority|weight|max-slots|gc-policy``, ``e label add|remove``,
``e download-model-def``, ``e pause|activate|cancel|kill|archive|unarchive|delete``, ``e wait``; in the SDK
``client.create_experiment(config, model_dir)``, ``Experiment.pause()/activate()/kill()/wait()``,
``archive()/unarchive()``, ``set_name()/set_description()``, ``add_label()/remove_label()``,
``download_code()``.

The master has no lifecycle loop (``tests.cli._api_master``): an experiment never gets Slurm jobs. Killing
or cancelling one whose trials have no live job ends it at once (``services.experiments``), as the loop
would; an experiment that completes is set so in the database, as the loop would set it."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import tarfile
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy import create_engine, update
from sqlalchemy.orm import Session

from hpc_master.db.models import ExperimentModel
from tests.determined_client.conftest import CONFIG, DeterminedClient, OurApi

pytestmark = pytest.mark.determined_client

PASSWORD = "Secret123pw"
TRAIN = "print('training')\n"
UTIL = "ANSWER = 42\n"


def as_user(name: str, password: str = PASSWORD) -> dict[str, str]:
    return {"DET_USER": name, "DET_PASS": password}


def model_dir(home: Path, name: str) -> tuple[Path, Path]:
    """A config file and a context directory (a file in a subdirectory too) in `home`."""
    context = home / "model"
    (context / "lib").mkdir(parents=True)
    (context / "train.py").write_text(TRAIN)
    (context / "lib" / "util.py").write_text(UTIL)
    config = home / "experiment.yaml"
    config.write_text(CONFIG.replace("NAME", name))
    return config, context


def tgz_files(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = [(m.name, tar.extractfile(m)) for m in tar.getmembers() if m.isfile()]
        return {name: f.read() for name, f in members if f is not None}


def created_id(out: str) -> int:
    line = next(line for line in out.splitlines() if line.startswith("Created experiment "))
    return int(line.removeprefix("Created experiment "))


def experiment(our_api: OurApi, experiment_id: int) -> dict[str, object]:
    r = httpx.get(f"{our_api.master.url}/api/v1/experiments/{experiment_id}", headers=our_api.admin)
    assert r.status_code == 200, r.text
    got = r.json()["experiment"]
    assert isinstance(got, dict)
    return got


def set_state(our_api: OurApi, experiment_id: int, state: str) -> None:
    """What the lifecycle loop would do once the searcher has finished."""
    with Session(create_engine(our_api.master.db_url)) as session, session.begin():
        session.execute(
            update(ExperimentModel).where(ExperimentModel.id == experiment_id).values(state=state)
        )


def test_create_config_and_download_model_def(determined: DeterminedClient, our_api: OurApi) -> None:
    name = our_api.create_user("create", PASSWORD)
    who = as_user(name)
    config, context = model_dir(determined.home, f"made-{name}")

    r = determined.det("e", "create", str(config), str(context), env=who)
    assert r.rc == 0, r.err
    experiment_id = created_id(r.out)
    assert "Traceback" not in r.err
    got = experiment(our_api, experiment_id)
    assert (got["name"], got["state"], got["username"]) == (f"made-{name}", "STATE_ACTIVE", name)

    # A part of the config ignored on Slurm: a warning for hpc-det's ``det`` (``configWarnings``), never a
    # ``warnings`` value that Determined's client cannot parse (it failed after creating the experiment).
    config.write_text(config.read_text() + "tensorboard_storage:\n  type: shared_fs\n  host_path: /tmp\n")
    paused = determined.det("e", "create", "--paused", str(config), str(context), env=who)
    assert paused.rc == 0 and "Traceback" not in paused.err, paused.err
    assert experiment(our_api, created_id(paused.out))["state"] == "STATE_PAUSED"

    shown = determined.det("e", "config", str(experiment_id), env=who)
    assert shown.rc == 0, shown.err
    as_yaml = yaml.safe_load(shown.out)
    assert as_yaml["name"] == f"made-{name}" and as_yaml["searcher"]["name"] == "grid"
    assert as_yaml["hyperparameters"]["lr"]["vals"] == [0.01, 0.1]

    # The context as uploaded, from what the master stored (Determined's client needs the directory to exist).
    (determined.home / "out").mkdir()
    r = determined.det("e", "download-model-def", str(experiment_id), "--output-dir", "out", env=who)
    assert r.rc == 0, r.err
    tgz = determined.home / "out" / f"experiment_{experiment_id}_model_def.tgz"
    assert tgz_files(tgz.read_bytes()) == {"train.py": TRAIN.encode(), "lib/util.py": UTIL.encode()}

    # Its file tree and one file (Determined's GetModelDefTree and GetModelDefFile).
    headers = our_api.login(name, PASSWORD)
    url = f"{our_api.master.url}/api/v1/experiments/{experiment_id}"
    tree = httpx.get(f"{url}/file_tree", headers=headers)
    assert tree.status_code == 200, tree.text
    nodes = tree.json()["files"]
    assert [(n["name"], n["isDir"]) for n in nodes] == [("lib", True), ("train.py", False)]
    assert nodes[0]["files"][0]["path"] == "lib/util.py" and nodes[1]["contentLength"] == len(TRAIN)
    one = httpx.post(
        f"{url}/file", json={"experimentId": experiment_id, "path": "lib/util.py"}, headers=headers
    )
    assert one.status_code == 200, one.text
    assert base64.b64decode(one.json()["file"]).decode() == UTIL
    for path in ("../../etc/passwd", "/etc/passwd", "lib"):  # only the stored archive's files, never a path
        missing = httpx.post(f"{url}/file", json={"path": path}, headers=headers)
        assert (missing.status_code, missing.json()["code"]) == (404, "not_found"), missing.text
    too_long = httpx.post(f"{url}/file", json={"path": "a" * 5000}, headers=headers)
    assert too_long.status_code == 400 and "path" in too_long.json()["message"]


def test_set_and_label_commands(determined: DeterminedClient, our_api: OurApi) -> None:
    name = our_api.create_user("set", PASSWORD)
    who = as_user(name)
    experiment_id = our_api.create_experiment(our_api.login(name, PASSWORD), f"set-{name}")
    eid = str(experiment_id)

    for args, said in [
        (("description", eid, "a new description"), "Set description of experiment"),
        (("name", eid, f"renamed-{name}"), "Set name of experiment"),
        (("priority", eid, "7"), "Set `priority`"),
        (("weight", eid, "2.5"), "Set `weight`"),
        (("max-slots", eid, "4"), "Set `max_slots`"),
        (("gc-policy", eid, "--yes", "--save-experiment-best", "2", "--save-trial-best", "1",
          "--save-trial-latest", "0"), "Set GC policy"),
    ]:  # fmt: skip
        r = determined.det("e", "set", *args, env=who)
        assert r.rc == 0 and said in r.out, (args, r.err)
    for label in ("fast", "baseline", "fast"):
        assert determined.det("e", "label", "add", eid, label, env=who).rc == 0
    r = determined.det("e", "label", "remove", eid, "fast", env=who)
    assert r.rc == 0 and "Removed label 'fast'" in r.out, r.err

    shown = yaml.safe_load(determined.det("e", "config", eid, env=who).out)
    assert shown["name"] == f"renamed-{name}" and shown["description"] == "a new description"
    assert {k: shown["resources"][k] for k in ("priority", "weight", "max_slots")} == {
        "priority": 7, "weight": 2.5, "max_slots": 4,
    }  # fmt: skip
    storage = shown["checkpoint_storage"]
    assert (storage["save_experiment_best"], storage["save_trial_best"], storage["save_trial_latest"]) == (
        2,
        1,
        0,
    )
    assert shown["labels"] == ["baseline"]
    got = experiment(our_api, experiment_id)
    assert (got["name"], got["description"], got["labels"]) == (
        f"renamed-{name}",
        "a new description",
        ["baseline"],
    )

    # ``none``: no limit again (Determined's ``det e set max-slots ID none``); the other fields stay.
    assert determined.det("e", "set", "max-slots", eid, "none", env=who).rc == 0
    resources = yaml.safe_load(determined.det("e", "config", eid, env=who).out)["resources"]
    assert (resources["max_slots"], resources["priority"], resources["weight"]) == (None, 7, 2.5)

    # Out of range: refused with the field and its bounds, nothing changed.
    bad = determined.det("e", "set", "priority", eid, "100", env=who)
    assert bad.rc == 1 and "priority" in bad.err and "99" in bad.err, bad.err
    assert "Traceback" not in bad.err
    bad = determined.det("e", "set", "weight", eid, "0", env=who)
    assert bad.rc == 1 and "weight" in bad.err, bad.err
    assert yaml.safe_load(determined.det("e", "config", eid, env=who).out)["resources"]["priority"] == 7

    # What this master does not offer says so.
    r = determined.det("e", "set", "log-retention", eid, "--days", "5", env=who)
    assert r.rc == 1 and "not implemented by this master" in r.err, r.err


def test_pause_activate_kill_wait_archive_delete(determined: DeterminedClient, our_api: OurApi) -> None:
    name = our_api.create_user("life", PASSWORD)
    who = as_user(name)
    experiment_id = our_api.create_experiment(our_api.login(name, PASSWORD), f"life-{name}")
    trial_ids = our_api.seed_trials(experiment_id, [{"lr": 0.01}])
    eid = str(experiment_id)

    def state() -> str:
        return str(experiment(our_api, experiment_id)["state"])

    assert determined.det("e", "pause", eid, env=who).out.strip() == f"Paused experiment {eid}"
    assert state() == "STATE_PAUSED"
    assert determined.det("e", "activate", eid, env=who).out.strip() == f"Activated experiment {eid}"
    assert state() == "STATE_ACTIVE"

    refused = determined.det("e", "archive", eid, env=who)
    assert refused.rc == 1 and "only finished ones archive" in refused.err, refused.err
    refused = determined.det("e", "delete", eid, "--yes", env=who)
    assert refused.rc == 1 and "cannot go from ACTIVE to DELETING" in refused.err, refused.err

    # ``det e wait`` polls until the experiment ends; a kill ends it (its trials have no live job).
    waiting = subprocess.Popen(
        [str(determined.venv / "bin" / "det"), "e", "wait", eid, "--polling-interval", "1"],
        env=determined.env(who), cwd=determined.home, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(timeout=3)  # still ACTIVE: it keeps waiting
        assert determined.det("e", "kill", eid, env=who).out.strip() == f"Killed experiment {eid}"
        _, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 1, err  # Determined's: 0 only for COMPLETED
    assert state() == "STATE_CANCELED"
    assert determined.det("e", "wait", eid, env=who).rc == 1  # ended already: at once
    trial = json.loads(determined.det("t", "describe", str(trial_ids[0]), "--json", env=who).out)
    assert trial["trial"]["state"] == "STATE_COMPLETED"  # a finished trial stays as it was

    assert determined.det("e", "archive", eid, env=who).out.strip() == f"Archived experiment {eid}"
    assert experiment(our_api, experiment_id)["archived"] is True
    assert determined.det("e", "unarchive", eid, env=who).out.strip() == f"Unarchived experiment {eid}"
    assert experiment(our_api, experiment_id)["archived"] is False

    # delete asks first: "n" keeps it, "y" (or --yes) deletes it.
    kept = determined.det("e", "delete", eid, stdin="n\n", env=who)
    assert kept.rc == 0 and "Aborting experiment deletion." in kept.out, kept.err
    assert state() == "STATE_CANCELED"
    r = determined.det("e", "delete", eid, stdin="y\n", env=who)
    assert r.rc == 0 and f"Deletion of experiment {eid} is in progress" in r.out, r.err
    gone = determined.det("e", "describe", eid, env=who)
    assert gone.rc == 1 and "not found" in gone.err.lower()

    # cancel, and a wait that ends in COMPLETED (as the loop sets it when the searcher is done): exit 0.
    other = our_api.create_experiment(our_api.login(name, PASSWORD), f"life2-{name}")
    assert determined.det("e", "cancel", str(other), env=who).out.strip() == f"Canceled experiment {other}"
    assert experiment(our_api, other)["state"] == "STATE_CANCELED"
    assert determined.det("e", "delete", str(other), "--yes", env=who).rc == 0
    done = our_api.create_experiment(our_api.login(name, PASSWORD), f"life3-{name}")
    set_state(our_api, done, "COMPLETED")
    r = determined.det("e", "wait", str(done), env=who)
    assert r.rc == 0, r.err


SDK_CODE = """
import json, pathlib, tarfile
from determined.experimental import client
client.login(master=MASTER, user=USER, password=PASSWORD)
exp = client.create_experiment(CONFIG_PATH, MODEL_DIR)
out = {"id": exp.id, "created": exp.state.value}
exp.pause(); exp.reload(); out["paused"] = exp.state.value
exp.activate(); exp.reload(); out["activated"] = exp.state.value
exp.set_name("sdk-renamed"); exp.set_description("from the SDK")
exp.add_label("a"); exp.add_label("b"); exp.remove_label("a")
out["labels"] = sorted(exp.labels)
exp.reload(); out["name"], out["description"] = exp.name, exp.description
try:
    exp.set_notes("notes")
except Exception as e:
    out["notes"] = str(e)
path = exp.download_code(str(pathlib.Path(MODEL_DIR).parent / "code"))
with tarfile.open(path) as tar:
    out["code"] = sorted(m.name for m in tar.getmembers() if m.isfile())
exp.kill()
out["waited"] = exp.wait(interval=0.2).value
exp.archive(); exp.reload(); out["archived"] = exp.archived
exp.unarchive(); exp.reload(); out["unarchived"] = exp.archived
print(json.dumps(out))
"""


def test_sdk_experiment_calls(determined: DeterminedClient, our_api: OurApi) -> None:
    name = our_api.create_user("sdkexp", PASSWORD)
    config, context = model_dir(determined.home, f"sdk-{name}")
    code = SDK_CODE
    for key, value in {"MASTER": determined.master.url, "USER": name, "PASSWORD": PASSWORD,
                       "CONFIG_PATH": str(config), "MODEL_DIR": str(context)}.items():  # fmt: skip
        code = code.replace(key, repr(value))
    got = determined.sdk(code)
    assert isinstance(got, dict)
    experiment_id = got.pop("id")
    assert "this master keeps no experiment notes" in str(got.pop("notes"))  # refused, never dropped silently
    assert got == {
        "created": "STATE_ACTIVE",
        "paused": "STATE_PAUSED",
        "activated": "STATE_ACTIVE",
        "labels": ["b"],
        "name": "sdk-renamed",
        "description": "from the SDK",
        "code": ["lib/util.py", "train.py"],
        "waited": "STATE_CANCELED",
        "archived": True,
        "unarchived": False,
    }
    stored = experiment(our_api, experiment_id)
    assert (stored["name"], stored["labels"], stored["username"]) == ("sdk-renamed", ["b"], name)


def test_only_the_owner_or_an_admin(determined: DeterminedClient, our_api: OurApi) -> None:
    owner = our_api.create_user("owner", PASSWORD)
    other = our_api.create_user("other", PASSWORD)
    experiment_id = our_api.create_experiment(our_api.login(owner, PASSWORD), f"own-{owner}")
    eid = str(experiment_id)
    theirs = as_user(other)

    for args in (
        ("pause", eid), ("activate", eid), ("kill", eid), ("cancel", eid), ("download-model-def", eid),
        ("set", "priority", eid, "5"), ("set", "name", eid, "stolen"), ("label", "add", eid, "x"),
        ("delete", eid, "--yes"),
    ):  # fmt: skip
        r = determined.det("e", *args, env=theirs)
        assert r.rc == 1 and "belongs to another user" in r.err, (args, r.err)
    got = experiment(our_api, experiment_id)
    assert (got["state"], got["name"], got["labels"]) == ("STATE_ACTIVE", f"own-{owner}", [])

    url = f"{our_api.master.url}/api/v1/experiments/{experiment_id}"
    other_headers = our_api.login(other, PASSWORD)
    calls = [("GET", "/model_def", None), ("GET", "/file_tree", None),
             ("POST", "/file", {"path": "train.py"}), ("PUT", "/labels/x", None),
             ("DELETE", "/labels/x", None)]  # fmt: skip
    for method, path, body in calls:
        r = httpx.request(method, url + path, json=body, headers=other_headers)
        assert (r.status_code, r.json()["code"]) == (403, "permission_denied"), (path, r.text)
        r = httpx.request(method, url + path, json=body)
        assert r.status_code == 401, (path, r.text)
    missing = httpx.get(f"{our_api.master.url}/api/v1/experiments/999999/model_def", headers=other_headers)
    assert missing.status_code == 404 and "experiment 999999 not found" in missing.json()["message"]

    # An admin may: the model definition as stored (the conftest's one file), labels.
    r = httpx.get(url + "/model_def", headers=our_api.admin)
    assert r.status_code == 200, r.text
    assert tgz_files(base64.b64decode(r.json()["b64Tgz"])) == {"train.py": b"print('hi')\n"}
    r = httpx.put(url + "/labels/admin-set", headers=our_api.admin)
    assert (r.status_code, r.json()) == (200, {"labels": ["admin-set"]})
    too_long = httpx.put(url + "/labels/" + "x" * 300, headers=our_api.admin)
    assert too_long.status_code == 400, too_long.text
    bad = httpx.patch(url, json={"resources": {"priority": 0}}, headers=our_api.admin)
    assert bad.status_code == 400 and bad.json()["field"], bad.text


def test_create_test_mode_and_what_this_master_does_not_have(
    determined: DeterminedClient, our_api: OurApi
) -> None:
    """``det e create --test`` validates first (the validate-only answer carries an empty experiment, as
    Determined's master answers) and then creates its small test experiment; ``--template`` and a project that
    does not exist are errors that say so, not experiments created without them."""
    name = our_api.create_user("testmode", PASSWORD)
    who = as_user(name)
    config, context = model_dir(determined.home, f"test-{name}")
    proc = subprocess.Popen(
        [str(determined.venv / "bin" / "det"), "e", "create", "--test", str(config), str(context)],
        env=determined.env(who), cwd=determined.home, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    seen = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # it follows the test experiment's logs from here on: stop reading then
            seen.append(line)
            if "Created test experiment" in line or "Traceback" in line:
                break
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    text = "".join(seen)
    assert "validation succeeded" in text and "Created test experiment" in text, text
    test_id = int(text.split("Created test experiment ")[1].split()[0])
    assert experiment(our_api, test_id)["name"] == f"test-{name}"

    before = len(
        httpx.get(f"{our_api.master.url}/api/v1/experiments", headers=our_api.admin).json()["experiments"]
    )
    r = determined.det("e", "create", "--template", "gpu-defaults", str(config), str(context), env=who)
    assert r.rc != 0 and "no config templates" in r.err, (r.out, r.err)
    r = determined.det("e", "create", "--project_id", "7", str(config), str(context), env=who)
    assert r.rc != 0 and "project 7 not found" in r.err, (r.out, r.err)
    after = len(
        httpx.get(f"{our_api.master.url}/api/v1/experiments", headers=our_api.admin).json()["experiments"]
    )
    assert after == before  # nothing created
    r = determined.det("e", "create", "--project_id", "1", "--paused", str(config), str(context), env=who)
    assert r.rc == 0, r.err  # the one project there is
