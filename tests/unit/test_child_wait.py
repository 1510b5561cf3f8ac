"""`harness.exec.child_wait.wait_child`: a signal whose handler is pending while the main thread waits for its
child is handled while the child still runs (the launchers and the job entry forward Slurm's signals so)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from harness.exec.child_wait import wait_child


def _handled_while_child_ran(wait: Callable[[subprocess.Popen[Any]], int]) -> bool:
    """While the main thread waits for a child, trip SIGUSR1's handler from another thread: the state that a
    signal landing just before waitpid(2) leaves (the handler pending, waitpid not interrupted). Whether the
    handler ran before the wait reaped the child."""
    seen: list[bool] = []
    box: list[subprocess.Popen[Any]] = []
    started = threading.Event()

    def other_thread() -> None:  # SIGUSR1 is not blocked here: pthread_kill delivers it to this thread
        started.wait(30)
        time.sleep(0.3)  # the main thread is in its wait by now
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
        stdin = box[0].stdin
        assert stdin is not None
        stdin.close()  # the child ends half a second from now

    def handler(
        *_: object,
    ) -> None:  # the child not reaped yet (Popen.poll() says None while a wait holds it)
        try:
            os.kill(box[0].pid, 0)
            seen.append(True)
        except ProcessLookupError:
            seen.append(False)

    old = signal.signal(signal.SIGUSR1, handler)
    thread = threading.Thread(target=other_thread, daemon=True)
    thread.start()
    signal.pthread_sigmask(
        signal.SIG_BLOCK, {signal.SIGUSR1}
    )  # so the kernel never interrupts the main thread
    try:
        code = "import sys, time; sys.stdin.read(); time.sleep(0.5)"
        box.append(subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE))
        started.set()
        wait(box[0])
        thread.join(30)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        signal.signal(signal.SIGUSR1, old)
    assert seen, "the handler never ran"
    return seen[0]


def test_wait_child_runs_a_pending_handler_while_the_child_runs() -> None:
    assert _handled_while_child_ran(wait_child)


def test_a_blocking_wait_leaves_it_pending_until_the_child_ends() -> None:
    """What wait_child is for: with Popen.wait() the handler runs only once the child has exited."""
    assert not _handled_while_child_ran(lambda p: p.wait())
