"""The `slurm:` section, our addition to Determined's schema."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator

from hpc_master.expconf._base import StrictModel
from hpc_master.expconf._errors import custom_error
from slurm_backend.sbatch_args import SbatchArgError, check_header_value, validate_sbatch_args
from slurm_backend.times import time_to_minutes


class SlurmConfig(StrictModel):
    """Per-experiment Slurm settings. `time_limit` is stored in minutes (see `time_limit_min`)."""

    sbatch_args: list[str] = Field(default_factory=list)
    slots_per_node: Annotated[int, Field(ge=1)] | None = None
    gpu_type: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: int | None = None

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("expected minutes or a Slurm time string such as '1:30:00', got a boolean")
        if isinstance(v, str):
            v = time_to_minutes(v)
        if isinstance(v, int) and v < 1:
            raise ValueError(f"must be at least 1 minute, got {v}")
        if not isinstance(v, int):
            raise ValueError(f"expected minutes or a Slurm time string such as '1:30:00', got {v!r}")
        return v

    @field_validator("sbatch_args")
    @classmethod
    def _args(cls, v: list[str]) -> list[str]:
        # The Slurm backend's one policy (`slurm_backend.sbatch_args`), so that a config is refused here, with
        # the element's path, rather than at every submission. The list is kept as written.
        try:
            validate_sbatch_args(v)
        except SbatchArgError as exc:
            raise custom_error(exc.message, [exc.index]) from None
        return v

    @field_validator("partition", "account", "qos")
    @classmethod
    def _header_value(cls, v: str) -> str:
        why = check_header_value(v)
        if why:
            raise ValueError(why)
        return v

    @property
    def time_limit_min(self) -> int | None:
        return self.time_limit
