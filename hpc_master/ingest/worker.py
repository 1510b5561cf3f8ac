"""The metrics writer's child process on SQLite: parses plain metric batches and stores them on its own GIL.

At 100 rows per batch the master's ingest is bound by one CPU: the event loop (HTTP, authentication) and the
metrics writer share the interpreter lock, and parsing a batch (``ingest.plain``) plus binding its rows cost
more than the HTTP work. So on SQLite the writer hands the bodies of plain training batches, as the client
sent them, to this process. It parses each body (``plain_training_rows``), stores every group in one
transaction (``sqlite_ingest_raw``, the same SQL as in the master), and answers only after ``COMMIT``, so a
2xx still means "durable". The master's own interpreter is left with HTTP and authentication.

Protocol, over the child's stdin and stdout (little-endian): the child first writes ``b"R"`` once its
database is open. A group is ``<I`` job count, then per job ``<qI`` trial id and body length, and the body.
The answer is ``<I`` job count, then per job ``<Bqq`` status, rows accepted and duplicates. ``OK``: stored.
``NOT_PLAIN``: not the plain form, untouched (the master runs it through pydantic and the ORM). ``FAILED``:
the group was rolled back (a trial that is gone, say), and the master runs each of its batches the ordinary
way, which gives each one its own answer. Ingest is idempotent, so a batch the child may have stored before
it died is stored at most once when the master runs it again.

    python -c "import sys; from hpc_master.ingest.worker import main; sys.exit(main())" DATABASE_FILE
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

OK, NOT_PLAIN, FAILED = 0, 1, 2
_GROUP = struct.Struct("<I")
_JOB = struct.Struct("<qI")
_ANSWER = struct.Struct("<Bqq")
_CHILD = "import sys; from hpc_master.ingest.worker import main; sys.exit(main())"
"""Not ``-m``: that would import this module twice (``hpc_master.api`` imports it through the writer)."""


def _read_exact(stream: IO[bytes], n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise EOFError("the other side of the metrics ingest pipe closed it")
    return data


class IngestWorker:
    """The master's handle on the child process; used by one thread at a time (the metrics writer)."""

    def __init__(self, db_path: str) -> None:
        root = str(Path(__file__).resolve().parents[2])  # so the child imports this checkout
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, db_path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in, self._out = self.proc.stdin, self.proc.stdout
        try:
            if _read_exact(self._out, 1) != b"R":
                raise EOFError("the metrics ingest worker did not start")
        except BaseException:
            self.close()
            raise

    def run(self, jobs: list[tuple[int, bytes]]) -> list[tuple[int, int, int]]:
        """Store ``(trial_id, body)`` batches in one transaction; (status, accepted, duplicates) per batch.
        Raises OSError or EOFError if the child is gone."""
        if not jobs:
            return []
        frame = [_GROUP.pack(len(jobs))]
        for trial_id, body in jobs:
            frame += (_JOB.pack(trial_id, len(body)), body)
        self._in.write(b"".join(frame))
        self._in.flush()
        count = _GROUP.unpack(_read_exact(self._out, _GROUP.size))[0]
        if count != len(jobs):
            raise EOFError(f"the metrics ingest worker answered {count} batches for {len(jobs)}")
        answers = _read_exact(self._out, _ANSWER.size * count)
        return [_ANSWER.unpack_from(answers, i * _ANSWER.size) for i in range(count)]

    def close(self) -> None:
        for stream in (self._in, self._out):
            with contextlib.suppress(OSError):
                stream.close()
        try:
            self.proc.wait(timeout=10)  # it exits at the end of its input
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------- the child


def _store(conn: sqlite3.Connection, jobs: list[tuple[int, bytes]]) -> list[tuple[int, int, int]]:
    from hpc_master.ingest.plain import plain_training_rows
    from hpc_master.services.metrics import sqlite_ingest_raw

    parsed = [(trial_id, plain_training_rows(body, trial_id)) for trial_id, body in jobs]
    answers: list[tuple[int, int, int]] = [(NOT_PLAIN, 0, 0)] * len(jobs)
    if all(rows is None for _, rows in parsed):
        return answers
    conn.execute("BEGIN IMMEDIATE")
    try:
        for i, (trial_id, rows) in enumerate(parsed):
            if rows is not None:
                answers[i] = (OK, *sqlite_ingest_raw(conn, trial_id, rows))
        conn.execute("COMMIT")
    except Exception as e:  # every batch goes back to the master, which answers it
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        print(f"metrics ingest worker: group rolled back: {e}", file=sys.stderr, flush=True)
        return [(FAILED, 0, 0)] * len(jobs)
    return answers


def serve(db_path: str, stdin: IO[bytes], stdout: IO[bytes]) -> None:
    from hpc_master.db.engine import configure_sqlite_connection

    conn = sqlite3.connect(db_path, isolation_level=None)
    configure_sqlite_connection(conn)
    stdout.write(b"R")
    stdout.flush()
    while True:
        head = stdin.read(_GROUP.size)
        if len(head) < _GROUP.size:
            return  # the master closed the pipe (it stopped, or died)
        jobs: list[tuple[int, bytes]] = []
        for _ in range(_GROUP.unpack(head)[0]):
            trial_id, length = _JOB.unpack(_read_exact(stdin, _JOB.size))
            jobs.append((trial_id, _read_exact(stdin, length)))
        answers = _store(conn, jobs)
        stdout.write(_GROUP.pack(len(answers)) + b"".join(_ANSWER.pack(*a) for a in answers))
        stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the master, which then closes the pipe
    out: Any = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but answers on the pipe
    # EOFError, BrokenPipeError: the master went away mid-group; it acknowledged nothing this did not answer.
    with contextlib.suppress(EOFError, BrokenPipeError):
        serve(args[0], sys.stdin.buffer, out)
    return 0
