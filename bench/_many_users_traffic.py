"""One researcher's traffic for ``bench/many_users.py``: a thread with its own token and keep-alive client.

Each researcher keeps one experiment of its own live (a new one once the last has ended, at most one per
``create_every_s``), and in between, after a think time, does one of: list its experiments, list everyone's,
describe one of its experiments, list its trials, read a trial's training metrics, or follow a trial's logs for
a few seconds. Every call's latency is recorded per route class; for a log follow, the time to the response
headers (the stream then stays open, which is not latency).
"""

from __future__ import annotations

import base64
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

TERMINAL = {"STATE_COMPLETED", "STATE_CANCELED", "STATE_ERROR", "STATE_DELETED"}
ACTIONS = (  # (route class, weight)
    ("list own experiments", 20),
    ("list all experiments", 10),
    ("describe experiment", 20),
    ("list trials", 20),
    ("trial metrics", 20),
    ("follow logs (headers)", 10),
)

TRIAL_SCRIPT = """\
import time

import determined as det


def main(core_context):
    hp = det.get_cluster_info().trial.hparams
    print("tiny trial starting", flush=True)
    for op in core_context.searcher.operations():
        for step in range(1, op.length + 1):
            time.sleep(hp["sleep_s"])
            loss = hp["lr"] / step
            core_context.train.report_training_metrics(steps_completed=step, metrics={"loss": loss})
            print(f"step {step} loss {loss:.5f}", flush=True)
        core_context.train.report_validation_metrics(
            steps_completed=op.length, metrics={"validation_loss": loss}
        )
        op.report_completed(loss)


if __name__ == "__main__":
    with det.core.init() as core_context:
        main(core_context)
"""


def experiment_config(name: str, searcher: str, steps: int, sleep_s: float, secret: str) -> str:
    """A tiny CPU-only experiment: ``single`` (one trial) or ``random`` (two trials at once)."""
    if searcher == "single":
        search = f"{{name: single, metric: validation_loss, max_length: {{batches: {steps}}}}}"
        lr = "0.01"
    else:
        search = (
            "{name: random, metric: validation_loss, max_trials: 2, max_concurrent_trials: 2, "
            f"max_length: {{batches: {steps}}}}}"
        )
        lr = "{type: double, minval: 0.001, maxval: 0.1}"
    return (
        f"name: {name}\n"
        "entrypoint: python3 tiny.py\n"
        f"hyperparameters: {{sleep_s: {sleep_s}, lr: {lr}}}\n"
        f"searcher: {search}\n"
        "resources: {slots_per_trial: 0}\n"
        "max_restarts: 0\n"
        f'environment: {{environment_variables: ["BENCH_API_TOKEN={secret}"]}}\n'
    )


def model_definition() -> list[dict[str, Any]]:
    content = base64.b64encode(TRIAL_SCRIPT.encode()).decode()
    return [{"path": "tiny.py", "type": 48, "content": content, "mode": 0o644}]


@dataclass
class Calls:
    """Latencies (s) per route class, and failures (status or exception) per route class."""

    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    log_lines: int = 0

    def merge(self, other: Calls) -> None:
        for k, v in other.latency.items():
            self.latency[k].extend(v)
        for k, e in other.errors.items():
            self.errors[k].extend(e)
        self.log_lines += other.log_lines


@dataclass
class Researcher:
    """A master user (``username``) whose jobs run as the Unix account ``unix``."""

    index: int
    username: str
    unix: str
    token: str
    experiments: list[int] = field(default_factory=list)  # created by this user, all levels
    live: int | None = None  # the experiment this user waits on


class UserLoop(threading.Thread):
    def __init__(
        self,
        url: str,
        user: Researcher,
        stop: threading.Event,
        *,
        steps: int,
        sleep_s: float,
        create_every_s: float,
        follow_s: float,
        think_s: tuple[float, float],
        seed: int,
    ) -> None:
        super().__init__(name=f"user-{user.username}", daemon=True)
        self.api = url + "/api/v1"
        self.user = user
        self.stop = stop
        self.steps, self.sleep_s = steps, sleep_s
        self.create_every_s, self.follow_s, self.think_s = create_every_s, follow_s, think_s
        self.rng = random.Random(seed)
        self.calls = Calls()
        self.created: list[int] = []  # during this level
        self.client = httpx.Client(
            headers={"Authorization": f"Bearer {user.token}"}, timeout=httpx.Timeout(60, read=60)
        )

    # ---- one timed call ------------------------------------------------------------------------------
    def call(self, route: str, method: str, path: str, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            r = self.client.request(method, self.api + path, **kw)
        except httpx.HTTPError as e:
            self.calls.errors[route].append(type(e).__name__)
            return None
        self.calls.latency[route].append(time.perf_counter() - t0)
        if r.status_code >= 300:
            self.calls.errors[route].append(str(r.status_code))
            return None
        return r.json()

    def follow_logs(self, trial_id: int) -> None:
        """``GET /trials/{id}/logs?follow=true`` for ``follow_s``: the time to the headers is its latency."""
        route = "follow logs (headers)"
        t0 = time.perf_counter()
        timeout = httpx.Timeout(60, read=self.follow_s)
        try:
            with self.client.stream(
                "GET", f"{self.api}/trials/{trial_id}/logs", params={"follow": "true"}, timeout=timeout
            ) as r:
                self.calls.latency[route].append(time.perf_counter() - t0)
                if r.status_code >= 300:
                    self.calls.errors[route].append(str(r.status_code))
                    return
                deadline = time.monotonic() + self.follow_s
                try:
                    for _line in r.iter_lines():
                        self.calls.log_lines += 1
                        if time.monotonic() > deadline:
                            break
                except httpx.ReadTimeout:
                    pass  # nothing new for follow_s: a quiet trial
        except httpx.HTTPError as e:
            self.calls.errors[route].append(type(e).__name__)

    # ---- the researcher ------------------------------------------------------------------------------
    def create(self) -> None:
        n = len(self.user.experiments) + 1
        searcher = "single" if n % 2 else "random"
        config = experiment_config(
            f"{self.user.username}-{n}", searcher, self.steps, self.sleep_s, f"secret-of-{self.user.unix}"
        )
        body = {"config": config, "modelDefinition": model_definition(), "activate": True}
        answer = self.call("create experiment", "POST", "/experiments", json=body)
        if answer is not None:
            exp_id = int(answer["experiment"]["id"])
            self.user.experiments.append(exp_id)
            self.created.append(exp_id)
            self.user.live = exp_id

    def run(self) -> None:
        next_create = 0.0
        trial_ids: list[int] = []
        names = [a for a, _ in ACTIONS]
        weights = [w for _, w in ACTIONS]
        while not self.stop.is_set():
            now = time.monotonic()
            if self.user.live is None and now >= next_create:
                self.create()
                next_create = now + self.create_every_s
            else:
                action = self.rng.choices(names, weights)[0]
                exp = self.user.live or (self.user.experiments[-1] if self.user.experiments else None)
                if action == "list own experiments":
                    self.call(action, "GET", "/experiments", params={"users": self.user.username, "limit": 20,
                                                                     "orderBy": "ORDER_BY_DESC"})  # fmt: skip
                elif action == "list all experiments":
                    self.call(action, "GET", "/experiments", params={"limit": 50, "orderBy": "ORDER_BY_DESC"})
                elif exp is None:
                    pass
                elif action == "describe experiment":
                    answer = self.call(action, "GET", f"/experiments/{exp}")
                    if answer and exp == self.user.live and answer["experiment"]["state"] in TERMINAL:
                        self.user.live = None
                elif action == "list trials":
                    answer = self.call(action, "GET", f"/experiments/{exp}/trials")
                    if answer:
                        trial_ids = [int(t["id"]) for t in answer["trials"]]
                elif trial_ids and action == "trial metrics":
                    self.call(action, "GET", f"/trials/{self.rng.choice(trial_ids)}/metrics",
                              params={"group": "training"})  # fmt: skip
                elif trial_ids and action == "follow logs (headers)":
                    self.follow_logs(self.rng.choice(trial_ids))
            self.stop.wait(self.rng.uniform(*self.think_s))
        self.client.close()


def trial_log_owner(job_root: Path, exp_id: int) -> list[int]:
    """The uids owning the output logs of an experiment's runs (written by the job, as its Unix account)."""
    return [p.stat().st_uid for p in sorted((job_root / f"exp-{exp_id}").glob("trial-*/run-*/output.log"))]
