"""What the task routes answer (``responses`` has the rest): Determined's ``v1Command`` and its kin.

A command, notebook, TensorBoard and shell share one shape, under a key named for the type (``command``,
``notebook``, ...): ``answers(key)`` makes each type's launch, get, kill and list answers.
"""

from __future__ import annotations

from functools import cache
from typing import Any, NotRequired

from pydantic import BaseModel, ConfigDict, create_model, with_config
from typing_extensions import TypedDict

from hpc_master.api.responses import STRICT, Mapping


@with_config(STRICT)
class Task(TypedDict):
    """Determined's ``v1Command`` (``v1Notebook`` ... have the same fields), plus what Slurm says (ours). A
    preview (``--preview``: nothing launched) has only the fields that a task that does not exist has."""

    id: str
    description: str
    state: str
    username: str
    resourcePool: str
    startTime: str | None
    jobId: str
    workspaceId: int
    serviceAddress: str
    isReady: bool
    container: NotRequired[None]
    userId: NotRequired[int]
    displayName: NotRequired[str]
    endTime: NotRequired[str | None]
    exitStatus: NotRequired[str | None]
    exitCode: NotRequired[int | None]
    slurmJobId: NotRequired[str | None]  # ours
    nodeList: NotRequired[str | None]  # ours
    pendingReason: NotRequired[str | None]  # ours
    pendingClass: NotRequired[str | None]  # ours (as a trial run's)
    stuck: NotRequired[bool]  # ours
    jobsAhead: NotRequired[int | None]  # ours
    taskType: NotRequired[str]
    workDir: NotRequired[str]  # ours


class TaskAnswers:
    """One task type's answers, named for it (``LaunchCommand``, ``GetCommand``, ...)."""

    def __init__(self, key: str, plural: str) -> None:
        name = key.capitalize() if key != "tensorboard" else "TensorBoard"
        self.launched = _model(f"Launched{name}", {key: Task, "config": Mapping, "warnings": list[str]})
        self.got = _model(f"{name}Answer", {key: Task, "config": Mapping})
        self.killed = _model(f"Killed{name}", {key: Task})
        self.listed = _model(f"{name}List", {plural: list[Task], "pagination": None})


@cache
def answers(key: str, plural: str) -> TaskAnswers:
    return TaskAnswers(key, plural)


def _model(name: str, fields: dict[str, Any]) -> type[BaseModel]:
    spec: dict[str, Any] = {k: (v, ...) for k, v in fields.items()}
    return create_model(name, __config__=ConfigDict(extra="forbid"), **spec)


@with_config(STRICT)
class AllocationSummary(TypedDict):
    """Determined's ``v1AllocationSummary`` (what ``det task list`` prints)."""

    taskId: str
    allocationId: str
    name: str
    registeredTime: str | None
    resourcePool: str
    slotsNeeded: int
    resources: list[Mapping]
    schedulerType: str
    priority: int | None
    proxyPorts: list[Mapping]
    username: str
    state: str
    taskType: str
    slurmJobId: str | None  # ours


@with_config(STRICT)
class AllocationSummaries(TypedDict):
    allocationIdToSummary: dict[str, AllocationSummary]


@with_config(STRICT)
class Allocation(TypedDict):
    taskId: str
    allocationId: str
    state: str
    isReady: bool
    startTime: str | None
    endTime: str | None
    slots: int


@with_config(STRICT)
class GenericTask(TypedDict):
    """Determined's ``v1Task``, plus the task's description, exit and Slurm job (ours)."""

    taskId: str
    taskType: str
    startTime: str | None
    endTime: str | None
    allocations: list[Allocation]
    description: str
    exitStatus: str | None
    exitCode: int | None
    slurmJobId: str | None
    nodeList: str | None


@with_config(STRICT)
class GenericTaskAnswer(TypedDict):
    task: GenericTask
