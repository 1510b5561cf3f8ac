"""What the launchers share: signal forwarding, per-rank exit records, Slurm/cluster facts from the environment."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator

from harness.exec.child_wait import wait_child

FORWARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
EXIT_DIR_ENV = "DET_RANK_EXIT_DIR"
_BATCH_STEP_IDS = {"", "batch", "extern", "4294967294", "4294967295"}


def split_launcher_args(args: list[str], usage: str) -> tuple[list[str], list[str]]:
    """``[OVERRIDES... --] (--trial MODULE:CLASS | SCRIPT...)`` → (overrides, script argv).

    ``--trial X`` becomes ``python -m harness.exec.run_trial X``. Exits with `usage` when no script is given.
    """
    overrides: list[str] = []
    if "--" in args:
        i = args.index("--")
        overrides, args = args[:i], args[i + 1 :]
    if args[:1] == ["--trial"]:
        if len(args) != 2:
            raise SystemExit("error: --trial takes exactly one MODULE:CLASS and no script")
        args = [sys.executable, "-m", "harness.exec.run_trial", args[1]]
    if not args:
        raise SystemExit(usage)
    return overrides, args


def exit_code_of(returncode: int) -> int:
    """A Popen returncode as a shell exit status (killed by signal N → 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


@contextlib.contextmanager
def forward_signals(
    handler_for: Callable[[int], None], signals: tuple[signal.Signals, ...] = FORWARDED_SIGNALS
) -> Iterator[None]:
    """Install ``handler_for(signum)`` for ``signals`` (main thread only) and restore the old handlers after."""
    old: dict[
        signal.Signals, signal.Handlers | int | Callable[[int, types.FrameType | None], object] | None
    ] = {}

    def handle(signum: int, _frame: types.FrameType | None) -> None:
        handler_for(signum)

    try:
        for sig in signals:
            old[sig] = signal.signal(sig, handle)
        yield
    finally:
        for sig, prev in old.items():
            signal.signal(sig, prev if prev is not None else signal.SIG_DFL)


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc)."""
    out = []
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        pass
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return out


def in_srun_step() -> bool:
    """True inside an ``srun`` task (as opposed to the batch script or no Slurm at all)."""
    return "SLURM_JOB_ID" in os.environ and os.environ.get("SLURM_STEP_ID", "") not in _BATCH_STEP_IDS


def in_slurm_allocation() -> bool:
    return "SLURM_JOB_ID" in os.environ


def ensure_exit_dir() -> pathlib.Path:
    """Directory where wrap_rank records each rank's exit (shared by every node when under DET_JOB_STORAGE)."""
    raw = os.environ.get(EXIT_DIR_ENV)
    if raw:
        path = pathlib.Path(raw)
    else:
        base = os.environ.get("DET_JOB_STORAGE")
        tag = f"{os.environ.get('SLURM_JOB_ID', 'local')}-{os.getpid()}-{time.time_ns()}"
        if base:
            path = pathlib.Path(base) / ".rank-exits" / tag
        else:
            path = pathlib.Path(tempfile.mkdtemp(prefix="det-rank-exits-"))
        os.environ[EXIT_DIR_ENV] = str(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def record_exit(rank: int, exit_code: int, signalled: bool) -> None:
    """Record a rank's exit in ``DET_RANK_EXIT_DIR`` (with its node, ``SLURM_NODEID``, when under srun)."""
    raw = os.environ.get(EXIT_DIR_ENV)
    if not raw:
        return
    record: dict[str, object] = {
        "rank": rank,
        "exit_code": exit_code,
        "signalled": signalled,
        "time": time.time(),
    }
    node = os.environ.get("SLURM_NODEID", "")
    if node.isdigit():
        record["node"] = int(node)
    try:
        path = pathlib.Path(raw) / f"rank-{rank}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
    except OSError:
        pass


def node_ranks_exited_cleanly(exit_dir: pathlib.Path, node: int, expected: int) -> bool:
    """True when ``expected`` ranks recorded for ``node`` all exited 0."""
    mine = [r for r in _exit_records(exit_dir) if r.get("node") == node]
    return len(mine) == expected and all(r.get("exit_code") == 0 for r in mine)


def _exit_records(exit_dir: pathlib.Path) -> list[dict[str, object]]:
    records = []
    for p in exit_dir.glob("rank-*.json"):
        try:
            records.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return records


def first_failure(exit_dir: pathlib.Path) -> dict[str, object] | None:
    """The rank that failed first on its own (not because it was told to stop), else the first failure."""
    records = _exit_records(exit_dir)
    failed = sorted(
        (r for r in records if r.get("exit_code")), key=lambda r: (bool(r.get("signalled")), r["time"])
    )
    return failed[0] if failed else None


def failed_peer(rank: int) -> int | None:
    """A rank other than ``rank`` that already failed on its own (``DET_RANK_EXIT_DIR``), else None.

    A stop signal that arrives after a peer failed is the launchers tearing the job down (torchrun stops the
    node's other ranks, ``srun --kill-on-bad-exit`` the other nodes), not a preemption.
    """
    raw = os.environ.get(EXIT_DIR_ENV)
    if not raw:
        return None
    for r in _exit_records(pathlib.Path(raw)):
        peer = r.get("rank")
        if isinstance(peer, int) and peer != rank and r.get("exit_code") and not r.get("signalled"):
            return peer
    return None


def run_and_report(
    cmd: list[str],
    exit_dir: pathlib.Path,
    *,
    on_signal: Callable[[subprocess.Popen[bytes], int], None] | None = None,
    preexec_fn: Callable[[], None] | None = None,
    signals_seen: list[int] | None = None,
) -> int:
    """Run ``cmd`` forwarding signals; exit with the first failed rank's exit code when a rank failed.

    The signals received meanwhile are appended to ``signals_seen`` when given.
    """
    proc = subprocess.Popen(cmd, preexec_fn=preexec_fn)

    def forward(signum: int) -> None:
        if signals_seen is not None:
            signals_seen.append(signum)
        if on_signal is not None:
            on_signal(proc, signum)
        else:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)

    with forward_signals(forward):
        rc = exit_code_of(wait_child(proc))
    if rc != 0:
        failure = first_failure(exit_dir)
        if failure is not None:
            print(
                f"[launcher] rank {failure['rank']} failed first with exit code {failure['exit_code']}",
                flush=True,
            )
            code = failure["exit_code"]
            return int(code) if isinstance(code, int) else rc
    return rc


def python_cmd() -> list[str]:
    import sys

    return [sys.executable]


def srun_per_node_cmd(
    *,
    module: str,
    nnodes: int,
    override_args: list[str],
    script: list[str],
    python: str = "python3",
    extra_srun_args: list[str] | None = None,
) -> list[str]:
    """``srun`` one task per node, each running ``python -m MODULE --node [OVERRIDES --] SCRIPT...``: how the
    per-node launchers (torch.distributed, DeepSpeed) start themselves from the batch script. A ``--`` goes
    before the script when overrides precede it or it starts with a dash, so the node never misreads it."""
    node_cmd = [python, "-m", module, "--node"]
    if override_args:
        node_cmd += [*override_args, "--"]
    elif script and script[0].startswith("-"):
        node_cmd += ["--"]
    return [
        "srun",
        f"--nodes={nnodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        *(extra_srun_args or []),
        *node_cmd,
        *script,
    ]


def ignore_usr1() -> None:
    """A ``preexec_fn`` for a per-node launcher (torchrun, DeepSpeed's runner): none has a SIGUSR1 handler, so
    the signal would kill it; the ranks get it from us instead."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
