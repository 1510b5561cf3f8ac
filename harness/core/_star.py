"""A small TCP star for the Core API's collectives: the chief listens, every worker connects once.

Frames are an 8-byte big-endian length followed by a pickle. A worker's first frame is a handshake carrying an
HMAC of the job's shared secret and its id, checked before anything is unpickled, so a stray connection cannot
feed the chief pickles. Determined uses ZMQ PUB/PULL for this; the semantics (gather to the chief in rank order,
broadcast from it) are the same.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import socket
import struct
import time
from typing import Any

_LEN = struct.Struct(">Q")
_MAGIC = b"hpcdet-star-1"


def get_secret() -> bytes:
    """Shared secret of this job's ranks: ``DET_DIST_SECRET``, else derived from the session token / job id."""
    for name in ("DET_DIST_SECRET", "DET_SESSION_TOKEN", "SLURM_JOB_ID"):
        raw = os.environ.get(name)
        if raw:
            return hashlib.sha256(name.encode() + b"=" + raw.encode()).digest()
    return b""


def _handshake(secret: bytes, ident: int) -> bytes:
    return hmac.new(secret, _MAGIC + _LEN.pack(ident), hashlib.sha256).digest()


def send_bytes(sock: socket.socket, payload: bytes) -> None:
    if len(payload) < 65536:  # one segment for the small frames that collectives mostly carry
        sock.sendall(_LEN.pack(len(payload)) + payload)
    else:
        sock.sendall(_LEN.pack(len(payload)))
        sock.sendall(payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k
    return bytes(buf)


def recv_bytes(sock: socket.socket) -> bytes:
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    return _recv_exact(sock, n)


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class StarServer:
    """The chief's end: ``listen()`` then ``accept_all()``; workers are ids ``1..num_workers``."""

    def __init__(self, num_workers: int, host: str, port: int, secret: bytes) -> None:
        self.num_workers = num_workers
        self._secret = secret
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(max(num_workers, 16))
        self.port: int = self._listener.getsockname()[1]
        self._conns: list[socket.socket] = []

    def accept_all(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        by_id: dict[int, socket.socket] = {}
        while len(by_id) < self.num_workers:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"only {len(by_id)} of {self.num_workers} workers connected to the chief on port "
                    f"{self.port} within {timeout_s:.0f}s"
                )
            self._listener.settimeout(left)
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(30.0)
            try:
                (ident,) = _LEN.unpack(_recv_exact(conn, _LEN.size))
                mac = _recv_exact(conn, 32)
            except (OSError, ConnectionError):
                conn.close()
                continue
            good = hmac.compare_digest(mac, _handshake(self._secret, ident))
            if not good or not 1 <= ident <= self.num_workers or ident in by_id:
                conn.close()
                continue
            conn.settimeout(None)
            _tune(conn)
            by_id[ident] = conn
        self._conns = [by_id[i] for i in range(1, self.num_workers + 1)]
        self._listener.close()

    def gather(self) -> list[Any]:
        """One object from every worker, in worker-id order."""
        out = []
        for i, conn in enumerate(self._conns):
            try:
                out.append(pickle.loads(recv_bytes(conn)))
            except (OSError, ConnectionError) as e:
                raise ConnectionError(f"lost worker {i + 1} during a collective: {e}") from None
        return out

    def broadcast(self, obj: Any) -> None:
        payload = dumps(obj)
        for i, conn in enumerate(self._conns):
            try:
                send_bytes(conn, payload)
            except OSError as e:
                raise ConnectionError(f"lost worker {i + 1} during a collective: {e}") from None

    def close(self) -> None:
        for conn in self._conns:
            conn.close()
        self._conns = []
        self._listener.close()


class StarClient:
    """A worker's end: connects to the chief (retrying until it is up) and sends its handshake."""

    def __init__(self, host: str, port: int, ident: int, secret: bytes, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        delay = 0.01
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=max(1.0, deadline - time.monotonic()))
                break
            except OSError as e:
                if time.monotonic() + delay > deadline:
                    raise TimeoutError(f"could not reach the chief at {host}:{port}: {e}") from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        sock.settimeout(None)
        _tune(sock)
        sock.sendall(_LEN.pack(ident) + _handshake(secret, ident))
        self._sock = sock

    def send(self, obj: Any) -> None:
        try:
            send_bytes(self._sock, dumps(obj))
        except OSError as e:
            raise ConnectionError(f"lost the chief during a collective: {e}") from None

    def recv(self) -> Any:
        try:
            return pickle.loads(recv_bytes(self._sock))
        except (OSError, ConnectionError) as e:
            raise ConnectionError(f"lost the chief during a collective: {e}") from None

    def close(self) -> None:
        self._sock.close()
