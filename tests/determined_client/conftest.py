"""Determined's official client (``determined==0.38.1``: its ``det`` CLI and Python SDK), unmodified, against a
real master (the REST API under uvicorn on a free loopback port, as in ``tests/cli``).

The client lives in its own virtual environment, ``.venv-determined`` (``scripts/determined_client.sh``, run
by ``scripts/bootstrap.sh``), so that it never shadows the job-side ``determined`` package; it runs here only
as a subprocess, with ``PYTHONPATH`` cleared. Without that environment the tests skip, or fail under
``DET_TEST_REQUIRE_ALL=1``.

The master is set up through our own API (plain-password logins, the owner key for ``admin``), as hpc-det's
``det`` and the web UI do; everything the tests assert about is then done with Determined's client.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from hpc_master.db.models import CheckpointModel, MetricModel, TrialModel, TrialRunModel
from tests.cli.conftest import Master, running_master

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-determined"
CLIENT_TIMEOUT_S = 60.0


def client_venv_or_skip() -> Path:
    """``.venv-determined``, or a skip (a failure under ``DET_TEST_REQUIRE_ALL=1``) naming how to make it."""
    if not (VENV / "bin" / "det").exists():
        reason = f"Determined's client is not installed at {VENV} (run scripts/determined_client.sh)"
        if os.environ.get("DET_TEST_REQUIRE_ALL") == "1":
            pytest.fail(f"{reason} and DET_TEST_REQUIRE_ALL=1")
        pytest.skip(reason)
    return VENV


@pytest.fixture(scope="session")
def venv() -> Path:
    return client_venv_or_skip()


@pytest.fixture(scope="session")
def master(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Master]:
    with running_master(tmp_path_factory.mktemp("master"), ["tests.cli._api_master", "{port}"]) as m:
        yield m


@dataclass(frozen=True)
class Result:
    rc: int
    out: str
    err: str


class DeterminedClient:
    """Runs Determined's ``det`` and Python from the client's venv, as one user on one machine: its own
    ``HOME`` and config directory (Determined's token store, ``auth.json``, lives there)."""

    def __init__(self, venv: Path, master: Master, home: Path) -> None:
        self.venv = venv
        self.master = master
        self.home = home

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DET_", "XDG_", "PYTHON")) and k not in ("VIRTUAL_ENV",)
        }
        env.update(
            HOME=str(self.home), XDG_CONFIG_HOME=str(self.home / ".config"), DET_MASTER=self.master.url
        )
        env.update(extra or {})
        return env

    def run(
        self, argv: list[str], *, stdin: str = "", env: dict[str, str] | None = None,
        timeout_s: float = CLIENT_TIMEOUT_S,
    ) -> Result:  # fmt: skip
        # A new session has no controlling terminal, so ``getpass`` reads the password from stdin.
        proc = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, env=self.env(env), cwd=self.home,
            timeout=timeout_s, start_new_session=True,
        )  # fmt: skip
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def det(
        self,
        *args: str,
        stdin: str = "",
        env: dict[str, str] | None = None,
        timeout_s: float = CLIENT_TIMEOUT_S,
    ) -> Result:
        return self.run([str(self.venv / "bin" / "det"), *args], stdin=stdin, env=env, timeout_s=timeout_s)

    def sdk(self, code: str, env: dict[str, str] | None = None) -> object:
        """Run `code` in the client's Python; it prints one JSON document, which is returned."""
        r = self.run([str(self.venv / "bin" / "python"), "-c", code], env=env)
        assert r.rc == 0, r.err
        return json.loads(r.out.strip().splitlines()[-1])


@pytest.fixture
def determined(venv: Path, master: Master, tmp_path: Path) -> DeterminedClient:
    home = tmp_path / "home"
    home.mkdir()
    return DeterminedClient(venv, master, home)


class OurApi:
    """hpc-det's own REST API, as its ``det`` and web UI use it (plain passwords; the owner key for admin)."""

    def __init__(self, master: Master) -> None:
        self.master = master
        key_file = master.root / "home" / ".config" / "hpc-det" / f"owner-key-{httpx.URL(master.url).port}"
        self.admin = self.login("admin", "", owner_key=key_file.read_text().strip())

    def login(self, username: str, password: str, owner_key: str | None = None) -> dict[str, str]:
        body = {"username": username, "password": password, "ownerKey": owner_key}
        r = httpx.post(f"{self.master.url}/api/v1/auth/login", json=body)
        assert r.status_code == 200, r.text
        return {"Authorization": f"Bearer {r.json()['token']}"}

    def create_user(self, prefix: str, password: str) -> str:
        name = f"{prefix}{uuid.uuid4().hex[:8]}"
        body = {"user": {"username": name}, "password": password}
        r = httpx.post(f"{self.master.url}/api/v1/users", json=body, headers=self.admin)
        assert r.status_code == 200, r.text
        return name

    def create_experiment(self, headers: dict[str, str], name: str) -> int:
        config = CONFIG.replace("NAME", name)
        train = {"path": "train.py", "type": 48, "content": "cHJpbnQoJ2hpJykK", "mode": 0o644}
        body = {"config": config, "modelDefinition": [train], "activate": True}
        r = httpx.post(f"{self.master.url}/api/v1/experiments", json=body, headers=headers)
        assert r.status_code == 200, r.text
        return int(r.json()["experiment"]["id"])

    def seed_trials(self, experiment_id: int, hparams: list[dict[str, float]]) -> list[int]:
        """What the lifecycle loop and the harness would record for finished trials: each a run, two training
        reports, a validation and a checkpoint."""
        ids = []
        with Session(create_engine(self.master.db_url)) as session, session.begin():
            for i, hp in enumerate(hparams):
                trial = TrialModel(
                    experiment_id=experiment_id, request_id=f"r{i}", hparams=hp, state="COMPLETED",
                    steps_completed=100,
                )  # fmt: skip
                session.add(trial)
                session.flush()
                session.add(
                    TrialRunModel(trial_id=trial.id, run_number=0, state="COMPLETED", slurm_job_id="7")
                )
                for steps in (50, 100):
                    session.add(MetricModel(trial_id=trial.id, trial_run_id=0, group="training",
                                            steps_completed=steps, metrics={"loss": 1.0 / steps}))  # fmt: skip
                session.add(MetricModel(trial_id=trial.id, trial_run_id=0, group="validation",
                                        steps_completed=100, metrics={"validation_loss": 0.25 + i}))  # fmt: skip
                session.add(CheckpointModel(uuid=str(uuid.uuid4()), trial_id=trial.id, trial_run_id=0,
                                            steps_completed=100, resources={"model.pt": 5}))  # fmt: skip
                ids.append(int(trial.id))
        return ids


CONFIG = """\
name: NAME
entrypoint: python3 train.py
searcher:
  name: grid
  metric: validation_loss
  smaller_is_better: true
  max_length:
    batches: 100
hyperparameters:
  lr:
    type: categorical
    vals: [0.01, 0.1]
"""


@pytest.fixture(scope="session")
def our_api(master: Master) -> OurApi:
    return OurApi(master)
