"""One user's polling metric streams against another user's requests: ``GET /api/v1/me`` latency while user A
holds many streams, next to the same master idle.

    .venv/bin/python bench/streams.py [--streams 1000] [--seconds 10] [--period-s 1] [--out FILE]

A SQLite database gets two users and one ACTIVE experiment (8 trials × 200 training reports, written through
``tests.webui.seed``). Then, for each part, a fresh master (the real app under uvicorn, one process, loopback)
on that database:

- **idle**: nobody streams;
- **shared threads, no cap**: A opens ``--streams`` streams of
  ``/experiments/{id}/metrics-stream/trials-sample?periodSeconds=P`` (the web UI's learning curves, polled
  every ``--period-s``) with ``security.max_streams_per_user`` above that number and the streams' reads put
  back in the thread pool of the synchronous routes: the master as it was before ``api.streams``;
- **own threads, no cap**: the same, the reads in the streams' own threads (``STREAM_THREADS``);
- **default cap**: the same streams asked for, against the default ``security.max_streams_per_user``: the
  ones over it are refused (429) and the rest stay open.

Once A's streams are open (status line read, then a few seconds' settling), user B asks ``GET /api/v1/me``
every 50 ms for ``--seconds`` on one kept-alive connection; reported: p50 / p99 / max and the p99's ratio to
the idle master's, the streams opened and refused, and the master's CPU over the window. The streams are read
(and their bytes dropped) by one asyncio thread of this process. No cluster needed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PASSWORD = "bench-pw"
SETTLE_S = 3.0
PROBE_EVERY_S = 0.05

SERVE = """
import resource, sys, uvicorn
import anyio.to_thread
from hpc_master.api import streams
from hpc_master.api.app import create_app
from hpc_master.masterconf import parse_master_config
url, port, cap, shared = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "shared"
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
if shared:  # as before api.streams: the streams' reads in the synchronous routes' thread pool
    streams.StreamThreads.limiter = lambda self: anyio.to_thread.current_default_thread_limiter()
security = {"require_passwords": True, "admin_password": "admin-pw"}
if cap:
    security["max_streams_per_user"] = cap
config = parse_master_config({"db": {"url": url}, "listen": {"host": "127.0.0.1", "port": port},
    "security": security}, env={})
uvicorn.run(create_app(config), host="127.0.0.1", port=port, log_level="warning")
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build_database(path: Path) -> int:
    from hpc_master.db.engine import make_engine, make_sessionmaker, transaction
    from hpc_master.db.migrate import upgrade_to_head
    from tests.webui.seed import seed_experiment, seed_user

    engine = make_engine(f"sqlite:///{path}")
    upgrade_to_head(engine)
    with transaction(make_sessionmaker(engine)) as s:
        alice = seed_user(s, "alice", PASSWORD)
        seed_user(s, "bob", PASSWORD)
        experiment, _ = seed_experiment(s, alice, name="curves", trials=8, points=200, state="ACTIVE")
    engine.dispose()
    return experiment


@dataclass
class Part:
    name: str
    streams: int
    cap: int  # 0: the default
    shared_threads: bool = False


@dataclass
class Result:
    part: Part
    opened: int
    refused: int
    other: int
    me_ms: list[float]
    cpu_pct: float


class Streams:
    """Holds ``n`` streams open from one asyncio thread, reading and dropping what they send."""

    def __init__(self, port: int, path: str, token: str, n: int) -> None:
        self.port, self.path, self.token, self.n = port, path, token, n
        self.statuses: list[int] = []
        self.loop = asyncio.new_event_loop()
        self.opened = threading.Event()
        self._writers: list[asyncio.StreamWriter] = []
        self._readers: set[asyncio.Future[None]] = set()
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._run(),), daemon=True)
        self._stop: asyncio.Event | None = None
        self._thread.start()

    async def _open_one(self) -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            self._writers.append(writer)
            request = f"GET {self.path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {self.token}\r\n\r\n"
            writer.write(request.encode())
            status = await reader.readline()
        except OSError:
            status = b""
        self.statuses.append(int(status.split()[1]) if status else 0)
        if status:
            self._readers.add(asyncio.ensure_future(self._drain(reader)))

    async def _drain(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError):
            while await reader.read(65536):
                pass

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        for start in range(0, self.n, 50):  # 50 at a time: the listen backlog never overflows
            await asyncio.gather(*(self._open_one() for _ in range(min(50, self.n - start))))
        self.opened.set()
        await self._stop.wait()
        for writer in self._writers:
            writer.close()
        for task in self._readers:
            task.cancel()

    def close(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_part(part: Part, db: Path, experiment: int, args: argparse.Namespace, log: Path) -> Result:
    port = free_port()
    mode = "shared" if part.shared_threads else "own"
    argv = [sys.executable, "-c", SERVE, f"sqlite:///{db}", str(port), str(part.cap), mode]
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/api/v1/master", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.1)
        tokens = {}
        for user in ("alice", "bob"):
            r = httpx.post(f"{url}/api/v1/auth/login", json={"username": user, "password": PASSWORD})
            tokens[user] = r.json()["token"]
        path = (
            f"/api/v1/experiments/{experiment}/metrics-stream/trials-sample?metricName=loss&group=training"
            f"&periodSeconds={args.period_s:g}"
        )
        holder = Streams(port, path, tokens["alice"], part.streams) if part.streams else None
        if holder is not None:
            holder.opened.wait(120)
        time.sleep(SETTLE_S)
        times: list[float] = []
        headers = {"Authorization": f"Bearer {tokens['bob']}"}
        with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
            client.get("/api/v1/me")  # the connection, and bob's token in the master's cache
            cpu0, end = cpu_s(proc.pid), time.monotonic() + args.seconds
            started = time.monotonic()
            while time.monotonic() < end or len(times) < 5:
                t0 = time.perf_counter()
                assert client.get("/api/v1/me").status_code == 200
                times.append((time.perf_counter() - t0) * 1000)
                time.sleep(max(0.0, PROBE_EVERY_S - (time.perf_counter() - t0)))
            cpu = 100 * (cpu_s(proc.pid) - cpu0) / (time.monotonic() - started)
        statuses = holder.statuses if holder is not None else []
        if holder is not None:
            holder.close()
        return Result(part, statuses.count(200), statuses.count(429), len(statuses) - statuses.count(200)
                      - statuses.count(429), times, cpu)  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(30)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--period-s", type=float, default=1.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from hpc_master.api.streams import STREAM_THREADS
    from hpc_master.masterconf import SecurityConfig

    default_cap = SecurityConfig().max_streams_per_user
    lifted = args.streams + 1000
    parts = [
        Part("idle", 0, 0),
        Part("shared threads, no cap (as before)", args.streams, lifted, shared_threads=True),
        Part(f"own threads ({STREAM_THREADS}), no cap", args.streams, lifted),
        Part(f"default cap ({default_cap}), own threads", args.streams, 0),
    ]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-streams-") as tmp:
        os.environ.update(HOME=tmp, DET_MASTER_DATA_DIR=tmp, DET_MASTER_STATE_DIR=tmp)
        db = Path(tmp) / "master.db"
        experiment = build_database(db)
        for part in parts:
            results.append(run_part(part, db, experiment, args, Path(tmp) / "master.log"))
            r = results[-1]
            print(f"{part.name}: opened {r.opened}, refused {r.refused}, /me p50 "
                  f"{statistics.median(r.me_ms):.1f} p99 {pct(r.me_ms, 0.99):.1f} ms", flush=True)  # fmt: skip
    idle_p99 = pct(results[0].me_ms, 0.99)
    lines = [
        "| user A's streams | opened / refused (429) / other | B's `/me` p50 / p99 / max (ms) | p99 ÷ idle p99 "
        "| requests | master CPU (% of a core) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        me = r.me_ms
        lines.append(
            f"| {r.part.name} | {r.opened} / {r.refused} / {r.other} | {statistics.median(me):.1f} / "
            f"{pct(me, 0.99):.1f} / {max(me):.1f} | {pct(me, 0.99) / idle_p99:.1f} | {len(me)} | {r.cpu_pct:.0f} |"
        )
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(
            f"# bench/streams.py\n\n{args.streams} streams asked for by user A (`trials-sample`, "
            f"periodSeconds={args.period_s:g}), B's `/me` every {PROBE_EVERY_S * 1000:.0f} ms for "
            f"{args.seconds:g} s per part, {os.cpu_count()} CPUs, SQLite.\n\n{report}\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
