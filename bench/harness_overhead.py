"""Overhead of reporting metrics through the harness on every training step.

    .venv/bin/python bench/harness_overhead.py [--quick] [--step-kind busy|sleep]

A loopback HTTP sink in a separate process plays the master (``POST /api/v1/trials/{id}/metrics/batch``). For
steps of ~1 ms, ~10 ms and ~100 ms, the same loop runs without the harness and with
``report_training_metrics()`` every step (plus ``report_progress()``), alternating, and the best steps/s of
the median pair is shown. ``busy`` steps hold the GIL (the worst case for the shipper thread); ``sleep`` steps release it
as torch kernels do. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness._http import MasterSession
from harness.core._metrics import MetricsShipper
from harness.core._train import TrainContext


def _sink(port_q: Any) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: Any) -> None:
            pass

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            raw = json.dumps({"accepted": len(body.get("metrics", []))}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port_q.put(server.server_address[1])
    server.serve_forever()


def _step(step_s: float, kind: str) -> None:
    if kind == "sleep":
        time.sleep(step_s)
        return
    end = time.perf_counter() + step_s
    while time.perf_counter() < end:
        pass


def _run(n: int, step_s: float, kind: str, train: TrainContext | None) -> float:
    start = time.perf_counter()
    for i in range(1, n + 1):
        _step(step_s, kind)
        if train is not None:
            train.report_training_metrics(i, {"loss": 1.0 / i, "accuracy": 0.5})
            train.report_progress(i / n)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--step-kind", choices=["busy", "sleep"], default="busy")
    args = parser.parse_args()
    seconds = 1.0 if args.quick else 4.0
    rounds = 3 if args.quick else 5

    q: Any = multiprocessing.Queue()
    sink = multiprocessing.Process(target=_sink, args=(q,), daemon=True)
    sink.start()
    url = f"http://127.0.0.1:{q.get(timeout=10)}"
    session = MasterSession(url, "token")
    shipper = MetricsShipper(session, 1)
    train = TrainContext(session, 1, 1, 1, shipper)

    rows = []
    for step_ms in (1.0, 10.0, 100.0):
        n = max(10, int(seconds / (step_ms / 1000)))
        pairs = []
        for _ in range(rounds):
            b = _run(n, step_ms / 1000, args.step_kind, None)
            h = _run(n, step_ms / 1000, args.step_kind, train)
            pairs.append((h / b, b, h))
        pairs.sort()
        ratio, base, harn = pairs[len(pairs) // 2]  # the median pair
        rows.append((step_ms, n, base, harn, ratio))
    calls = 20_000
    t0 = time.perf_counter()
    for i in range(calls):
        train.report_training_metrics(i, {"loss": 1.0 / (i + 1), "accuracy": 0.5})
    per_call_us = (time.perf_counter() - t0) / calls * 1e6
    t0 = time.perf_counter()
    shipper.flush(60)
    ship_us = (time.perf_counter() - t0) / calls * 1e6
    sent_ok = shipper.close(30)
    sink.terminate()

    print(
        f"step kind: {args.step_kind}; {rounds} alternating rounds, median pair shown; flushed: {sent_ok}, "
        f"sent {shipper.sent}\n"
    )
    print(
        f"\nreport_training_metrics(): {per_call_us:.1f} µs per call in the training thread; draining "
        f"{calls} queued reports to the sink took {ship_us:.1f} µs per report in the shipper thread.\n"
    )
    print("| step | steps/run | steps/s without harness | steps/s with harness | ratio | overhead |")
    print("|---:|---:|---:|---:|---:|---:|")
    for step_ms, n, base, harn, ratio in rows:
        print(f"| {step_ms:g} ms | {n} | {base:.1f} | {harn:.1f} | {ratio:.4f} | {100 * (1 - ratio):.2f}% |")


if __name__ == "__main__":
    main()
