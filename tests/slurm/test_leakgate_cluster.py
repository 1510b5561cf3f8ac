"""The leak gate on the real cluster: a test that leaves a Slurm job of one of its masters, or a core dump, fails
naming it (the gate's process checks are tests/unit/test_leakgate.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.conftest import require
from tests.slurm.fixtures import REPO, Researcher, job_state, wait_for

pytestmark = pytest.mark.slurm


def inner_pytest(tmp_path: Path, source: str) -> tuple[int, str]:
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(source))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_DET_TEST_", "PYTEST_"))}
    env.update(PYTHONPATH=str(REPO), DET_TEST_LEAK_SETTLE_S="2")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.leakgate", "-p", "no:cacheprovider", "--rootdir",
         str(tmp_path), "-c", os.devnull, "-q", str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


def test_a_job_left_by_a_tests_master_fails_the_test_naming_it_and_is_cancelled(
    researcher: Researcher, shared_dir: Path, tmp_path: Path
) -> None:
    """The inner test stands for a test whose master submitted a job and was stopped without cancelling it:
    it reports a master id (as the tests' master starters do) and submits, as the researcher, a job whose
    comment carries that id, the way the master writes it."""
    cluster_id = str(uuid.uuid4())
    comment = f"hpc-det:{cluster_id.replace('-', '')[:12]}:exp=1,trial=1,run=1"
    job_file = shared_dir / "job_id"
    rc, out = inner_pytest(
        tmp_path,
        f"""
        import subprocess
        from tests.leakgate import note_master
        def test_leaks_a_job():
            note_master({cluster_id!r})
            job = subprocess.run(
                ["runuser", "-u", {researcher.name!r}, "--", "sbatch", "--parsable", "--comment", {comment!r},
                 "-o", "/dev/null", "--wrap", "sleep 300"],
                capture_output=True, text=True, check=True, cwd="/",
            ).stdout.strip()
            open({str(job_file)!r}, "w").write(job)
        def test_submits_nothing():
            note_master("00000000-0000-0000-0000-000000000000")
        """,
    )
    job = job_file.read_text().strip()
    assert rc == 1, out
    assert "2 passed, 1 error" in out, out
    assert f"Slurm job {job}" in out and comment in out, out
    assert "test_submits_nothing left behind" not in out
    terminal = {"CANCELLED", "COMPLETED", "UNKNOWN"}
    wait_for(lambda: job_state(job) in terminal, 30, f"the gate to cancel job {job}")


@pytest.mark.exclusive  # its core lands in the run's one core directory: a concurrent cluster test would see it
def test_a_core_dump_during_a_cluster_test_fails_it(tmp_path: Path) -> None:
    """A process that crashes (SIGSEGV, with cores allowed) while a test that touches the cluster runs leaves a
    core in the run's core directory (scripts/test.sh sets the kernel's pattern there): the test fails.

    Exclusive: the kernel's core pattern is one for the machine, so the cluster lane's other tests, running at the
    same time, would each find this core and fail (CI, stop 45: a notebook test failed for this test's bash)."""
    core_dir = os.environ.get("DET_TEST_CORE_DIR")
    require(bool(core_dir), "DET_TEST_CORE_DIR (scripts/test.sh sets the core pattern and RLIMIT_CORE)")
    pid_file = tmp_path / "pid"
    rc, out = inner_pytest(
        tmp_path,
        f"""
        import subprocess
        import pytest
        pytestmark = pytest.mark.slurm
        def test_crashes():
            subprocess.run(["bash", "-c", "echo $$ > {pid_file}; ulimit -c unlimited; kill -SEGV $$"])
        """,
    )
    core = Path(f"{core_dir}/core.bash.{pid_file.read_text().strip()}")
    try:
        assert rc == 1, out
        assert "test_crashes left behind" in out and f"core file {core}" in out, out
    finally:
        core.unlink(missing_ok=True)  # or this test would fail for it too
