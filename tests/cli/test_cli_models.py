"""`det model`: create, list, describe, register-version, list-versions, delete (Determined's commands and
flags), against a real master; who may register what; a registered checkpoint refuses `det c delete`."""

from __future__ import annotations

import json
from pathlib import Path

from hpc_master.db.models import ModelVersionModel, RegistryModel
from tests.cli.conftest import Det, Master, unique
from tests.cli.test_cli import MakeUser, create, db, write_context
from tests.cli.test_cli_checkpoints import checkpoint_states, seed_checkpoints


def test_create_list_describe_register_list_versions_delete(
    det: Det, master: Master, make_user: MakeUser, tmp_path: Path
) -> None:
    alice = make_user("alice")
    experiment_id = create(det, alice, *write_context(tmp_path))
    five, ten = seed_checkpoints(master, experiment_id, {5: 0.5, 10: 0.2})
    name = unique("mnist ")  # a space: the CLI quotes names in paths

    r = det("model", "create", name, "--description", "digits", env=alice)
    assert r.rc == 0, r.err
    assert f"Name:              {name}" in r.out and "digits" in r.out and "Versions:          0" in r.out
    r = det("m", "create", name.upper(), env=alice)
    assert r.rc == 1 and "already exists" in r.err and "already_exists" in r.err

    created = json.loads(det("m", "create", unique("json-"), "--json", env=alice).out)
    assert created["workspaceId"] == 1 and created["numVersions"] == 0

    listed = json.loads(det("model", "list", "--json", "--sort-by", "name", env=alice).out)
    names = [m["name"] for m in listed]
    assert name in names and created["name"] in names and names == sorted(names, key=str.casefold)
    desc = json.loads(det("m", "ls", "--json", "--sort-by", "name", "--order-by", "desc", env=alice).out)
    assert [m["name"] for m in desc] == names[::-1]
    table = det("model", "list", env=alice).out
    assert [h.strip() for h in table.splitlines()[0].split(" | ")][:2] == ["ID", "Name"] and name in table
    assert json.loads(det("m", "list", "-w", "elsewhere", "--json", env=alice).out) == []

    r = det("model", "register-version", name, ten, env=alice)
    assert r.rc == 0, r.err
    assert "Version #" in r.out and ten in r.out and "validation_loss" in r.out
    answer = json.loads(det("model", "register-version", name, five, "--json", env=alice).out)
    assert answer["modelVersion"]["version"] == 2 and answer["modelVersion"]["checkpoint"]["uuid"] == five

    r = det("model", "list-versions", name, env=alice)
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    rows = lines[lines.index(next(line for line in lines if line.startswith("Version #"))) + 2 :]
    assert [row.split(" | ")[0].strip() for row in rows] == ["2", "1"]  # newest first
    versions = json.loads(det("model", "list-versions", name, "--json", env=alice).out)
    assert [v["version"] for v in versions["modelVersions"]] == [1, 2] and versions["model"]["name"] == name

    r = det("model", "describe", name, env=alice)
    assert r.rc == 0 and "Versions:          2" in r.out and five in r.out and ten not in r.out  # latest
    r = det("model", "describe", name, "--version", "1", env=alice)
    assert ten in r.out and five not in r.out
    assert (
        json.loads(det("model", "describe", str(created["id"]), "--json", env=alice).out)["id"]
        == created["id"]
    )
    r = det("model", "describe", name, "--version", "9", env=alice)
    assert r.rc == 1 and "not_found" in r.err

    # Registered: `det c delete` is refused, naming the model and version.
    r = det("c", "delete", ten, "--yes", env=alice)
    assert r.rc == 1 and f"version 1 of model '{name}'" in r.err
    assert checkpoint_states(master, [ten]) == ["COMPLETED"]

    r = det("model", "delete", name, env=alice)
    assert (r.rc, r.out.strip()) == (0, f"Deleted model {name}"), r.err
    assert det("model", "describe", name, env=alice).rc == 1
    with db(master) as session:
        assert session.query(RegistryModel).filter_by(name=name).count() == 0
        assert session.query(ModelVersionModel).filter_by(checkpoint_uuid=ten).count() == 0
    assert det("c", "delete", ten, "--yes", env=alice).rc == 0  # no longer registered


def test_only_owners_change_models_and_no_one_registers_anothers_checkpoint(
    det: Det, master: Master, make_user: MakeUser, tmp_path: Path
) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    (ckpt,) = seed_checkpoints(master, create(det, alice, *write_context(tmp_path)), {3: 0.3})
    alices, bobs = unique("alices-"), unique("bobs-")
    assert det("m", "create", alices, env=alice).rc == 0
    assert det("m", "create", bobs, env=bob).rc == 0

    r = det("m", "register-version", bobs, ckpt, env=bob)  # bob's model, alice's checkpoint
    assert r.rc == 1 and "permission_denied" in r.err and "another user's experiment" in r.err
    r = det("m", "register-version", alices, ckpt, env=bob)  # alice's model
    assert r.rc == 1 and "permission_denied" in r.err
    r = det("m", "delete", alices, env=bob)
    assert r.rc == 1 and "permission_denied" in r.err
    assert det("m", "describe", alices, env=bob).rc == 0  # anyone may look
    assert det("m", "register-version", alices, ckpt, env=alice).rc == 0
    r = det("m", "register-version", alices, "not-a-uuid", env=alice)
    assert r.rc == 1 and "invalid_argument" in r.err
    r = det("m", "create", "12345", env=alice)
    assert r.rc == 1 and "only numbers" in r.err
