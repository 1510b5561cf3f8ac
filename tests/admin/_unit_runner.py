"""A stand-in for ``systemctl`` and ``journalctl`` where PID 1 is not systemd (containers, CI), for the admin
guide's test. It runs a unit's service the way systemd does, as far as the master can tell:

- ``ExecStart`` with only the unit's ``Environment=`` and ``EnvironmentFile=`` (and systemd's ``PATH``), no
  terminal, its own session, ``%S`` (the state directory root) resolved, ``StateDirectory=`` created;
- ``Type=notify``: ``start`` returns once ``READY=1`` arrives on ``$NOTIFY_SOCKET`` (fails if it exits first);
- stdout and stderr go to the "journal", a file named by ``$JOURNAL_STREAM``; ``journalctl -p`` reads the
  ``<N>`` priority prefixes as journald does;
- ``stop`` sends SIGTERM to the main process (``KillMode=mixed``), then SIGKILL to what is left after
  ``TimeoutStopSec``; ``restart`` is stop then start.

Not emulated: ``User=``, the sandbox options (they need systemd itself) and ``Restart=`` (nothing watches the
service between commands; ``tests/admin/test_det_master_service.py`` plays that sequence on the process).

    python -m tests.admin._unit_runner systemctl enable --now det-master
    python -m tests.admin._unit_runner journalctl -u det-master -p warning

Its directories come from ``UNIT_RUNNER_UNITS`` (unit files) and ``UNIT_RUNNER_ROOT`` (``%S`` is its
``var/lib``; the journal and the main pid live in its ``run``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PRIORITIES = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warning": 4, "notice": 5, "info": 6, "debug": 7}


@dataclass
class Unit:
    name: str
    description: str = ""
    exec_start: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    environment_files: list[str] = field(default_factory=list)
    state_directories: list[str] = field(default_factory=list)
    timeout_start_s: float = 90.0
    timeout_stop_s: float = 90.0
    type: str = "simple"


def _seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+)\s*(min|s)?", value.strip())
    if not m:
        return 90.0
    return float(m.group(1)) * (60 if m.group(2) == "min" else 1)


def load_unit(units: Path, name: str, state_root: Path) -> Unit:
    name = name if name.endswith(".service") else f"{name}.service"
    path = units / name
    if not path.is_file():
        raise SystemExit(f"Unit {name} not found.")
    unit = Unit(name)
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        value = value.replace("%S", str(state_root)).replace("%%", "%")
        if section == "Unit" and key == "Description":
            unit.description = value
        elif section != "Service":
            continue
        elif key == "ExecStart":
            unit.exec_start = shlex.split(value)
        elif key == "Environment":
            unit.environment.update(w.split("=", 1) for w in shlex.split(value) if "=" in w)  # type: ignore[misc]
        elif key == "EnvironmentFile":
            unit.environment_files.append(value)
        elif key == "StateDirectory":
            unit.state_directories += value.split()
        elif key == "TimeoutStartSec":
            unit.timeout_start_s = _seconds(value)
        elif key == "TimeoutStopSec":
            unit.timeout_stop_s = _seconds(value)
        elif key == "Type":
            unit.type = value
    return unit


def read_environment_file(path: str) -> dict[str, str]:
    optional = path.startswith("-")
    try:
        text = Path(path.lstrip("-")).read_text()
    except OSError:
        if optional:
            return {}
        raise
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";")) and "=" in line:
            key, value = line.split("=", 1)
            env[key.strip()] = " ".join(shlex.split(value)) if value[:1] in "'\"" else value
    return env


class Runner:
    def __init__(self) -> None:
        self.units = Path(os.environ["UNIT_RUNNER_UNITS"])
        root = Path(os.environ["UNIT_RUNNER_ROOT"])
        self.state_root = root / "var" / "lib"
        self.run_dir = root / "run"
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def _pid_file(self, unit: Unit) -> Path:
        return self.run_dir / f"{unit.name}.pid"

    def journal(self, unit: Unit) -> Path:
        return self.run_dir / f"{unit.name}.journal"

    def main_pid(self, unit: Unit) -> int | None:
        try:
            pid = int(self._pid_file(unit).read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid

    def start(self, unit: Unit) -> int:
        if self.main_pid(unit) is not None:
            return 0
        env = {"PATH": SYSTEMD_PATH, "LANG": "C.UTF-8", **unit.environment}
        # The test's tag (tests/leakgate.py), so that a service left running fails the test that started it.
        env.update({k: v for k, v in os.environ.items() if k == "HPC_DET_TEST_TAG"})
        for path in unit.environment_files:
            env.update(read_environment_file(path))
        for directory in unit.state_directories:
            (self.state_root / directory).mkdir(parents=True, exist_ok=True, mode=0o700)
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        address = f"hpc-det-unit-runner-{os.getpid()}-{os.urandom(4).hex()}"
        notify.bind("\0" + address)
        env["NOTIFY_SOCKET"] = "@" + address
        with self.journal(unit).open("ab") as journal:
            st = os.fstat(journal.fileno())
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
            proc = subprocess.Popen(
                unit.exec_start, env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=journal, stderr=journal,
                start_new_session=True,
            )  # fmt: skip
        self._pid_file(unit).write_text(str(proc.pid))
        if unit.type != "notify":
            return 0
        deadline = time.monotonic() + unit.timeout_start_s
        while time.monotonic() < deadline and proc.poll() is None:
            notify.settimeout(0.2)
            try:
                fields = notify.recv(4096).decode().split("\n")
            except TimeoutError:
                continue
            self._record_status(unit, fields)
            if "READY=1" in fields:
                self._keep_listening(unit, notify, proc.pid)
                return 0
        if proc.poll() is None:
            proc.kill()
        print(
            f"Job for {unit.name} failed (status {proc.wait()}): see journalctl -u {unit.name}",
            file=sys.stderr,
        )
        self._pid_file(unit).unlink(missing_ok=True)
        return 1

    def _status_file(self, unit: Unit) -> Path:
        return self.run_dir / f"{unit.name}.status"

    def _record_status(self, unit: Unit, fields: list[str]) -> None:
        for f in fields:
            if f.startswith("STATUS="):
                self._status_file(unit).write_text(f.removeprefix("STATUS="))

    def _keep_listening(self, unit: Unit, notify: socket.socket, pid: int) -> None:
        """systemd keeps reading the service's notifications (STOPPING=1, STATUS=…) as long as it runs; this
        command exits, so a small process takes the socket over until the service ends."""
        code = (
            "import os, socket, sys\n"
            "sock = socket.socket(fileno=int(sys.argv[1])); sock.settimeout(1)\n"
            "while True:\n"
            "    try: os.kill(int(sys.argv[2]), 0)\n"
            "    except ProcessLookupError: break\n"
            "    try: fields = sock.recv(4096).decode().split('\\n')\n"
            "    except TimeoutError: continue\n"
            "    for f in fields:\n"
            "        if f.startswith('STATUS='): open(sys.argv[3], 'w').write(f[7:])\n"
        )
        subprocess.Popen(
            [sys.executable, "-c", code, str(notify.fileno()), str(pid), str(self._status_file(unit))],
            pass_fds=[notify.fileno()], start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def stop(self, unit: Unit) -> int:
        pid = self.main_pid(unit)
        if pid is None:
            return 0
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + unit.timeout_stop_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.killpg(pid, signal.SIGKILL)
            print(f"{unit.name}: State 'stop-sigterm' timed out. Killing.", file=sys.stderr)
            return 1
        with contextlib.suppress(ProcessLookupError):  # KillMode=mixed: what the main process left behind
            os.killpg(pid, signal.SIGKILL)
        self._pid_file(unit).unlink(missing_ok=True)
        return 0

    def status(self, unit: Unit) -> int:
        pid = self.main_pid(unit)
        print(f"● {unit.name} - {unit.description}")
        if pid is None:
            print("     Active: inactive (dead)")
            return 3
        status = self._status_file(unit)
        print(f"     Active: active (running)\n   Main PID: {pid}")
        if status.exists():
            print(f'     Status: "{status.read_text()}"')
        return 0


def systemctl(args: list[str]) -> int:
    runner = Runner()
    args = [a for a in args if a not in ("--no-pager", "--quiet", "-q")]
    if not args:
        raise SystemExit("systemctl: no command")
    command, names = args[0], [a for a in args[1:] if not a.startswith("-")]
    if command == "daemon-reload":
        return 0
    rc = 0
    for name in names:
        unit = load_unit(runner.units, name, runner.state_root)
        if command == "enable":
            rc |= runner.start(unit) if "--now" in args else 0
        elif command == "start":
            rc |= runner.start(unit)
        elif command == "stop":
            rc |= runner.stop(unit)
        elif command == "restart":
            rc |= runner.stop(unit) or runner.start(unit)
        elif command == "status":
            rc |= runner.status(unit)
        elif command == "is-active":
            active = runner.main_pid(unit) is not None
            print("active" if active else "inactive")
            rc |= 0 if active else 3
        else:
            raise SystemExit(f"systemctl stand-in: {command!r} is not emulated")
    return rc


def journalctl(args: list[str]) -> int:
    runner = Runner()
    unit_name, max_priority, lines = None, 7, None
    it = iter(args)
    for arg in it:
        if arg in ("-u", "--unit"):
            unit_name = next(it)
        elif arg in ("-p", "--priority"):
            value = next(it)
            max_priority = int(value) if value.isdigit() else PRIORITIES[value]
        elif arg in ("-n", "--lines"):
            lines = int(next(it))
        elif arg in ("--since", "--until", "-S", "-U"):
            next(it)  # the stand-in keeps one run of entries: all of them are recent
    if unit_name is None:
        raise SystemExit("journalctl stand-in: give -u UNIT")
    unit = load_unit(runner.units, unit_name, runner.state_root)
    journal = runner.journal(unit)
    out = []
    for line in journal.read_text(errors="replace").splitlines() if journal.exists() else []:
        m = re.match(r"<([0-7])>(.*)", line)
        priority, text = (int(m.group(1)), m.group(2)) if m else (6, line)
        if priority <= max_priority:
            out.append(f"{unit.name.removesuffix('.service')}: {text}")
    for line in out[-lines:] if lines else out:
        print(line)
    return 0


def main(argv: list[str]) -> int:
    command, *args = argv
    return {"systemctl": systemctl, "journalctl": journalctl}[command](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
