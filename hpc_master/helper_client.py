"""Running the per-user helper (``userhelper``) as a researcher, and turning its answers back into results and
exceptions: the master's side of the privilege separation.

`UserHelper.session(user)` starts one helper process as `user` (``runuser -u USER --`` from a root master,
``sudo -n -u USER --`` from its service account) and sends it requests, one JSON line each, for as long as the
caller holds the session: a submission's files and its sbatch are one process. Every call has a deadline; a
helper that does not answer by then is killed and the call raises `HelperError`.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import logging
import os
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import userfiles
import userhelper
from det_errors import ConfigError
from slurm_backend.cli import CommandResult, UserRunner

log = logging.getLogger(__name__)

SCRIPT = str(Path(userhelper.__file__).resolve().parent / "run.py")
HELPER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
VIA = ("runuser", "sudo")


class HelperError(OSError):
    """The helper could not be run, refused the request, or did not answer in time."""


_KINDS: dict[str, type[OSError]] = {
    "not_regular": userfiles.NotRegularError,
    "unsafe": userfiles.UnsafePathError,
    "too_large": userfiles.FileTooLargeError,
    "not_found": FileNotFoundError,
    "permission": PermissionError,
    "os": OSError,
}


def helper_command(roots: Sequence[str], python: str = sys.executable) -> list[str]:
    """The helper's command line for these roots (each once, in order): what a sudoers rule names, exactly.
    ``-I -S``: no environment, no user or site packages (its script puts its own installation first)."""
    return [python, "-I", "-S", SCRIPT, *[a for r in dict.fromkeys(roots) for a in ("--root", r)]]


class UserHelper:
    """The helper, run as any of the master's users: `via` is ``runuser`` (the master is root) or ``sudo``
    (the master is its service account, allowed by the sudoers rule of `sudoers_rule`)."""

    def __init__(
        self,
        roots: Sequence[str],
        *,
        via: str = "runuser",
        python: str = sys.executable,
        timeout_s: float = 120.0,
    ) -> None:
        if via not in VIA:
            raise ValueError(f"via: one of {VIA}")
        self.roots = list(roots)
        self.via = via
        self.command = helper_command(self.roots, python)
        self.timeout_s = timeout_s
        self._local = threading.local()
        self.started = 0
        """Helper processes started (for tests and benchmarks)."""

    def argv(self, user: str) -> list[str]:
        if self.via == "sudo":
            return ["sudo", "-n", "-u", user, "--", *self.command]
        return ["runuser", "-u", user, "--", *self.command]

    @contextlib.contextmanager
    def session(self, user: str) -> Iterator[HelperSession]:
        session = HelperSession(self.argv(user), user, self.timeout_s)
        self.started += 1
        try:
            yield session
        finally:
            session.close()

    @contextlib.contextmanager
    def batch(self, user: str) -> Iterator[None]:
        """In this thread, every call as `user` in the block goes to one helper process, started at the first
        (a submission's run directory, its context and its sbatch: one process, not one per step)."""
        if getattr(self._local, "batch", None) is not None:
            yield  # already in one
            return
        self._local.batch = (user, [])
        try:
            yield
        finally:
            _, started = self._local.batch
            self._local.batch = None
            for session in started:
                session.close()

    def call(self, user: str, op: str, **fields: Any) -> dict[str, Any]:
        """One request: to the batch's helper (see `batch`), else in a helper process of its own."""
        batch = getattr(self._local, "batch", None)
        if batch is not None and batch[0] == user:
            if not batch[1]:
                batch[1].append(HelperSession(self.argv(user), user, self.timeout_s))
                self.started += 1
            session: HelperSession = batch[1][0]
            if session.proc.poll() is None:
                return session.call(op, **fields)
        with self.session(user) as s:
            return s.call(op, **fields)


class _Count:
    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self) -> None:
        with self._lock:
            self.value += 1


STARTS = _Count()
"""How many per-user helper processes this master started."""


class HelperSession:
    """One helper process as one user; not thread-safe (one caller at a time)."""

    def __init__(self, argv: list[str], user: str, timeout_s: float) -> None:
        self.user = user
        self.timeout_s = timeout_s
        env = {"PATH": HELPER_PATH, "LANG": "C.UTF-8"}
        if os.environ.get("SLURM_CONF"):
            env["SLURM_CONF"] = os.environ["SLURM_CONF"]
        STARTS.add()  # the master's /metrics
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd="/",
                start_new_session=True,
            )  # fmt: skip
        except OSError as e:
            raise HelperError(e.errno or errno.EIO, f"cannot run the helper as {user}: {e.strerror}") from e
        self._buffer = b""
        self.answered = False
        """Whether the helper answered a request (a refusal comes from a helper that works)."""

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """The helper's answer to one request; its error as the exception it names."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"op": op, **fields}).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._died(op) from None
        line = self._read_line(op)
        answer = json.loads(line)
        self.answered = True
        if answer.get("ok"):
            return dict(answer)
        kind, message = str(answer.get("kind")), str(answer.get("error"))
        code = int(answer.get("errno") or errno.EINVAL)
        if kind in _KINDS:
            raise _KINDS[kind](code, f"{message} (as {self.user})")
        raise HelperError(code, f"the helper refused {op} as {self.user}: {message}")

    def _read_line(self, op: str) -> bytes:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + self.timeout_s
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    self.proc.kill()
                    raise HelperError(errno.ETIMEDOUT, f"the helper ({op} as {self.user}) took over "
                                      f"{self.timeout_s:.0f} s")  # fmt: skip
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise self._died(op)
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _died(self, op: str) -> HelperError:
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        stderr = self.proc.stderr.read().decode(errors="replace").strip() if self.proc.stderr else ""
        hint = ""
        if "password is required" in stderr or "not allowed" in stderr:
            hint = " (the sudoers rule of `det-master --print-sudoers` is missing or names other roots)"
        return HelperError(errno.EIO, f"the helper ({op} as {self.user}) exited {self.proc.returncode}: "
                           f"{stderr[-500:] or 'no message'}{hint}")  # fmt: skip

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin:
                self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()


class HelperPool:
    """Long-lived helpers, one per user, shared by every reader of that user's files (log followers): a poll
    is one request line to a helper that is already running, not a process. A user's helper serves one
    request at a time; one idle for `idle_s` is ended (by a reaper thread that runs while any helper does, and
    at the next call), so that a user who stopped following logs keeps no process of theirs running."""

    def __init__(self, helper: UserHelper, *, idle_s: float = 30.0) -> None:
        self.helper = helper
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._users: dict[str, tuple[threading.Lock, list[Any]]] = {}
        """user → (its lock, [session or None, last use])."""
        self.started = 0
        """Helper processes started (for tests and benchmarks)."""
        self._reaper: threading.Thread | None = None
        self._closed = threading.Event()

    def call(self, user: str, op: str, **fields: Any) -> dict[str, Any]:
        with self._lock:
            lock, slot = self._users.setdefault(user, (threading.Lock(), [None, 0.0]))
            self._end_idle(time.monotonic())
        with lock:
            for attempt in (1, 2):
                if slot[0] is None:
                    slot[0] = HelperSession(self.helper.argv(user), user, self.helper.timeout_s)
                    self.started += 1
                    self._keep_reaping()
                slot[1] = time.monotonic()
                session: HelperSession = slot[0]
                try:
                    return session.call(op, **fields)
                except HelperError:
                    if session.proc.poll() is None and attempt == 1 and session.answered:
                        raise  # a refusal: the helper is fine
                    session.close()
                    slot[0] = None
                    if attempt == 2:
                        raise
        raise AssertionError("unreachable")

    def _end_idle(self, now: float) -> None:
        for lock, slot in self._users.values():
            if slot[0] is not None and now - slot[1] > self.idle_s and lock.acquire(blocking=False):
                try:
                    slot[0].close()
                    slot[0] = None
                finally:
                    lock.release()

    def _keep_reaping(self) -> None:
        with self._lock:
            if self._reaper is None and not self._closed.is_set():
                self._reaper = threading.Thread(target=self._reap, name="helper-pool-reaper", daemon=True)
                self._reaper.start()

    def _reap(self) -> None:
        """End idle helpers every `idle_s` / 2 until none runs (a new helper starts the reaper again)."""
        while not self._closed.wait(self.idle_s / 2):
            with self._lock:
                self._end_idle(time.monotonic())
                if all(slot[0] is None for _, slot in self._users.values()):
                    self._reaper = None
                    return

    def running(self) -> int:
        """Helper processes running now."""
        with self._lock:
            return sum(1 for _, slot in self._users.values() if slot[0] is not None)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            self._end_idle(float("inf"))


def slurm_runner(helper: UserHelper) -> UserRunner:
    """`SlurmCli`'s ``user_runner``: the command run by the helper as the user. A helper that cannot be run
    (no sudoers rule, no such account) is a refusal the admin must fix, never a lost job."""

    def run(user: str, argv: Sequence[str], stdin: str | None, timeout_s: float) -> CommandResult:
        try:
            answer = helper.call(user, "slurm", argv=list(argv), stdin=stdin, timeout_s=timeout_s)
        except OSError as e:
            raise ConfigError(f"cannot run {argv[0]} as {user}: {e.strerror}", field="unix_username") from e
        return CommandResult(int(answer["returncode"]), str(answer["stdout"]), str(answer["stderr"]))

    return run


def encode(data: bytes) -> str:
    return base64.b64encode(data).decode()


def decode(text: str) -> bytes:
    return base64.b64decode(text)
