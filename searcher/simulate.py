"""Run a search method against synthetic learning curves, in memory, in simulated time.

``simulate(method, workload, SimConfig(workers=W))`` plays the master: it executes the method's
actions with ``W`` workers (one trial per worker, FIFO queue for the rest), calls the method's event
handlers as trials reach their ``ValidateAfter`` targets, exit or close, and returns a ``Summary``.
Event-driven: time jumps from one event to the next, so a whole search takes milliseconds.
Runtimes per unit come from the workload (heterogeneous across trials); starting a trial and
resuming a paused one cost ``start_overhead_s`` / ``resume_overhead_s``. Optional failure injection
(``error_rate``, ``invalid_hp_rate``) exercises the early-exit paths.

Anything with the ``SearchMethod`` event methods can be driven (the benchmark drives Optuna that way).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import random
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from searcher.actions import Action, Create, ExitedReason, Pause, Resume, Shutdown, Stop, ValidateAfter


class Driven(Protocol):
    def initial_actions(self) -> list[Action]: ...
    def on_trial_created(self, request_id: str, trial_id: int) -> list[Action]: ...
    def on_validation_completed(self, trial_id: int, metric: float, units_completed: int) -> list[Action]: ...
    def on_trial_exited_early(self, trial_id: int, reason: ExitedReason) -> list[Action]: ...
    def on_trial_closed(self, trial_id: int) -> list[Action]: ...


class Workload(Protocol):
    def metric(self, hparams: Mapping[str, Any], trial_seed: int, units: int) -> float: ...
    def seconds_per_unit(self, hparams: Mapping[str, Any], trial_seed: int) -> float: ...


def _uniform(*parts: Any) -> float:
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "big") / 2.0**64


@dataclass(frozen=True)
class SyntheticCurves:
    """Learning curves for any hyperparameter space: each configuration hashes to a final loss in
    [0.1, 1.0) and an early-phase loss whose rank agrees with the final one by ``correlation``;
    the curve moves from one to the other as ``sqrt(units / horizon)``, plus Gaussian noise."""

    horizon: int
    correlation: float = 0.7
    noise: float = 0.02
    runtime_spread: float = 0.5
    seed: int = 0

    def final(self, hparams: Mapping[str, Any]) -> float:
        return 0.1 + 0.9 * _uniform(self.seed, "final", hparams)

    def metric(self, hparams: Mapping[str, Any], trial_seed: int, units: int) -> float:
        final = self.final(hparams)
        early = self.correlation * final + (1 - self.correlation) * _uniform(self.seed, "early", hparams)
        s = math.sqrt(min(1.0, units / self.horizon))
        jitter = random.Random(_uniform(self.seed, "noise", trial_seed, units)).gauss(0.0, 1.0)
        return s * final + (1 - s) * (0.5 + early) + self.noise * jitter

    def seconds_per_unit(self, hparams: Mapping[str, Any], trial_seed: int) -> float:
        z = random.Random(_uniform(self.seed, "speed", hparams)).gauss(0.0, 1.0)
        return math.exp(self.runtime_spread * z)


@dataclass(frozen=True)
class SimConfig:
    workers: int = 4
    start_overhead_s: float = 0.0
    resume_overhead_s: float = 0.0
    max_time_s: float | None = None
    error_rate: float = 0.0
    invalid_hp_rate: float = 0.0
    seed: int = 0
    max_events: int = 1_000_000
    smaller_is_better: bool = True
    final_length: int | None = None
    """Validations at or beyond this many units count as final results (``best_final_over_time``)."""


@dataclass
class Summary:
    trials_created: int = 0
    trials_closed: int = 0
    trials_paused: int = 0
    trials_resumed: int = 0
    trials_errored: int = 0
    trials_invalid: int = 0
    validations: list[tuple[float, int, int, float]] = field(default_factory=list)
    """(time_s, trial_id, units, metric) for every validation reported."""
    best_over_time: list[tuple[float, float]] = field(default_factory=list)
    """(time_s, best metric so far at any length)."""
    best_final_over_time: list[tuple[float, int, float]] = field(default_factory=list)
    """(time_s, trial_id, best metric so far among final validations)."""
    unit_time_s: float = 0.0
    """Worker time used: training plus start/resume overheads, summed over workers."""
    units_trained: int = 0
    makespan_s: float = 0.0
    max_active_trials: int = 0
    """Most trials the method held active at once (requested or running, not paused or ended)."""
    shutdown: Shutdown | None = None
    truncated: bool = False
    hparams: dict[int, dict[str, Any]] = field(default_factory=dict)
    final_units: dict[int, int] = field(default_factory=dict)


class SimulationError(RuntimeError):
    pass


@dataclass
class _Trial:
    trial_id: int
    hparams: dict[str, Any]
    seed: int
    spu: float
    units: int = 0
    target: int | None = None
    state: str = "idle"  # idle | queued | running | paused | done
    on_worker: bool = False
    resume_pending: bool = False
    started: bool = False
    epoch: int = 0  # invalidates scheduled events when the trial is preempted
    error_at: int | None = None
    invalid: bool = False


_ACTIVE = frozenset({"idle", "queued", "running"})


class _Sim:
    def __init__(self, method: Driven, workload: Workload, cfg: SimConfig) -> None:
        self.method, self.workload, self.cfg = method, workload, cfg
        self.rng = random.Random(cfg.seed)
        self.now = 0.0
        self.events: list[tuple[float, int, str, int, int]] = []
        self.seq = 0
        self.trials: dict[int, _Trial] = {}
        self.requests: dict[str, int] = {}
        self.queue: deque[int] = deque()
        self.free = cfg.workers
        self.summary = Summary()
        self.best = math.inf
        self.best_final = math.inf
        self.busy_since: dict[int, float] = {}
        self.n_active = 0

    def sign(self, metric: float) -> float:
        return metric if self.cfg.smaller_is_better else -metric

    def push(self, at: float, kind: str, trial: _Trial) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, trial.trial_id, trial.epoch))

    def set_state(self, t: _Trial, state: str) -> None:
        self.n_active += (state in _ACTIVE) - (t.state in _ACTIVE)
        t.state = state

    def release(self, t: _Trial) -> None:
        if t.on_worker:
            t.on_worker = False
            self.free += 1
            self.summary.unit_time_s += self.now - self.busy_since.pop(t.trial_id)
        t.epoch += 1

    def apply(self, actions: list[Action]) -> None:
        work = deque(actions)
        while work:
            a = work.popleft()
            if isinstance(a, Create):
                work.extend(self.create(a))
            elif isinstance(a, ValidateAfter):
                self.validate_after(self.trials[a.trial_id], a.length)
            elif isinstance(a, Pause):
                self.pause(self.trials[a.trial_id])
            elif isinstance(a, Resume):
                self.resume(self.trials[a.trial_id])
            elif isinstance(a, Stop):
                work.extend(self.stop(self.trials[a.trial_id]))
            elif isinstance(a, Shutdown):
                self.summary.shutdown = a
            self.summary.max_active_trials = max(self.summary.max_active_trials, self.n_active)

    def create(self, a: Create) -> list[Action]:
        """A new trial, which may be drawn to have invalid hyperparameters or to fail; the method's answer."""
        tid = len(self.trials) + 1
        spu = self.workload.seconds_per_unit(a.hparams, a.trial_seed)
        t = _Trial(tid, dict(a.hparams), a.trial_seed, spu)
        if self.rng.random() < self.cfg.invalid_hp_rate:
            t.invalid = True
        elif self.rng.random() < self.cfg.error_rate:
            t.error_at = self.rng.randint(0, max(1, self.cfg.final_length or 1))
        self.trials[tid] = t
        self.n_active += 1
        self.requests[a.request_id] = tid
        self.summary.trials_created += 1
        self.summary.hparams[tid] = t.hparams
        return self.method.on_trial_created(a.request_id, tid)

    def pause(self, t: _Trial) -> None:
        self.release(t)
        self.set_state(t, "paused")
        t.resume_pending = True
        self.summary.trials_paused += 1

    def resume(self, t: _Trial) -> None:
        if t.state != "paused":
            raise SimulationError(f"Resume of trial {t.trial_id} in state {t.state}")
        self.set_state(t, "idle")
        self.summary.trials_resumed += 1

    def stop(self, t: _Trial) -> list[Action]:
        """Close the trial unless it is closed already; the method's answer."""
        if t.state == "done":
            return []
        self.release(t)
        self.set_state(t, "done")
        return self.close(t)

    def close(self, t: _Trial) -> list[Action]:
        self.summary.trials_closed += 1
        self.summary.final_units[t.trial_id] = t.units
        return self.method.on_trial_closed(t.trial_id)

    def validate_after(self, t: _Trial, length: int) -> None:
        if t.state == "done":
            raise SimulationError(f"ValidateAfter for closed trial {t.trial_id}")
        if t.state == "paused":
            raise SimulationError(f"ValidateAfter for paused trial {t.trial_id} without Resume")
        t.target = length
        if t.on_worker:
            self.set_state(t, "running")
            self.schedule(t, 0.0)
        else:
            self.set_state(t, "queued")
            self.queue.append(t.trial_id)

    def schedule(self, t: _Trial, overhead: float) -> None:
        assert t.target is not None
        if t.invalid:
            self.push(self.now + overhead, "invalid", t)
        elif t.error_at is not None and t.error_at < t.target:
            self.push(self.now + overhead + max(0, t.error_at - t.units) * t.spu, "error", t)
        else:
            self.push(self.now + overhead + max(0, t.target - t.units) * t.spu, "validate", t)

    def dispatch(self) -> None:
        while self.free > 0 and self.queue:
            t = self.trials[self.queue.popleft()]
            if t.state != "queued":
                continue
            self.free -= 1
            t.on_worker = True
            self.set_state(t, "running")
            self.busy_since[t.trial_id] = self.now
            overhead = self.cfg.resume_overhead_s if t.resume_pending else self.cfg.start_overhead_s
            t.resume_pending = False
            self.schedule(t, overhead)

    def on_event(self, kind: str, t: _Trial) -> None:
        if kind == "validate":
            assert t.target is not None
            self.summary.units_trained += t.target - t.units
            t.units = t.target
            metric = self.workload.metric(t.hparams, t.seed, t.units)
            self.record(t, metric)
            actions = self.method.on_validation_completed(t.trial_id, metric, t.units)
            self.apply(actions)
            if t.on_worker and t.state == "running" and t.target == t.units:
                raise SimulationError(f"trial {t.trial_id} got no decision after validating at {t.units}")
            return
        reason = ExitedReason.INVALID_HP if kind == "invalid" else ExitedReason.ERRORED
        if kind == "error":
            assert t.error_at is not None
            self.summary.units_trained += max(0, t.error_at - t.units)
            t.units = max(t.units, t.error_at)
            self.summary.trials_errored += 1
        else:
            self.summary.trials_invalid += 1
        self.release(t)
        self.set_state(t, "done")
        self.apply(self.method.on_trial_exited_early(t.trial_id, reason))
        self.apply(self.close(t))

    def record(self, t: _Trial, metric: float) -> None:
        self.summary.validations.append((self.now, t.trial_id, t.units, metric))
        signed = self.sign(metric)
        if signed < self.best:
            self.best = signed
            self.summary.best_over_time.append((self.now, metric))
        final = self.cfg.final_length
        if final is not None and t.units >= final and signed < self.best_final:
            self.best_final = signed
            self.summary.best_final_over_time.append((self.now, t.trial_id, metric))

    def run(self) -> Summary:
        self.apply(self.method.initial_actions())
        self.dispatch()
        handled = 0
        while self.summary.shutdown is None:
            if not self.events:
                raise SimulationError("no events left and no Shutdown: the search is stuck")
            at, _, kind, tid, epoch = heapq.heappop(self.events)
            if self.cfg.max_time_s is not None and at > self.cfg.max_time_s:
                self.now = self.cfg.max_time_s
                self.summary.truncated = True
                break
            self.now = at
            t = self.trials[tid]
            if epoch != t.epoch or t.state != "running":
                continue
            self.on_event(kind, t)
            self.dispatch()
            handled += 1
            if handled > self.cfg.max_events:
                raise SimulationError(f"more than {self.cfg.max_events} events")
        for t in self.trials.values():
            if t.on_worker:
                self.release(t)
        self.summary.makespan_s = self.now
        return self.summary


def simulate(method: Driven, workload: Workload, config: SimConfig | None = None) -> Summary:
    """Run ``method`` to its ``Shutdown`` (or to ``config.max_time_s``) and summarise."""
    return _Sim(method, workload, config or SimConfig()).run()
