"""State vocabularies and the explicit tables that govern them.

Experiments and trials use Determined's states. A trial's Slurm job is a *trial run* with its own small state
machine. Why a run ended is a :class:`TerminationReason`; :data:`TERMINATION_TABLE` maps each reason to the run's
final state, what happens to the trial, whether it is resubmitted, and the message shown to the user.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ExperimentState(enum.StrEnum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    STOPPING_CANCELED = "STOPPING_CANCELED"
    STOPPING_KILLED = "STOPPING_KILLED"
    STOPPING_COMPLETED = "STOPPING_COMPLETED"
    STOPPING_ERROR = "STOPPING_ERROR"
    COMPLETED = "COMPLETED"
    CANCELED = "CANCELED"
    ERROR = "ERROR"
    DELETING = "DELETING"
    DELETE_FAILED = "DELETE_FAILED"


class TrialState(enum.StrEnum):
    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    STOPPING_CANCELED = "STOPPING_CANCELED"
    STOPPING_KILLED = "STOPPING_KILLED"
    STOPPING_COMPLETED = "STOPPING_COMPLETED"
    STOPPING_ERROR = "STOPPING_ERROR"
    COMPLETED = "COMPLETED"
    CANCELED = "CANCELED"
    ERROR = "ERROR"


class RunState(enum.StrEnum):
    PENDING = "PENDING"
    """Submitted to Slurm, not started yet."""
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    PREEMPTED = "PREEMPTED"
    """Exited after checkpointing because it was asked to (Slurm preemption, time limit, pause)."""
    FAILED = "FAILED"
    CANCELED = "CANCELED"


TERMINAL_EXPERIMENT_STATES = frozenset(
    {ExperimentState.COMPLETED, ExperimentState.CANCELED, ExperimentState.ERROR}
)
STOPPING_EXPERIMENT_STATES = frozenset(
    {
        ExperimentState.STOPPING_CANCELED,
        ExperimentState.STOPPING_KILLED,
        ExperimentState.STOPPING_COMPLETED,
        ExperimentState.STOPPING_ERROR,
    }
)
TERMINAL_TRIAL_STATES = frozenset({TrialState.COMPLETED, TrialState.CANCELED, TrialState.ERROR})
LIVE_RUN_STATES = frozenset({RunState.PENDING, RunState.RUNNING})

_E = ExperimentState
EXPERIMENT_TRANSITIONS: dict[ExperimentState, frozenset[ExperimentState]] = {
    _E.ACTIVE: frozenset(
        {
            _E.PAUSED,
            _E.STOPPING_CANCELED,
            _E.STOPPING_KILLED,
            _E.STOPPING_COMPLETED,
            _E.STOPPING_ERROR,
            _E.COMPLETED,
            _E.CANCELED,
            _E.ERROR,
        }
    ),
    _E.PAUSED: frozenset(
        {_E.ACTIVE, _E.STOPPING_CANCELED, _E.STOPPING_KILLED, _E.STOPPING_ERROR, _E.CANCELED, _E.ERROR}
    ),
    _E.STOPPING_CANCELED: frozenset({_E.STOPPING_KILLED, _E.CANCELED, _E.ERROR}),
    _E.STOPPING_KILLED: frozenset({_E.CANCELED, _E.ERROR}),
    _E.STOPPING_COMPLETED: frozenset({_E.STOPPING_CANCELED, _E.STOPPING_KILLED, _E.COMPLETED, _E.ERROR}),
    _E.STOPPING_ERROR: frozenset({_E.STOPPING_KILLED, _E.ERROR}),
    _E.COMPLETED: frozenset({_E.DELETING}),
    _E.CANCELED: frozenset({_E.DELETING}),
    _E.ERROR: frozenset({_E.DELETING}),
    _E.DELETING: frozenset({_E.DELETE_FAILED}),
    _E.DELETE_FAILED: frozenset({_E.DELETING}),
}

_T = TrialState
TRIAL_TRANSITIONS: dict[TrialState, frozenset[TrialState]] = {
    _T.ACTIVE: frozenset(
        {
            _T.PAUSED,
            _T.STOPPING_CANCELED,
            _T.STOPPING_KILLED,
            _T.STOPPING_COMPLETED,
            _T.STOPPING_ERROR,
            _T.COMPLETED,
            _T.CANCELED,
            _T.ERROR,
        }
    ),
    _T.PAUSED: frozenset(
        {
            _T.ACTIVE,
            _T.STOPPING_CANCELED,
            _T.STOPPING_KILLED,
            _T.STOPPING_COMPLETED,
            _T.COMPLETED,
            _T.CANCELED,
            _T.ERROR,
        }
    ),
    _T.STOPPING_CANCELED: frozenset({_T.STOPPING_KILLED, _T.CANCELED, _T.ERROR}),
    _T.STOPPING_KILLED: frozenset({_T.CANCELED, _T.ERROR}),
    _T.STOPPING_COMPLETED: frozenset({_T.STOPPING_CANCELED, _T.STOPPING_KILLED, _T.COMPLETED, _T.ERROR}),
    _T.STOPPING_ERROR: frozenset({_T.STOPPING_KILLED, _T.ERROR}),
    _T.COMPLETED: frozenset(),
    _T.CANCELED: frozenset(),
    _T.ERROR: frozenset(),
}

_R = RunState
RUN_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    _R.PENDING: frozenset({_R.RUNNING, _R.COMPLETED, _R.PREEMPTED, _R.FAILED, _R.CANCELED}),
    _R.RUNNING: frozenset({_R.COMPLETED, _R.PREEMPTED, _R.FAILED, _R.CANCELED}),
    _R.COMPLETED: frozenset(),
    _R.PREEMPTED: frozenset(),
    _R.FAILED: frozenset(),
    _R.CANCELED: frozenset(),
}

# A trial that is stopping ends in this state whatever its job's outcome.
STOPPING_TRIAL_END: dict[TrialState, TrialState] = {
    _T.STOPPING_CANCELED: _T.CANCELED,
    _T.STOPPING_KILLED: _T.CANCELED,
    _T.STOPPING_COMPLETED: _T.COMPLETED,
    _T.STOPPING_ERROR: _T.ERROR,
}
STOPPING_EXPERIMENT_END: dict[ExperimentState, ExperimentState] = {
    _E.STOPPING_CANCELED: _E.CANCELED,
    _E.STOPPING_KILLED: _E.CANCELED,
    _E.STOPPING_COMPLETED: _E.COMPLETED,
    _E.STOPPING_ERROR: _E.ERROR,
}


class Retry(enum.StrEnum):
    NEVER = "NEVER"
    RESUBMIT = "RESUBMIT"
    """Resubmit from the latest checkpoint at once; does not count against ``max_restarts``."""
    RESTART = "RESTART"
    """Resubmit from the latest checkpoint if ``restarts < max_restarts`` (counts one restart)."""
    ON_ACTIVATE = "ON_ACTIVATE"
    """Resubmit when the trial is activated again (user or searcher pause)."""


class TerminationReason(enum.StrEnum):
    SEARCHER_DONE = "SEARCHER_DONE"
    EARLY_EXIT_INVALID_HP = "EARLY_EXIT_INVALID_HP"
    EARLY_EXIT_USER_STOP = "EARLY_EXIT_USER_STOP"
    SLURM_PREEMPTED = "SLURM_PREEMPTED"
    TIME_LIMIT_CHECKPOINTED = "TIME_LIMIT_CHECKPOINTED"
    PAUSED_BY_USER = "PAUSED_BY_USER"
    PAUSED_BY_SEARCHER = "PAUSED_BY_SEARCHER"
    PAUSE_CALLED_OFF = "PAUSE_CALLED_OFF"
    CANCELED_BY_USER = "CANCELED_BY_USER"
    KILLED_BY_USER = "KILLED_BY_USER"
    NONZERO_EXIT = "NONZERO_EXIT"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    TIME_LIMIT = "TIME_LIMIT"
    JOB_LOST = "JOB_LOST"
    SUBMIT_FAILED = "SUBMIT_FAILED"


@dataclass(frozen=True)
class Termination:
    run_state: RunState
    trial_state: TrialState | None
    """Where the trial goes; None means it stays ACTIVE (to be resubmitted) or ERROR once out of restarts.
    `next_step` reads this against the trial's and the searcher's state."""
    retry: Retry
    message: str


_X = TerminationReason
TERMINATION_TABLE: dict[TerminationReason, Termination] = {
    _X.SEARCHER_DONE: Termination(_R.COMPLETED, _T.COMPLETED, Retry.NEVER, "trial completed"),
    _X.EARLY_EXIT_INVALID_HP: Termination(
        _R.COMPLETED, _T.COMPLETED, Retry.NEVER, "trial exited early: invalid hyperparameters"
    ),
    _X.EARLY_EXIT_USER_STOP: Termination(
        _R.COMPLETED, _T.COMPLETED, Retry.NEVER, "trial exited early at the user's request"
    ),
    _X.SLURM_PREEMPTED: Termination(_R.PREEMPTED, None, Retry.RESUBMIT, "preempted by Slurm"),
    _X.TIME_LIMIT_CHECKPOINTED: Termination(
        _R.PREEMPTED,
        None,
        Retry.RESUBMIT,
        "reached the job time limit",
    ),
    _X.PAUSED_BY_USER: Termination(_R.PREEMPTED, _T.PAUSED, Retry.ON_ACTIVATE, "paused by the user"),
    _X.PAUSED_BY_SEARCHER: Termination(
        _R.PREEMPTED, _T.PAUSED, Retry.ON_ACTIVATE, "paused by the searcher until promoted"
    ),
    _X.PAUSE_CALLED_OFF: Termination(
        _R.PREEMPTED,
        None,
        Retry.RESUBMIT,
        "resumed while its job was already stopping for a pause",
    ),
    _X.CANCELED_BY_USER: Termination(_R.CANCELED, _T.CANCELED, Retry.NEVER, "canceled by the user"),
    _X.KILLED_BY_USER: Termination(_R.CANCELED, _T.CANCELED, Retry.NEVER, "killed by the user"),
    _X.NONZERO_EXIT: Termination(_R.FAILED, None, Retry.RESTART, "the job exited with a non-zero status"),
    _X.NODE_FAIL: Termination(_R.FAILED, None, Retry.RESTART, "a node of the job failed"),
    _X.OUT_OF_MEMORY: Termination(_R.FAILED, None, Retry.RESTART, "the job ran out of memory"),
    _X.TIME_LIMIT: Termination(
        _R.FAILED, None, Retry.RESTART, "the job hit its time limit without checkpointing"
    ),
    _X.JOB_LOST: Termination(_R.FAILED, None, Retry.RESTART, "Slurm no longer knows the job"),
    _X.SUBMIT_FAILED: Termination(_R.FAILED, _T.ERROR, Retry.NEVER, "the job could not be submitted"),
}

EARLY_EXIT_REASONS: dict[str, TerminationReason] = {
    "EXITED_REASON_INVALID_HP": TerminationReason.EARLY_EXIT_INVALID_HP,
    "EXITED_REASON_USER_REQUESTED_STOP": TerminationReason.EARLY_EXIT_USER_STOP,
    "EXITED_REASON_UNSPECIFIED": TerminationReason.NONZERO_EXIT,
}


class Next(enum.StrEnum):
    """The three ways a run's end may leave its trial: every (reason × trial state × searcher state) gives one."""

    RESUBMIT = "RESUBMIT"
    """ACTIVE with a new run queued (from the latest checkpoint)."""
    WAIT = "WAIT"
    """PAUSED, with the user (``det e activate``) or the searcher (a promotion) to resume it."""
    END = "END"
    """A terminal state."""


@dataclass(frozen=True)
class NextStep:
    next: Next
    trial_state: TrialState
    pause_reason: TerminationReason | None = None
    """Why a trial that waits is paused: who resumes it (the user or the searcher)."""
    counts_restart: bool = False
    note: str = ""
    """What happens next when the row alone does not say (resubmitted, or why the trial goes elsewhere),
    shown after the row's message."""


# A trial whose experiment is stopping (with no stop of its own recorded) ends as the experiment will.
EXPERIMENT_STOPPING_TRIAL_END: dict[ExperimentState, TrialState] = {
    _E.STOPPING_CANCELED: _T.CANCELED,
    _E.STOPPING_KILLED: _T.CANCELED,
    _E.STOPPING_COMPLETED: _T.COMPLETED,
    _E.STOPPING_ERROR: _T.ERROR,
}


def next_step(
    reason: TerminationReason,
    trial_state: TrialState,
    experiment_state: ExperimentState,
    *,
    searcher_done: bool,
    pause_reason: str | None,
    restarts: int,
    max_restarts: int,
) -> NextStep:
    """Where a trial goes when its run ends: the termination table's row for `reason`, read against the
    trial's and the searcher's state. Pure; the one place that decides, so that no combination leaves an
    ACTIVE trial with neither a live run nor a place in the submit queue (a run that "resubmits" a trial the
    searcher is done with used to do exactly that: ACTIVE forever, nothing submitted).

    In order: a stopping trial ends as asked; a row with a terminal state applies; a trial the searcher is
    done with completes, however its last job ended (its work was done: as in Determined, a trial whose
    search is complete is COMPLETED on exit); a stopping experiment takes its trials along; a failure with no
    restarts left is an ERROR; a paused trial, or one whose pause the searcher or the user asked for, waits;
    a trial of an experiment that is not ACTIVE waits for the user; anything else is resubmitted.
    """
    term = TERMINATION_TABLE[reason]
    ended = _end_regardless(term, trial_state, experiment_state, searcher_done=searcher_done)
    if ended is not None:
        return ended
    restart = term.retry == Retry.RESTART
    if restart and restarts >= max_restarts:
        return NextStep(Next.END, _T.ERROR, note="out of restarts")
    if trial_state == _T.PAUSED:
        # Paused while the job ran: resumed on activate (or promotion), whatever else ended the job.
        return NextStep(Next.WAIT, _T.PAUSED, _pause_reason(pause_reason), counts_restart=restart)
    if term.trial_state == _T.PAUSED:
        return NextStep(Next.WAIT, _T.PAUSED, reason, counts_restart=restart)
    if pause_reason == _X.PAUSED_BY_SEARCHER:
        # The searcher asked for a pause and the job ended otherwise (preempted, failed) before it: paused.
        return NextStep(
            Next.WAIT, _T.PAUSED, _X.PAUSED_BY_SEARCHER, restart, "the searcher had asked for a pause: paused"
        )
    if experiment_state != ExperimentState.ACTIVE:
        return NextStep(
            Next.WAIT, _T.PAUSED, _X.PAUSED_BY_USER, restart, f"the experiment is {experiment_state}: paused"
        )
    return NextStep(
        Next.RESUBMIT, _T.ACTIVE, counts_restart=restart, note="resubmitted from the latest checkpoint"
    )


def _end_regardless(
    term: Termination, trial_state: TrialState, experiment_state: ExperimentState, *, searcher_done: bool
) -> NextStep | None:
    """The first rules of `next_step`, those that end the trial whatever its restarts; None when none applies."""
    if trial_state in STOPPING_TRIAL_END:
        return NextStep(Next.END, STOPPING_TRIAL_END[trial_state])
    if trial_state in TERMINAL_TRIAL_STATES:
        return NextStep(Next.END, trial_state)
    if term.trial_state in TERMINAL_TRIAL_STATES:
        return NextStep(Next.END, term.trial_state)
    if searcher_done:
        return NextStep(Next.END, _T.COMPLETED, note="the searcher was done with the trial: completed")
    if experiment_state in EXPERIMENT_STOPPING_TRIAL_END:
        target = EXPERIMENT_STOPPING_TRIAL_END[experiment_state]
        return NextStep(Next.END, target, note=f"the experiment is {experiment_state}: {target}")
    return None


def _pause_reason(value: str | None) -> TerminationReason:
    if value == _X.PAUSED_BY_SEARCHER:
        return _X.PAUSED_BY_SEARCHER
    return _X.PAUSED_BY_USER


def can_transition_experiment(old: ExperimentState, new: ExperimentState) -> bool:
    return new in EXPERIMENT_TRANSITIONS[old]


def can_transition_trial(old: TrialState, new: TrialState) -> bool:
    return new in TRIAL_TRANSITIONS[old]
