"""`det` against a real master: auth and token cache, experiment create (context, limits, config errors,
overrides), JSON/CSV outputs, permissions, trial logs and metrics, checkpoint download, the unreachable hint."""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from hpc_master.cli import _client
from hpc_master.db.models import (
    CheckpointModel,
    ExperimentModel,
    LogFileModel,
    MetricModel,
    TrialModel,
    TrialRunModel,
)
from hpc_master.services.context import unpack_context_listing
from tests.cli.conftest import ADMIN, Det, Master, free_port, running_master

MakeUser = Callable[..., dict[str, str]]

CONFIG = """\
name: cli-test
entrypoint: python3 train.py
searcher:
  name: random
  metric: validation_loss
  smaller_is_better: true
  max_trials: 2
  max_length:
    batches: 100
hyperparameters:
  lr:
    type: double
    minval: 0.001
    maxval: 0.1
"""


def write_context(tmp_path: Path, config: str = CONFIG) -> tuple[Path, Path]:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "train.py").write_text("print('hi')\n")
    cfg = tmp_path / "const.yaml"
    cfg.write_text(config)
    return cfg, ctx


def create(det: Det, who: dict[str, str], cfg: Path, ctx: Path, *extra: str) -> int:
    r = det("e", "create", str(cfg), str(ctx), *extra, env=who)
    assert r.rc == 0, r.err
    assert r.out.startswith("Created experiment "), r.out
    return int(r.out.split()[-1])


def db(master: Master) -> Session:
    return Session(create_engine(master.db_url))


# ---------------------------------------------------------------- the master and auth


def test_unreachable_master_hint(det: Det) -> None:
    port = free_port()
    r = det("-m", f"127.0.0.1:{port}", "e", "list")
    assert r.rc == 1
    assert r.err.strip() == (
        f"Error: Cannot reach the master at http://127.0.0.1:{port}. Start one with: det-master --daemon"
    )


def test_unreachable_default_master_hint(det: Det, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        if sock.connect_ex(("127.0.0.1", 8080)) == 0:
            pytest.skip("something listens on localhost:8080")
    monkeypatch.delenv("DET_MASTER")
    r = det("user", "whoami")
    assert r.rc == 1
    assert "Cannot reach the master at http://localhost:8080. Start one with: det-master --daemon" in r.err


def test_master_info(det: Det, master: Master) -> None:
    r = det("-m", master.url + "/", "master", "info", "--json")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["clusterName"] == "hpc-det"
    assert "version" in det("master", "info").out


def test_automatic_login_as_determined(det: Det, tmp_path: Path) -> None:
    r = det("user", "whoami")
    assert r.rc == 0, r.err
    assert "'determined'" in r.out
    auth = json.loads((tmp_path / "config" / "hpc-det" / "auth.json").read_text())
    assert auth["masters"][os.environ["DET_MASTER"]]["tokens"]["determined"]


def test_another_account_on_the_login_node_cannot_use_a_personal_masters_blank_passwords(
    det: Det, master: Master, tmp_path: Path
) -> None:
    """Its CLI has no owner key (it cannot read the owner's 0600 file), so `determined` and `admin` are shut."""
    for key in (tmp_path / "config" / "hpc-det").glob("owner-key-*"):
        key.unlink()
    r = det("e", "list")
    assert r.rc != 0 and "owner" in r.err, r.err
    r = det("user", "login", "admin", env={"DET_PASS": ""})
    assert r.rc != 0 and "owner" in r.err, r.err
    (tmp_path / "config" / "hpc-det" / f"owner-key-{httpx.URL(master.url).port}").write_text("a guess\n")
    assert det("e", "list").rc != 0


def test_login_whoami_logout_and_token_file_mode(
    det: Det, master: Master, make_user: MakeUser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = make_user("alice")
    name = alice["DET_USER"]

    def no_chmod(*_: Any, **__: Any) -> None:
        raise AssertionError("the token file must be created 0600, never chmod'ed")

    monkeypatch.setattr(os, "chmod", no_chmod)
    monkeypatch.setattr(os, "fchmod", no_chmod)
    r = det("user", "login", name, env={"DET_PASS": "pw"})
    assert r.rc == 0, r.err
    auth_file = tmp_path / "config" / "hpc-det" / "auth.json"
    assert stat.S_IMODE(auth_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(auth_file.parent.stat().st_mode) == 0o700
    assert f"'{name}'" in det("user", "whoami").out  # the active user, no DET_USER needed

    # A token the master no longer knows is dropped and replaced (DET_PASS given).
    data = json.loads(auth_file.read_text())
    data["masters"][master.url]["tokens"][name] = "stale"
    auth_file.write_text(json.dumps(data))
    assert f"'{name}'" in det("user", "whoami", env={"DET_PASS": "pw"}).out

    r = det("user", "logout")
    assert r.rc == 0, r.err
    assert name not in auth_file.read_text()
    assert "'determined'" in det("user", "whoami").out  # back to Determined's default user

    bad = det("user", "login", name, env={"DET_PASS": "wrong"})
    assert bad.rc == 1
    assert "invalid credentials (unauthenticated, HTTP 401)" in bad.err


def test_user_admin_commands(det: Det, make_user: MakeUser, monkeypatch: pytest.MonkeyPatch) -> None:
    bob = make_user("bob")
    name = bob["DET_USER"]
    users = json.loads(det("user", "list", "--json", env=ADMIN).out)["users"]
    assert any(u["username"] == name and u["active"] for u in users)
    assert name in det("user", "list", env=ADMIN).out

    # A non-admin cannot create users: the server's message and code, one line, exit 1.
    r = det("user", "create", "x" + name, env=bob)
    assert r.rc == 1
    assert r.err.strip() == "Error: only an admin can do this (permission_denied, HTTP 403)"

    assert det("user", "deactivate", name, env=ADMIN).rc == 0
    assert det("user", "whoami", env=bob).rc == 1
    assert det("user", "activate", name, env=ADMIN).rc == 0

    answers = iter(["new-pw", "new-pw"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    r = det("user", "change-password", env=bob)
    assert r.rc == 0, r.err
    assert det("user", "login", name, env={"DET_PASS": "new-pw"}).rc == 0

    r = det("user", "create", "u" + name, "--unix-username", "someone", env=ADMIN)
    assert r.rc == 0, r.err
    users = json.loads(det("user", "list", "--json", env=ADMIN).out)["users"]
    assert [u["unixUsername"] for u in users if u["username"] == "u" + name] == ["someone"]
    assert det("user", "edit", "u" + name, "--unix-username", "other", "--admin", env=ADMIN).rc == 0
    users = json.loads(det("user", "list", "--json", env=ADMIN).out)["users"]
    assert [(u["unixUsername"], u["admin"]) for u in users if u["username"] == "u" + name] == [
        ("other", True)
    ]


# ---------------------------------------------------------------- experiment create


def test_create_honours_detignore_and_symlinks(
    det: Det, master: Master, make_user: MakeUser, tmp_path: Path
) -> None:
    who = make_user("ctx")
    cfg, ctx = write_context(tmp_path)
    (ctx / ".detignore").write_text("data/\n*.log\n!keep.log\n")
    (ctx / "data").mkdir()
    (ctx / "data" / "big.bin").write_bytes(b"x" * 1000)
    (ctx / "run.log").write_text("noise\n")
    (ctx / "keep.log").write_text("kept\n")
    (ctx / "pkg").mkdir()
    (ctx / "pkg" / "model.py").write_text("X = 1\n")
    (ctx / "__pycache__").mkdir()
    (ctx / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (ctx / ".git").mkdir()
    (ctx / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("do not send\n")
    (ctx / "escape.txt").symlink_to(secret)
    (ctx / "alias.py").symlink_to(ctx / "train.py")

    r = det("e", "create", str(cfg), str(ctx), env=who)
    assert r.rc == 0, r.err
    assert "not sending escape.txt (link out of the context" in r.err
    experiment_id = int(r.out.split()[-1])
    with db(master) as session:
        archive = session.scalar(
            select(ExperimentModel.context_archive).where(ExperimentModel.id == experiment_id)
        )
    assert archive is not None
    names = set(unpack_context_listing(archive))
    assert names == {"train.py", "keep.log", "pkg", "pkg/model.py", "alias.py"}


def test_create_refuses_over_95_mb_listing_the_largest(det: Det, tmp_path: Path) -> None:
    cfg, ctx = write_context(tmp_path)
    sizes_mb = {"huge.bin": 60, "big.bin": 30, "mid.bin": 4, "small.bin": 2, "tiny.bin": 1, "least.bin": 0.5}
    for name, size_mb in sizes_mb.items():
        with (ctx / name).open("wb") as handle:  # sparse: instant, no disk used
            handle.truncate(int(size_mb * 2**20))
    r = det("e", "create", str(cfg), str(ctx))
    assert r.rc == 1
    assert r.err.count("\n") == 1, r.err
    assert "over the 95.0 MB limit" in r.err
    assert (
        "huge.bin (60.0 MB); big.bin (30.0 MB); mid.bin (4.0 MB); small.bin (2.0 MB); tiny.bin (1.0 MB)"
        in r.err
    )
    assert "least.bin" not in r.err
    assert ".detignore" in r.err


def test_bad_config_exits_2_naming_the_yaml_path(det: Det, tmp_path: Path) -> None:
    cfg, ctx = write_context(tmp_path, CONFIG.replace("max_trials", "max_trails"))
    r = det("e", "create", str(cfg), str(ctx))
    assert r.rc == 2
    assert r.err.strip() == f"Error: {cfg}: `searcher.max_trails`: unknown field; did you mean `max_trials`?"

    cfg.write_text("searcher: [unclosed\n")
    r = det("e", "create", str(cfg), str(ctx))
    assert r.rc == 2
    assert "not valid YAML (line" in r.err


def test_config_overrides(det: Det, make_user: MakeUser, tmp_path: Path) -> None:
    who = make_user("ovr")
    cfg, ctx = write_context(tmp_path)
    experiment_id = create(
        det, who, cfg, ctx, "--config", "searcher.max_trials=5", "--config", "name=overridden",
        "--config", "slurm.partition=short", "--paused",
    )  # fmt: skip
    described = json.loads(det("e", "describe", str(experiment_id), "--json", env=who).out)
    experiment = described["experiment"]
    assert experiment["config"]["searcher"]["max_trials"] == 5
    assert experiment["config"]["slurm"]["partition"] == "short"
    assert experiment["name"] == "overridden"
    assert experiment["state"] == "STATE_PAUSED"
    text = det("e", "describe", str(experiment_id), env=who).out
    assert "Priority" in text and "42 (Slurm: its jobs compete as plain sbatch jobs do, nice 0)" in text
    higher = create(det, who, cfg, ctx, "--config", "resources.priority=5", "--paused")
    assert "needs a Slurm operator's rights" in det("e", "describe", str(higher), env=who).out

    r = det("e", "create", str(cfg), str(ctx), "--config", "searcher.max_trails=5", env=who)
    assert r.rc == 2
    assert "`searcher.max_trails`: unknown field; did you mean `max_trials`?" in r.err
    r = det("e", "create", str(cfg), str(ctx), "--config", "name.first=x", env=who)
    assert r.rc == 2
    assert "`name` is not a mapping" in r.err


# ---------------------------------------------------------------- outputs and permissions


def test_json_and_csv_outputs_parse(det: Det, make_user: MakeUser, tmp_path: Path) -> None:
    who = make_user("out")
    cfg, ctx = write_context(tmp_path)
    experiment_id = create(det, who, cfg, ctx)

    listed = json.loads(det("e", "list", "--json", env=who).out)["experiments"]
    assert [e["id"] for e in listed] == [experiment_id]  # only mine by default
    everyone = json.loads(det("e", "list", "--all", "--json", env=who).out)["experiments"]
    assert experiment_id in [e["id"] for e in everyone]
    rows = list(csv.DictReader(io.StringIO(det("e", "list", "--csv", env=who).out)))
    assert rows[0]["ID"] == str(experiment_id) and rows[0]["State"] == "ACTIVE"
    table = det("e", "list", env=who).out.splitlines()
    assert table[0].startswith("ID | Owner") and str(experiment_id) in table[2]

    for argv in (
        ("e", "describe", str(experiment_id), "--json"),
        ("e", "list-trials", str(experiment_id), "--json"),
        ("e", "list-checkpoints", str(experiment_id), "--json"),
        ("e", "lc", str(experiment_id), "--best", "1", "--json"),
        ("user", "list", "--json"),
        ("master", "info", "--json"),
    ):
        r = det(*argv, env=who)
        assert r.rc == 0, (argv, r.err)
        json.loads(r.out)
    assert det("e", "list-trials", str(experiment_id), "--csv", env=who).out.startswith("Trial ID,State")

    missing = det("e", "describe", "999999", env=who)
    assert missing.rc == 1 and "(not_found, HTTP 404)" in missing.err


def test_other_user_cannot_pause(det: Det, make_user: MakeUser, tmp_path: Path) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    cfg, ctx = write_context(tmp_path)
    experiment_id = create(det, alice, cfg, ctx)

    r = det("e", "pause", str(experiment_id), env=bob)
    assert r.rc == 1
    assert r.err.strip() == (
        f"Error: experiment {experiment_id} belongs to another user (permission_denied, HTTP 403)"
    )
    assert "Traceback" not in r.err

    assert (
        det("e", "pause", str(experiment_id), env=alice).out.strip() == f"Paused experiment {experiment_id}"
    )
    state = json.loads(det("e", "describe", str(experiment_id), "--json", env=alice).out)
    assert state["experiment"]["state"] == "STATE_PAUSED"
    assert det("e", "activate", str(experiment_id), env=alice).rc == 0
    assert det("e", "kill", str(experiment_id), env=alice).rc == 0
    # No trials: killing ends it at once, and `wait` reports how it ended through its exit status.
    r = det("e", "wait", str(experiment_id), env=alice)
    assert (r.rc, r.out.strip()) == (4, f"Experiment {experiment_id} ended: CANCELED")
    assert det("e", "archive", str(experiment_id), env=alice).rc == 0
    assert det("e", "list", "--json", env=alice).out.count('"id"') == 0
    assert det("e", "unarchive", str(experiment_id), env=alice).rc == 0
    assert det("e", "delete", str(experiment_id), env=bob).rc == 1
    r = det("e", "delete", str(experiment_id), env=alice)
    assert r.rc == 1 and "--yes" in r.err  # no TTY, no --yes: refused
    assert det("e", "delete", str(experiment_id), "--yes", env=alice).rc == 0
    assert det("e", "describe", str(experiment_id), env=alice).rc == 1


# ---------------------------------------------------------------- trials, logs, checkpoints (seeded rows)


def seed_trial(master: Master, experiment_id: int, log_text: str, checkpoint_uuid: str) -> int:
    """What the lifecycle loop and the harness would record: a finished trial, its run, log, metrics, ckpt."""
    log_file = (
        master.root / "jobs" / f"trial-{experiment_id}.log"
    )  # below the job storage root: read from there
    log_file.parent.mkdir(exist_ok=True)
    log_file.write_text(log_text)
    with db(master) as session, session.begin():
        trial = TrialModel(
            experiment_id=experiment_id, request_id="r1", hparams={"lr": 0.01}, state="COMPLETED",
            steps_completed=100,
        )  # fmt: skip
        session.add(trial)
        session.flush()
        run = TrialRunModel(trial_id=trial.id, run_number=0, state="COMPLETED", slurm_job_id="42")
        session.add(run)
        session.flush()
        session.add(LogFileModel(trial_run_id=run.id, path=str(log_file)))
        for steps in (50, 100):
            session.add(MetricModel(trial_id=trial.id, trial_run_id=0, group="training",
                                    steps_completed=steps, metrics={"loss": 1.0 / steps}))  # fmt: skip
        session.add(MetricModel(trial_id=trial.id, trial_run_id=0, group="validation", steps_completed=100,
                                metrics={"validation_loss": 0.5}))  # fmt: skip
        session.add(CheckpointModel(uuid=checkpoint_uuid, trial_id=trial.id, trial_run_id=0,
                                    steps_completed=100, resources={"model.pt": 5}))  # fmt: skip
        return int(trial.id)


def test_trial_describe_logs_and_checkpoint_download(
    det: Det, master: Master, make_user: MakeUser, tmp_path: Path
) -> None:
    who = make_user("trial")
    cfg, ctx = write_context(tmp_path)
    experiment_id = create(det, who, cfg, ctx)
    uuid = f"ckpt-{experiment_id}"
    trial_id = seed_trial(master, experiment_id, "[rank=0] step 1\n[rank=1] step 1\nplain line\n", uuid)

    described = json.loads(det("t", "describe", str(trial_id), "--metrics", "--json", env=who).out)
    assert described["trial"]["hparams"] == {"lr": 0.01}
    assert [(m["group"], m["stepsCompleted"]) for m in described["metrics"]] == [
        ("training", 50), ("training", 100), ("validation", 100)
    ]  # fmt: skip
    text = det("trial", "describe", str(trial_id), "--metrics", env=who).out
    assert "validation_loss" in text and "Slurm Job" in text

    assert det("t", "logs", str(trial_id), env=who).out == "[rank=0] step 1\n[rank=1] step 1\nplain line\n"
    assert det("t", "logs", str(trial_id), "--rank-id", "1", env=who).out == "[rank=1] step 1\n"
    assert det("t", "logs", str(trial_id), "-f", env=who).out.count("\n") == 3  # terminal: the stream ends
    assert det("e", "logs", str(experiment_id), env=who).out.startswith("[rank=0] step 1\n")

    best = json.loads(det("e", "list-checkpoints", str(experiment_id), "--best", "1", "--json", env=who).out)
    assert [(c["uuid"], c["training"]["searcherMetric"]) for c in best["checkpoints"]] == [(uuid, 0.5)]
    assert json.loads(det("c", "describe", uuid, "--json", env=who).out)["uuid"] == uuid

    missing = det("c", "download", uuid, "-o", str(tmp_path / "out"), env=who)
    assert missing.rc == 1 and "not readable on this machine" in missing.err
    source = master.checkpoint_root / uuid
    source.mkdir(parents=True)
    (source / "model.pt").write_bytes(b"12345")
    r = det(
        "c",
        "download",
        uuid,
        "-o",
        str(tmp_path / "out"),
        env={**who, "DET_CHECKPOINT_ROOT": str(master.checkpoint_root)},
    )
    assert r.rc == 0, r.err
    assert (tmp_path / "out" / "model.pt").read_bytes() == b"12345"


def test_trial_kill_permission(det: Det, master: Master, make_user: MakeUser, tmp_path: Path) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    cfg, ctx = write_context(tmp_path)
    experiment_id = create(det, alice, cfg, ctx)
    trial_id = seed_trial(master, experiment_id, "x\n", f"k-{experiment_id}")
    r = det("t", "kill", str(trial_id), env=bob)
    assert r.rc == 1 and "permission_denied" in r.err
    assert det("t", "kill", str(trial_id), env=alice).rc == 0


def test_usage_errors_exit_2(det: Det) -> None:
    assert det("e", "pause").rc == 2
    assert det("e", "create", "only-config.yaml").rc == 2


def test_auth_file_is_per_master_and_user(det: Det, master: Master, make_user: MakeUser) -> None:
    who = make_user("cache")
    assert det("user", "whoami", env=who).rc == 0
    assert _client.cached_token(master.url, who["DET_USER"])
    assert _client.cached_token("http://elsewhere:8080", who["DET_USER"]) is None


def test_master_that_refuses_blank_passwords(det: Det, tmp_path: Path) -> None:
    strict_env = {"DET_REQUIRE_PASSWORDS": "true", "DET_ADMIN_PASSWORD": "s3cret"}
    with running_master(tmp_path / "strict", ["tests.cli._api_master", "{port}"], strict_env) as strict:
        r = det("-m", strict.url, "user", "whoami")
        assert r.rc == 1
        assert r.err.strip() == (
            "Error: could not log in as 'determined' with a blank password (invalid credentials); "
            "log in with: det user login USERNAME"
        )
        r = det("-m", strict.url, "-u", "admin", "user", "whoami", env={"DET_PASS": "s3cret"})
        assert (r.rc, r.out.strip()) == (0, "You are logged in as user 'admin'")


def test_large_upload_reports_progress_on_stderr(det: Det, make_user: MakeUser, tmp_path: Path) -> None:
    who = make_user("big")
    cfg, ctx = write_context(tmp_path)
    (ctx / "weights.bin").write_bytes(os.urandom(5 * 2**20))
    r = det("e", "create", str(cfg), str(ctx), "--paused", env=who)
    assert r.rc == 0, r.err
    assert "Reading the context: 5.0 MB..." in r.err
    assert "Uploading: 6.7 MB..." in r.err
    assert r.out.startswith("Created experiment")
