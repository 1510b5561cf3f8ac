"""Waiting for a child process while this process's signal handlers forward signals to it.

CPython runs a Python signal handler in the main thread between bytecodes; a blocking ``Popen.wait()`` sits in
``waitpid(2)``, which a signal interrupts (EINTR) so the handler runs and the call is retried (PEP 475). A signal
that arrives after that retry's check for pending handlers and before ``waitpid(2)`` is entered again does not
interrupt it: its handler waits, unrun, until the child exits. A second signal soon after a first (SIGUSR1, then
Slurm's SIGTERM) hit that window (``tests/unit/test_launchers.py`` hung on it in CI): the preemption signal was
never forwarded, so the trial could not checkpoint. `wait_child` waits in slices instead: ``Popen.wait(timeout)``
polls with sleeps of at most 50 ms, between which pending handlers run.
"""

from __future__ import annotations

import subprocess

SLICE_S = 1.0
"""How long one ``Popen.wait(timeout)`` lasts; inside it, handlers run at least every 50 ms."""


def wait_child(proc: subprocess.Popen) -> int:  # type: ignore[type-arg]  # (no `typing` at job start)
    """``proc.wait()``, with this process's signal handlers run within 50 ms of a signal."""
    while True:
        try:
            return proc.wait(timeout=SLICE_S)
        except subprocess.TimeoutExpired:
            continue
