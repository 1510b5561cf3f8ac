"""The leak gate (tests/leakgate.py) catches what a test leaves behind, and test processes die with pytest.

Each test runs an inner pytest with the gate on a small test file and reads its outcome; no cluster needed (the
cluster half, a leaked Slurm job and a core dump, is tests/slurm/test_leakgate_cluster.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def inner_pytest(tmp_path: Path, source: str, *args: str) -> subprocess.Popen[str]:
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(source))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_DET_TEST_", "PYTEST_"))}
    env.update(PYTHONPATH=str(REPO), DET_TEST_LEAK_SETTLE_S="0.3")
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "tests.leakgate", "-p", "no:cacheprovider", "--rootdir",
         str(tmp_path), "-c", os.devnull, "-q", *args, str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def outcome(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pid: int, timeout_s: float = 15) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_a_process_left_running_fails_the_test_naming_it_and_is_killed(tmp_path: Path) -> None:
    rc, out = outcome(
        inner_pytest(
            tmp_path,
            f"""
            import subprocess
            def test_leaks():
                p = subprocess.Popen(["sleep", "300"])
                open({str(tmp_path / "pid")!r}, "w").write(str(p.pid))
            def test_clean():
                subprocess.run(["true"], check=True)
            """,
        )
    )
    assert rc == 1, out
    assert "2 passed, 1 error" in out, out  # an error at teardown: the test's own outcome stays "passed"
    assert "test_leaks left behind" in out and "sleep 300" in out, out
    assert "test_clean left behind" not in out
    assert wait_gone(int((tmp_path / "pid").read_text())), "the gate kills what it found"


def test_a_process_left_by_a_module_fixture_is_reported_when_the_module_ends(tmp_path: Path) -> None:
    rc, out = outcome(
        inner_pytest(
            tmp_path,
            """
            import subprocess
            import pytest
            @pytest.fixture(scope="module")
            def server():
                p = subprocess.Popen(["sleep", "301"])
                yield p  # never stopped
            def test_one(server):
                pass
            def test_two(server):
                pass
            """,
        )
    )
    assert rc == 1, out
    assert "sleep 301" in out and "(from fixture server)" in out, out
    assert "test_two left behind" in out, "reported by the module's last test, when the fixture ends"


def test_a_process_a_module_fixture_stops_is_not_a_leak(tmp_path: Path) -> None:
    rc, out = outcome(
        inner_pytest(
            tmp_path,
            """
            import subprocess
            import pytest
            @pytest.fixture(scope="module")
            def server():
                p = subprocess.Popen(["sleep", "302"])
                yield p
                p.kill(); p.wait()
            def test_one(server):
                assert server.poll() is None
            def test_two(server):
                assert server.poll() is None
            """,
        )
    )
    assert rc == 0 and "2 passed" in out, out


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["serial", "xdist"])
def test_a_master_dies_with_a_sigkilled_pytest(tmp_path: Path, workers: list[str]) -> None:
    """A master started by the tests' own starter (tests/cli/conftest.py) outlives neither pytest nor an
    xdist worker killed with it: SIGKILL leaves no time for teardown, so only PR_SET_PDEATHSIG stops it."""
    pid_file = tmp_path / "master.pid"
    proc = inner_pytest(
        tmp_path,
        f"""
        import time
        from pathlib import Path
        from tests.cli.conftest import running_master
        def test_runs_forever(tmp_path):
            with running_master(tmp_path / "m", ["tests.cli._api_master", "{{port}}"]) as m:
                Path({str(pid_file)!r}).write_text(str(m.proc.pid))
                time.sleep(600)
        """,
        *workers,
    )
    deadline = time.monotonic() + 120
    while not pid_file.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert pid_file.exists(), outcome(proc)[1]
    master = int(pid_file.read_text())
    assert alive(master)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert wait_gone(master), f"master {master} still running after pytest was killed"
