"""What a search method asks the master to do, and the reasons a trial can end early.

Actions are small frozen dataclasses. ``Create`` names the trial-to-be by a *request id* (the master
has not assigned a trial id yet); every other action names a trial by the master's integer trial id,
which the searcher learns from ``on_trial_created(request_id, trial_id)``.

Contract, per trial (the master side):

* ``Create`` → create the trial (state QUEUED), then call ``on_trial_created``. The returned
  ``ValidateAfter`` says how far to train first.
* ``ValidateAfter(trial_id, length)`` → train until the trial's *total* trained units reach
  ``length`` (in the searcher's unit: batches, records, epochs, or the 0.38 ``time_metric``), then
  report a validation with ``on_validation_completed(trial_id, metric, units_completed)``.
  Validations reported before ``length`` are accepted and ignored by the search.
* After each validation that reaches the current target, the search answers with exactly one of
  ``ValidateAfter`` (keep going), ``Pause`` or ``Stop`` for that trial.
* ``Pause`` → checkpoint, let the job exit and free its slots, keep the trial open (PAUSED).
  A later ``Resume`` (always followed by a ``ValidateAfter``) resubmits it from that checkpoint.
* ``Stop`` → the trial is done: checkpoint and exit (or, if paused, just close it), then call
  ``on_trial_closed``. Every trial, however it ends, gets exactly one ``on_trial_closed``.
* ``Shutdown`` → the search is over; it comes after the last ``on_trial_closed``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class ExitedReason(enum.StrEnum):
    """Why a trial ended without the searcher asking it to (Determined's ``ExitedReason``)."""

    ERRORED = "ERRORED"
    """Failed after ``max_restarts``: counts as a finished trial with the worst possible metric."""
    INVALID_HP = "INVALID_HP"
    """The user code raised ``InvalidHP``: the trial does not count and a replacement is created."""
    USER_CANCELED = "USER_CANCELED"
    """Killed by the user: counts as finished with the worst possible metric, but is not a failure."""


@dataclass(frozen=True)
class Create:
    request_id: str
    hparams: Mapping[str, Any]
    trial_seed: int
    proposal: str = "random"
    """Where the hyperparameters came from: ``random`` (sampled), ``model`` (``proposals: model``,
    ``searcher.proposals``), ``grid`` (a grid point) or ``given`` (any other method's own choice)."""


@dataclass(frozen=True)
class ValidateAfter:
    trial_id: int
    length: int


@dataclass(frozen=True)
class Pause:
    trial_id: int


@dataclass(frozen=True)
class Resume:
    trial_id: int


@dataclass(frozen=True)
class Stop:
    trial_id: int


@dataclass(frozen=True)
class Shutdown:
    cancel: bool = False
    failure: bool = False


Action = Create | ValidateAfter | Pause | Resume | Stop | Shutdown

_KINDS: dict[str, type[Action]] = {
    "create": Create,
    "validate_after": ValidateAfter,
    "pause": Pause,
    "resume": Resume,
    "stop": Stop,
    "shutdown": Shutdown,
}
_NAMES = {cls: name for name, cls in _KINDS.items()}


def action_to_dict(action: Action) -> dict[str, Any]:
    """JSON-compatible form, e.g. ``{"kind": "validate_after", "trial_id": 3, "length": 100}``."""
    out: dict[str, Any] = {"kind": _NAMES[type(action)]}
    out.update(vars(action))
    if isinstance(action, Create):
        out["hparams"] = dict(action.hparams)
    return out


def action_from_dict(data: Mapping[str, Any]) -> Action:
    fields = dict(data)
    cls = _KINDS[str(fields.pop("kind"))]
    return cls(**fields)


def describe(action: Action) -> str:
    """One short line for logs."""
    if isinstance(action, Create):
        return f"Create({action.request_id[:8]}, seed={action.trial_seed}, proposal={action.proposal})"
    return repr(action)
