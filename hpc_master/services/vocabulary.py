"""The words the web UI shows and the choices it offers, read from the master's own tables so that the UI never
re-types them: the states one can filter by, which actions each experiment state allows (from
``EXPERIMENT_TRANSITIONS``, the table the actions themselves are checked against), and what each way a run can
end is called (``TERMINATION_TABLE``'s messages)."""

from __future__ import annotations

from hpc_master.services.states import (
    EXPERIMENT_TRANSITIONS,
    TERMINAL_EXPERIMENT_STATES,
    TERMINATION_TABLE,
    ExperimentState,
    RunState,
    TrialState,
)

_E = ExperimentState
# An action is offered in a state when the transition it makes is in the table.
_ACTION_TARGET: dict[str, ExperimentState] = {
    "pause": _E.PAUSED,
    "activate": _E.ACTIVE,
    "cancel": _E.STOPPING_CANCELED,
    "kill": _E.STOPPING_KILLED,
}


def experiment_actions(state: ExperimentState) -> list[str]:
    """What the owner (or an admin) may do to an experiment in ``state``: the UI's buttons. Only a finished
    experiment archives; an archived one unarchives in any state (``set_archived``)."""
    actions = [a for a, target in _ACTION_TARGET.items() if target in EXPERIMENT_TRANSITIONS[state]]
    if state in TERMINAL_EXPERIMENT_STATES:
        actions.append("archive")
    return actions


def vocabulary() -> dict[str, object]:
    return {
        "experimentStates": [s.value for s in ExperimentState],
        "trialStates": [s.value for s in TrialState],
        "runStates": [s.value for s in RunState],
        "experimentActions": {s.value: experiment_actions(s) for s in ExperimentState},
        "terminationReasons": {reason.value: t.message for reason, t in TERMINATION_TABLE.items()},
    }
