"""What ``det-master`` needs to run as a system service (``hpc_master/deploy/det-master.service``):

- readiness: ``sd_notify`` tells systemd (``Type=notify``) ``READY=1`` once the API listens, after the database
  was migrated and the lifecycle loop started, and ``STOPPING=1`` when the shutdown begins. It is the whole
  protocol (a datagram to ``$NOTIFY_SOCKET``), in the standard library: no libsystemd.
- an orderly stop on SIGTERM or SIGINT: uvicorn stops serving and drains, then raises the signal again once
  it has returned (so that the default action, death, would skip what the master still has to close).
  `ExitSignals` takes that second delivery, so the master closes its background work in order and exits 0.
- logs for journald: with stderr connected to the journal (``$JOURNAL_STREAM``), each line starts with its
  syslog priority (``<3>`` for errors) instead of a timestamp, so ``journalctl -p err -u det-master`` works.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import uvicorn

log = logging.getLogger("hpc_master")

EXIT_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def sd_notify(*fields: str) -> bool:
    """Send ``KEY=value`` fields to the service manager; False when not run by one (no ``$NOTIFY_SOCKET``)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address or not fields:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(fields).encode())
    except (ConnectionRefusedError, FileNotFoundError):
        # Its listener is gone (``det-master --daemon`` returned once the master was ready): stop telling.
        os.environ.pop("NOTIFY_SOCKET", None)
        return False
    except OSError as err:
        log.warning("cannot notify the service manager at %s: %s", address, err)
        return False
    return True


class ReadyListener:
    """The service manager's side of ``sd_notify``, for ``det-master --daemon``: a datagram socket (abstract,
    nothing to clean up) that the child is given as ``$NOTIFY_SOCKET``, and a wait for its ``READY=1``."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        name = f"hpc-det-master-{os.getpid()}-{os.urandom(6).hex()}"
        self.sock.bind("\0" + name)
        self.address = "@" + name

    def wait(self, alive: Callable[[], bool], timeout_s: float) -> bool:
        """Whether ``READY=1`` came within `timeout_s` while `alive()` (False at once when it dies)."""
        deadline = time.monotonic() + timeout_s
        while alive() and (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(min(left, 0.2))
            try:
                if "READY=1" in self.sock.recv(4096).decode(errors="replace").split("\n"):
                    return True
            except TimeoutError:
                continue
        return False

    def close(self) -> None:
        self.sock.close()


class CompanionServer(uvicorn.Server):
    """A second uvicorn server of the same app in the same loop (another TLS setting: the web UI's HTTPS
    port beside the plain one), started and stopped by its `NotifyingServer`: it neither takes the signals
    nor runs the app's lifespan (its config says ``lifespan="off"``)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class NotifyingServer(uvicorn.Server):
    """uvicorn's server, which tells systemd when it listens and when it begins to stop. Its companions
    (`CompanionServer`, with their sockets) start once it serves, before it says it is ready, and stop first
    when it stops, before the app's shutdown."""

    def __init__(
        self,
        config: uvicorn.Config,
        companions: list[tuple[CompanionServer, list[socket.socket]]] | None = None,
    ) -> None:
        super().__init__(config)
        self.companions = companions or []
        self._companion_tasks: list[asyncio.Task[None]] = []
        self.companion_failed = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not await self._start_companions():
            log.error("a second listener of the master did not start (above); stopping")
            self.companion_failed = self.should_exit = True
            return
        if self.started:
            where = ", ".join(
                "{}:{}".format(*s.getsockname()[:2])
                for server in [self, *(c for c, _ in self.companions)]
                for listener in server.servers
                for s in listener.sockets
            )
            sd_notify("READY=1", f"STATUS=serving on {where}")

    async def _start_companions(self) -> bool:
        for companion, sockets in self.companions:
            task = asyncio.create_task(companion.serve(sockets))
            self._companion_tasks.append(task)
            while not companion.started and not task.done():
                await asyncio.sleep(0.01)
            if not companion.started:
                if task.exception() is not None:
                    log.error("the listener on %s failed: %s", sockets, task.exception())
                return False
        return True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        sd_notify("STOPPING=1", "STATUS=stopping: draining requests")
        for companion, _ in self.companions:
            companion.should_exit = True
        await asyncio.gather(*self._companion_tasks, return_exceptions=True)
        await super().shutdown(sockets)


class ExitSignals:
    """SIGTERM and SIGINT handlers for the master's whole life: a signal asks `server` to stop (before uvicorn
    took over its handlers, or after it gave them back) and is recorded, never fatal."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.server: uvicorn.Server | None = None

    def install(self) -> None:
        for sig in EXIT_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if not self.received and (self.server is None or not self.server.started):
            log.info("%s received: stopping once started", signal.Signals(signum).name)
        self.received.append(signum)
        if self.server is not None:
            self.server.should_exit = True


class ShutdownNoise(logging.Filter):
    """uvicorn's lines about requests a stop cut short (streams and long polls outlive the graceful wait, and
    their clients reconnect once the master is back): its ERROR "Cancel N running task(s)" becomes one INFO
    line, and the cancelled requests' tracebacks (CancelledError) are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError):
            return False
        message = record.getMessage()
        if message.startswith("Cancel ") and "graceful shutdown" in message:
            record.msg, record.args = (
                "stopping: %s open requests (streams, long polls) cut short",
                (message.split()[1],),
            )
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


class JournalFormatter(logging.Formatter):
    """``<priority>name: message``: journald reads the priority and adds the time itself."""

    PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))

    def __init__(self) -> None:
        super().__init__("%(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        priority = next((p for level, p in self.PRIORITIES if record.levelno >= level), 7)
        text = super().format(record)
        return "\n".join(f"<{priority}>{line}" for line in text.splitlines() or [""])


def logs_to_journal(stream: Any = None) -> bool:
    """Whether `stream` (default stderr) is the journal's: systemd sets ``$JOURNAL_STREAM`` to its device and
    inode (a stream passed on to a child is not, and keeps the plain format)."""
    expected = os.environ.get("JOURNAL_STREAM", "")
    try:
        st = os.fstat((stream or sys.stderr).fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return expected == f"{st.st_dev}:{st.st_ino}"


def error_line(message: str) -> str:
    """`message` for stderr, with an error's priority when stderr is the journal's."""
    return f"<3>{message}" if logs_to_journal() else message


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    if logs_to_journal():
        handler.setFormatter(JournalFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    from hpc_master.master_log import MASTER_LOG

    logging.basicConfig(level=level.upper(), handlers=[handler, MASTER_LOG], force=True)
    logging.getLogger("uvicorn.error").addFilter(ShutdownNoise())
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # nine lines at every start
