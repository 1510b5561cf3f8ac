"""Every run ends somewhere: the termination table, read against the trial's and the searcher's state, on
SQLite and PostgreSQL.

For every termination reason × trial state (ACTIVE, a pause the searcher asked for, PAUSED by the user or by
the searcher, each STOPPING_*) × searcher state (its operation pending, completed at ``max_length`` and not yet
seen by the searcher, the searcher done with the trial, no length at all as in Determined 0.38) × restarts
left or not × experiment ACTIVE or PAUSED, a live run is ended through the real `finish_trial_run` and the
trial must be in exactly one of:

- a new run queued: ACTIVE, and in `list_trials_to_submit` (what the loop submits);
- a wait that the user or the searcher will end: PAUSED, with the reason saying which;
- a terminal state.

A second table does the same from how Slurm says the job ended (each outcome × what the job wrote × whether
the master had asked it to stop) through `record_run_end`, which classifies the end first.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import SearcherOpCompletionModel, TrialModel, TrialRunModel, UserModel
from hpc_master.lifecycle.jobs import record_run_end
from hpc_master.services import lifecycle as svc
from hpc_master.services.access import Principal
from hpc_master.services.experiments import create_experiment
from hpc_master.services.states import (
    STOPPING_TRIAL_END,
    TERMINAL_TRIAL_STATES,
    ExperimentState,
    Next,
    RunState,
    TerminationReason,
    TrialState,
    next_step,
)
from slurm_backend import JobStatus, Outcome

R = TerminationReason
T = TrialState
MAX_RESTARTS = 2
CONFIG = f"""\
entrypoint: python3 train.py
searcher: {{name: single, metric: validation_loss, max_length: {{batches: 100}}}}
hyperparameters: {{lr: 0.1}}
max_restarts: {MAX_RESTARTS}
"""

# (trial state, pause reason) as the master leaves them while the trial's job still runs.
TRIAL_STATES: dict[str, tuple[TrialState, str | None]] = {
    "active": (T.ACTIVE, None),
    "active, searcher pause asked": (T.ACTIVE, R.PAUSED_BY_SEARCHER),
    "paused by user": (T.PAUSED, R.PAUSED_BY_USER),
    "paused by searcher": (T.PAUSED, R.PAUSED_BY_SEARCHER),
    **{s.lower(): (s, None) for s in STOPPING_TRIAL_END},
}
SEARCHER_STATES = ("op pending", "op completed at max_length", "searcher done", "no length (0.38)")


@dataclass(frozen=True)
class Case:
    experiment: str
    trial: str
    searcher: str
    restarts_left: bool
    end: Any  # a TerminationReason, or (Outcome, exit info, preempt requested) for the Slurm table

    def __str__(self) -> str:
        return f"{self.end} | trial {self.trial} | {self.searcher} | restarts left: {self.restarts_left} | experiment {self.experiment}"


@pytest.fixture
def experiments(sessions: sessionmaker[Session]) -> dict[str, int]:
    """An ACTIVE and a PAUSED experiment of one user."""
    with transaction(sessions) as s:
        user = UserModel(username="alice", password_hash="", admin=False)
        s.add(user)
        s.flush()
        owner = Principal(user_id=user.id, username="alice", admin=False)
        out = {}
        for state in (ExperimentState.ACTIVE, ExperimentState.PAUSED):
            exp, _ = create_experiment(
                s, owner, config_text=CONFIG, model_definition=[], activate=state == ExperimentState.ACTIVE
            )
            assert exp is not None and exp.state == state
            out[state.value] = exp.id
        return out


def _running_trials(
    s: Session, experiments: dict[str, int], cases: list[Case]
) -> dict[Case, tuple[int, int]]:
    """For each case, a trial in the case's state whose run is live (RUNNING): (trial id, run id). Rows are
    made directly, in bulk, in the states the master leaves them in while a job runs."""
    trials: dict[Case, TrialModel] = {}
    for n, case in enumerate(cases):
        state, pause_reason = TRIAL_STATES[case.trial]
        trials[case] = TrialModel(
            experiment_id=experiments[case.experiment],
            request_id=f"req-{n}",
            hparams={"lr": 0.1},
            seed=0,
            state=state,
            pause_reason=pause_reason,
            run_id=1,
            restarts=0 if case.restarts_left else MAX_RESTARTS,
            searcher_op_length=None if case.searcher == "no length (0.38)" else 100,
            searcher_done=case.searcher == "searcher done",
        )
    s.add_all(trials.values())
    s.flush()
    runs: dict[Case, TrialRunModel] = {}
    for n, case in enumerate(cases):
        trial = trials[case]
        # A pause or a stop (the user's, or the searcher's Stop) asked the job to checkpoint and exit.
        asked = trial.pause_reason is not None or trial.state in STOPPING_TRIAL_END or trial.searcher_done
        runs[case] = TrialRunModel(
            trial_id=trial.id, run_number=1, state=RunState.RUNNING, slurm_job_id=str(10_000 + n),
            preempt_requested=asked,
        )  # fmt: skip
        if case.searcher in ("op completed at max_length", "searcher done"):
            s.add(SearcherOpCompletionModel(trial_id=trial.id, length=100, metric=0.5))
    s.add_all(runs.values())
    s.flush()
    return {case: (trials[case].id, runs[case].id) for case in cases}


def _where(s: Session, trial_id: int, queued: set[int]) -> str:
    trial = s.get(TrialModel, trial_id)
    assert trial is not None
    assert svc.live_run_of(s, trial_id) is None  # every case ended the trial's only run
    places = []
    if trial.state in TERMINAL_TRIAL_STATES:
        places.append(f"END {trial.state}")
    if trial_id in queued:
        assert trial.state == T.ACTIVE
        places.append("RESUBMIT")
    if trial.state == T.PAUSED and trial.pause_reason in (R.PAUSED_BY_USER, R.PAUSED_BY_SEARCHER):
        if trial.pause_reason == R.PAUSED_BY_SEARCHER:
            assert not trial.searcher_done  # the searcher still holds it, to resume or stop
        places.append(f"WAIT {trial.pause_reason}")
    assert len(places) == 1, f"{trial.state} (pause reason {trial.pause_reason}): {places}"
    return places[0]


def _run_table(
    sessions: sessionmaker[Session], experiments: dict[str, int], cases: list[Case], end: Any
) -> dict[Case, str]:
    """End each case's run with `end(session, run id, case)`; where every trial is afterwards."""
    resubmit: dict[Case, bool] = {}
    with transaction(sessions) as s:
        made = _running_trials(s, experiments, cases)
        ids = {case: trial_id for case, (trial_id, _) in made.items()}
        for case in cases:
            resubmit[case] = end(s, made[case][1], case)
    with transaction(sessions) as s:
        queued = {t.id for t in svc.list_trials_to_submit(s)}
        where = {case: _where(s, ids[case], queued) for case in cases}
    for case in cases:
        assert resubmit[case] == (where[case] == "RESUBMIT"), case
    return where


def _cases(ends: list[Any]) -> Iterator[Case]:
    for exp, trial, searcher, left, end in itertools.product(
        ("ACTIVE", "PAUSED"), TRIAL_STATES, SEARCHER_STATES, (True, False), ends
    ):
        if exp == "PAUSED" and TRIAL_STATES[trial][0] == T.ACTIVE:
            continue  # pausing an experiment pauses its ACTIVE trials
        yield Case(exp, trial, searcher, left, end)


def _finish(s: Session, run_id: int, case: Case) -> bool:
    return svc.finish_trial_run(s, run_id, case.end, "test").resubmit


def test_every_reason_and_state_leads_to_a_new_run_a_wait_or_an_end(
    sessions: sessionmaker[Session], experiments: dict[str, int]
) -> None:
    cases = list(_cases(list(TerminationReason)))
    where = _run_table(sessions, experiments, cases, _finish)
    failures = []

    def expect(case: Case, wanted: str) -> None:
        if where[case] != wanted:
            failures.append(f"{case}: {where[case]}, expected {wanted}")

    for case in cases:
        state, pause_reason = TRIAL_STATES[case.trial]
        if state in STOPPING_TRIAL_END:  # the stop asked for wins, whatever the job did
            expect(case, f"END {STOPPING_TRIAL_END[state]}")
        elif case.end in (R.CANCELED_BY_USER, R.KILLED_BY_USER):
            expect(case, "END CANCELED")
        elif case.end == R.SUBMIT_FAILED:
            expect(case, "END ERROR")
        elif case.searcher == "searcher done" or case.end in (
            R.SEARCHER_DONE, R.EARLY_EXIT_INVALID_HP, R.EARLY_EXIT_USER_STOP,
        ):  # fmt: skip
            expect(case, "END COMPLETED")  # the hang: a trial the searcher was done with, "resubmitted"
        elif case.end in (R.NONZERO_EXIT, R.NODE_FAIL, R.OUT_OF_MEMORY, R.TIME_LIMIT, R.JOB_LOST) and (
            not case.restarts_left
        ):
            expect(case, "END ERROR")
        elif state == T.PAUSED:
            expect(case, f"WAIT {pause_reason}")
        elif case.end in (R.PAUSED_BY_USER, R.PAUSED_BY_SEARCHER):
            expect(case, f"WAIT {case.end}")
        elif pause_reason == R.PAUSED_BY_SEARCHER:
            expect(case, "WAIT PAUSED_BY_SEARCHER")  # preempted or failed before the searcher's pause
        else:  # preempted, time limit, a called-off pause, a failure with restarts left
            expect(case, "RESUBMIT")
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures[:40])


def test_restarts_are_counted_only_for_failures_the_trial_will_retry(
    sessions: sessionmaker[Session], experiments: dict[str, int]
) -> None:
    cases = [Case("ACTIVE", "active", "op pending", True, r) for r in TerminationReason]
    with transaction(sessions) as s:
        made = _running_trials(s, experiments, cases)
        for case in cases:
            svc.finish_trial_run(s, made[case][1], case.end)
    with transaction(sessions) as s:
        counted = {
            c.end for c in cases if (t := s.get(TrialModel, made[c][0])) is not None and t.restarts == 1
        }
    assert counted == {R.NONZERO_EXIT, R.NODE_FAIL, R.OUT_OF_MEMORY, R.TIME_LIMIT, R.JOB_LOST}


# ---- from Slurm's side: each way a job can end, classified, then applied ----------------------------------

EXIT_INFOS: dict[str, dict[str, Any] | None] = {
    "no exit.json": None,
    "exit 0": {"exitCode": 0, "preempted": False},
    "checkpointed on SIGUSR1": {"exitCode": 0, "preempted": True, "signal": "SIGUSR1"},
    "checkpointed on SIGTERM": {"exitCode": 0, "preempted": True, "signal": "SIGTERM"},
}
OUTCOMES = [o for o in Outcome if o.is_terminal] + [Outcome.UNSCHEDULABLE]


def test_every_way_a_job_ends_leads_to_a_new_run_a_wait_or_an_end(
    sessions: sessionmaker[Session], experiments: dict[str, int]
) -> None:
    ends = [(o, info) for o in dict.fromkeys(OUTCOMES) for info in EXIT_INFOS]

    def end(s: Session, run_id: int, case: Case) -> bool:
        outcome, info = case.end
        status = JobStatus(str(run_id), outcome, outcome.value, exit_code=0 if info else 1)
        got = record_run_end(s, run_id, status, EXIT_INFOS[info], "SIGUSR1")
        assert got is not None
        return got[1].resubmit

    cases = [c for c in _cases(ends) if c.experiment == "ACTIVE" and c.restarts_left]  # the first table's
    where = _run_table(sessions, experiments, cases, end)
    # Spot checks of the rows the issue is about; `_run_table` checked all the others are one of the three.
    for case in cases:
        ran = case.end[0] is not Outcome.UNSCHEDULABLE
        if ran and case.searcher == "searcher done" and TRIAL_STATES[case.trial][0] not in STOPPING_TRIAL_END:
            assert where[case] == "END COMPLETED", case
    active = [c for c in cases if c.trial == "active" and c.experiment == "ACTIVE" and c.restarts_left]
    for case in active:
        if case.searcher != "searcher done" and case.end[0] in (Outcome.PREEMPTED, Outcome.NODE_FAILED):
            assert where[case] == "RESUBMIT", case
    assert all(where[c] == "END ERROR" for c in cases if c.end[0] is Outcome.UNSCHEDULABLE and (
        TRIAL_STATES[c.trial][0] not in STOPPING_TRIAL_END))  # fmt: skip


def test_next_step_is_always_one_of_the_three() -> None:
    """The pure rule over everything it reads, including experiment states the table above leaves out."""
    for reason, state, exp_state, done, pause_reason, restarts in itertools.product(
        TerminationReason, TrialState, ExperimentState, (False, True),
        (None, R.PAUSED_BY_USER, R.PAUSED_BY_SEARCHER), (0, MAX_RESTARTS),
    ):  # fmt: skip
        step = next_step(
            reason, state, exp_state, searcher_done=done, pause_reason=pause_reason, restarts=restarts,
            max_restarts=MAX_RESTARTS,
        )  # fmt: skip
        where = (reason, state, exp_state, done, pause_reason, restarts, step)
        if step.next == Next.RESUBMIT:
            assert step.trial_state == T.ACTIVE and not done and exp_state == ExperimentState.ACTIVE, where
        elif step.next == Next.WAIT:
            assert step.trial_state == T.PAUSED, where
            assert step.pause_reason in (R.PAUSED_BY_USER, R.PAUSED_BY_SEARCHER), where
            assert not done, where  # the searcher would never resume it
        else:
            assert step.trial_state in TERMINAL_TRIAL_STATES, where
