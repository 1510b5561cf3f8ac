"""JobSpec: everything the master decides about one Slurm job, as a frozen value rendered by `render.py`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from det_errors import ClientError
from slurm_backend.sbatch_args import validate_sbatch_args

GpuRequestStyle = Literal["gres", "gpus_per_node", "none"]
GPU_REQUEST_STYLES: tuple[GpuRequestStyle, ...] = ("gres", "gpus_per_node", "none")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SIGNAL = re.compile(r"^(SIG)?[A-Z0-9]+$")
_GPU_TYPE = re.compile(r"^[A-Za-z0-9_.-]+$")
NICE_MAX = 2_147_483_645  # Slurm's largest --nice (a negative one needs an operator: never ours)


@dataclass(frozen=True)
class JobSpec:
    job_name: str
    comment: str  # identifies the run and its master, e.g. "hpc-det:1b4e28ba2fa1:exp=3,trial=7,run=2"
    commands: tuple[tuple[str, ...], ...]  # argv lists run in order; the last is exec'ed (gets the signal)
    output_path: str  # stdout and stderr; Slurm expands %j
    workdir: str
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit_min: int | None = None
    nodes: int = 1
    ntasks_per_node: int = 1
    cpus_per_task: int | None = None
    gpus_per_node: int = 0
    gpu_type: str | None = None
    gpu_request_style: GpuRequestStyle = "gres"
    mem_per_node_mb: int | None = None
    preempt_signal: str = "USR1"
    preempt_lead_s: int | None = None  # None: no --signal; else --signal=B:<sig>@<lead_s>
    env: tuple[tuple[str, str], ...] = ()  # exported in the script body, in this order
    extra_sbatch_args: tuple[str, ...] = ()  # the user's slurm.sbatch_args (validated here)
    nice: int | None = None  # --nice: the experiment's priority (hpc_master.priority); None: not passed
    exec_last: bool = True

    def __post_init__(self) -> None:
        self._check_counts()
        self._check_gpus()
        self._check_preemption()
        self._check_script()
        # Normalise and refuse master-owned options once, here, so a JobSpec is always renderable.
        object.__setattr__(self, "extra_sbatch_args", validate_sbatch_args(self.extra_sbatch_args))

    def _check_counts(self) -> None:
        for name in ("nodes", "ntasks_per_node"):
            _positive(name, getattr(self, name))
        for name in ("time_limit_min", "cpus_per_task", "mem_per_node_mb"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.nice is not None and not 0 <= self.nice <= NICE_MAX:
            raise ClientError(f"nice must be 0 to {NICE_MAX}, not {self.nice}", field="nice")

    def _check_gpus(self) -> None:
        if self.gpus_per_node < 0:
            raise ClientError("gpus_per_node must be ≥ 0", field="gpus_per_node")
        if self.gpu_request_style not in GPU_REQUEST_STYLES:
            raise ClientError(
                f"gpu_request_style must be one of {', '.join(GPU_REQUEST_STYLES)}", field="gpu_request_style"
            )
        if self.gpu_request_style == "none" and self.gpus_per_node:
            raise ClientError(
                f"this resource pool is CPU-only (gpu_request_style none) but {self.gpus_per_node} GPUs "
                "per node were asked for",
                field="resources.slots_per_trial",
            )
        if self.gpu_type is not None and not _GPU_TYPE.match(self.gpu_type):
            raise ClientError(
                f"gpu_type {self.gpu_type!r} may hold only letters, digits, _ . -", field="slurm.gpu_type"
            )

    def _check_preemption(self) -> None:
        if self.preempt_lead_s is not None:
            if self.preempt_lead_s < 0 or self.preempt_lead_s > 65535:
                raise ClientError("preempt_lead_s must be between 0 and 65535", field="preempt_lead_s")
            if not _SIGNAL.match(self.preempt_signal):
                raise ClientError(f"not a signal name: {self.preempt_signal!r}", field="preempt_signal")

    def _check_script(self) -> None:
        for key, _ in self.env:
            if not _ENV_NAME.match(key):
                raise ClientError(
                    f"{key!r} is not a valid environment variable name", field="environment_variables"
                )
        if not self.commands or any(not cmd for cmd in self.commands):
            raise ClientError("a job needs at least one non-empty command", field="commands")

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ClientError(f"{name} must be a whole number ≥ 1, not {value!r}", field=name)
