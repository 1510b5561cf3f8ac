"""Commands, and what every task has (Determined's ``/api/v1/commands`` and ``/api/v1/tasks`` routes).

Owner-only: a user sees, kills and reads the logs of their own tasks; an admin of everyone's; a per-trial
token of none. Files are read only from the task's recorded run directory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path as PurePath
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import StreamingResponse
from pydantic import ConfigDict, Field
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from hpc_master.admission import admit_task
from hpc_master.api import responses_tasks, responses_ui
from hpc_master.api.bounds import Id, Limit, OptionalId
from hpc_master.api.deps import State, UserPrincipal
from hpc_master.api.schemas import ApiModel, ModelDefinitionFile
from hpc_master.api.streams import ndjson, open_stream, stream_threads
from hpc_master.db.models import UserModel
from hpc_master.errors import ClientError
from hpc_master.expconf import load_yaml
from hpc_master.expconf.tasks import TaskConfig, TaskType
from hpc_master.services import context as ctx
from hpc_master.services import log_follow, logs, notify
from hpc_master.services.access import Principal
from hpc_master.services.stored_config import task_config
from hpc_master.taskjob import task_run_dir
from hpc_master.tasks import service as svc
from hpc_master.tasks.tensorboard import logdir_spec
from hpc_master.trialjob import user_job_root

router = APIRouter(prefix="/api/v1", tags=["tasks"])

TASK_ID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
TaskId = Annotated[str, Path(pattern=TASK_ID_PATTERN, max_length=36)]
MAX_FILES = 100_000


class LaunchTaskRequest(ApiModel):
    """Determined's ``v1LaunchCommandRequest``: ``config`` is a mapping (or YAML text), ``files`` the
    context directory as ``det e create`` sends it."""

    model_config = ConfigDict(extra="forbid")
    config: dict[str, Any] | str = Field(default_factory=dict)
    files: list[ModelDefinitionFile] = Field(default_factory=list, max_length=MAX_FILES)
    template_name: str | None = Field(default=None, alias="templateName", max_length=256)
    workspace_id: OptionalId | None = Field(default=None, alias="workspaceId")
    data: str | None = Field(default=None, max_length=1 << 20)
    # Determined's client sends null for the ids it was not given (`det tensorboard start EXP`).
    experiment_ids: list[Id] | None = Field(default=None, alias="experimentIds", max_length=1000)
    trial_ids: list[Id] | None = Field(default=None, alias="trialIds", max_length=1000)
    preview: bool = False
    """Determined's ``--preview``: answer the completed config and what the task would be; launch nothing."""


def launch(state: State, principal: Any, body: LaunchTaskRequest, task_type: TaskType) -> dict[str, Any]:
    """Validate the config, dry-run its job against the pool, store the task QUEUED (the loop submits it)."""
    if body.template_name:
        raise ClientError(
            "this master has no config templates: pass the settings with --config-file or --config",
            code="not_supported",
            field="templateName",
        )
    if body.workspace_id not in (None, 0, svc.WORKSPACE_ID):
        raise ClientError(f"workspace {body.workspace_id} not found", code="not_found", field="workspaceId")
    raw = load_yaml(body.config) if isinstance(body.config, str) else body.config
    files = ctx.parse_model_definition([f.model_dump(by_alias=False) for f in body.files])
    admitted = admit_task(
        raw,
        task_type,
        state.config,
        master_url=state.config.master_url(),
        cluster_id=state.cluster_id,
        has_context=bool(files),
    )
    config, pool, root = admitted.config, admitted.pool, str(state.config.job_storage_dir())
    archive = ctx.pack_context(files) if files else None
    experiment_ids, trial_ids = _tensorboard_ids(body, task_type)
    with state.tx() as session:
        service_args = None
        if task_type is TaskType.TENSORBOARD:
            service_args = _tensorboard_args(
                session, principal, config, experiment_ids, trial_ids, str(state.config.checkpoint_dir())
            )
        if body.preview:
            return {"config": config.to_dict(), "warnings": [],
                    task_type.lower(): svc.preview_to_api(task_type, config, pool.name, principal.username)}  # fmt: skip
        owner = session.get(UserModel, principal.user_id)
        assert owner is not None
        user_root = user_job_root(root, owner.unix_username if state.acts_for_users else None)
        task = svc.create_task(
            session,
            principal,
            task_type,
            config,
            run_dir_of=lambda task_id: task_run_dir(user_root, task_id),
            resource_pool=pool.name,
            context_archive=archive,
            service_args=service_args,
        )
        answer = {"config": task.config, "warnings": []}
        answer[task_type.lower()] = svc.task_to_api(task, owner)
    notify.changed()
    return answer


def _tensorboard_ids(body: LaunchTaskRequest, task_type: TaskType) -> tuple[list[int], list[int]]:
    """The experiments and trials asked for (only a TensorBoard takes any)."""
    experiment_ids, trial_ids = body.experiment_ids or [], body.trial_ids or []
    if task_type is not TaskType.TENSORBOARD and (experiment_ids or trial_ids):
        raise ClientError("only a TensorBoard takes experimentIds and trialIds", field="experimentIds")
    return experiment_ids, trial_ids


def _tensorboard_args(
    session: Session,
    principal: Principal,
    config: TaskConfig,
    experiment_ids: list[int],
    trial_ids: list[int],
    checkpoint_root: str,
) -> list[str]:
    """A TensorBoard's server arguments for what it shows; with no description, one naming its experiments."""
    service_args, experiments = logdir_spec(session, principal, experiment_ids, trial_ids, checkpoint_root)
    if not config.description:
        word = "experiment" if len(experiments) == 1 else "experiments"
        config.description = f"TensorBoard ({word} {', '.join(map(str, experiments))})"[:512]
    return service_args


def _add_typed_routes(plural: str, task_type: TaskType) -> None:
    """Determined's launch, list, get and kill routes of one task type (``/commands``, ``/notebooks``, …)."""
    key = task_type.lower()
    shapes = responses_tasks.answers(key, plural)

    def launch_route(body: LaunchTaskRequest, state: State, principal: UserPrincipal) -> dict[str, Any]:
        return launch(state, principal, body, task_type)

    def list_route(
        state: State,
        principal: UserPrincipal,
        users: Annotated[list[str], Query(max_length=100)] = [],  # noqa: B006
        limit: Limit = 1000,
    ) -> dict[str, Any]:
        with state.tx() as session:
            rows = svc.list_tasks(
                session, principal, task_type, everyone=True, usernames=users, limit=_limit(limit)
            )
            return {plural: [svc.task_to_api(t, u) for t, u in rows], "pagination": None}

    def get_route(task_id: TaskId, state: State, principal: UserPrincipal) -> dict[str, Any]:
        with state.tx() as session:
            task = svc.get_task(session, principal, task_id, task_type)
            owner = session.get(UserModel, task.owner_id)
            assert owner is not None
            return {key: svc.task_to_api(task, owner), "config": task.config}

    def kill_route(task_id: TaskId, state: State, principal: UserPrincipal) -> dict[str, Any]:
        with state.tx() as session:
            task = svc.get_task(session, principal, task_id, task_type)
            svc.kill_task(session, task)
            owner = session.get(UserModel, task.owner_id)
            assert owner is not None
            answer = {key: svc.task_to_api(task, owner)}
        notify.changed()
        return answer

    def add(path: str, route: Callable[..., Any], method: str, name: str, shape: type[Any]) -> None:
        router.add_api_route(path, route, methods=[method], name=name, response_model=shape)

    add(f"/{plural}", launch_route, "POST", f"launch_{key}", shapes.launched)
    add(f"/{plural}", list_route, "GET", f"list_{plural}", shapes.listed)
    add(f"/{plural}/{{task_id}}", get_route, "GET", f"get_{key}", shapes.got)
    add(f"/{plural}/{{task_id}}/kill", kill_route, "POST", f"kill_{key}", shapes.killed)


_add_typed_routes("commands", TaskType.COMMAND)
_add_typed_routes("notebooks", TaskType.NOTEBOOK)
_add_typed_routes("tensorboards", TaskType.TENSORBOARD)
_add_typed_routes("shells", TaskType.SHELL)


@router.get("/tasks", response_model=responses_tasks.AllocationSummaries)
def list_tasks(state: State, principal: UserPrincipal) -> dict[str, Any]:
    """Determined's ``GetTasks``: the caller's tasks that have not ended (an admin's: everyone's), by
    allocation id."""
    with state.tx() as session:
        rows = svc.list_tasks(session, principal, everyone=True, live_only=True)
        return {"allocationIdToSummary": {f"{t.id}.1": svc.allocation_summary(t, u) for t, u in rows}}


@router.get("/tasks/{task_id}", response_model=responses_tasks.GenericTaskAnswer)
def get_task(task_id: TaskId, state: State, principal: UserPrincipal) -> dict[str, Any]:
    with state.tx() as session:
        task = svc.get_task(session, principal, task_id)
        owner = session.get(UserModel, task.owner_id)
        assert owner is not None
        api = svc.task_to_api(task, owner)
        return {
            "task": {
                "taskId": task.id,
                "taskType": f"TASK_TYPE_{task.task_type}",
                "startTime": api["startTime"],
                "endTime": api["endTime"],
                "allocations": [
                    {
                        "taskId": task.id,
                        "allocationId": f"{task.id}.1",
                        "state": task.state,
                        "isReady": task.state == svc.TaskState.RUNNING,
                        "startTime": api["startTime"],
                        "endTime": api["endTime"],
                        "slots": task_config(task).resources.slots,
                    }
                ],
                **{k: api[k] for k in ("description", "exitStatus", "exitCode", "slurmJobId", "nodeList")},
            }
        }


@router.get("/tasks/{task_id}/logs", **responses_ui.ndjson(responses_ui.TaskLogLine))
async def task_logs(
    task_id: TaskId,
    state: State,
    principal: UserPrincipal,
    follow: bool = False,
    limit: Limit = 0,
    search_text: Annotated[str, Query(alias="searchText", max_length=1024)] = "",
) -> StreamingResponse:
    """Newline-delimited JSON, one ``{"result": {...}}`` per line (Determined's ``TaskLogs``): the job's output
    file; with ``follow=true`` the stream stays open until the task has ended and its last line was sent."""

    def snapshot() -> tuple[list[logs.LogSource], bool]:
        with state.tx() as session:
            task = svc.get_task(session, principal, task_id)
            path = task.run_dir.rstrip("/") + "/output.log"
            anchor = state.config.job_storage_dir()
            owner = session.get(UserModel, task.owner_id)
            unix = owner.unix_username if owner is not None and state.acts_for_users else None
            source = logs.LogSource(1, PurePath(path), anchor, owner_unix=unix)
            return [source], task.state == svc.TaskState.TERMINATED

    sources, done = await run_in_threadpool(snapshot)  # 404 before the stream starts

    def entry(line: dict[str, object]) -> dict[str, object]:
        return {
            "id": str(line["id"]),
            "taskId": task_id,
            "allocationId": f"{task_id}.1",
            "message": line["message"],
            "log": line["log"],
            "level": line["level"],
            "timestamp": line["timestamp"],
            "stdtype": line["stdtype"],
            "source": line["source"],
            "rankId": line["rankId"],
        }

    spec = log_follow.Follow(
        stream_threads.run, snapshot, state.log_reader, follow=follow, limit=limit,
        keep=lambda line: not search_text or search_text in str(line["log"]),
    )  # fmt: skip

    async def stream() -> AsyncIterator[bytes]:
        async for lines in log_follow.batches(spec, sources, done):
            yield ndjson(entry(x) for x in lines)

    return open_stream(state.streams, principal, stream())


def _limit(limit: int) -> int:
    return 1000 if limit <= 0 else min(limit, 10_000)
