"""A task's config: Determined's command/notebook/shell/TensorBoard config, plus the experiment's `slurm:` section.

    config = parse_task_config(raw, TaskType.COMMAND)   # raises ExperimentConfigError naming the field's path

The sections are the experiment config's own models (``environment``, ``bind_mounts``, ``slurm``), so a
typo reads the same everywhere ("`slurm.partiton`: unknown field; did you mean `partition`?"). Determined's
task ``resources`` name their GPUs ``slots`` (an experiment's are ``slots_per_trial``); a command asks for
one by default, as Determined's do, and ``resources.slots: 0`` runs it on CPUs. Fields that only mean
something on Kubernetes (``pod_spec``, ``pbs``) are accepted and ignored.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator

from hpc_master.expconf._base import StrictModel
from hpc_master.expconf._errors import config_error, to_config_error
from hpc_master.expconf.environment import EnvironmentConfig
from hpc_master.expconf.resources import BindMount, Device
from hpc_master.expconf.slurm import SlurmConfig

MAX_ENTRYPOINT_ARGS = 1024
MAX_ENTRYPOINT_CHARS = 64 * 1024
IGNORED = {"pod_spec": "is for Kubernetes", "pbs": "is for PBS"}


_DURATION = re.compile(r"^\s*(\d+)\s*(s|m|h|d)?\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(value: int | str) -> int:
    """``300``, ``"300s"``, ``"30m"``, ``"2h"`` → seconds (at least 1)."""
    if isinstance(value, bool):
        raise ValueError("expected seconds or a duration such as '30m'")
    if isinstance(value, int):
        seconds = value
    else:
        m = _DURATION.match(value)
        if not m:
            raise ValueError(f"expected seconds or a duration such as '30m' or '2h', got {value!r}")
        seconds = int(m.group(1)) * _UNIT_S[m.group(2) or "s"]
    if not 1 <= seconds <= 366 * 86400:
        raise ValueError(f"must be between 1 second and a year, got {value!r}")
    return seconds


class TaskType(enum.StrEnum):
    """Determined's ``v1TaskType`` names (without the ``TASK_TYPE_`` prefix)."""

    COMMAND = "COMMAND"
    NOTEBOOK = "NOTEBOOK"
    SHELL = "SHELL"
    TENSORBOARD = "TENSORBOARD"


class TaskResources(StrictModel):
    slots: Annotated[int, Field(ge=0, le=4096)] = 1
    resource_pool: str | None = None
    priority: Annotated[int, Field(ge=1, le=99)] | None = None
    weight: Annotated[float, Field(gt=0)] = 1.0
    shm_size: int | str | None = None
    is_single_node: bool = False
    devices: list[Device] = Field(default_factory=list)


class TaskConfig(StrictModel):
    description: Annotated[str, Field(max_length=512)] | None = None
    entrypoint: list[str] | str | None = None
    resources: TaskResources = Field(default_factory=TaskResources)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    bind_mounts: list[BindMount] = Field(default_factory=list)
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)
    debug: bool = False
    idle_timeout: int | str | None = None
    """A notebook's or TensorBoard's: ended after this long with no traffic through the proxy (``30m``)."""
    notebook_idle_type: Literal["kernels_or_terminals", "kernel_connections", "activity"] = (
        "kernels_or_terminals"
    )

    @field_validator("idle_timeout")
    @classmethod
    def _idle(cls, v: int | str | None) -> int | str | None:
        if v is not None:
            duration_s(v)
        return v

    def idle_timeout_s(self) -> int | None:
        return None if self.idle_timeout is None else duration_s(self.idle_timeout)

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, v: list[str] | str | None) -> list[str] | str | None:
        if v is None:
            return v
        args = [v] if isinstance(v, str) else v
        if len(args) > MAX_ENTRYPOINT_ARGS or sum(len(a) for a in args) > MAX_ENTRYPOINT_CHARS:
            raise ValueError(f"at most {MAX_ENTRYPOINT_ARGS} arguments and {MAX_ENTRYPOINT_CHARS} characters")
        if any("\0" in a for a in args):
            raise ValueError("an argument holds a NUL character")
        if not any(a.strip() for a in args):
            raise ValueError("the command is empty")
        return v

    def argv(self) -> list[str]:
        """The entrypoint as an argv. As Determined's task entrypoint does, one word (a string, or a list of
        one) is a shell command line, run by ``/bin/sh -c`` (``det cmd run 'nvidia-smi; hostname'``); several
        words run as they are, no shell in between."""
        args = [self.entrypoint] if isinstance(self.entrypoint, str) else list(self.entrypoint or [])
        return ["/bin/sh", "-c", args[0]] if len(args) == 1 else args

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


def parse_task_config(raw: Mapping[str, Any] | None, task_type: TaskType) -> TaskConfig:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise config_error(
            f"a {task_type.lower()} config must be a mapping of fields, got {type(raw).__name__}"
        )
    data = _task_data(raw, task_type)
    try:
        config = TaskConfig.model_validate(data)
    except ValidationError as exc:
        raise to_config_error(exc, data) from None
    if task_type is TaskType.COMMAND and not config.argv():
        raise config_error("a command needs something to run: `det cmd run CMD [ARG...]`", "entrypoint")
    return config


def _task_data(raw: Mapping[str, Any], task_type: TaskType) -> dict[str, Any]:
    """`raw` without the IGNORED fields, with a TensorBoard's default of no GPU."""
    data = {k: v for k, v in raw.items() if k not in IGNORED}
    resources = data.get("resources")
    if task_type is TaskType.TENSORBOARD and (resources is None or isinstance(resources, Mapping)):
        data["resources"] = {"slots": 0, **(resources or {})}  # a TensorBoard needs no GPU unless asked
    return data
