"""job_entry end to end, as a local subprocess with a fake Slurm environment (no cluster needed)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from harness.exec import job_plan as run_files
from hpc_master.expconf import parse_experiment_config
from hpc_master.trialjob import JobPaths, PoolSpec, TrialJobInputs, TrialJobPlan, build_trial_job
from hpc_master.trialjob_files import write_run_dir

REPO = Path(__file__).resolve().parents[2]
TOKEN = "tok-e2e"

REPORT = r"""
import json, os, pathlib, signal, sys, time
import determined as det

info = det.get_cluster_info()
print("REPORT " + json.dumps({
    "container_addrs": info.container_addrs,
    "container_rank": info.container_rank,
    "hparams": info.trial.hparams,
    "trial_id": info.trial.trial_id,
    "allocation_id": info.allocation_id,
    "token": info.session_token,
    "latest": info.latest_checkpoint,
    "cwd": os.getcwd(),
    "python": sys.executable,
}), flush=True)
mode = os.environ["MODE"]
if mode == "fail":
    sys.exit(3)
if mode in ("preempt", "die"):
    got = []
    if mode == "preempt":
        signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    pathlib.Path("ready").write_text("1")
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    print("checkpointed; exiting", flush=True)
"""


def _context(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return path


def _plan(tmp_path: Path, mode: str, files: dict[str, str] | None = None) -> TrialJobPlan:
    cfg = parse_experiment_config(
        {
            "entrypoint": "python3 report.py",
            "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 1}},
            "hyperparameters": {"lr": 0.25},
            "environment": {"environment_variables": [f"MODE={mode}"]},
            "resources": {"slots_per_trial": 1},
        }
    )
    archive = _context(tmp_path / "context.tar.gz", {"report.py": REPORT, **(files or {})})
    paths = JobPaths(str(tmp_path / "jobs"), str(tmp_path / "ck"), str(REPO), sys.executable)
    trial = TrialJobInputs(
        experiment_id=3,
        trial_id=7,
        trial_run_id=1,
        hparams={"lr": 0.25},
        trial_seed=1,
        owner="me",
        latest_checkpoint="ck-uuid",
        context_archive=str(archive),
    )
    plan = build_trial_job(
        cfg, PoolSpec(slots_per_node=1), trial, paths, master_url="http://127.0.0.1:9", session_token=TOKEN
    )
    write_run_dir(plan, paths.job_storage_root)
    return plan


def _start(plan: TrialJobPlan, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DET_", "SLURM_"))}
    env.update(dict(plan.env))
    env.update(
        {
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "localhost",
            "DET_RESOLVE_OVERRIDE": "localhost=10.1.2.3",
            "SLURM_NODEID": "0",
        }
    )
    with open(log, "wb") as out:
        cmd = list(plan.command)
        cmd[0] = sys.executable
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=plan.trial_dir)


def _finish(proc: subprocess.Popen[bytes], plan: TrialJobPlan, log: Path) -> tuple[int, dict[str, Any], str]:
    code = proc.wait(timeout=60)
    record = json.loads((Path(plan.run_dir) / run_files.EXIT_FILE).read_text())
    return code, record, log.read_text()


def _report(output: str) -> dict[str, Any]:
    line = next(x for x in output.splitlines() if x.startswith("REPORT "))
    return dict(json.loads(line[len("REPORT ") :]))


def test_success_cluster_info_and_exit_record(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "ok")
    log = tmp_path / "out.log"
    code, record, output = _finish(_start(plan, log), plan, log)
    assert code == 0, output
    report = _report(output)
    assert report["container_addrs"] == ["10.1.2.3"]
    assert report["hparams"] == {"lr": 0.25}
    assert report["trial_id"] == 7 and report["allocation_id"] == "7.1"
    assert report["token"] == TOKEN
    assert report["latest"] == "ck-uuid"
    assert report["cwd"] == plan.workdir
    assert os.path.dirname(report["python"]) == os.path.dirname(sys.executable)
    assert record["exitCode"] == 0 and record["preempted"] is False and record["reason"] == "completed"
    assert record["signal"] is None and record["slurmJobId"] == "4242" and record["finishedAt"].endswith("Z")
    info = json.loads((Path(plan.run_dir) / run_files.CLUSTER_INFO_FILE).read_text())
    assert info["container_addrs"] == ["10.1.2.3"] and info["session_token"] == ""
    assert oct(os.stat(Path(plan.run_dir) / run_files.CLUSTER_INFO_FILE).st_mode & 0o777) == oct(0o600)


def test_failure_exit_code_is_the_entrypoints(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "fail")
    log = tmp_path / "out.log"
    code, record, output = _finish(_start(plan, log), plan, log)
    assert code == 3, output
    assert record["exitCode"] == 3 and record["preempted"] is False
    assert record["reason"] == "the entrypoint exited with code 3"
    assert record["stage"] == "entrypoint"


def _wait_ready(plan: TrialJobPlan) -> None:
    ready = Path(plan.workdir) / "ready"
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline, "the entrypoint never got ready"
        time.sleep(0.05)


def test_sigterm_with_clean_exit_is_a_preemption(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "preempt")
    log = tmp_path / "out.log"
    proc = _start(plan, log)
    _wait_ready(plan)
    proc.send_signal(signal.SIGTERM)
    code, record, output = _finish(proc, plan, log)
    assert code == 0, output
    assert "checkpointed; exiting" in output
    assert record["preempted"] is True and record["signal"] == "SIGTERM" and record["exitCode"] == 0


def test_sigterm_that_kills_the_entrypoint_is_a_failure(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "die")
    log = tmp_path / "out.log"
    proc = _start(plan, log)
    _wait_ready(plan)
    proc.send_signal(signal.SIGTERM)
    code, record, _ = _finish(proc, plan, log)
    assert code == 128 + signal.SIGTERM
    assert record["preempted"] is False and record["signal"] == "SIGTERM"
    assert record["reason"] == "the entrypoint was killed by SIGTERM (exit code 143)"


def test_failing_startup_hook_stops_the_job(tmp_path: Path) -> None:
    hook = "echo 'installing deps: no such package'\nexit 7\n"
    plan = _plan(tmp_path, "ok", {"startup-hook.sh": hook})
    log = tmp_path / "out.log"
    code, record, output = _finish(_start(plan, log), plan, log)
    assert code == 1
    assert "installing deps: no such package" in output
    assert "REPORT " not in output
    assert record["stage"] == "startup_hook"
    assert record["reason"].startswith("startup-hook.sh failed with exit code 7")


def test_context_is_unpacked_once_per_trial(tmp_path: Path) -> None:
    hook = "echo hook ran >> hook.log\n"
    plan = _plan(tmp_path, "ok", {"startup-hook.sh": hook})
    log = tmp_path / "out.log"
    assert _finish(_start(plan, log), plan, log)[0] == 0
    (Path(plan.workdir) / "user-output.txt").write_text("kept")
    code, _, output = _finish(_start(plan, log), plan, log)
    assert code == 0, output
    assert "context already unpacked" in output
    assert (Path(plan.workdir) / "user-output.txt").read_text() == "kept"
    assert (Path(plan.workdir) / "hook.log").read_text() == "hook ran\nhook ran\n"


def test_unsafe_context_fails_with_a_clear_reason(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "ok")
    with tarfile.open(plan.plan.context_archive, "w:gz") as tar:
        info = tarfile.TarInfo("../../escape.py")
        tar.addfile(info, io.BytesIO(b""))
    log = tmp_path / "out.log"
    code, record, _ = _finish(_start(plan, log), plan, log)
    assert code == 1
    assert record["stage"] == "context"
    assert "the context archive was refused: entry '../../escape.py' has a '..' component" in record["reason"]
    assert not Path(plan.workdir).exists()


@pytest.mark.parametrize("missing", [run_files.PLAN_FILE, run_files.CLUSTER_INFO_TEMPLATE_FILE])
def test_missing_run_files_fail_clearly(tmp_path: Path, missing: str) -> None:
    plan = _plan(tmp_path, "ok")
    (Path(plan.run_dir) / missing).unlink()
    log = tmp_path / "out.log"
    code, record, _ = _finish(_start(plan, log), plan, log)
    assert code == 1 and missing in record["reason"]


def test_job_entry_starts_without_container_archive_or_argparse_modules() -> None:
    """Every job starts this module: what it imports is paid per job (a plan without an image and a context
    unpacked before needs none of these)."""
    probe = (
        "import sys, harness.exec.job_entry; "
        "print(sorted(m for m in ('argparse', 'tarfile', 'zipfile', 'containers.job', 'containers.images') "
        "if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-S", "-c", probe], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_job_entry_arguments() -> None:
    from harness.exec.job_entry import parse_run_dir

    assert parse_run_dir(["--run-dir", "/x/run-1"]) == "/x/run-1"
    assert parse_run_dir(["--run-dir=/x/run-2"]) == "/x/run-2"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for bad in ([], ["--run-dir"], ["--run-dir", "a", "b"], ["--nope", "x"]):
        proc = subprocess.run(
            [sys.executable, "-S", "-m", "harness.exec.job_entry", *bad],
            env=env,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 2, (bad, proc.stderr)
        assert "usage: python -m harness.exec.job_entry" in proc.stderr
