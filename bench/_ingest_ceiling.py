"""The HTTP ceiling for ``bench/metrics_ingest.py``: the same server stack as the master (uvicorn, one process,
uvloop + httptools) running an ASGI app that only reads the batch body, parses its JSON and answers how many
rows it held. No routing, no authentication, no validation, no database: no ingest route on this stack can
accept more rows per second than this, on the same machine with the same clients.

    python bench/_ingest_ceiling.py PORT
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    rows = len(json.loads(b"".join(chunks)).get("metrics", [])) if scope["method"] == "POST" else 0
    body = json.dumps({"accepted": rows, "duplicates": 0}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
