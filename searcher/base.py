"""The shell every search method shares: events in, actions out, JSON snapshots.

A method's algorithm (``Algorithm`` subclasses in ``random_search.py``, ``asha.py``, ...) speaks only
in *request ids* and emits ``Create`` plus ``TrialOp`` (validate_after / pause / resume / stop), the
way Determined's search methods do. ``SearchMethod`` is what the master holds: it maps request ids to
the master's trial ids, holds back trial operations until ``on_trial_created`` names the trial,
drops operations on trials that already ended, flips the metric sign for ``smaller_is_better: false``,
emits ``Shutdown`` after the last trial closes, and snapshots everything, RNG included, to JSON.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from searcher import hparams
from searcher.actions import Action, Create, ExitedReason, Pause, Resume, Shutdown, Stop, ValidateAfter
from searcher.config import SearcherConfig

SNAPSHOT_FORMAT = "hpc-det-searcher/1"
WORST_METRIC = sys.float_info.max
"""Metric recorded for trials that exited early (Determined's ``ashaExitedMetricValue``)."""

OpKind = Literal["validate_after", "pause", "resume", "stop"]


@dataclass(frozen=True)
class TrialOp:
    """An operation on a trial, named by request id (internal to the searcher)."""

    kind: OpKind
    request_id: str
    length: int = 0


Op = Create | TrialOp


def validate_after(request_id: str, length: int) -> TrialOp:
    return TrialOp("validate_after", request_id, length)


def pause(request_id: str) -> TrialOp:
    return TrialOp("pause", request_id)


def resume(request_id: str) -> TrialOp:
    return TrialOp("resume", request_id)


def stop(request_id: str) -> TrialOp:
    return TrialOp("stop", request_id)


class Context:
    """What an algorithm may draw on: the experiment's seeded RNG and its hyperparameter space."""

    def __init__(self, rng: random.Random, space: hparams.Space) -> None:
        self.rng = rng
        self.space = space

    def create(self, sample: Mapping[str, Any] | None = None, proposal: str = "given") -> Create:
        """A new trial request: hyperparameters (sampled unless given), request id, trial seed.
        ``proposal`` names where a given sample came from (a sampled one is ``random``)."""
        hp = dict(sample) if sample is not None else hparams.sample(self.space, self.rng)
        request_id = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        return Create(
            request_id=request_id,
            hparams=hp,
            trial_seed=self.rng.randrange(2**31),
            proposal=proposal if sample is not None else "random",
        )


class Algorithm(ABC):
    """One search method's decisions. Metrics arrive sign-normalised: smaller is always better."""

    name: ClassVar[str]

    @abstractmethod
    def initial(self, ctx: Context) -> list[Op]: ...

    def created(self, ctx: Context, request_id: str) -> list[Op]:
        return []

    @abstractmethod
    def validated(self, ctx: Context, request_id: str, metric: float, units: int) -> list[Op]:
        """Called once per trial each time it reaches its current ``validate_after`` target."""

    @abstractmethod
    def exited_early(self, ctx: Context, request_id: str, reason: ExitedReason) -> list[Op]: ...

    def closed(self, ctx: Context, request_id: str) -> list[Op]:
        return []

    @abstractmethod
    def progress(self, units: Mapping[str, int], closed: set[str], invalid: set[str]) -> float: ...

    @abstractmethod
    def get_state(self) -> dict[str, Any]: ...

    @abstractmethod
    def set_state(self, state: Mapping[str, Any]) -> None: ...


@dataclass
class _Trial:
    """The shell's view of one requested trial."""

    request_id: str
    trial_id: int | None = None
    status: str = "requested"  # requested | running | paused | stopping | exited | closed
    target: int | None = None
    units: int = 0
    exit_reason: str | None = None

    def to_list(self) -> list[Any]:
        return [self.request_id, self.trial_id, self.status, self.target, self.units, self.exit_reason]


def config_digest(config: SearcherConfig, space: hparams.Space) -> str:
    parts = [repr(config), repr(space)]
    if config.proposals != "random":
        parts.append(f"proposals={config.proposals}")  # so that snapshots of earlier searches still match
    blob = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class SearchMethod:
    """What the master drives. Every handler returns the actions to execute, in order."""

    def __init__(self, config: SearcherConfig, space: hparams.Space, algorithm: Algorithm, seed: int) -> None:
        self.config = config
        self.algorithm = algorithm
        self._ctx = Context(random.Random(seed), space)
        self._digest = config_digest(config, space)
        self._trials: dict[str, _Trial] = {}
        self._by_trial_id: dict[int, str] = {}
        self._held: list[TrialOp] = []
        self._shutdown = False
        self._started = False

    # ---- events -------------------------------------------------------------------------------
    def initial_actions(self) -> list[Action]:
        if self._started:
            raise RuntimeError("initial_actions() may be called once")
        self._started = True
        actions = self._emit(self.algorithm.initial(self._ctx))
        return actions + self._maybe_shutdown()

    def on_trial_created(self, request_id: str, trial_id: int) -> list[Action]:
        trial = self._trials.get(request_id)
        if trial is None or trial.trial_id is not None:
            raise ValueError(f"on_trial_created: unknown or already created request {request_id!r}")
        trial.trial_id = trial_id
        self._by_trial_id[trial_id] = request_id
        held = [op for op in self._held if op.request_id == request_id]
        self._held = [op for op in self._held if op.request_id != request_id]
        return self._emit(held + self.algorithm.created(self._ctx, request_id))

    def on_validation_completed(self, trial_id: int, metric: float, units_completed: int) -> list[Action]:
        trial = self._trial(trial_id)
        trial.units = max(trial.units, int(units_completed))
        if trial.status != "running" or trial.target is None or units_completed < trial.target:
            return []
        trial.target = None
        signed = _sanitise(metric if self.config.smaller_is_better else -metric)
        ops = self.algorithm.validated(self._ctx, trial.request_id, signed, int(units_completed))
        decisions = [op for op in ops if isinstance(op, TrialOp) and op.request_id == trial.request_id]
        if not decisions:
            raise RuntimeError(f"{self.algorithm.name}: no decision for trial {trial_id} after validation")
        return self._emit(ops)

    def on_trial_exited_early(self, trial_id: int, reason: ExitedReason | str) -> list[Action]:
        trial = self._trial(trial_id)
        if trial.status in ("exited", "closed"):
            return []
        trial.status, trial.exit_reason, trial.target = "exited", ExitedReason(reason).value, None
        return self._emit(self.algorithm.exited_early(self._ctx, trial.request_id, ExitedReason(reason)))

    def on_trial_closed(self, trial_id: int) -> list[Action]:
        trial = self._trial(trial_id)
        if trial.status == "closed":
            return []
        trial.status, trial.target = "closed", None
        actions = self._emit(self.algorithm.closed(self._ctx, trial.request_id))
        return actions + self._maybe_shutdown()

    # ---- queries ------------------------------------------------------------------------------
    def progress(self) -> float:
        if self._shutdown:
            return 1.0
        closed = {rid for rid, t in self._trials.items() if t.status == "closed"}
        invalid = {rid for rid, t in self._trials.items() if t.exit_reason == ExitedReason.INVALID_HP}
        units = {rid: t.units for rid, t in self._trials.items()}
        value = self.algorithm.progress(units, closed, invalid)
        return 0.0 if math.isnan(value) else min(1.0, max(0.0, value))

    @property
    def is_shutdown(self) -> bool:
        return self._shutdown

    def running_trials(self) -> int:
        """Trials the searcher currently wants to hold resources (requested/running, not paused)."""
        return sum(t.status in ("requested", "running") for t in self._trials.values())

    def trials_requested(self) -> int:
        return len(self._trials)

    def target_of(self, trial_id: int) -> int | None:
        return self._trial(trial_id).target

    def request_id_of(self, trial_id: int) -> str:
        return self._by_trial_id[trial_id]

    # ---- snapshots ----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        version, internal, gauss = self._ctx.rng.getstate()
        return {
            "format": SNAPSHOT_FORMAT,
            "method": self.algorithm.name,
            "config_digest": self._digest,
            "rng": [version, list(internal), gauss],
            "started": self._started,
            "shutdown": self._shutdown,
            "trials": [t.to_list() for t in self._trials.values()],
            "held": [[op.kind, op.request_id, op.length] for op in self._held],
            "algorithm": self.algorithm.get_state(),
        }

    def restore(self, snap: Mapping[str, Any]) -> None:
        if snap.get("format") != SNAPSHOT_FORMAT or snap.get("method") != self.algorithm.name:
            raise ValueError(f"snapshot is not a {self.algorithm.name} searcher snapshot ({SNAPSHOT_FORMAT})")
        if snap.get("config_digest") != self._digest:
            raise ValueError("snapshot was taken with a different searcher config or hyperparameter space")
        version, internal, gauss = snap["rng"]
        self._ctx.rng.setstate((version, tuple(internal), gauss))
        self._started, self._shutdown = bool(snap["started"]), bool(snap["shutdown"])
        self._trials = {row[0]: _Trial(*row) for row in snap["trials"]}
        self._by_trial_id = {t.trial_id: rid for rid, t in self._trials.items() if t.trial_id is not None}
        self._held = [TrialOp(kind, rid, length) for kind, rid, length in snap["held"]]
        self.algorithm.set_state(snap["algorithm"])

    # ---- internals ----------------------------------------------------------------------------
    def _trial(self, trial_id: int) -> _Trial:
        try:
            return self._trials[self._by_trial_id[trial_id]]
        except KeyError:
            raise ValueError(f"unknown trial id {trial_id}") from None

    def _emit(self, ops: Sequence[Op]) -> list[Action]:
        out: list[Action] = []
        for op in ops:
            if isinstance(op, Create):
                self._trials[op.request_id] = _Trial(op.request_id)
                out.append(op)
                continue
            trial = self._trials[op.request_id]
            if trial.status in ("exited", "closed", "stopping"):
                continue
            if trial.trial_id is None:
                self._held.append(op)
                continue
            out.append(self._apply(trial, op, trial.trial_id))
        return out

    def _apply(self, trial: _Trial, op: TrialOp, trial_id: int) -> Action:
        if op.kind == "validate_after":
            trial.status, trial.target = "running", op.length
            return ValidateAfter(trial_id, op.length)
        trial.target = None
        if op.kind == "pause":
            trial.status = "paused"
            return Pause(trial_id)
        if op.kind == "resume":
            trial.status = "running"
            return Resume(trial_id)
        trial.status = "stopping"
        return Stop(trial_id)

    def _maybe_shutdown(self) -> list[Action]:
        if self._shutdown or any(t.status != "closed" for t in self._trials.values()):
            return []
        self._shutdown = True
        reasons = [t.exit_reason for t in self._trials.values()]
        valid = [r for r in reasons if r != ExitedReason.INVALID_HP]
        failure = bool(valid) and all(r == ExitedReason.ERRORED for r in valid)
        return [Shutdown(cancel=False, failure=failure)]


def _sanitise(metric: float) -> float:
    if math.isnan(metric):
        return WORST_METRIC
    return min(WORST_METRIC, max(-WORST_METRIC, float(metric)))
