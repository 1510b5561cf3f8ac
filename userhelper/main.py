"""The helper's loop: JSON requests on stdin, one per line; one answer per line on stdout, in order
(``{"ok": true, …}`` or ``{"ok": false, "kind": …, "error": …}``); it ends at the end of its input."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from userhelper.ops import Helper, RefusedError, errno_of, error_kind

MAX_REQUEST_BYTES = 192 << 20
"""A request's most: a context archive (the master accepts up to 96 MiB) in base64, and its envelope."""
IDLE_TIMEOUT_S = 120
"""A helper that got no request for this long ends (its master's pool starts another when it needs one)."""


def main(argv: list[str]) -> int:
    if len(argv) % 2 or any(flag != "--root" for flag in argv[::2]):
        print("usage: userhelper [--root DIR]... (JSON requests on stdin)", file=sys.stderr)
        return 2
    os.umask(0o027)
    try:
        helper = Helper(argv[1::2])
    except RefusedError as exc:
        print(f"userhelper: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGALRM, lambda *_: os._exit(3))
    stdin = sys.stdin.buffer
    while True:
        signal.alarm(IDLE_TIMEOUT_S)
        line = stdin.readline(MAX_REQUEST_BYTES + 1)
        signal.alarm(0)
        if not line:
            return 0
        answer = answer_to(helper, line)
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


def answer_to(helper: Helper, line: bytes) -> dict[str, Any]:
    if len(line) > MAX_REQUEST_BYTES:
        return {
            "ok": False,
            "kind": "bad_request",
            "error": f"a request is at most {MAX_REQUEST_BYTES} bytes",
        }
    try:
        request = json.loads(line)
        if not isinstance(request, dict):
            raise ValueError("a request is a JSON object")
        return {"ok": True, **helper.handle(request)}
    except Exception as exc:  # every failure is an answer: the next request still gets its own
        text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if isinstance(exc, OSError) and exc.filename:
            text = f"{exc.filename}: {text}"
        return {"ok": False, "kind": error_kind(exc), "errno": errno_of(exc), "error": text}
