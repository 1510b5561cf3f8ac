"""TensorBoard on a Unix socket: ``python -m harness.exec.serve_tensorboard SOCKET [TENSORBOARD ARG...]``.

TensorBoard has no token of its own and listens on TCP (loopback at best, which every user of the node
reaches). Here its WSGI app is served on `SOCKET` (in a directory only the job's user can enter) by
werkzeug, the server TensorBoard itself uses; ``serve_door`` is the only way in.
"""

from __future__ import annotations

import sys
from typing import Any


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        raise SystemExit("usage: python -m harness.exec.serve_tensorboard SOCKET [TENSORBOARD ARG...]")
    socket_path, extra = args[0], args[1:]
    from tensorboard import default, program
    from werkzeug import serving

    class UnixSocketServer(program.TensorBoardServer):  # type: ignore[misc]
        def __init__(self, wsgi_app: Any, flags: Any) -> None:
            self._server = serving.make_server(f"unix://{socket_path}", 0, wsgi_app, threaded=True)

        def serve_forever(self) -> None:
            self._server.serve_forever()

        def get_url(self) -> str:
            return f"unix://{socket_path}"

    board = program.TensorBoard(plugins=default.get_plugins(), server_class=UnixSocketServer)
    board.configure(argv=["tensorboard", *extra])
    # Not board.main(): that also records a TCP port in the node's shared /tmp/.tensorboard-info for
    # `%tensorboard` to find, and this server has none.
    server = board._make_server()
    sys.stderr.write(f"TensorBoard on {server.get_url()}\n")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
