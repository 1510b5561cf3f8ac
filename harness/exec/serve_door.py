"""The door of a notebook's or TensorBoard's server: the one TCP port of the task on its node.

The server itself listens on a Unix socket in a directory only the job's user can enter, so nothing on the
node, loopback included, reaches it except through this door. The door

- answers ``GET <base>__det_proof__?nonce=N`` with ``HMAC-SHA256(token, N)``: the master proves with it that
  the port it is about to proxy to is this task's server (a port someone else opened cannot answer without
  the token, and the answer gives the token away to no one);
- lets a connection through only when its first request carries ``Authorization: token <token>`` (the master
  adds it to every request it proxies), then splices it to the server both ways (HTTP keep-alive and
  WebSockets included); anything else gets 403.

Standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import socket
import threading
from urllib.parse import parse_qs

PROOF_NAME = "__det_proof__"
HEAD_LIMIT = 64 * 1024
HEAD_TIMEOUT_S = 30.0


def proof(token: str, nonce: str) -> str:
    """What the door answers to `nonce`, and what the master expects."""
    return hmac.new(token.encode(), nonce.encode(), hashlib.sha256).hexdigest()


def _answer(writer: asyncio.StreamWriter, status: str, body: bytes) -> None:
    writer.write(
        f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\nCache-Control: no-store\r\n\r\n".encode()
        + body
    )


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


class Door:
    def __init__(self, token: str, base_url: str, socket_path: str) -> None:
        self.want = f"token {token}".encode()
        self.token = token
        self.proof_path = base_url.rstrip("/") + "/" + PROOF_NAME
        self.socket_path = socket_path

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handle(reader, writer)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            return
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            _answer(writer, "400 Bad Request", b"not an HTTP request\n")
            return
        path, _, query = parts[1].partition("?")
        if path == self.proof_path:
            nonce = parse_qs(query).get("nonce", [""])[0]
            if not 16 <= len(nonce) <= 128:
                _answer(writer, "400 Bad Request", b"a nonce of 16 to 128 characters\n")
            else:
                _answer(writer, "200 OK", proof(self.token, nonce).encode())
            return
        auth = b""
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "authorization":
                auth = value.strip().encode("latin-1")
        if not hmac.compare_digest(auth, self.want):
            _answer(writer, "403 Forbidden", b"this server wants its token\n")
            return
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.socket_path, limit=HEAD_LIMIT)
        except OSError:
            _answer(writer, "502 Bad Gateway", b"the server does not answer\n")
            return
        up_writer.write(head)
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            up_writer.close()


def open_door(token: str, base_url: str, socket_path: str) -> int:
    """Serve the door on every interface, on a port of the system's choosing, from a daemon thread; returns
    the port once it listens."""
    door = Door(token, base_url, socket_path)
    ready = threading.Event()
    port: list[int] = []

    async def serve() -> None:
        server = await asyncio.start_server(door.handle, host="0.0.0.0", port=0, limit=HEAD_LIMIT)
        port.append(int(server.sockets[0].getsockname()[1]))
        ready.set()
        async with server:
            await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(serve()), name="door", daemon=True).start()
    if not ready.wait(30):
        raise SystemExit("error: the door did not open")
    return port[0]


def unix_socket_answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False
