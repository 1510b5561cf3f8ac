"""Trials inside Apptainer images, on the real cluster with a real Apptainer (scripts/install_apptainer.sh).

The image is scripts/build_test_image.sh's: Debian 12 minbase with python3, no registry involved, recognisable
from inside by /etc/hpc-det-test-image and VARIANT_ID=hpc-det-test in /etc/os-release. Trials are submitted
through a real master as alice (Unix user `researcher`): apptainer runs unprivileged, in user-namespace mode.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from containers.job import JobContainer
from containers.runtime import Bind, ContainerRuntime, find_program
from tests.conftest import require
from tests.e2e.conftest import Master
from tests.slurm.fixtures import REPO, SHARED_TEST_ROOT, Researcher

pytestmark = [pytest.mark.apptainer, pytest.mark.slow]

CONTEXT = Path(__file__).parent / "images" / "context"
DONE = {"STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED"}
UNREACHABLE = "docker://registry.invalid/hpc-det/missing:1.0"


@pytest.fixture(scope="session")
def apptainer() -> str:
    program = find_program(ContainerRuntime("apptainer"))
    require(program is not None, "Apptainer (sudo scripts/install_apptainer.sh)")
    assert program is not None
    return program


@pytest.fixture(scope="session")
def test_image(apptainer: str) -> str:
    """The test image's .sif (built once per machine, then cached by the script)."""
    require(os.geteuid() == 0, "root (to build the test image)")
    started = time.monotonic()
    proc = subprocess.run(
        [str(REPO / "scripts" / "build_test_image.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    path = proc.stdout.strip().splitlines()[-1]
    print(f"test image {path} ready in {time.monotonic() - started:.1f} s")
    return path


@pytest.fixture()
def data_dir(master: Master) -> Path:
    d = master.root / "dataset"  # the module's master: the tests share it
    d.mkdir(exist_ok=True)
    (d / "hello.txt").write_text("hello from the host\n")
    d.chmod(0o755)
    return d


def _config(name: str, image: str, data: Path, slots: int, extra: str = "") -> str:
    return f"""
name: {name}
entrypoint: python3 in_image.py
hyperparameters: {{bind: /data}}
searcher: {{name: single, metric: loss, max_length: {{batches: 5}}}}
resources: {{slots_per_trial: {slots}}}
environment:
  image: {image}
  environment_variables: ["FROM_CONFIG=a,b"]
bind_mounts:
  - {{host_path: {data}, container_path: /data, read_only: true}}
max_restarts: 0
{extra}"""


def _seen(master: Master, exp: int, trial_id: int) -> dict[int, dict[str, Any]]:
    logs = sorted((master.user_jobs / f"exp-{exp}" / f"trial-{trial_id}").glob("run-*/output.log"))
    rows: dict[int, dict[str, Any]] = {}
    for line in logs[-1].read_text().splitlines():
        m = re.match(r"^(?:\[rank=\d+\] )?SEEN (.*)$", line)
        if m:
            row = json.loads(m.group(1))
            rows[int(row["rank"])] = row
    return rows


def _metrics(master: Master, headers: dict[str, str], trial_id: int, group: str) -> list[int]:
    rows = master.api("GET", f"/trials/{trial_id}/metrics", headers, params={"group": group})
    return sorted(int(m["stepsCompleted"]) for m in rows.get("metrics", rows.get("data", [])))


def _assert_completed_with_metrics_and_checkpoint(
    master: Master, alice: dict[str, str], exp: int
) -> dict[str, Any]:
    assert master.wait_state(alice, exp, DONE, 300) == "STATE_COMPLETED", master.diagnose(exp)
    (trial,) = master.trials(alice, exp)
    assert trial["state"] == "STATE_COMPLETED" and trial["stepsCompleted"] == 5
    assert _metrics(master, alice, trial["id"], "training") == [1, 2, 3, 4, 5]
    assert _metrics(master, alice, trial["id"], "validation") == [5]
    assert trial["latestCheckpointUuid"]
    return dict(trial)


def _assert_inside(row: dict[str, Any], gpus: int) -> None:
    assert row["variant"] == "hpc-det-test" and row["marker"].startswith("hpc-det-test-image ")
    assert row["python"] == "/usr/bin/python3"  # the image's interpreter, not the platform's venv
    assert row["bind_content"] == "hello from the host" and row["bind_writable"] is False  # read_only: true
    # Slurm's GPUs for the step (which ones depends on what else runs on the node), passed in past --cleanenv.
    assert row["cuda"] and len(row["cuda"].split(",")) == gpus and row["cuda"] == row["step_gpus"]
    assert row["user_var"] == "a,b"


@pytest.mark.slurm
def test_single_slot_trial_runs_inside_the_image(
    master: Master, alice: dict[str, str], test_image: str, data_dir: Path
) -> None:
    exp = master.create_experiment(alice, _config("in-image-1", test_image, data_dir, 1), CONTEXT)
    trial = _assert_completed_with_metrics_and_checkpoint(master, alice, exp)
    rows = _seen(master, exp, trial["id"])
    assert sorted(rows) == [0], master.diagnose(exp)
    _assert_inside(rows[0], gpus=1)
    assert not (data_dir / "written-from-the-trial").exists()


@pytest.mark.slurm
def test_two_node_trial_runs_each_node_inside_the_image(
    master: Master, alice: dict[str, str], test_image: str, data_dir: Path
) -> None:
    # The image has python3 but no torch, which the launcher's torchrun needs: bind the platform's own
    # site-packages (same Debian python 3.11) read-only, as sites bind a shared software tree.
    site = sysconfig.get_paths()["purelib"]
    extra = f"""
  - {{host_path: {site}, container_path: /opt/site, read_only: true}}
"""
    config = _config("in-image-4", test_image, data_dir, 4).replace(
        '["FROM_CONFIG=a,b"]', '["FROM_CONFIG=a,b", "PYTHONPATH=/opt/site"]'
    )
    config = config.replace("max_restarts: 0", extra.strip("\n") + "\nmax_restarts: 0")
    exp = master.create_experiment(alice, config, CONTEXT)
    trial = _assert_completed_with_metrics_and_checkpoint(master, alice, exp)
    rows = _seen(master, exp, trial["id"])
    assert sorted(rows) == [0, 1, 2, 3], master.diagnose(exp)
    # Two ranks on each of two nodes, in node order (which two of the cluster's nodes is Slurm's choice).
    first, second = {rows[r]["host"] for r in (0, 1)}, {rows[r]["host"] for r in (2, 3)}
    assert len(first) == len(second) == 1 and first != second, rows
    for row in rows.values():
        assert row["size"] == 4
        _assert_inside(row, gpus=2)


@pytest.mark.slurm
def test_a_missing_image_fails_the_trial_naming_it(
    master: Master, alice: dict[str, str], apptainer: str, data_dir: Path
) -> None:
    missing = f"/var/tmp/hpc-det-no-such-image-{uuid.uuid4().hex[:6]}.sif"
    exp = master.create_experiment(alice, _config("missing-image", missing, data_dir, 1), CONTEXT)
    assert master.wait_state(alice, exp, DONE, 180) == "STATE_ERROR", master.diagnose(exp)
    (trial,) = master.trials(alice, exp)
    assert missing in trial["exitMessage"] and "no such image file" in trial["exitMessage"]


@pytest.mark.slurm
def test_a_failed_docker_pull_fails_the_trial_naming_it_and_leaves_no_partial_image(
    master: Master, alice: dict[str, str], apptainer: str, data_dir: Path
) -> None:
    exp = master.create_experiment(alice, _config("failed-pull", UNREACHABLE, data_dir, 1), CONTEXT)
    assert master.wait_state(alice, exp, DONE, 180) == "STATE_ERROR", master.diagnose(exp)
    (trial,) = master.trials(alice, exp)
    assert f"container image '{UNREACHABLE}'" in trial["exitMessage"]
    assert "the pull failed" in trial["exitMessage"]
    cache = master.root / "jobs" / "images"  # the pool's default cache, created by the master
    assert cache.is_dir() and os.listdir(cache) == []


# -- the runtime on its own (no Slurm) -------------------------------------------------------------------------


@pytest.fixture()
def scratch(researcher: Researcher) -> Path:
    d = SHARED_TEST_ROOT / f"containers-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True)
    os.chown(d, researcher.uid, researcher.gid)
    return d


@pytest.mark.slurm  # the researcher's account is the cluster's: not while the exclusive lane restarts it
def test_exec_passes_the_environment_and_binds_as_a_researcher(
    researcher: Researcher, test_image: str, scratch: Path, apptainer: str
) -> None:
    box = JobContainer(
        runtime=ContainerRuntime("apptainer"),
        program=apptainer,
        image=test_image,
        image_ref=test_image,
        binds=(Bind(str(REPO), str(REPO), True), Bind(str(scratch), "/scratch")),
        gpus=True,
        pwd="/scratch",
        python="python3",
        user_env_names=("MY_FLAG",),
    )
    env = {
        "PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_NODEID": "1",
        "DET_SESSION_TOKEN": "tok", "MY_FLAG": "x,y", "PYTHONPATH": str(REPO), "HOST_ONLY": "leak",
    }  # fmt: skip
    probe = (
        "import json, os, containers; print(json.dumps({k: os.environ.get(k) for k in "
        "['CUDA_VISIBLE_DEVICES', 'SLURM_NODEID', 'DET_SESSION_TOKEN', 'MY_FLAG', 'HOST_ONLY']} | "
        "{'cwd': os.getcwd(), 'code': os.path.dirname(containers.__file__), "
        "'marker': open('/etc/hpc-det-test-image').read().strip()}))"
    )
    argv, run_env = box.command(["python3", "-c", probe], env)
    started = time.monotonic()
    proc = subprocess.run(
        ["runuser", "-u", researcher.name, "--", "env", "-i", *(f"{k}={v}" for k, v in run_env.items()), *argv],
        capture_output=True, text=True, timeout=120, cwd="/", check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"apptainer exec took {time.monotonic() - started:.1f} s")
    assert got == {
        "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_NODEID": "1", "DET_SESSION_TOKEN": "tok", "MY_FLAG": "x,y",
        "HOST_ONLY": None, "cwd": "/scratch", "code": str(REPO / "containers"),
        "marker": Path(test_image).resolve().name.replace("det-test-", "hpc-det-test-image ").removesuffix(".sif"),
    }  # fmt: skip


@pytest.mark.slurm  # the researcher's account is the cluster's: not while the exclusive lane restarts it
def test_prepull_of_an_unreachable_image_fails_naming_it_and_leaves_nothing(
    researcher: Researcher, scratch: Path, apptainer: str
) -> None:
    cache = scratch / "cache"
    proc = researcher.run(
        [sys.executable, "-m", "containers.prepull", "--runtime", "apptainer", "--cache-dir", str(cache),
         UNREACHABLE],
        check=False, timeout_s=300,
    )  # fmt: skip
    assert proc.returncode == 1
    assert f"container image '{UNREACHABLE}': the pull failed" in proc.stderr
    assert os.listdir(cache) == []


@pytest.mark.slurm
def test_a_command_runs_inside_the_image_with_its_bind_mounts(
    master: Master, alice: dict[str, str], test_image: str, data_dir: Path
) -> None:
    """`det cmd run` with `environment.image`: the command runs in the image (its marker, its python), sees
    the bind mount, and its exit code comes back."""
    env = dict(os.environ, DET_MASTER=master.url, DET_USER="alice", DET_PASS="alice-pw")
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_master.cli.main", "cmd", "run", "--config", f"environment.image={test_image}",
         "--config", "resources.slots=0", "-v", f"{data_dir}:/data",
         "head -c 19 /etc/hpc-det-test-image; echo; command -v python3; cat /data/hello.txt; exit 5"],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 5, proc.stdout + proc.stderr
    out = [
        x for x in proc.stdout.splitlines() if not x.startswith(("INFO:", "srun:"))
    ]  # the job's own output
    assert out == ["hpc-det-test-image ", "/usr/bin/python3", "hello from the host"], proc.stdout
