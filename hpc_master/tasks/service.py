"""Tasks in the database: create, find (owner-only), kill, and their JSON (Determined's ``v1Command`` fields).

A task's states, and what moves it on (``hpc_master.tasks.driver`` does the Slurm half)::

    QUEUED ──(Slurm starts the job)──▶ RUNNING ──(the job ends)──▶ TERMINATED
      │  └──(the job ends before it ran: refused, cancelled, lost)──────────▲
      └──(kill)──▶ TERMINATING ──(the job ends; scancel every tick until it does)──┘
    QUEUED and never submitted ──(kill)──▶ TERMINATED at once

Every state but TERMINATED has a way out that needs nobody: the loop submits what is queued, polls what
was submitted, and cancels what was killed. Only the owner and admins see or touch a task: another user's
task is "not found", as a file another user cannot read would be.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hpc_master.db.models import TaskModel, UserModel, utcnow
from hpc_master.errors import ClientError, NotFoundError
from hpc_master.expconf.tasks import TaskConfig, TaskType
from hpc_master.services import access, audit
from hpc_master.services.access import Principal
from hpc_master.services.stored_config import task_config
from slurm_backend import pending

MAX_LIVE_TASKS_PER_USER = 100
"""Tasks not yet terminated, per user: a runaway script gets an error, not a thousand jobs."""
WORKSPACE_ID = 1  # Determined's default workspace, the only one here


class TaskState(enum.StrEnum):
    """Determined's ``taskv1State`` values that a Slurm-run task goes through."""

    QUEUED = "STATE_QUEUED"
    RUNNING = "STATE_RUNNING"
    TERMINATING = "STATE_TERMINATING"
    TERMINATED = "STATE_TERMINATED"


LIVE_STATES = (TaskState.QUEUED, TaskState.RUNNING, TaskState.TERMINATING)
KILLABLE_STATES = (TaskState.QUEUED, TaskState.RUNNING)  # a TERMINATING task is being killed already


def task_vocabulary() -> dict[str, object]:
    """The web UI's words for tasks: their states, which are live (not ended), what each state allows."""
    return {
        "taskStates": [s.value for s in TaskState],
        "liveTaskStates": [s.value for s in LIVE_STATES],
        "taskActions": {s.value: ["kill"] if s in KILLABLE_STATES else [] for s in TaskState},
    }


def new_task_id() -> str:
    return str(uuid.uuid4())


def default_description(task_type: TaskType, config: TaskConfig) -> str:
    if config.description:
        return config.description
    entrypoint = config.entrypoint
    shown = entrypoint if isinstance(entrypoint, str) else " ".join(entrypoint or [])
    words = {TaskType.COMMAND: "Command", TaskType.NOTEBOOK: "JupyterLab", TaskType.SHELL: "Shell"}
    head = words.get(task_type, "TensorBoard")
    return f"{head} ({shown[:60]}{'…' if len(shown) > 60 else ''})" if shown else head


def create_task(
    session: Session,
    principal: Principal,
    task_type: TaskType,
    config: TaskConfig,
    *,
    run_dir_of: Any,
    resource_pool: str,
    context_archive: bytes | None,
    service_args: list[str] | None = None,
) -> TaskModel:
    """A QUEUED task owned by the caller; the loop submits its job. `run_dir_of(task_id)` names its
    directory (recorded: nothing later derives a path from a request)."""
    live = session.scalar(
        select(func.count())
        .select_from(TaskModel)
        .where(TaskModel.owner_id == principal.user_id, TaskModel.state.in_(LIVE_STATES))
    )
    if (live or 0) >= MAX_LIVE_TASKS_PER_USER:
        raise ClientError(
            f"you have {live} tasks that have not ended, the most one user may have; `det task list` shows "
            "them and `det cmd kill ID` ends one",
            code="too_many_tasks",
        )
    task_id = new_task_id()
    task = TaskModel(
        id=task_id,
        task_type=task_type.value,
        owner_id=principal.user_id,
        description=default_description(task_type, config),
        state=TaskState.QUEUED.value,
        config=config.to_dict(),
        context_archive=context_archive,
        resource_pool=resource_pool,
        run_dir=str(run_dir_of(task_id)),
        service_args=service_args,
        submit_attempted=False,
        kill_requested=False,
    )
    session.add(task)
    session.flush()
    return task


def get_task(
    session: Session, principal: Principal, task_id: str, task_type: TaskType | None = None
) -> TaskModel:
    """The task, if the caller may see it (its owner, or an admin) and it is of `task_type` (when given)."""
    task = session.get(TaskModel, task_id)
    if (
        task is None
        or not access.task_visible(principal, task.owner_id)
        or (task_type is not None and task.task_type != task_type.value)
    ):
        what = task_type.lower() if task_type else "task"
        raise NotFoundError(f"{what} {task_id} not found")
    # Recorded when an admin reaches another user's task (``cross_user`` skips one's own).
    audit.cross_user(session, actor_id=principal.user_id, actor=principal.username, owner_id=task.owner_id,
                     target=f"{task.task_type.lower()} {task.id}")  # fmt: skip
    return task


def list_tasks(
    session: Session,
    principal: Principal,
    task_type: TaskType | None = None,
    *,
    everyone: bool = False,
    live_only: bool = False,
    usernames: Sequence[str] = (),
    limit: int = 1000,
) -> list[tuple[TaskModel, UserModel]]:
    """The caller's tasks, newest last; an admin's `everyone` (or `usernames`) reaches other users'."""
    stmt = select(TaskModel, UserModel).join(UserModel, UserModel.id == TaskModel.owner_id)
    if task_type is not None:
        stmt = stmt.where(TaskModel.task_type == task_type.value)
    stmt = access.only_own(stmt, TaskModel.owner_id, principal, everyone=everyone or bool(usernames))
    if usernames and access.lists_everyone(principal):
        stmt = stmt.where(UserModel.username.in_(list(usernames)))
    if live_only:
        stmt = stmt.where(TaskModel.state.in_(LIVE_STATES))
    stmt = stmt.order_by(TaskModel.start_time.desc(), TaskModel.id).limit(limit)
    rows = [(t, u) for t, u in session.execute(stmt).all()]
    rows.reverse()
    return rows


def kill_task(session: Session, task: TaskModel) -> None:
    """Idempotent. A task whose job was never asked for ends at once; otherwise the loop cancels the job."""
    if task.state == TaskState.TERMINATED:
        return
    task.kill_requested = True
    if task.slurm_job_id is None and not task.submit_attempted:
        finish(task, exit_status="killed by the user before it was submitted to Slurm")
    else:
        task.state = TaskState.TERMINATING.value


def finish(task: TaskModel, *, exit_status: str, exit_code: int | None = None) -> None:
    task.state = TaskState.TERMINATED.value
    task.exit_status = exit_status
    task.exit_code = exit_code
    task.pending_reason = None
    task.end_time = utcnow()
    task.context_archive = None  # it was written to the run directory, or never will be


def _iso(when: dt.datetime | None) -> str | None:
    if when is None:
        return None
    return when.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def task_to_api(task: TaskModel, owner: UserModel) -> dict[str, Any]:
    """Determined's ``v1Command`` (and ``v1Notebook``, … : the same fields), plus what Slurm says."""
    return {
        "id": task.id,
        "description": task.description,
        "state": task.state,
        "container": None,
        "username": owner.username,
        "userId": owner.id,
        "displayName": owner.display_name or owner.username,
        "resourcePool": task.resource_pool,
        "startTime": _iso(task.start_time),
        "endTime": _iso(task.end_time),
        "exitStatus": task.exit_status,
        "exitCode": task.exit_code,
        "jobId": task.slurm_job_id or "",
        "slurmJobId": task.slurm_job_id,
        "nodeList": task.node_list,
        "pendingReason": task.pending_reason,
        "pendingClass": pending.classify(task.pending_reason),
        "stuck": pending.is_stuck(task.pending_reason),
        "jobsAhead": task.jobs_ahead,
        "workspaceId": WORKSPACE_ID,
        "taskType": task.task_type,
        "serviceAddress": f"/proxy/{task.id}/" if task.service_address else "",
        "isReady": task.state == TaskState.RUNNING
        and (bool(task.service_address) or task.task_type == TaskType.SHELL),
        "workDir": f"{task.run_dir.rstrip('/')}/work",
    }


def preview_to_api(
    task_type: TaskType, config: TaskConfig, resource_pool: str, username: str
) -> dict[str, Any]:
    """What ``task_to_api`` would answer for a task launched with `config`, before it exists: no id, no job,
    state ``STATE_UNSPECIFIED`` (Determined's answer to ``preview``)."""
    return {
        "id": "",
        "description": default_description(task_type, config),
        "state": "STATE_UNSPECIFIED",
        "username": username,
        "resourcePool": resource_pool,
        "startTime": "1970-01-01T00:00:00Z",
        "jobId": "",
        "workspaceId": WORKSPACE_ID,
        "serviceAddress": "",
        "isReady": False,
    }


def allocation_summary(task: TaskModel, owner: UserModel) -> dict[str, Any]:
    """Determined's ``v1AllocationSummary`` (what ``det task list`` prints)."""
    resources = task_config(task).resources
    return {
        "taskId": task.id,
        "allocationId": f"{task.id}.1",
        "name": task.description,
        "registeredTime": _iso(task.start_time),
        "resourcePool": task.resource_pool,
        "slotsNeeded": resources.slots,
        "resources": [],
        "schedulerType": "slurm",
        "priority": resources.priority,
        "proxyPorts": [],
        "username": owner.username,
        "state": task.state,
        "taskType": task.task_type,
        "slurmJobId": task.slurm_job_id,
    }
