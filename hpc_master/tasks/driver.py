"""The Slurm half of tasks, run by the lifecycle loop each tick: submit what is queued, cancel what was
killed, and learn from the shared poller how jobs went.

Slurm is reached through the master's one `SlurmJobs` (``hpc_master.lifecycle.slurm_jobs``), as the trials'
jobs are: the same submit ladder, and the same gate (while the controller does not answer, no task's sbatch
is tried until the backoff has passed; a task over a submit limit waits until a job ends).

After a master crash nothing runs twice: a task is marked ``submit_attempted`` (committed) before its sbatch,
and a task so marked with no job id is looked for by its job comment before another sbatch is tried (one
squeue per Unix account for all such tasks, not one per task).
"""

from __future__ import annotations

import datetime as dt
import hmac
import http.client
import logging
import os
import posixpath
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from harness.exec.job_nodes import expand_nodelist
from harness.exec.job_plan import EXIT_FILE
from harness.exec.serve_door import PROOF_NAME, proof
from hpc_master.asuser import AsUser, JobOwner, RunFiles
from hpc_master.db.engine import transaction
from hpc_master.db.models import TaskModel, UserModel, utcnow
from hpc_master.errors import ClientError
from hpc_master.expconf.tasks import TaskType
from hpc_master.lifecycle.outcomes import JobEnd, task_end
from hpc_master.lifecycle.slurm_jobs import (
    ByComment,
    JobToSubmit,
    Lost,
    Refused,
    SlurmJobs,
    SubmitResult,
    Waits,
)
from hpc_master.lifecycle.waiting import SLURM_UNAVAILABLE
from hpc_master.masterconf import MasterConfig
from hpc_master.services.stored_config import task_config
from hpc_master.taskjob import (
    SERVICE_FILE,
    SERVICE_TYPES,
    TASKS_DIR,
    TaskJobPlan,
    build_task_job,
    task_argv,
    task_comment,
)
from hpc_master.tasks import service as svc
from hpc_master.trialjob import DEFAULT_MAX_CONTEXT_BYTES, JobPaths, pool_from_master_config
from slurm_backend import JobStatus, Outcome, Poller, SlurmCli

log = logging.getLogger(__name__)

TaskState = svc.TaskState


class TaskDriver:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        config: MasterConfig,
        cli: SlurmCli,
        poller: Poller,
        *,
        job_storage_root: str,
        platform_root: str,
        python: str,
        master_url: str,
        cluster_id: str,
        as_user: AsUser | None = None,
    ) -> None:
        self.sessions = sessions
        self.config = config
        self.as_user = as_user or AsUser(RunFiles(job_storage_root), SlurmJobs(cli, poller))
        """Everything done in a user's name: the trials' driver's, in a master (one submit gate for both)."""
        self.slurm = self.as_user.slurm
        self.files = self.as_user.files
        self.job_storage_root = job_storage_root
        self.platform_root = platform_root
        self.python = python
        self.master_url = master_url
        self.cluster_id = cluster_id
        self.acts_for_users = self.as_user.acts_for_users

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        with transaction(self.sessions) as session:
            yield session

    def tick(self) -> None:
        """One pass; one task's trouble never stops the others (it is logged and tried again next tick)."""
        for step in (self.end_idle, self.cancel_killed, self.submit_queued, self.poll):
            try:
                step()
            except Exception:
                log.exception("tasks: %s failed; tried again next tick", step.__name__)

    # ---- submit ---------------------------------------------------------------------------------------
    def submit_queued(self) -> int:
        with self._tx() as s:
            rows = s.execute(
                select(TaskModel.id, TaskModel.submit_attempted, UserModel.unix_username)
                .join(UserModel, UserModel.id == TaskModel.owner_id)
                .where(TaskModel.state.in_(svc.LIVE_STATES), TaskModel.slurm_job_id.is_(None))
                .order_by(TaskModel.start_time)
            ).all()
        # Tasks whose sbatch may have run (before a crash, or its answer lost): Slurm's jobs by comment, asked
        # once per Unix account for all of them.
        known = self.slurm.jobs_by_comment({self._account(unix) for _, attempted, unix in rows if attempted})
        submitted = 0
        for task_id, _, _ in rows:
            try:
                submitted += self._submit(task_id, known)
            except Exception:
                log.exception("task %s: submitting failed; tried again next tick", task_id)
        return submitted

    def _submit(self, task_id: str, known: ByComment | None) -> int:
        with self._tx() as s:
            task = s.get(TaskModel, task_id)
            owner = s.get(UserModel, task.owner_id) if task is not None else None
            if task is None or owner is None or task.slurm_job_id is not None:
                return 0
            attempted, killed = task.submit_attempted, task.kill_requested
            unix_user = owner.unix_username
            owner_name = owner.username
            pending = task.pending_reason
        comment = task_comment(self.cluster_id, task_id)
        as_user = self._account(unix_user)
        # sbatch may have run before a crash: adopt its job rather than submit a second
        if attempted and self._settled_by_comment(task_id, known, as_user, comment):
            return 0
        if killed:
            self._end_killed(task_id)
            return 0
        if self._controller_away(task_id, pending):
            return 0
        result = self._sbatch(task_id, owner_name, unix_user, as_user, comment)
        return 0 if result is None else self._apply_submission(task_id, result)

    def _settled_by_comment(
        self, task_id: str, known: ByComment | None, as_user: str | None, comment: str
    ) -> bool:
        """Whether looking for the job of a task whose sbatch may have run settles it for this tick: it waits
        (Slurm cannot be asked yet) or its job was found and adopted."""
        if known is None or as_user not in known:
            log.info("task %s: cannot ask Slurm for its job yet", task_id)
            self._set_pending(task_id, SLURM_UNAVAILABLE)
            return True
        found = known[as_user].get(comment)
        if found:
            log.info(
                "task %s: adopting Slurm job %s, submitted before the master restarted", task_id, found[0]
            )
            self._record_job(task_id, found[0])
            return True
        return False

    def _end_killed(self, task_id: str) -> None:
        """End a task killed before its job was submitted."""
        with self._tx() as s:
            task = s.get(TaskModel, task_id)
            if task is not None and task.state != TaskState.TERMINATED:
                svc.finish(task, exit_status="killed by the user before its job started")

    def _controller_away(self, task_id: str, pending: str | None) -> bool:
        """Whether the controller does not answer: the task then waits, saying so (not even its files are
        written again while the controller is away)."""
        if not self.slurm.unavailable():
            return False
        if pending != SLURM_UNAVAILABLE:
            self._set_pending(task_id, SLURM_UNAVAILABLE)
        return True

    def _sbatch(
        self, task_id: str, owner_name: str, unix_user: str | None, as_user: str | None, comment: str
    ) -> SubmitResult | None:
        """Write the task's files and sbatch its job; None when it could not be prepared (the task failed)."""
        with self.as_user.batch(as_user):  # its files and its sbatch: one helper process
            try:
                plan = self._prepare(task_id, owner_name, unix_user)
            except (ClientError, OSError) as e:
                self._fail(task_id, f"cannot submit: {e}")
                return None
            spec = plan.spec
            return self.slurm.submit(
                JobToSubmit(plan.script, comment, as_user, (as_user, spec.account, spec.qos, spec.partition))
            )

    def _apply_submission(self, task_id: str, result: SubmitResult) -> int:
        """Record what sbatch said (a job, a wait, a refusal or a lost submission); 1 for a job, else 0."""
        if isinstance(result, Waits):
            log.info("task %s waits: %s", task_id, result.reason)
            self._set_pending(task_id, result.reason)
            return 0
        if isinstance(result, Refused):  # what it asks for can never run here
            self._fail(task_id, f"Slurm refused the job: {result.message}")
            return 0
        if isinstance(result, Lost):
            self._fail(task_id, result.message)
            return 0
        self._record_job(task_id, result.job_id)
        log.info(
            "task %s %s Slurm job %s", task_id, "adopted" if result.adopted else "submitted as", result.job_id
        )
        return 1

    def _prepare(self, task_id: str, owner_name: str, unix_user: str | None) -> TaskJobPlan:
        owner = JobOwner.of(owner_name, unix_user, acts_for_users=self.acts_for_users)
        with self._tx() as s:
            task = s.get(TaskModel, task_id)
            assert task is not None
            task_type = TaskType(task.task_type)
            config = task_config(task)
            archive = task.context_archive
            run_dir = task.run_dir
            service_args = list(task.service_args or [])
        pool = pool_from_master_config(self.config, config.resources.resource_pool)
        image = config.environment.image_for("cuda" if config.resources.slots else "cpu")
        in_image = bool(image or pool.container_image)
        # In an image, a notebook's or TensorBoard's server is the image's python3 (which needs jupyterlab or
        # tensorboard installed), with this repository on PYTHONPATH as for trials.
        python = "python3" if in_image else self.python
        plan = build_task_job(
            config,
            task_type,
            pool,
            task_id=task_id,
            argv=task_argv(config, task_type, python, service_args),
            paths=self._paths(self.files.user_root(owner)),
            master_url=self.master_url,
            cluster_id=self.cluster_id,
            has_context=archive is not None,
            max_context_bytes=DEFAULT_MAX_CONTEXT_BYTES,
        )
        if plan.run_dir != run_dir:  # the job storage root moved since the task was created
            raise ClientError(f"the task's directory {run_dir} is not where this master keeps tasks")
        token = secrets.token_urlsafe(32) if task_type in SERVICE_TYPES else None
        write_task_dir(self.files, plan, archive, owner, service_token=token)
        with self._tx() as s:
            task = s.get(TaskModel, task_id)
            assert task is not None
            task.submit_attempted = True
            task.service_token = token
        return plan

    def _paths(self, user_root: str) -> JobPaths:
        return JobPaths(
            job_storage_root=self.job_storage_root,
            user_root=user_root,
            checkpoint_root="",
            platform_root=self.platform_root,
            python=self.python,
        )

    def _record_job(self, task_id: str, job_id: str) -> None:
        with self._tx() as s:
            task = s.get(TaskModel, task_id)
            if task is not None:
                task.slurm_job_id = job_id
                task.submit_attempted = True
                task.pending_reason = None
        self.slurm.watch(job_id)

    def _set_pending(self, task_id: str, reason: str) -> None:
        with self._tx() as s:
            task = s.get(TaskModel, task_id)
            if task is not None and task.pending_reason != reason:
                task.pending_reason = reason

    def _fail(self, task_id: str, message: str) -> None:
        log.warning("task %s: %s", task_id, message)
        with self._tx() as s:
            task = s.get(TaskModel, task_id)
            if task is not None and task.state != TaskState.TERMINATED:
                svc.finish(task, exit_status=message)

    # ---- kill -----------------------------------------------------------------------------------------
    def cancel_killed(self) -> None:
        """scancel the job of every killed task, each tick until the job has ended (scancel is idempotent)."""
        with self._tx() as s:
            jobs = s.execute(
                select(TaskModel.slurm_job_id, UserModel.unix_username)
                .outerjoin(UserModel, UserModel.id == TaskModel.owner_id)
                .where(
                    TaskModel.kill_requested.is_(True),
                    TaskModel.state != TaskState.TERMINATED,
                    TaskModel.slurm_job_id.is_not(None),
                )
            ).all()
        for job_id, unix in jobs:
            if self.slurm.unavailable() or not self.slurm.cancel(str(job_id), self._owner_of(unix).unix):
                return  # asked again once the controller answers

    # ---- poll -----------------------------------------------------------------------------------------
    def poll(self) -> int:
        with self._tx() as s:
            live = {
                str(job_id): (task_id, run_dir, self._owner_of(unix))
                for task_id, job_id, run_dir, unix in s.execute(
                    select(TaskModel.id, TaskModel.slurm_job_id, TaskModel.run_dir, UserModel.unix_username)
                    .outerjoin(UserModel, UserModel.id == TaskModel.owner_id)
                    .where(TaskModel.state.in_(svc.LIVE_STATES), TaskModel.slurm_job_id.is_not(None))
                )
            }
        if not live:
            return 0
        statuses = self.slurm.poll(live)
        ended = 0
        for job_id, (task_id, run_dir, owner) in live.items():
            status = statuses.get(job_id)
            if status is None:
                continue
            if status.outcome is Outcome.UNSCHEDULABLE and not self.slurm.cancel(job_id, owner.unix):
                continue
            if status.is_terminal or status.outcome is Outcome.UNSCHEDULABLE:
                exit_record = self.files.read_json(posixpath.join(run_dir, EXIT_FILE), owner=owner)
                self._finish(task_id, status, exit_record)
                self.slurm.unwatch(job_id)
                ended += 1
            else:
                self._update(task_id, status, owner)
        if ended:
            self.slurm.jobs_ended()
        return ended

    def _account(self, unix: str | None) -> str | None:
        """The account a task's job and files are, where the master acts for its users; None: its own."""
        return unix if self.acts_for_users else None

    def _owner_of(self, unix: str | None) -> JobOwner:
        """Whose files a task's are (read as them by a master that acts for its users)."""
        return JobOwner(self._account(unix))

    def _update(self, task_id: str, status: JobStatus, owner: JobOwner | None = None) -> None:
        with self._tx() as s:
            task = s.get(TaskModel, task_id)
            if task is None:
                return
            discover = _to_discover(task, status)
            _apply_live_status(task, status)
        if discover is not None:
            self._discover_address(task_id, discover, owner)

    def _discover_address(self, task_id: str, discover: tuple[str, str, str], owner: JobOwner | None) -> None:
        """Record the address of a running service task's server once it answers (`discover`: its run
        directory, nodes and token)."""
        run_dir, nodes, token = discover
        service_file = posixpath.join(run_dir, SERVICE_FILE)
        address = service_address(self.files, service_file, nodes, task_id, token, owner=owner)
        if address is not None:
            with self._tx() as s:
                task = s.get(TaskModel, task_id)
                if task is not None and task.state == TaskState.RUNNING:
                    task.service_address = address
                    task.last_activity = utcnow()
            log.info("task %s: its server answers at %s", task_id, address)

    def end_idle(self, now: dt.datetime | None = None) -> int:
        """Kill the notebooks and TensorBoards that had no traffic through the proxy for their idle timeout
        (a notebook's ``idle_timeout``; a TensorBoard's, or else the master's ``tensorboard_timeout``)."""
        now = now or utcnow()
        ended = 0
        with self._tx() as s:
            for task in s.scalars(
                select(TaskModel).where(
                    TaskModel.state == TaskState.RUNNING, TaskModel.service_address.is_not(None)
                )
            ):
                timeout = idle_timeout_s(task, self.config.tensorboard_timeout_s)
                if timeout is None or task.last_activity is None:
                    continue
                idle = (now - task.last_activity).total_seconds()
                if idle >= timeout:
                    svc.kill_task(s, task)
                    task.exit_status = f"idle for {int(idle)} s, over its idle timeout of {timeout} s"
                    log.info("task %s: %s; cancelling its job", task.id, task.exit_status)
                    ended += 1
        return ended

    def _finish(self, task_id: str, status: JobStatus, exit_info: dict[str, Any] | None) -> None:
        with self._tx() as s:
            task = s.get(TaskModel, task_id)
            if task is None or task.state == TaskState.TERMINATED:
                return
            # A kill with a reason already recorded (an idle timeout) keeps it; a user's kill has none.
            why = task.exit_status if task.kill_requested else None
            code, words = task_end(JobEnd.of(status, exit_info), killed=task.kill_requested, why=why)
            if status.node_list and not task.node_list:
                task.node_list = status.node_list
            svc.finish(task, exit_status=words, exit_code=code)
        log.info("task %s (job %s) ended: %s", task_id, status.job_id, words)


def _to_discover(task: TaskModel, status: JobStatus) -> tuple[str, str, str] | None:
    """(run directory, nodes, token) of a running service task whose server's address is not known yet."""
    if (
        status.outcome is Outcome.RUNNING
        and task.service_address is None
        and TaskType(task.task_type) in SERVICE_TYPES
    ):
        return (task.run_dir, status.node_list or task.node_list or "", task.service_token or "")
    return None


def _apply_live_status(task: TaskModel, status: JobStatus) -> None:
    """What Slurm says of a live task's job: running (where), or pending (why)."""
    if status.outcome is Outcome.RUNNING:
        if task.state == TaskState.QUEUED:
            task.state = TaskState.RUNNING.value
        if status.node_list and task.node_list != status.node_list:
            task.node_list = status.node_list
        if task.pending_reason is not None or task.jobs_ahead is not None:
            task.pending_reason, task.jobs_ahead = None, None
    elif status.outcome is Outcome.PENDING:
        if task.pending_reason != status.reason:
            task.pending_reason = status.reason
        if task.jobs_ahead != status.jobs_ahead:
            task.jobs_ahead = status.jobs_ahead


def idle_timeout_s(task: TaskModel, tensorboard_timeout_s: int | None) -> int | None:
    seconds = task_config(task).idle_timeout_s()
    if seconds is not None:
        return seconds
    return tensorboard_timeout_s if task.task_type == TaskType.TENSORBOARD else None


def service_address(
    files: RunFiles,
    path: str,
    node_list: str,
    task_id: str,
    token: str,
    timeout_s: float = 0.5,
    *,
    owner: JobOwner | None = None,
) -> str | None:
    """``node:port`` once the task's server answers there and proves it holds the task's token, else None.

    The node is where Slurm placed the job (`node_list`, from squeue); the port is the job's ``service.json``'s
    (read through `files`), believed only once the door there answers a fresh nonce with HMAC(token, nonce)
    (``harness.exec.serve_door``): the file is the user's to write, and the proxy must reach nothing but
    this task's own server. The file's ``host`` is never used."""
    nodes = expand_nodelist(node_list) if node_list else []
    if len(nodes) != 1 or not token:
        return None
    host = nodes[0]
    info = files.read_json(path, owner=owner, often=True)
    if info is None:
        return None
    port = info.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        return None
    if not _proves_token(host, port, task_id, token, timeout_s):
        return None
    return f"{host}:{port}"


def _proves_token(host: str, port: int, task_id: str, token: str, timeout_s: float) -> bool:
    """Whether the door at ``host:port`` answers a fresh nonce with HMAC(token, nonce)."""
    nonce = secrets.token_hex(16)
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", f"/proxy/{task_id}/{PROOF_NAME}?nonce={nonce}")
        response = conn.getresponse()
        answer = response.read(256)
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()
    if response.status != 200 or not hmac.compare_digest(answer, proof(token, nonce).encode()):
        log.warning("task %s: %s:%s does not prove it is the task's server", task_id, host, port)
        return False
    return True


def write_task_dir(
    files: RunFiles,
    plan: TaskJobPlan,
    archive: bytes | None,
    owner: JobOwner,
    *,
    service_token: str | None = None,
) -> None:
    """``tasks`` in the user's directory (``trialjob.user_job_root``; a personal master's own, which others
    may pass through, not list), then the task's own directory, owned by the user the job runs as, with the
    plan's files and the context archive."""
    user_root = files.ensure_user_root(owner)
    parent = os.path.dirname(plan.run_dir)
    if os.path.basename(parent) != TASKS_DIR or os.path.dirname(parent) != user_root.rstrip("/"):
        raise ClientError(f"unexpected task directory {plan.run_dir}")
    if owner.unix is None:
        files.make_masters_dir(TASKS_DIR, mode=0o711)  # the master's, never chowned
    else:
        files.make_dir(parent, owner, anchor=user_root)
    files.write_files(plan.run_dir, plan.files(service_token), owner, anchor=parent)
    if archive is not None and plan.context_path is not None:
        files.write(plan.context_path, archive, owner, anchor=parent)
