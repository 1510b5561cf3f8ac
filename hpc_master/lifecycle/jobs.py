"""Trial runs as Slurm jobs: submit what the searcher wants running, follow jobs, apply how they ended.

Every step is load → act → apply: read what is needed in one short transaction, run Slurm commands and
write files with no transaction open, then apply the result in a second short transaction through the
`hpc_master.services.lifecycle` choke points. Nothing here holds a transaction across a Slurm call.

Slurm says "wait" more often than "no". A run whose job Slurm will take later waits *in the master*: it stays
PENDING with no job id and a `pending_reason`, and is submitted again (the same run, the same job script) when
that may succeed:
- sbatch refused for a submit-count limit (`SubmitLimitError`: AssocMaxSubmitJobLimit, QOS...SubmitJob...):
  once one of the master's jobs has ended, or after `limit_retry_s` (the user's other jobs may end too);
- the controller does not answer (`SlurmUnavailableError`): after a backoff (5 s doubling to 60 s), and not
  while the poller's last try failed the same way; no scancel is tried meanwhile either;
- an answer that may have been lost after the controller created the job ("Socket timed out"), or a master
  restarted between allocating a run and recording its job id: the job is looked for by its comment first,
  and adopted when found.
Only sbatch's refusals of what the job asks (`SubmitRefusedError`) fail the trial; only the poller (sacct, or
a job missing from squeue past its grace period) makes a submitted job lost.
"""

from __future__ import annotations

import logging
import os
import posixpath
import pwd
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from harness.exec.job_plan import EXIT_FILE
from hpc_master.asuser import AsUser, JobOwner, RunFiles
from hpc_master.db.engine import transaction
from hpc_master.db.models import ExperimentModel, TrialModel, TrialRunModel, UserModel
from hpc_master.errors import ClientError
from hpc_master.expconf import ExperimentConfig, parse_experiment_config
from hpc_master.lifecycle.configs import LEAN_EXPERIMENT, ConfigKey, DerivedConfigs, config_key
from hpc_master.lifecycle.job_host import (
    PLATFORM_ROOT,
    ensure_image_cache,
    master_url_for_jobs,
)
from hpc_master.lifecycle.outcomes import JobEnd, RunContext, classify, describe
from hpc_master.lifecycle.priorities import KnobCache, Renicer, within_max_slots
from hpc_master.lifecycle.slurm_jobs import ByComment, JobToSubmit, Lost, Refused, SlurmJobs, Submitted, Waits
from hpc_master.lifecycle.waiting import (
    SLURM_UNAVAILABLE,
    Prepared,
    Waiting,
    list_waiting,
    pending_reasons,
    write_pending_reason,
    write_waiting,
)
from hpc_master.masterconf import MasterConfig
from hpc_master.paths import get_checkpoint_root, get_job_storage_root
from hpc_master.services import lifecycle as svc
from hpc_master.services.common import InvalidTransitionError
from hpc_master.services.states import RunState, TerminationReason, TrialState
from hpc_master.trialjob import (
    JobPaths,
    TrialJobInputs,
    build_trial_job,
    checkpoint_root_of,
    job_comment,
    pool_from_master_config,
    run_dirs,
)
from slurm_backend import JobStatus, Outcome, Poller, SlurmCli

log = logging.getLogger(__name__)
CONTEXT_FILE = "context.tar.gz"


@dataclass(frozen=True)
class _Submission:
    run_id: int
    run_number: int
    trial_id: int
    experiment_id: int
    config_key: ConfigKey
    config: dict[str, Any] | None
    """The stored config, read only when `JobDriver.configs` does not hold the experiment's parsed one."""
    hparams: dict[str, Any]
    seed: int
    request_id: str
    latest_checkpoint: str | None
    steps_completed: int
    owner_unix: str | None
    owner_name: str
    has_context: bool
    token: str


class JobDriver:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        config: MasterConfig,
        cli: SlurmCli,
        poller: Poller,
        *,
        python: str | None = None,
        cluster_id: str = "hpc-det",
        limit_retry_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        as_user: AsUser | None = None,
    ) -> None:
        self.sessions = sessions
        self.config = config
        self.job_storage_root = str(config.job_storage_root or get_job_storage_root())
        self.as_user = as_user or AsUser(
            RunFiles(self.job_storage_root), SlurmJobs(cli, poller, limit_retry_s=limit_retry_s, clock=clock)
        )
        """Everything done in a user's name (run directories, Slurm, checkpoints): shared with the tasks'
        driver (one submit gate for the whole master)."""
        self.slurm = self.as_user.slurm
        self.files = self.as_user.files
        self.python = python or os.environ.get("DET_JOB_PYTHON") or sys.executable
        self.cluster_id = cluster_id
        self._tensorboard_warned: set[str] = set()
        self._contexts_written: set[int] = set()
        """Experiments whose context archive this master wrote or found (not looked for again)."""
        self.master_url = master_url_for_jobs(config)
        self._acts_for_users = self.as_user.acts_for_users
        self.configs: DerivedConfigs[ExperimentConfig] = DerivedConfigs(parse_experiment_config)
        """Parsed configs by experiment: a grid of thousands of trials decodes its config once."""
        self.knobs = KnobCache()
        """Each experiment's priority and max_slots, re-read only when its row changes."""
        self.renicer = Renicer(config, cli, poller, self.knobs, clock=clock, as_owner=self._acts_for_users)
        self._prepared: dict[int, Prepared] = {}

    @property
    def acts_for_users(self) -> bool:
        """Whether jobs run as their owners' accounts (the master acts for its users; tests turn it off)."""
        return self._acts_for_users

    @acts_for_users.setter
    def acts_for_users(self, value: bool) -> None:
        self._acts_for_users = self.renicer.as_owner = value

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        with transaction(self.sessions) as session:
            yield session

    # ---- submit ---------------------------------------------------------------------------------------
    def submit_pending(self) -> int:
        """Submit the runs waiting in the master (oldest first), then every trial that wants a job. One
        trial's failure never stops the others: a refusal fails that trial with the reason, and anything
        else (the database busy, say) is retried next tick. Returns how many jobs were submitted."""
        with self._tx() as s:
            waiting = list_waiting(s)
            todo = within_max_slots(
                s, self.knobs, [(t.id, t.experiment_id) for t in svc.list_trials_to_submit(s)]
            )
        submitted = 0
        known = self._jobs_by_comment(waiting)
        for run in waiting:
            try:
                submitted += self._submit_waiting(run, known)
            except Exception:
                log.exception(
                    "submitting trial %s run %s failed; retried next tick", run.trial_id, run.run_number
                )
        for trial_id in todo:
            try:
                sub = self._allocate(trial_id)
                with self.as_user.batch(self._account(sub.owner_unix) if sub is not None else None):
                    prepared = self._prepare(sub) if sub is not None else None
                    if prepared is not None:
                        submitted += self._try_sbatch(prepared)
            except Exception:
                log.exception("submitting trial %s failed; retried next tick", trial_id)
        return submitted

    def slurm_unavailable(self) -> bool:
        return self.slurm.unavailable()

    def renice_pending(self) -> int:
        """Pending jobs of experiments whose priority changed get their new ``--nice``."""
        if self.slurm_unavailable():
            return 0
        return self.renicer.step(self._tx)

    def _needs_check(self, run: Waiting) -> bool:
        """Whether the run's job may exist: the master restarted before recording its job id (nothing of
        it in memory), or an sbatch answer was lost."""
        prepared = self._prepared.get(run.run_id)
        return prepared is None or prepared.check_comment

    def _jobs_by_comment(self, waiting: list[Waiting]) -> ByComment | None:
        """Slurm's jobs by comment, one squeue per Unix account of the runs that need a look; None when the
        controller does not answer (those runs wait)."""
        return self.slurm.jobs_by_comment(
            {self._account(run.owner_unix) for run in waiting if self._needs_check(run)}
        )

    def _submit_waiting(self, run: Waiting, known: ByComment | None) -> int:
        prepared = self._prepared.get(run.run_id)
        if self._needs_check(run) and self._settled_by_comment(run, known, prepared):
            return 0
        if not run.submittable:
            self._finish_unsubmitted(run)
            return 0
        with self.as_user.batch(self._account(run.owner_unix)):
            if prepared is None:
                sub = self._reload(run.run_id)
                prepared = self._prepare(sub) if sub is not None else None
                if prepared is None:
                    return 0
            return self._try_sbatch(prepared, run.pending_reason)

    def _settled_by_comment(self, run: Waiting, known: ByComment | None, prepared: Prepared | None) -> bool:
        """Whether looking for the run's job by its comment settles it for this tick: it waits (no answer for
        its account) or its job was found and adopted. Otherwise it need not be looked for again."""
        user = self._account(run.owner_unix)
        if known is None or user not in known:
            self._set_pending_reason(run.run_id, SLURM_UNAVAILABLE, run.pending_reason)
            return True
        comment = job_comment(self.cluster_id, run.experiment_id, run.trial_id, run.run_number)
        found = known[user].get(comment)
        if found:
            log.info("adopted Slurm job %s for trial %s run %s", found[0], run.trial_id, run.run_number)
            self._record_job(run.run_id, found[0], prepared.output_path if prepared else None)
            return True
        if prepared is not None:
            prepared.check_comment = False
        return False

    def _allocate(self, trial_id: int) -> _Submission | None:
        try:
            with self._tx() as s:
                trial = s.get(TrialModel, trial_id)
                if trial is None:  # no length from the searcher is fine: the script decides (0.38)
                    return None
                run = svc.allocate_trial_run(s, trial_id)
                return self._submission(s, trial, run)
        except InvalidTransitionError as e:
            log.debug("not submitting trial %s: %s", trial_id, e)
            return None

    def _reload(self, run_id: int) -> _Submission | None:
        """The submission of a run allocated earlier (before a master restart): a new trial token."""
        with self._tx() as s:
            run = s.get(TrialRunModel, run_id)
            trial = s.get(TrialModel, run.trial_id) if run is not None else None
            if run is None or trial is None or run.slurm_job_id is not None:
                return None
            return self._submission(s, trial, run)

    def _submission(self, s: Session, trial: TrialModel, run: TrialRunModel) -> _Submission | None:
        exp = s.get(ExperimentModel, trial.experiment_id, options=LEAN_EXPERIMENT)
        owner = s.get(UserModel, exp.owner_id) if exp else None
        if exp is None or owner is None:
            return None
        key = config_key(exp)
        return _Submission(
            run_id=run.id,
            run_number=run.run_number,
            trial_id=trial.id,
            experiment_id=exp.id,
            config_key=key,
            config=None if self.configs.peek(key) is not None else dict(exp.config),
            hparams=dict(trial.hparams),
            seed=int(trial.seed),
            request_id=trial.request_id,
            latest_checkpoint=trial.latest_checkpoint,
            steps_completed=int(trial.steps_completed),
            owner_unix=owner.unix_username,
            owner_name=owner.username,
            has_context=_has_context(s, exp.id),
            token=svc.mint_trial_token(s, trial.id),
        )

    def _job_owner(self, sub: _Submission) -> JobOwner:
        """A root master runs each job as its owner's Unix account."""
        return JobOwner.of(sub.owner_name, sub.owner_unix, acts_for_users=self.acts_for_users)

    def _config(self, sub: _Submission) -> ExperimentConfig:
        config = self.configs.peek(sub.config_key)
        if config is None:
            if sub.config is None:  # cached at `_allocate`, evicted since: read it again
                with self._tx() as s:
                    raw = s.scalar(
                        select(ExperimentModel.config).where(ExperimentModel.id == sub.experiment_id)
                    )
            else:
                raw = sub.config
            self.configs.decodes += 1
            config = self.configs.put(sub.config_key, parse_experiment_config(raw or {}))
        return config

    def _prepare(self, sub: _Submission) -> Prepared | None:
        """Build the run's job and write its run directory. A refusal (ours: a config this release cannot
        build a job from, a user with no Unix account) or any unexpected error fails the trial with the
        reason, shown in its events and exit message: retrying cannot help, and leaving the run allocated
        would leave the trial ACTIVE with no job."""
        try:
            owner = self._job_owner(sub)
            config = self._config(sub)
            user_root = self.files.ensure_user_root(owner)
            trial_dir, _ = run_dirs(user_root, sub.experiment_id, sub.trial_id, sub.run_number)
            context_path = os.path.join(os.path.dirname(trial_dir), CONTEXT_FILE)  # one per experiment
            plan = build_trial_job(
                config,
                pool_from_master_config(self.config, config.resources.resource_pool),
                TrialJobInputs(
                    experiment_id=sub.experiment_id,
                    trial_id=sub.trial_id,
                    trial_run_id=sub.run_number,
                    hparams=sub.hparams,
                    trial_seed=sub.seed,
                    owner=owner.unix or pwd.getpwuid(os.geteuid()).pw_name,
                    latest_checkpoint=sub.latest_checkpoint,
                    steps_completed=sub.steps_completed,
                    request_id=sub.request_id,
                    context_archive=context_path if sub.has_context else None,
                ),
                JobPaths(
                    job_storage_root=self.job_storage_root,
                    user_root=user_root,
                    checkpoint_root=str(self.config.checkpoint_storage.host_path or get_checkpoint_root()),
                    platform_root=PLATFORM_ROOT,
                    python=self.python,
                ),
                master_url=self.master_url,
                session_token=sub.token,
                cluster_id=self.cluster_id,
            )
            self.files.write_run_dir(plan, owner)
            master_root = str(self.config.checkpoint_dir())
            if owner.unix is not None and checkpoint_root_of(config, master_root) == master_root:
                self._make_tensorboard_dir(master_root, sub.experiment_id, owner)  # a shared master's storage
            ensure_image_cache(plan.plan)
            if sub.has_context:
                self._write_context_once(sub.experiment_id, Path(context_path), owner)
        except (ClientError, OSError) as e:
            self._fail_submission(sub.run_id, sub.trial_id, TerminationReason.SUBMIT_FAILED, str(e))
            return None
        except Exception as e:
            log.exception("submitting trial %s failed", sub.trial_id)
            self._fail_submission(
                sub.run_id, sub.trial_id, TerminationReason.SUBMIT_FAILED,
                f"internal error: {type(e).__name__}: {e}",
            )  # fmt: skip
            return None
        spec = plan.spec
        prepared = Prepared(
            run_id=sub.run_id,
            trial_id=sub.trial_id,
            run_number=sub.run_number,
            script=plan.script,
            comment=spec.comment,
            as_user=owner.unix,
            output_path=plan.output_path,
            limit_key=(owner.unix, spec.account, spec.qos, spec.partition),
            nice=spec.nice,
        )
        self._prepared[sub.run_id] = prepared
        return prepared

    def _try_sbatch(self, prepared: Prepared, pending_reason: str | None = None) -> int:
        """sbatch the prepared job unless Slurm said to wait; 1 if it was submitted (or adopted)."""
        result = self.slurm.submit(
            JobToSubmit(prepared.script, prepared.comment, prepared.as_user, prepared.limit_key)
        )
        if isinstance(result, Waits):
            if (
                result.check_comment
            ):  # the answer was lost and Slurm could not say: look before the next sbatch
                prepared.check_comment = True
            if result.reason != SLURM_UNAVAILABLE:
                log.debug("trial %s waits in the master: %s", prepared.trial_id, result.reason)
            self._set_pending_reason(prepared.run_id, result.reason, pending_reason)
            return 0
        if isinstance(result, Refused):
            self._fail_submission(
                prepared.run_id, prepared.trial_id, TerminationReason.SUBMIT_FAILED, result.message
            )
            return 0
        if isinstance(result, Lost):  # the run is lost (restarted while restarts last)
            self._fail_submission(
                prepared.run_id, prepared.trial_id, TerminationReason.JOB_LOST, result.message
            )
            return 0
        assert isinstance(result, Submitted)
        if not result.adopted:
            self.renicer.submitted(result.job_id, prepared.nice)
        self._record_job(prepared.run_id, result.job_id, prepared.output_path)
        log.info(
            "trial %s run %s %s Slurm job %s", prepared.trial_id, prepared.run_number,
            "adopted" if result.adopted else "submitted as", result.job_id,
        )  # fmt: skip
        return 1

    def _record_job(self, run_id: int, job_id: str, log_path: str | None) -> None:
        self._prepared.pop(run_id, None)
        with self._tx() as s:
            svc.start_trial_run(s, run_id, job_id, log_path=log_path)
            write_pending_reason(s, run_id, None)
        self.slurm.watch(job_id)

    def _fail_submission(self, run_id: int, trial_id: int, reason: TerminationReason, message: str) -> None:
        log.warning("submitting trial %s failed: %s", trial_id, message)
        self._prepared.pop(run_id, None)
        with self._tx() as s:
            svc.finish_trial_run(s, run_id, reason, message)

    def _finish_unsubmitted(self, run: Waiting) -> None:
        """A run that waited in the master and is no longer wanted (paused, killed, stopped by the
        searcher): it ends as a job cancelled before it started would."""
        self._prepared.pop(run.run_id, None)
        status = JobStatus(job_id="", outcome=Outcome.CANCELLED, slurm_state="", source="master")
        waited = f" (it waited in the master: {run.pending_reason})" if run.pending_reason else ""
        with self._tx() as s:
            record_run_end(
                s, run.run_id, status, None, self.config.preemption.signal,
                message=f"never submitted to Slurm{waited}",
            )  # fmt: skip

    def _set_pending_reason(self, run_id: int, reason: str, current: str | None) -> None:
        if reason != current:
            with self._tx() as s:
                write_pending_reason(s, run_id, reason)

    def _make_tensorboard_dir(self, root: str, experiment_id: int, owner: JobOwner) -> None:
        """The experiment's TensorBoard directory, made by the master; where an older master let a user make
        ``tensorboard/experiment``, the trials make their own as they did then, and the admin is told once."""
        try:
            self.files.make_tensorboard_dir(root, experiment_id, owner)
        except OSError as e:  # UnsafePathError, or a service account's directory its users cannot write
            if root not in self._tensorboard_warned:
                self._tensorboard_warned.add(root)
                log.warning(
                    "TensorBoard directories under %s are not the master's (%s): trials make their own, as "
                    "before; chown %s/tensorboard and %s/tensorboard/experiment to the master's account "
                    "(docs/security.md)", root, e, root, root,
                )  # fmt: skip

    def _write_context_once(self, experiment_id: int, path: Path, owner: JobOwner) -> None:
        """The experiment's context archive, written next to its trials' directories by its first submission
        (read from the database then only: it can be 95 MB, and a grid has thousands of trials)."""
        if experiment_id in self._contexts_written or self.files.exists(str(path), owner):
            self._contexts_written.add(experiment_id)
            return
        with self._tx() as s:
            data = s.scalar(
                select(ExperimentModel.context_archive).where(ExperimentModel.id == experiment_id)
            )
        if data is not None:
            self.files.write(str(path), data, owner)
            self._contexts_written.add(experiment_id)

    def _account(self, unix: str | None) -> str | None:
        """The account a job and its files are (what is done to them is done as it), where the master acts
        for its users; None: the master's own."""
        return unix if self.acts_for_users else None

    def _exit_record(self, run: svc.LiveRun) -> dict[str, Any] | None:
        """The run's ``exit.json``, read as its owner; a run submitted by a master before directories were
        per user has it directly below the root."""
        owner = JobOwner(self._account(run.owner_unix))
        _, run_dir = run_dirs(self.files.user_root(owner), run.experiment_id, run.trial_id, run.run_number)
        found = self.files.read_json(posixpath.join(run_dir, EXIT_FILE), owner=owner)
        if found is None and owner.unix is not None:  # read as its owner too
            _, old = run_dirs(self.job_storage_root, run.experiment_id, run.trial_id, run.run_number)
            found = self.files.read_json(
                posixpath.join(old, EXIT_FILE), anchor=self.job_storage_root, owner=owner
            )
        return found

    # ---- stop -----------------------------------------------------------------------------------------
    def cancel_stopped(self) -> None:
        """scancel jobs of killed trials, and jobs that were asked to stop before they even started
        (tried again every tick until the job ends; not while the controller does not answer)."""
        if self.slurm_unavailable():
            return
        with self._tx() as s:
            live = svc.list_live_runs(s)
        for run in live:
            if run.slurm_job_id is None:
                continue
            if self._to_cancel(run, run.slurm_job_id) and not self.slurm.cancel(
                run.slurm_job_id, self._account(run.owner_unix)
            ):
                return

    def _to_cancel(self, run: svc.LiveRun, job_id: str) -> bool:
        """Whether the run's job is to be cancelled: its trial was killed, or it never started (below)."""
        kill = run.trial_state == TrialState.STOPPING_KILLED
        # Asked to stop before it started: cancel it, but only if Slurm itself still says it is pending
        # (our record lags behind Slurm between polls; a running job checkpoints and exits by itself).
        status = self.slurm.status(job_id)
        never_started = run.preempt_requested and status is not None and status.outcome is Outcome.PENDING
        if never_started and not kill and not self.slurm.still_pending(job_id):
            return False  # it started since the last poll: it checkpoints and exits by itself
        return kill or never_started

    # ---- poll -----------------------------------------------------------------------------------------
    def poll(self) -> int:
        """Apply what Slurm says of every live run, and record why pending ones wait; returns how many runs
        ended. A run ending frees a place under the user's submit limit: runs held back for one are tried
        again in the same tick."""
        with self._tx() as s:
            live = svc.list_live_runs(s)
            reasons = pending_reasons(s)
        jobs = {r.slurm_job_id: r for r in live if r.slurm_job_id}
        statuses = self.slurm.poll(jobs)
        ended = 0
        for job_id, run in jobs.items():
            status = statuses.get(job_id)
            if status is not None and self._apply_status(job_id, run, status, reasons):
                ended += 1
        if ended:
            self.slurm.jobs_ended()
        return ended

    def _apply_status(
        self,
        job_id: str,
        run: svc.LiveRun,
        status: JobStatus,
        reasons: dict[int, tuple[str | None, int | None]],
    ) -> bool:
        """Apply what Slurm says of one live run; whether the run ended."""
        if status.outcome is Outcome.RUNNING and run.state == RunState.PENDING:
            with self._tx() as s:
                svc.mark_run_running(s, run.run_id, status.node_list or None)
                write_pending_reason(s, run.run_id, None)
        elif status.outcome is Outcome.PENDING and run.state == RunState.PENDING:
            recorded = reasons.get(run.run_id, (None, None))  # the reason: None until the scheduler looked
            if recorded != (status.reason, status.jobs_ahead):
                with self._tx() as s:
                    write_waiting(s, run.run_id, status.reason, status.jobs_ahead, recorded)
        elif status.outcome is Outcome.UNSCHEDULABLE:
            if self.slurm.cancel(job_id, self._account(run.owner_unix)):
                self._finish(run, status)
                return True
        elif status.is_terminal:
            self._finish(run, status)
            return True
        return False

    def _finish(self, run: svc.LiveRun, status: JobStatus) -> None:
        run_id, trial_id, run_number = run.run_id, run.trial_id, run.run_number
        exit_info = self._exit_record(run)
        with self._tx() as s:
            ended = record_run_end(s, run_id, status, exit_info, self.config.preemption.signal)
        if ended is None:
            return
        reason, outcome = ended
        self.slurm.unwatch(status.job_id)
        log.info(
            "trial %s run %s (job %s) ended: %s → trial %s%s",
            trial_id, run_number, status.job_id, reason, outcome.trial_state,
            ", resubmitting" if outcome.resubmit else "",
        )  # fmt: skip


def record_run_end(
    session: Session,
    run_id: int,
    status: JobStatus,
    exit_info: dict[str, Any] | None,
    preempt_signal: str,
    *,
    message: str | None = None,
) -> tuple[TerminationReason, svc.RunOutcome] | None:
    """Classify a finished job against what the master had asked of it, and apply the outcome."""
    run = session.get(TrialRunModel, run_id)
    trial = session.get(TrialModel, run.trial_id) if run is not None else None
    if run is None or trial is None:
        return None
    ctx = RunContext(
        trial_state=TrialState(trial.state),
        pause_reason=trial.pause_reason,
        preempt_requested=run.preempt_requested,
        searcher_done=trial.searcher_done,
        preempt_signal=preempt_signal,
    )
    end = JobEnd.of(status, exit_info)
    reason = classify(end, ctx)
    return reason, svc.finish_trial_run(session, run_id, reason, message or describe(end))


def _has_context(session: Session, experiment_id: int) -> bool:
    """Whether the experiment has a context archive, without reading it."""
    stmt = select(ExperimentModel.context_archive.is_not(None)).where(ExperimentModel.id == experiment_id)
    return bool(session.scalar(stmt))
