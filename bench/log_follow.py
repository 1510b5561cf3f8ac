"""What reading a run's log through ``userfiles`` costs next to a plain ``open`` (what the master did before
issue 32), in one process, alternating.

    .venv/bin/python bench/log_follow.py [--mb 64] [--polls 20000] [--out bench/results/log_follow.md]

Three cases, each through ``services.logs.read_new_lines`` (the log routes' reader) and through the same
function with a plain ``open`` (the baseline, kept here as it was):
- a follower's poll when nothing was appended (what every open ``det trial logs -f`` does each second): the
  file is opened, found at its end, closed;
- the same poll as the follow routes make it, from the event loop into the streams' threads
  (``api.streams.stream_threads``; the routes also read the trial's state from the database each poll, which
  is left out here and would only shrink the difference);
- reading a long log from its start, in the routes' 4 MiB pieces, parsed into lines.
Reported: medians of alternating rounds and the ratio userfiles/plain. No cluster needed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path, PurePath

from hpc_master.services import logs


def plain_read_new_lines(
    trial_id: int,
    sources: Sequence[logs.LogSource],
    cursor: logs.LogCursor,
    *,
    max_bytes: int = logs.MAX_READ_BYTES,
) -> tuple[list[dict[str, object]], bool]:
    """``read_new_lines`` as it was: ``open`` on the recorded path (links followed, FIFOs opened)."""
    out: list[dict[str, object]] = []
    more = False
    for source in sources:
        key = str(source.path)
        start = cursor.offsets.get(key, 0)
        try:
            with open(source.path, "rb") as handle:
                handle.seek(start)
                data = handle.read(max_bytes + 1)
                written = dt.datetime.fromtimestamp(os.fstat(handle.fileno()).st_mtime, dt.UTC)
        except OSError:
            continue
        if len(data) > max_bytes:
            data, more = data[:max_bytes], True
        cut = data.rfind(b"\n")
        if cut < 0:
            continue
        data = data[: cut + 1]
        cursor.offsets[key] = start + len(data)
        stamp = written.isoformat()
        for raw in data.splitlines(keepends=True):
            cursor.line_id += 1
            out.append(logs.log_entry(trial_id, cursor.line_id, source.run_number, raw.decode("utf-8", "replace"),
                                      stream=source.stream, timestamp=stamp))  # fmt: skip
    return out, more


Reader = Callable[..., tuple[list[dict[str, object]], bool]]


def poll_at_end(reader: Reader, sources: list[logs.LogSource], size: int, polls: int) -> float:
    """µs per poll of a follower already at the file's end."""
    cursor = logs.LogCursor(offsets={str(sources[0].path): size})
    t0 = time.perf_counter()
    for _ in range(polls):
        reader(1, sources, cursor)
    return (time.perf_counter() - t0) / polls * 1e6


def poll_in_threads(reader: Reader, sources: list[logs.LogSource], size: int, polls: int) -> float:
    """µs per poll of a follower at the file's end, made as the follow routes make it."""
    import asyncio

    from hpc_master.api.streams import stream_threads

    async def run() -> float:
        cursor = logs.LogCursor(offsets={str(sources[0].path): size})
        t0 = time.perf_counter()
        for _ in range(polls):
            await stream_threads.run(reader, 1, sources, cursor)
        return (time.perf_counter() - t0) / polls * 1e6

    return asyncio.run(run())


def read_whole(reader: Reader, sources: list[logs.LogSource]) -> float:
    """MB/s reading the whole log from its start, piece by piece, into entries."""
    cursor = logs.LogCursor(offsets={})
    size = sources[0].path
    t0 = time.perf_counter()
    total = 0
    while True:
        lines, more = reader(1, sources, cursor)
        total += len(lines)
        if not more:
            break
    elapsed = time.perf_counter() - t0
    return os.path.getsize(size) / 1e6 / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--polls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "jobs"
        run = root / "exp-1" / "trial-1" / "run-1"
        run.mkdir(parents=True)
        line = b"[rank=0] INFO: step 123 loss=0.1234 accuracy=0.9876 lr=0.001 throughput=1234.5 samples/s\n"
        log = run / "output.log"
        with log.open("wb") as f:
            f.write(line * (args.mb * 1_000_000 // len(line)))
        size = log.stat().st_size
        sources = [logs.LogSource(1, PurePath(log), PurePath(root))]
        results: dict[str, dict[str, list[float]]] = {
            case: {"plain": [], "userfiles": []} for case in ("poll", "route", "read")
        }
        readers: dict[str, Reader] = {"plain": plain_read_new_lines, "userfiles": logs.read_new_lines}
        for _ in range(args.rounds):
            for name, reader in readers.items():
                results["poll"][name].append(poll_at_end(reader, sources, size, args.polls))
                results["route"][name].append(poll_in_threads(reader, sources, size, args.polls // 4))
                results["read"][name].append(read_whole(reader, sources))
    med = {case: {k: statistics.median(v) for k, v in by.items()} for case, by in results.items()}
    report = [
        "# bench/log_follow.py",
        "",
        f"A {args.mb} MB log, {args.rounds} alternating rounds, medians; {os.cpu_count()} CPUs.",
        "",
        "| case | plain open | userfiles | ratio userfiles / plain |",
        "|---|---:|---:|---:|",
        f"| a follower's poll at the end (µs, lower is better) | {med['poll']['plain']:.1f} | "
        f"{med['poll']['userfiles']:.1f} | {med['poll']['userfiles'] / med['poll']['plain']:.2f} |",
        f"| the same poll as a follow route makes it (µs) | {med['route']['plain']:.1f} | "
        f"{med['route']['userfiles']:.1f} | {med['route']['userfiles'] / med['route']['plain']:.2f} |",
        f"| reading the whole log (MB/s, higher is better) | {med['read']['plain']:.0f} | "
        f"{med['read']['userfiles']:.0f} | {med['read']['userfiles'] / med['read']['plain']:.2f} |",
        "",
    ]
    print("\n".join(report))
    if args.out:
        args.out.write_text("\n".join(report))


if __name__ == "__main__":
    main()
