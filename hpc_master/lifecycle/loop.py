"""The master's lifecycle loop: a background thread that drives searchers and Slurm jobs every tick.

After a restart nothing is lost and nothing runs twice: live runs are simply polled again (sacct knows jobs
that ended meanwhile), and a run allocated just before a crash, whose `sbatch` answer was never recorded, is
found by its job comment by the job driver on its ticks (`lifecycle.waiting`), never before the API is up.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.exc import StaleDataError

from hpc_master.db.engine import transaction
from hpc_master.db.models import ExperimentModel
from hpc_master.lifecycle import searchers
from hpc_master.lifecycle.configs import LEAN_EXPERIMENT
from hpc_master.lifecycle.job_host import compile_job_code
from hpc_master.lifecycle.jobs import JobDriver
from hpc_master.services import lifecycle as svc
from hpc_master.services import notify
from hpc_master.services.checkpoints.gc import CheckpointCollector
from hpc_master.services.common import InvalidTransitionError
from hpc_master.services.states import ExperimentState
from hpc_master.services.users import purge_expired_sessions

log = logging.getLogger(__name__)

HOUSEKEEPING_S = 600.0


class Ticks(Protocol):
    """What the loop drives besides trials (the task driver, ``hpc_master.tasks.driver``): one step a tick.
    A protocol, so that the lifecycle room does not import the tasks room, which builds on it."""

    def tick(self) -> None: ...


class LifecycleLoop:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        jobs: JobDriver | None,
        interval_s: float = 2.0,
        collector: CheckpointCollector | None = None,
        tasks: Ticks | None = None,
    ) -> None:
        self.sessions = sessions
        self.jobs = jobs
        self.interval_s = interval_s
        self.collector = collector
        """Checkpoint GC: the experiments' policies applied, failed deletions retried (None: no GC)."""
        self.tasks = tasks
        """Commands, notebooks, shells and TensorBoards (None: none are run)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks = 0
        self.last_tick_at: float | None = None
        """When the last tick ended (``time.monotonic``): the master's ``/health`` and ``/metrics``."""
        self.tick_seconds = 0.0
        self._housekept_at: float | None = None
        self.search_inputs = searchers.new_search_inputs_cache()

    # ---- one tick ------------------------------------------------------------------------------------
    def tick(self) -> None:
        """Let the searchers react to what the API recorded (a harness that completed an operation waits for
        that answer, so it comes before any Slurm command), stop what must stop, learn how jobs ended and let
        the searchers react to that too, then submit in the same tick what they (or a failed run's restart)
        want running. First of all, the invariant: no trial is left where nothing would ever move it."""
        started = time.monotonic()
        self.repair_stranded_trials()
        self.drive_searchers()
        if self.jobs is not None:
            self.jobs.cancel_stopped()
            if self.jobs.poll():
                self.drive_searchers()
            self.jobs.submit_pending()
            self.renice_pending()
        if self.tasks is not None:
            self.tasks.tick()
        self.collect_checkpoints()
        self.housekeeping()
        self.ticks += 1
        self.last_tick_at = time.monotonic()
        self.tick_seconds += self.last_tick_at - started

    def renice_pending(self) -> None:
        """``det e set priority``: the experiment's jobs still pending in Slurm get their new ``--nice``."""
        assert self.jobs is not None
        try:
            self.jobs.renice_pending()
        except Exception:
            log.exception("re-nicing pending jobs failed; retried next tick")

    def collect_checkpoints(self) -> None:
        """Checkpoint GC (``services.checkpoints.gc``): record the last batch's removals and start the next in
        the collector's own thread, so that files being deleted never hold up the loop."""
        if self.collector is None:
            return
        try:
            self.collector.step()
        except Exception:
            log.exception("checkpoint GC failed; retried next tick")

    def housekeeping(self, *, every_s: float = HOUSEKEEPING_S) -> None:
        """Chores that need no hurry, at most every ``every_s``: expired login sessions and trial tokens
        (each run mints one, valid 30 days) are deleted."""
        now = time.monotonic()
        if self._housekept_at is not None and now - self._housekept_at < every_s:
            return
        self._housekept_at = now
        try:
            with transaction(self.sessions) as s:
                purged = purge_expired_sessions(s)
        except Exception:
            log.exception("housekeeping failed")
            return
        if purged:
            log.info("housekeeping: %d expired sessions and trial tokens deleted", purged)

    def repair_stranded_trials(self) -> int:
        """Every run ends somewhere: an ACTIVE trial has a live run or is queued to submit (or the trial waits,
        paused, or has ended). One query per tick finds a breach, normally none: each is a bug, repaired (the
        trial closed as its searcher or its stop says) and logged at ERROR with the trial and why."""
        try:
            with transaction(self.sessions) as s:
                repairs = svc.repair_stranded_trials(s)
        except (StaleDataError, InvalidTransitionError) as e:
            log.info("stranded trials: repair retried next tick (%s)", e)
            return 0
        except Exception:
            log.exception("checking for stranded trials failed")
            return 0
        for r in repairs:
            log.error(
                "trial %s of experiment %s had no live run and nothing would ever run or end it (%s): "
                "repaired, %s → %s. This is a bug in the master; please report it with this line.",
                r.trial_id, r.experiment_id, r.why, r.old_state, r.new_state,
            )  # fmt: skip
        return len(repairs)

    def drive_searchers(self) -> None:
        """One short transaction per ACTIVE experiment. Experiment rows are read without their config, which
        is decoded once per experiment into `search_inputs` (configs never change after create)."""
        with transaction(self.sessions) as s:
            ids = list(
                s.scalars(
                    select(ExperimentModel.id)
                    .where(ExperimentModel.state == ExperimentState.ACTIVE)
                    .order_by(ExperimentModel.id)
                )
            )
        for exp_id in ids:
            try:
                with transaction(self.sessions) as s:
                    exp = s.get(ExperimentModel, exp_id, options=LEAN_EXPERIMENT)
                    if exp is not None and exp.state == ExperimentState.ACTIVE:
                        searchers.drive(s, exp, self.search_inputs)
            except (StaleDataError, InvalidTransitionError) as e:
                log.info("experiment %s: searcher step retried next tick (%s)", exp_id, e)
            except Exception:
                log.exception("experiment %s: the searcher failed", exp_id)
        notify.searchers_driven()

    # ---- thread ----------------------------------------------------------------------------------------
    def start(self) -> None:
        # Runs allocated before a restart whose sbatch answer was never recorded are adopted by their
        # comment, or submitted again as the same run, by the job driver in the loop's thread (doing it here
        # would hold up the API's start while Slurm does not answer).
        if self.jobs is not None and not compile_job_code():
            log.info("some job-side modules could not be byte-compiled; jobs compile them as they start")
        self._thread = threading.Thread(target=self._run, name="lifecycle-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:
                log.exception("lifecycle tick failed")
            notify.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        notify.changed()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self.collector is not None:
            self.collector.close()

    def running(self) -> bool:
        """Whether the loop's thread is alive (after `stop`: its tick outlasted the timeout)."""
        return self._thread is not None and self._thread.is_alive()
