"""Run a command, prefixing every line of its stdout and stderr with ``[rank=N] ``.

    python3 -m launchers.wrap_rank [--no-redirect-stdio] RANK [--] SCRIPT...

RANK is an integer or a comma-separated list of environment variable names tried in order (``RANK``,
``SLURM_PROCID``). Lines end at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (progress bars); a final partial line is kept
and emitted with a newline; very long lines are cut at 64 KiB. SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2 and
SIGCONT are forwarded to the child. The exit code is the child's (128+N when killed by signal N), and is also
recorded in ``DET_RANK_EXIT_DIR`` when set, so a launcher can report the rank that failed first.

A stop signal (SIGTERM, SIGINT, SIGHUP) that arrives after another rank failed on its own (as recorded in
``DET_RANK_EXIT_DIR``) is the launchers tearing the job down, not a preemption: the child gets it and,
``DET_RANK_STOP_GRACE_S`` (default 2) seconds later, SIGKILL. Without that, a rank whose harness takes SIGTERM
for a preemption (it checkpoints at its next ``should_preempt()``, which a rank stuck waiting for its dead peer
never reaches) holds the whole job until torchrun's own kill timeout (30 s) or Slurm's KillWait.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading

from harness.exec.child_wait import wait_child
from launchers._common import STOP_SIGNALS, exit_code_of, failed_peer, forward_signals, record_exit

MAX_LINE = 65536
DEFAULT_STOP_GRACE_S = 2.0


def stop_grace_s() -> float:
    raw = os.environ.get("DET_RANK_STOP_GRACE_S", "")
    try:
        return max(0.0, float(raw)) if raw else DEFAULT_STOP_GRACE_S
    except ValueError:
        return DEFAULT_STOP_GRACE_S


def resolve_rank(spec: str) -> int:
    if spec.isdigit():
        return int(spec)
    for name in spec.split(","):
        value = os.environ.get(name.strip())
        if value is not None and value.strip().isdigit():
            return int(value)
    raise SystemExit(f"wrap_rank: none of the rank variables {spec} is set")


def prefix_lines(src_fd: int, dst_fd: int, prefix: bytes) -> None:
    """Copy ``src_fd`` to ``dst_fd`` line by line, each line prefixed; never loses a trailing partial line."""
    buf = b""
    skip_lf = False  # the previous chunk ended with '\r': a '\n' right after belongs to it
    while True:
        chunk = os.read(src_fd, 65536)
        if not chunk:
            break
        if skip_lf and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        skip_lf = chunk.endswith(b"\r")
        out, buf = _split_lines(buf + chunk, prefix)
        if out:
            _write_all(dst_fd, b"".join(out))
    if buf:
        _write_all(dst_fd, prefix + buf + b"\n")


def _split_lines(buf: bytes, prefix: bytes) -> tuple[list[bytes], bytes]:
    """(the complete lines of ``buf``, each prefixed and ending with ``\\n``; the partial line left). A line ends
    at ``\\n``, ``\\r\\n`` or ``\\r``; one longer than ``MAX_LINE`` is cut there."""
    out = []
    start = 0
    i = 0
    n = len(buf)
    while i < n:
        c = buf[i]
        if c == 10 or c == 13:  # '\n' or '\r'
            out.append(prefix + buf[start:i] + b"\n")
            if c == 13 and i + 1 < n and buf[i + 1] == 10:
                i += 1
            start = i + 1
        elif i - start >= MAX_LINE:
            out.append(prefix + buf[start:i] + b"\n")
            start = i
        i += 1
    return out, buf[start:]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def _without_separator(script: list[str]) -> list[str]:
    """The command after RANK, without the optional ``--`` before it."""
    if script and script[0] == "--":
        return script[1:]
    return script


def _prefix_threads(proc: subprocess.Popen[bytes], prefix: bytes) -> list[threading.Thread]:
    """Two threads (not started) copying the child's stdout and stderr to ours, each line prefixed."""
    assert proc.stdout is not None and proc.stderr is not None
    return [
        threading.Thread(
            target=prefix_lines, args=(proc.stdout.fileno(), sys.stdout.fileno(), prefix), daemon=True
        ),
        threading.Thread(
            target=prefix_lines, args=(proc.stderr.fileno(), sys.stderr.fileno(), prefix), daemon=True
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--no-redirect-stdio":
        args = args[1:]  # accepted for Determined compatibility; we always write to our own stdout/stderr
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    rank = resolve_rank(args[0])
    script = _without_separator(args[1:])
    if not script:
        print("wrap_rank: no command given", file=sys.stderr)
        return 2
    prefix = f"[rank={rank}] ".encode()
    proc = subprocess.Popen(script, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    stopped = False
    killer: threading.Timer | None = None

    def forward(signum: int) -> None:
        nonlocal stopped, killer
        stopped = stopped or signum in STOP_SIGNALS
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)
        if signum in STOP_SIGNALS and killer is None:
            peer = failed_peer(rank)
            if peer is not None:
                grace = stop_grace_s()
                msg = f"[rank={rank}] rank {peer} failed: stopping this rank (SIGKILL in {grace:g} s)\n"
                with contextlib.suppress(OSError):
                    _write_all(sys.stderr.fileno(), msg.encode())
                killer = threading.Timer(grace, _kill, args=(proc,))
                killer.daemon = True
                killer.start()

    threads = _prefix_threads(proc, prefix)
    with forward_signals(forward):
        for t in threads:
            t.start()
        rc = exit_code_of(wait_child(proc))
        if killer is not None:
            killer.cancel()
        for t in threads:
            t.join(timeout=10)  # a grandchild may hold the pipes open after the child exits
    record_exit(rank, rc, stopped)
    return rc


if __name__ == "__main__":
    sys.exit(main())
