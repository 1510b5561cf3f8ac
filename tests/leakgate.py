"""The leak gate: a test that leaves a Slurm job, a process or a core dump behind fails, naming what it left.

As Slurm's own test suite fails any test that leaves a core dump, after each test (and after each module- or
session-scoped fixture is torn down) this plugin checks that

- no process started during it is still alive (every process the tests start inherits ``HPC_DET_TEST_TAG``, set
  here per test and per fixture scope; only processes that did not exist before are read, so the check costs a
  directory listing);
- no Slurm job is left whose comment carries the id of a master started during it (masters report their id with
  `note_master`; concurrent tests use distinct masters, so their jobs never match another test's ids);
- for tests that touch the cluster: no new core file appeared in ``DET_TEST_CORE_DIR`` (set by scripts/test.sh
  with the core pattern and ``RLIMIT_CORE``), and no "core dumped" or "Segmentation fault" appeared in the
  slurmctld/slurmd logs.

What it finds it removes (SIGKILL, scancel), so the next test starts clean, and the test errors at teardown. At
the end the ten slowest real-cluster tests are printed. Test processes die with pytest, SIGKILL included:
`die_with_parent` is the ``preexec_fn`` of every long-lived process the tests start, and xdist workers set the
same on themselves.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TAG_VAR = "HPC_DET_TEST_TAG"
SESSION_VAR = "HPC_DET_TEST_SESSION"
_PR_SET_PDEATHSIG = 1
_CRASH = re.compile(r"core dumped|Segmentation fault", re.IGNORECASE)
_CLUSTER_MARKERS = ("slurm",)
# The local cluster's and PostgreSQL's daemons: a test that takes the cluster down brings them back up, and they
# are meant to outlive it.
DAEMONS = frozenset(
    {"slurmctld", "slurmd", "slurmdbd", "slurmstepd", "munged", "mariadbd", "mysqld", "postgres"}
)
# How long a cancelled job or a stopping process may take to go (tests of the gate itself shorten it).
_SETTLE_S = float(os.environ.get("DET_TEST_LEAK_SETTLE_S", "20"))


def die_with_parent() -> None:
    """``preexec_fn``: the child gets SIGKILL when the process (thread) that started it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class _Scope:
    """A test or a fixture: the processes that existed before it and the masters started in it."""

    tag: str
    name: str
    before: set[int]
    masters: set[str] = field(default_factory=set)


_scopes: dict[str, _Scope] = {}
_pending: list[str] = []  # leaks found while fixtures were torn down, reported by the test's teardown
_cluster_durations: list[tuple[float, str]] = []


def note_master(cluster_id: str) -> None:
    """Called by the tests' master starters with the master's ``clusterId`` (``GET /api/v1/master``)."""
    scope = _scopes.get(os.environ.get(TAG_VAR, ""))
    if scope is not None:
        scope.masters.add(cluster_id.replace("-", "")[:12])


def _pids() -> set[int]:
    return {int(p) for p in os.listdir("/proc") if p.isdigit()}


def _tagged(pids: Iterable[int], tag: str) -> dict[int, str]:
    """{pid: command line} of the processes in `pids` whose environment carries `tag`."""
    needle = f"{TAG_VAR}={tag}".encode()
    found: dict[int, str] = {}
    for pid in pids:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            if needle not in env.split(b"\0"):
                continue
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue  # a zombie: its parent (this process) has not reaped it yet; nothing runs
            if _daemon(stat[stat.index("(") + 1 : stat.rindex(")")], cmd):
                continue
        except OSError:
            continue
        found[pid] = cmd.strip()[:200]
    return found


def _daemon(comm: str, cmdline: str) -> bool:
    """One of DAEMONS, or ``runuser -u USER -- DAEMON …`` (how the local cluster starts MariaDB)."""
    if comm in DAEMONS:
        return True
    words = cmdline.split()
    if comm == "runuser" and "--" in words[:-1]:
        return Path(words[words.index("--") + 1]).name in DAEMONS
    return False


def _in_slurm_job(pid: int) -> bool:
    """Processes of a Slurm job inherit the submitter's environment; the job check covers them."""
    for _ in range(64):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name.startswith("slurmstepd"):
            return True
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        if pid <= 1:
            return False
    return False


def _leftover_processes(scope: _Scope) -> list[str]:
    deadline = time.monotonic() + _SETTLE_S
    while True:
        found = {
            pid: cmd
            for pid, cmd in _tagged(_pids() - scope.before, scope.tag).items()
            if not _in_slurm_job(pid)
        }
        found.pop(os.getpid(), None)
        if not found or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return [f"process {pid} still running: {cmd}" for pid, cmd in sorted(found.items())]


def _squeue() -> dict[str, tuple[str, str]] | None:
    """{job id: (state, comment)} of every job Slurm knows, None when it does not answer."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-a", "-o", "%i|%T|%k"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    jobs: dict[str, tuple[str, str]] = {}
    for line in out.stdout.splitlines():
        job_id, state, comment = [*line.split("|", 2), "", ""][:3]
        jobs[job_id.strip()] = (state, comment)
    return jobs


def _leftover_jobs(scope: _Scope) -> list[str]:
    if not scope.masters:
        return []
    prefixes = tuple(f"hpc-det:{m}:" for m in scope.masters)
    deadline = time.monotonic() + _SETTLE_S
    mine: dict[str, tuple[str, str]] = {}
    while True:
        jobs = _squeue()
        if jobs is None:
            return []
        mine = {j: sc for j, sc in jobs.items() if sc[1].startswith(prefixes)}
        if not mine or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if mine:
        subprocess.run(["scancel", *mine], capture_output=True, check=False, timeout=30)
    return [
        f"Slurm job {j} ({state}, comment {comment}) of a master started here"
        for j, (state, comment) in sorted(mine.items())
    ]


class _Crashes:
    """New core files and new crash lines in the Slurm daemons' logs since `start`."""

    def __init__(self) -> None:
        self.core_dir = Path(os.environ["DET_TEST_CORE_DIR"]) if os.environ.get("DET_TEST_CORE_DIR") else None
        self.logs: list[Path] = []
        with contextlib.suppress(Exception):
            from local_cluster.spec import get_state_dir

            self.logs = sorted((get_state_dir() / "log").glob("slurm*.log"))
        self.cores: set[str] = set()
        self.offsets: dict[Path, int] = {}

    def start(self) -> None:
        self.cores = self._core_files()
        self.offsets = {p: self._size(p) for p in self.logs}

    def found(self) -> list[str]:
        found = [f"core file {self.core_dir}/{name}" for name in sorted(self._core_files() - self.cores)]
        for path, offset in self.offsets.items():
            size = self._size(path)
            if size <= offset:
                continue
            with path.open("rb") as f:
                f.seek(offset)
                text = f.read(size - offset).decode(errors="replace")
            found += [f"{path.name}: {line.strip()}" for line in text.splitlines() if _CRASH.search(line)]
        return found

    def _core_files(self) -> set[str]:
        if self.core_dir is None or not self.core_dir.is_dir():
            return set()
        return {p.name for p in self.core_dir.iterdir()}

    @staticmethod
    def _size(path: Path) -> int:
        try:
            return path.stat().st_size
        except OSError:
            return 0


_crashes: _Crashes | None = None


def _touches_cluster(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) for m in _CLUSTER_MARKERS) or "cluster" in getattr(
        item, "fixturenames", ()
    )


def _tag_for(name: str) -> str:
    """The tag of a test or fixture in this process: xdist workers run the same module fixtures at once, and
    each must see only its own processes."""
    key = f"{os.environ.get(SESSION_VAR, '')}:{os.getpid()}:{name}"
    return hashlib.sha1(key.encode()).hexdigest()[:16]


@contextlib.contextmanager
def _scoped(name: str) -> Generator[_Scope, None, None]:
    """Run the block with its own tag in the environment (children inherit it); the previous tag after."""
    scope = _Scope(tag=_tag_for(name), name=name, before=_pids())
    _scopes[scope.tag] = scope
    previous = os.environ.get(TAG_VAR)
    os.environ[TAG_VAR] = scope.tag
    try:
        yield scope
    finally:
        if previous is None:
            os.environ.pop(TAG_VAR, None)
        else:
            os.environ[TAG_VAR] = previous


def _check(scope: _Scope) -> list[str]:
    _scopes.pop(scope.tag, None)
    return _leftover_processes(scope) + _leftover_jobs(scope)


# ---- hooks --------------------------------------------------------------------------------------------------
def pytest_configure(config: pytest.Config) -> None:
    global _crashes
    os.environ.setdefault(SESSION_VAR, uuid.uuid4().hex[:12])
    if os.environ.get("PYTEST_XDIST_WORKER"):
        die_with_parent()  # a worker dies with the controller (and its children with it)
    _crashes = _Crashes()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> Generator[None, object, object]:
    if fixturedef.scope == "function":
        return (yield)
    key = f"{fixturedef.scope}:{fixturedef.baseid}:{fixturedef.argname}"
    with _scoped(key):
        return (yield)


def pytest_fixture_post_finalizer(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> None:
    if fixturedef.scope == "function":
        return
    scope = _scopes.get(_tag_for(f"{fixturedef.scope}:{fixturedef.baseid}:{fixturedef.argname}"))
    if scope is not None:
        _pending.extend(f"{line} (from fixture {fixturedef.argname})" for line in _check(scope))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    started = time.monotonic()
    try:
        return (yield)
    finally:
        if _touches_cluster(item):
            _cluster_durations.append((time.monotonic() - started, item.nodeid))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    scope = _Scope(tag=_tag_for(item.nodeid), name=item.nodeid, before=_pids())
    _scopes[scope.tag] = scope
    os.environ[TAG_VAR] = scope.tag
    if _crashes is not None and _touches_cluster(item):
        _crashes.start()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    try:
        yield
    finally:
        found: list[str] = []
        scope = _scopes.get(_tag_for(item.nodeid))
        if scope is not None:
            found += _check(scope)
        found += _pending
        _pending.clear()
        if _crashes is not None and _touches_cluster(item):
            found += _crashes.found()
        os.environ.pop(TAG_VAR, None)
    if found:
        pytest.fail(f"{item.nodeid} left behind:\n  " + "\n  ".join(found), pytrace=False)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    durations = [(s, n) for s, n in _collect_durations(terminalreporter) if s > 0]
    if not durations:
        return
    terminalreporter.write_sep("=", "slowest real-cluster tests (leak gate)")
    for seconds, nodeid in sorted(durations, reverse=True)[:10]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {nodeid}")


def _collect_durations(terminalreporter: pytest.TerminalReporter) -> list[tuple[float, str]]:
    """This process's cluster tests, or (under xdist, in the controller) every worker's from the reports."""
    if _cluster_durations:
        return list(_cluster_durations)
    totals: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            nodeid = getattr(report, "nodeid", None)
            keywords = getattr(report, "keywords", {}) or {}
            if getattr(report, "when", None) not in ("setup", "call", "teardown"):
                continue  # a collection report: nothing ran
            if nodeid and any(m in keywords for m in _CLUSTER_MARKERS):
                totals[nodeid] = totals.get(nodeid, 0.0) + float(getattr(report, "duration", 0.0) or 0.0)
    return [(s, n) for n, s in totals.items()]
