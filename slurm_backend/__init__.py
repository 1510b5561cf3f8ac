"""The only code that talks to Slurm (sbatch/squeue/sacct/scontrol/scancel) and maps its job states."""

from slurm_backend.cli import CommandResult, Runner, SlurmCli, SubmitRefusedError, subprocess_runner
from slurm_backend.parse import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    parse_sacct,
    parse_sbatch_parsable,
    parse_scontrol_job,
    parse_squeue,
)
from slurm_backend.poller import Poller
from slurm_backend.render import render_sbatch_script
from slurm_backend.resources import NodeShape, slots_to_nodes
from slurm_backend.sbatch_args import validate_sbatch_args
from slurm_backend.spec import GpuRequestStyle, JobSpec
from slurm_backend.states import STATE_OUTCOMES, JobStatus, Outcome, outcome_for, reason_never_resolves

__all__ = [
    "SACCT_FIELDS",
    "SQUEUE_FORMAT",
    "STATE_OUTCOMES",
    "CommandResult",
    "GpuRequestStyle",
    "JobSpec",
    "JobStatus",
    "NodeShape",
    "Outcome",
    "Poller",
    "Runner",
    "SlurmCli",
    "SubmitRefusedError",
    "outcome_for",
    "parse_sacct",
    "parse_sbatch_parsable",
    "parse_scontrol_job",
    "parse_squeue",
    "reason_never_resolves",
    "render_sbatch_script",
    "slots_to_nodes",
    "subprocess_runner",
    "validate_sbatch_args",
]
