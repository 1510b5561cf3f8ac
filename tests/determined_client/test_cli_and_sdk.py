"""Determined 0.38.1's own ``det`` and SDK, unmodified, against our master: what ``docs/determined-client.md``
says works. Each test acts as a fresh user in a fresh home directory (Determined's token store is there)."""

from __future__ import annotations

import csv
import importlib.metadata
import io
import json
import sqlite3

import pytest

from hpc_master import auth
from tests.determined_client.conftest import DeterminedClient, OurApi

pytestmark = pytest.mark.determined_client

PASSWORD = "Secret123pw"  # meets Determined's client-side complexity rules (change-password enforces them)


def as_user(name: str, password: str = PASSWORD) -> dict[str, str]:
    return {"DET_USER": name, "DET_PASS": password}


def test_the_client_stays_in_its_own_venv(determined: DeterminedClient) -> None:
    """PyPI's ``determined`` must never shadow the job-side compatibility package (nor our ``det``)."""
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("determined")  # not in the environment these tests (and the master) run in
    where = determined.sdk(
        "import json, determined; print(json.dumps([determined.__version__, determined.__file__]))"
    )
    assert isinstance(where, list) and where[0] == "0.38.1"
    assert str(where[1]).startswith(str(determined.venv))


def test_version_and_master_info(determined: DeterminedClient, our_api: OurApi) -> None:
    r = determined.det("version")
    assert r.rc == 0, r.err
    assert "version: 0.38.1" in r.out and "hpcDetVersion" in r.out
    assert "Consider upgrading" not in r.err and "Master not found" not in r.err

    name = our_api.create_user("info", PASSWORD)
    r = determined.det("master", "info", env=as_user(name))
    assert r.rc == 0, r.err
    assert "clusterName: hpc-det" in r.out and "hasCustomLogo: false" in r.out
    assert json.loads(determined.det("master", "info", "--json", env=as_user(name)).out)["clusterId"]


def test_login_whoami_list_logout(determined: DeterminedClient, our_api: OurApi) -> None:
    name = our_api.create_user("login", PASSWORD)
    r = determined.det("user", "login", name, stdin=PASSWORD + "\n")
    assert r.rc == 0, r.err
    assert "complexity" not in r.err
    r = determined.det("user", "whoami")
    assert (r.rc, r.out.strip()) == (0, f"You are logged in as user '{name}'")
    listed = determined.det("user", "list")
    assert listed.rc == 0, listed.err
    assert name in listed.out and "admin" in listed.out

    assert determined.det("user", "logout").rc == 0
    r = determined.det("user", "whoami")
    assert r.rc == 1 and "Unauthenticated" in r.err  # no cached token: the default user, refused

    wrong = determined.det("user", "login", name, stdin="not-the-password\n")
    assert wrong.rc == 1 and "invalid credentials" in wrong.err
    nobody = determined.det("user", "login", "no-such-user", stdin=PASSWORD + "\n")
    assert nobody.rc == 1 and nobody.err.splitlines()[-1] == wrong.err.splitlines()[-1]  # no user enumeration


def test_change_password_then_login(determined: DeterminedClient, our_api: OurApi) -> None:
    name = our_api.create_user("chpw", PASSWORD)
    assert determined.det("user", "login", name, stdin=PASSWORD + "\n").rc == 0
    new = "Changed456pw"
    r = determined.det("user", "change-password", stdin=f"{new}\n{new}\n")
    assert r.rc == 0, r.err
    assert determined.det("user", "whoami").out.strip() == f"You are logged in as user '{name}'"

    old = determined.det("user", "login", name, stdin=PASSWORD + "\n")
    assert old.rc == 1 and "invalid credentials" in old.err
    assert determined.det("user", "login", name, stdin=new + "\n").rc == 0
    # The password Determined's client set (its client-side hash) works for hpc-det's plain logins too.
    assert our_api.login(name, new)


def test_experiment_and_trial_commands(determined: DeterminedClient, our_api: OurApi) -> None:
    name = our_api.create_user("exps", PASSWORD)
    exp_name = f"dc-{name}"
    experiment_id = our_api.create_experiment(our_api.login(name, PASSWORD), exp_name)
    trial_ids = our_api.seed_trials(experiment_id, [{"lr": 0.01}, {"lr": 0.1}])
    who = as_user(name)

    listed = determined.det("e", "list", env=who)
    assert listed.rc == 0, listed.err
    row = next(line for line in listed.out.splitlines() if exp_name in line)
    assert [c.strip() for c in row.split("|")][:3] == [str(experiment_id), name, exp_name]

    described = determined.det("e", "describe", str(experiment_id), env=who)
    assert described.rc == 0, described.err
    assert exp_name in described.out and "Workloads:" in described.out
    for trial_id in trial_ids:
        assert f"{trial_id} |" in described.out.replace("  ", " ")
    as_json = json.loads(determined.det("e", "describe", str(experiment_id), "--json", env=who).out)
    assert as_json[0]["experiment"]["name"] == exp_name

    trials = determined.det("e", "list-trials", str(experiment_id), "--csv", env=who)
    assert trials.rc == 0, trials.err
    rows = list(csv.reader(io.StringIO(trials.out)))
    assert rows[0][:2] == ["Trial ID", "State"]
    assert [(r[0], r[1], json.loads(r[2])) for r in rows[1:]] == [
        (str(trial_ids[0]), "COMPLETED", {"lr": 0.01}),
        (str(trial_ids[1]), "COMPLETED", {"lr": 0.1}),
    ]

    r = determined.det("t", "describe", str(trial_ids[0]), "--json", env=who)
    assert r.rc == 0, r.err
    trial = json.loads(r.out)
    assert trial["trial"]["hparams"] == {"lr": 0.01}
    kinds = [(k, v["totalBatches"]) for w in trial["workloads"] for k, v in w.items() if v is not None]
    assert kinds == [("training", 50), ("training", 100), ("checkpoint", 100), ("validation", 100)]
    text = determined.det("t", "describe", str(trial_ids[0]), "--metrics", env=who)
    assert text.rc == 0 and "validation_loss" in text.out and "COMPLETED" in text.out

    missing = determined.det("e", "describe", "999999", env=who)
    assert missing.rc == 1 and "not found" in missing.err.lower()


def test_sdk_login_list_and_trials(determined: DeterminedClient, our_api: OurApi) -> None:
    name = our_api.create_user("sdk", PASSWORD)
    exp_name = f"sdk-{name}"
    experiment_id = our_api.create_experiment(our_api.login(name, PASSWORD), exp_name)
    trial_ids = our_api.seed_trials(experiment_id, [{"lr": 0.01}, {"lr": 0.1}])
    code = f"""
import json
from determined.experimental import client
client.login(master={determined.master.url!r}, user={name!r}, password={PASSWORD!r})
listed = {{e.id: e.name for e in client.list_experiments()}}
exp = client.get_experiment({experiment_id})
trials = exp.list_trials()
print(json.dumps({{"listed": listed.get({experiment_id}), "name": exp.name, "config_name": exp.config["name"],
                  "state": exp.state.value, "trials": [t.id for t in trials],
                  "hparams": [t.hparams for t in trials]}}))
"""
    got = determined.sdk(code)
    assert got == {
        "listed": exp_name,
        "name": exp_name,
        "config_name": exp_name,
        "state": "STATE_ACTIVE",
        "trials": trial_ids,
        "hparams": [{"lr": 0.01}, {"lr": 0.1}],
    }


def test_sdk_wrong_password_is_refused(determined: DeterminedClient, our_api: OurApi) -> None:
    name = our_api.create_user("sdkbad", PASSWORD)
    code = f"""
import json
from determined.experimental import client
try:
    client.login(master={determined.master.url!r}, user={name!r}, password="wrong")
    print(json.dumps("logged in"))
except Exception as exc:
    print(json.dumps(type(exc).__name__ + ": " + str(exc)))
"""
    got = determined.sdk(code)
    assert isinstance(got, str) and got.startswith("ForbiddenException") and "invalid credentials" in got


def test_blank_password_user_is_told_to_set_one(determined: DeterminedClient, our_api: OurApi) -> None:
    """Determined's client cannot send a personal master's owner key, which a blank password needs."""
    r = determined.det("e", "list", env={"DET_USER": "admin", "DET_PASS": ""})
    assert r.rc == 1
    assert "Determined's client cannot send it" in r.err and "change-password" in r.err


def test_old_form_password_upgrades_on_a_plain_login(determined: DeterminedClient, our_api: OurApi) -> None:
    """A password stored before this master accepted Determined's client (scrypt over the plain password)
    cannot be checked against the client's hash; one plain login (hpc-det's det, the web UI) upgrades it."""
    name = our_api.create_user("oldform", PASSWORD)
    old_form = _old_form_hash(PASSWORD)
    with sqlite3.connect(determined.master.db_url.removeprefix("sqlite:///")) as conn:
        conn.execute("UPDATE users SET password_hash = ? WHERE username = ?", (old_form, name))

    refused = determined.det("user", "login", name, stdin=PASSWORD + "\n")
    assert refused.rc == 1 and "log in once with hpc-det's `det user login` or the web UI" in refused.err
    assert our_api.login(name, PASSWORD)  # plain: verifies the old form and stores the new one
    assert determined.det("user", "login", name, stdin=PASSWORD + "\n").rc == 0


def _old_form_hash(password: str) -> str:
    import hashlib
    import secrets

    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=auth.SCRYPT_N, r=8, p=1, dklen=32)
    return f"scrypt${auth.SCRYPT_N}$8$1${salt.hex()}${digest.hex()}"
