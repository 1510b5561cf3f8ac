"""PreemptContext: one decision, taken by all ranks at the same call, to stop and checkpoint.

Sources, any of which makes ``should_preempt()`` true:
- the master's long-poll route ``/api/v1/allocations/{id}/signals/preemption`` (user pause, scheduler),
  watched by a background thread on the chief (on every rank in ``WorkersAskMaster`` mode);
- local signals on *any* rank: SIGTERM (Slurm preemption, scancel) and ``DET_PREEMPT_SIGNAL`` (default
  SIGUSR1, what ``sbatch --signal=B:USR1@<lead>`` delivers ahead of the time limit).
In ``WorkersAskChief`` mode (the default) every rank must call ``should_preempt()`` in step; the ranks
allgather their local view, so a signal seen by one rank makes every rank return True at the same call.
"""

from __future__ import annotations

import enum
import logging
import os
import signal
import threading
import time
import types
from pathlib import Path
from typing import Any

from harness._http import MasterSession, backoff_s, retry
from harness.core._distributed import DistributedContext

logger = logging.getLogger("harness.core")


class PreemptMode(enum.Enum):
    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"
    WorkersAskMaster = "WORKERS_ASK_MASTER"


def get_preempt_signals() -> list[signal.Signals]:
    """SIGTERM plus ``DET_PREEMPT_SIGNAL`` (a name like ``SIGUSR1``/``USR1`` or a number; ``none`` to skip)."""
    out = [signal.SIGTERM]
    raw = os.environ.get("DET_PREEMPT_SIGNAL", "SIGUSR1").strip()
    if raw and raw.lower() != "none":
        sig = (
            signal.Signals(int(raw))
            if raw.isdigit()
            else signal.Signals[("" if raw.startswith("SIG") else "SIG") + raw]
        )
        if sig not in out:
            out.append(sig)
    return out


class _SignalLatch:
    """Process-wide: remembers that a preemption signal arrived.

    The handler only assigns a plain attribute. It must not take any lock (``threading.Event.set`` does):
    a signal that arrives while the main thread holds that lock, or a second signal that arrives inside the
    handler (Slurm signals the task's process group and ``wrap_rank`` forwards the same signal), deadlocks.
    """

    def __init__(self) -> None:
        self.received = False
        self.signum: int | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self._users = 0

    def _handler(self, signum: int, _frame: types.FrameType | None) -> None:
        self.signum = signum
        self.received = True

    def install(self, signals: list[signal.Signals]) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        self._users += 1
        for sig in signals:
            if sig not in self._previous:
                self._previous[sig] = signal.signal(sig, self._handler)
        return True

    def uninstall(self) -> None:
        self._users -= 1
        if self._users > 0 or threading.current_thread() is not threading.main_thread():
            return
        for sig, prev in self._previous.items():
            signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        self._previous.clear()


_latch = _SignalLatch()


def preempt_signal_received() -> bool:
    return _latch.received


class _PreemptionWatcher(threading.Thread):
    """Long-polls the master for a preemption signal. Never blocks the training loop."""

    def __init__(self, session: MasterSession, allocation_id: str, longpoll_s: int = 60) -> None:
        super().__init__(name="harness-preempt", daemon=True)
        self._session = session
        self._path = f"/api/v1/allocations/{allocation_id}/signals/preemption"
        self._longpoll_s = longpoll_s
        self.preempt = False
        self._quit = threading.Event()

    def _poll(self, timeout_s: int) -> bool:
        out = self._session.get(
            self._path, params={"timeoutSeconds": str(timeout_s)}, timeout_s=timeout_s + 10
        )
        return out.get("preempt") is True

    def run(self) -> None:
        attempt = 0
        # Long polls from the start: the master reads the state before it waits, so a stop requested before
        # the job started is answered at once (a quick first look would cost every trial a request).
        while not self.preempt and not self._quit.is_set():
            try:
                self.preempt = self._poll(self._longpoll_s)
                attempt = 0
            except Exception as e:
                delay = backoff_s(attempt, base_s=1.0, cap_s=30.0)
                if attempt % 10 == 0:
                    logger.warning("preemption check failed (%s); retrying in %.0fs", e, delay)
                attempt += 1
                self._quit.wait(delay)

    def close(self) -> None:
        self._quit.set()


class PreemptContext:
    def __init__(
        self,
        session: MasterSession | None,
        allocation_id: str,
        dist: DistributedContext,
        preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
        *,
        watch_signals: bool = True,
        longpoll_s: int = 60,
    ) -> None:
        self._session = session
        self._allocation_id = allocation_id
        self._dist = dist
        self._preempt_mode = PreemptMode(preempt_mode)
        self._watch_signals = watch_signals
        self._signals_installed = False
        self._local = threading.Event()  # this rank's own flag (tests set it to simulate a signal)
        self._watcher: _PreemptionWatcher | None = None
        if session is not None and (dist.rank == 0 or self._preempt_mode == PreemptMode.WorkersAskMaster):
            self._watcher = _PreemptionWatcher(session, allocation_id, longpoll_s)
        self._started = False
        self._ack_sent = False
        self.answered_true = False  # should_preempt() returned True at least once

    def start(self) -> PreemptContext:
        if self._started:
            raise RuntimeError("you cannot call PreemptContext.start() multiple times")
        self._started = True
        if self._watch_signals:
            self._signals_installed = _latch.install(get_preempt_signals())
        if self._watcher is not None:
            self._watcher.start()
        return self

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
        if self._signals_installed:
            _latch.uninstall()
            self._signals_installed = False

    def __enter__(self) -> PreemptContext:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.close()

    def _local_view(self) -> bool:
        if self._local.is_set():
            return True
        if self._signals_installed and _latch.received:
            return True
        return self._watcher is not None and self._watcher.preempt

    def should_preempt(self, auto_ack: bool = True) -> bool:
        """True when the task should checkpoint and exit. See the module doc for who must call it when."""
        mode = self._preempt_mode
        self._check_may_ask(mode)
        out = self._local_view()
        if mode == PreemptMode.WorkersAskChief:
            out = any(self._dist.allgather(out))
        if out:
            self.answered_true = True
        if out and auto_ack and not self._ack_sent and self._acknowledges(mode):
            self.acknowledge_preemption_signal()
        return out

    def _check_may_ask(self, mode: PreemptMode) -> None:
        """RuntimeError when should_preempt() is called before start(), or off the chief in ChiefOnly mode."""
        if not self._started:
            raise RuntimeError(
                "you cannot call PreemptContext.should_preempt() before PreemptContext.start()"
            )
        if mode == PreemptMode.ChiefOnly and self._dist.rank != 0:
            raise RuntimeError(
                "PreemptContext was configured with preempt_mode=ChiefOnly but .should_preempt() was "
                f"called from non-chief worker of rank={self._dist.rank}"
            )

    def _acknowledges(self, mode: PreemptMode) -> bool:
        """Whether this rank tells the master about a preemption: the chief, or every rank in WorkersAskMaster."""
        return self._dist.rank == 0 or mode == PreemptMode.WorkersAskMaster

    def acknowledge_preemption_signal(self) -> None:
        """Tell the master that we exit because of preemption and expect to be resumed."""
        self._ack_sent = True
        ack_file = os.environ.get("DET_PREEMPT_ACK_FILE")
        if ack_file:  # the job entry records an acknowledged preemption from this file, master or not
            try:
                Path(ack_file).touch()
            except OSError as e:
                logger.warning("could not write %s: %s", ack_file, e)
        if self._session is None:
            return
        path = f"/api/v1/allocations/{self._allocation_id}/signals/ack_preemption"
        session = self._session
        try:
            retry(lambda: session.post(path, {}), what="acknowledge preemption", deadline_s=30)
        except Exception as e:
            logger.warning("could not acknowledge preemption: %s", e)

    def _trigger_local(self) -> None:
        """Act as if this rank received a preemption signal (for tests and for callers with their own cue)."""
        self._local.set()

    def _wait_for_signal(self, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self._local_view():
                return True
            time.sleep(0.01)
        return False


class DummyPreemptContext(PreemptContext):
    """Never preempts off-cluster, but keeps the real collective pattern, so code that runs here runs there."""

    def __init__(
        self, dist: DistributedContext, preempt_mode: PreemptMode = PreemptMode.WorkersAskChief
    ) -> None:
        super().__init__(None, "", dist, preempt_mode, watch_signals=False)
