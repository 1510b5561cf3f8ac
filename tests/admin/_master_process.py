"""A real ``det-master`` process, started the way systemd starts ``det-master.service``: with a notification
socket (``$NOTIFY_SOCKET``, ``Type=notify``), and stopped with SIGTERM (``systemctl stop``)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.leakgate import die_with_parent

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def master_env(root: Path, **extra: str) -> dict[str, str]:
    """The environment of a master whose files all live under `root` (no DET_* or XDG_* of the caller's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DET_", "XDG_", "NOTIFY_", "JOURNAL_"))}
    env.update(
        HOME=str(root / "home"),
        DET_MASTER_DATA_DIR=str(root / "data"),
        DET_MASTER_STATE_DIR=str(root / "state"),
        DET_CHECKPOINT_ROOT=str(root / "checkpoints"),
        DET_JOB_STORAGE_ROOT=str(root / "jobs"),
        PYTHONPATH=str(REPO),
    )
    env.update(extra)
    return env


@dataclass
class MasterProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    notify: socket.socket
    messages: list[str] = field(default_factory=list)

    def receive(self, until: str, timeout_s: float) -> list[str]:
        """Notification fields received until one equal to `until` (``READY=1``), in order."""
        deadline = time.monotonic() + timeout_s
        while until not in self.messages:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"no {until} within {timeout_s:.0f} s; got {self.messages}\n{self.log()}"
                )
            self.notify.settimeout(min(left, 0.5))
            try:
                self.messages += self.notify.recv(4096).decode().split("\n")
            except TimeoutError:
                if self.proc.poll() is not None and until not in self.messages:
                    raise AssertionError(
                        f"det-master exited ({self.proc.returncode}) before {until}\n{self.log()}"
                    ) from None
        return self.messages

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 90.0) -> int:
        """Send `sig` and wait for the exit; the exit status (negative: killed by a signal)."""
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        finally:
            self.close()

    def close(self) -> None:
        """Kill the process if it still runs; keep the notifications it sent. Idempotent."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.notify.fileno() >= 0:
            self.drain()
            address = self.notify.getsockname()
            self.notify.close()
            if isinstance(address, str) and address.startswith(tempfile.gettempdir()):
                Path(address).unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    Path(address).parent.rmdir()

    def drain(self) -> None:
        self.notify.setblocking(False)
        try:
            while True:
                self.messages += self.notify.recv(4096).decode().split("\n")
        except (BlockingIOError, OSError):
            pass

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""


def start_master(
    root: Path,
    *args: str,
    env: dict[str, str] | None = None,
    module: str = "hpc_master.server",
    port: int | None = None,
    abstract_socket: bool = False,
    wait_ready: bool = True,
    journal: bool = False,
    prefix: tuple[str, ...] = (),
) -> MasterProcess:
    """``[PREFIX] python -m MODULE --port PORT ARGS`` with a notification socket; waits for ``READY=1``.
    `journal`: its output file stands for the journal (``$JOURNAL_STREAM`` names it, as systemd does)."""
    root.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract_socket:
        name = f"hpc-det-test-{uuid.uuid4().hex}"
        notify.bind("\0" + name)
        address = "@" + name
    else:
        # A socket path has at most 107 bytes: under a test's tmp_path (xdist adds to it) it may not fit.
        address = str(Path(tempfile.mkdtemp(prefix="hpcdet-notify-")) / "notify.sock")
        notify.bind(address)
    full_env = {**(env or master_env(root)), "NOTIFY_SOCKET": address}
    log_path = root / f"master-{port}.log"
    with log_path.open("ab") as log:
        if journal:
            st = os.fstat(log.fileno())
            full_env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", module, "--port", str(port), *args],
            env=full_env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )  # fmt: skip
    master = MasterProcess(proc, f"http://127.0.0.1:{port}", log_path, notify)
    if wait_ready:
        try:
            master.receive("READY=1", READY_TIMEOUT_S)
        except BaseException:
            master.close()
            raise
    return master
