"""The `resources:` section (Determined v0) and `bind_mounts` entries."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field, field_validator

from hpc_master.expconf._base import StrictModel

_MEM_RE = re.compile(r"^([0-9]*[.])?[0-9]+ ?(([kmgtpKMGTP]([iI]?[bB])?)|[bB])?$")
_MEM_FACTORS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def memory_bytes(size: int | str) -> int:
    """`"4G"`, `"512Mi"`, `"1.5 GB"`, `1024` → bytes. Units are binary (Docker's convention, as Determined)."""
    if isinstance(size, int):
        return size
    m = re.match(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgtpKMGTP]?)", size)
    if not m:
        raise ValueError(f"not a memory size: {size!r}")
    return int(float(m.group(1)) * _MEM_FACTORS[m.group(2).lower()])


class Device(StrictModel):
    host_path: str
    container_path: str
    mode: str = "mrw"


class ResourcesConfig(StrictModel):
    """`slots_per_trial` GPUs per trial (0 = CPU only), spread over nodes by the pool's slots per node."""

    slots_per_trial: Annotated[int, Field(ge=0)] = 1
    max_slots: Annotated[int, Field(ge=1)] | None = None
    priority: Annotated[int, Field(ge=1, le=99)] | None = None
    weight: Annotated[float, Field(gt=0)] = 1.0
    resource_pool: str | None = None
    shm_size: int | str | None = None
    is_single_node: bool = False
    devices: list[Device] = Field(default_factory=list)

    @field_validator("shm_size", mode="before")
    @classmethod
    def _shm(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int | str):
            raise ValueError("expected a memory size such as 4294967296, '4G' or '512Mi'")
        if isinstance(v, str) and not _MEM_RE.match(v):
            raise ValueError(f"expected a memory size such as '4G' or '512Mi', got {v!r}")
        if isinstance(v, int) and v < 0:
            raise ValueError(f"must be >= 0, got {v}")
        return v

    @property
    def shm_size_bytes(self) -> int | None:
        return None if self.shm_size is None else memory_bytes(self.shm_size)


class BindMount(StrictModel):
    host_path: str
    container_path: str
    read_only: bool = False
    propagation: str = "rprivate"

    @field_validator("host_path")
    @classmethod
    def _abs(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"must be an absolute path, got {v!r}")
        return v

    @field_validator("container_path")
    @classmethod
    def _not_dot(cls, v: str) -> str:
        if v in ("", "."):
            raise ValueError('must not be "." or empty (the working directory is the context directory)')
        return v
