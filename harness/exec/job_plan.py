"""The run directory contract between the master (``hpc_master.jobplan``) and the job entry, and the one rule
that turns an experiment's ``entrypoint`` into the command a job runs. Standard library only: imported by both.

Run directory ``<job_storage_root>/exp-E/trial-T/run-R/`` (on the shared filesystem)::

    plan.json                  written by the master: ``job_contract.JobPlan``
    session_token              written by the master, mode 0600: the trial's bearer token (never in the script)
    cluster_info.template.json written by the master: Determined's ClusterInfo without container_addrs
    job.sbatch                 written by the master: the script it submitted (for people; never read back)
    output.log                 Slurm's stdout+stderr of the job (every rank's lines prefixed ``[rank=N]``)
    cluster_info.json          written by the job entry, mode 0600: the template + container_addrs
    rank-exits/                per-rank exit records of the launchers (DET_RANK_EXIT_DIR)
    preempt_ack                written by whoever acknowledges a preemption in the job (DET_PREEMPT_ACK_FILE)
    exit.json                  written by the job entry, atomically: why the job ended (``job_contract.ExitRecord``)

The trial directory ``<job_storage_root>/exp-E/trial-T/`` (``DET_JOB_STORAGE``) holds ``work/`` (the unpacked
context, the entrypoint's working directory, kept across the trial's runs) and the runs.
"""

from __future__ import annotations

import os
import re
import shlex

PLAN_FILE = "plan.json"
TOKEN_FILE = "session_token"
CLUSTER_INFO_TEMPLATE_FILE = "cluster_info.template.json"
CLUSTER_INFO_FILE = "cluster_info.json"
SCRIPT_FILE = "job.sbatch"
OUTPUT_FILE = "output.log"
EXIT_FILE = "exit.json"
RANK_EXIT_DIR = "rank-exits"
PREEMPT_ACK_FILE = "preempt_ack"
WORK_DIR = "work"  # under the trial directory
UNPACKED_MARKER = ".context-unpacked"  # under the trial directory: the archive's fingerprint once unpacked
STARTUP_HOOK = "startup-hook.sh"
PLAN_VERSION = 1

# plan.json's required keys: its record is harness.exec.job_contract.JobPlan (JobPlan.KEYS is this tuple), as
# the ClusterInfo's and exit.json's are ClusterInfoDoc and ExitRecord there.
PLAN_KEYS = (
    "version",
    "entrypoint",
    "slots_per_trial",
    "python",
    "context_archive",
    "max_context_bytes",
    "workdir",
    "env",
    "user_env",
    "preempt_signal",
)


def tensorboard_path(storage_root: str, experiment_id: int, trial_id: int) -> str:
    """Where a trial's TensorBoard files go (``DET_TENSORBOARD_PATH``; Determined's layout under the
    experiment's checkpoint storage), and where ``det tensorboard start`` reads them from."""
    return "/".join(
        [storage_root.rstrip("/"), "tensorboard", "experiment", str(experiment_id), "trial", str(trial_id)]
    )


TRIAL_CLASS_RE = re.compile(r"^([A-Za-z_][\w.]*):([A-Za-z_]\w*)$")
# Modules and programs that start ranks themselves: never wrapped in another launcher.
LAUNCHER_MODULES = ("launchers.", "determined.launch.", "torch.distributed.run", "torch.distributed.launch")
LAUNCHER_PROGRAMS = ("torchrun", "horovodrun", "deepspeed", "mpirun", "mpiexec", "srun")
# Launchers whose ranks are Slurm tasks (one per slot), so the job must allocate that many tasks per node.
TASK_PER_SLOT_MODULES = (
    "launchers.mpi",
    "launchers.horovod",
    "determined.launch.horovod",
    "determined.launch.mpi",
)


def _module_of(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m":
            return argv[i + 1]
    return None


def is_trial_class(entrypoint: str | list[str]) -> bool:
    """``model_def:Trial`` (the legacy Trial API form), as ``ExperimentConfig.trial_class`` reads it."""
    return isinstance(entrypoint, str) and TRIAL_CLASS_RE.match(entrypoint.strip()) is not None


def launcher_of(argv: list[str]) -> str | None:
    """The launcher an argv already runs (module name or program name), else None."""
    module = _module_of(argv)
    if module is not None and (module.startswith(LAUNCHER_MODULES) or module in LAUNCHER_MODULES):
        return module
    program = os.path.basename(argv[0]) if argv else ""
    return program if program in LAUNCHER_PROGRAMS else None


def resolve_entrypoint(entrypoint: str | list[str], slots_per_trial: int, python: str) -> list[str]:
    """The argv the job runs for an experiment's ``entrypoint``.

    - ``model_def:Trial`` → ``python -m launchers.torch_distributed --trial model_def:Trial`` (any slot count);
    - a command that is already a launcher (``python3 -m determined.launch.torch_distributed …``, ``torchrun``)
      runs as given;
    - any other command runs as given on one slot, and under ``launchers.torch_distributed`` on more.
    A string is split like a shell would (no shell runs it).
    """
    if is_trial_class(entrypoint):
        assert isinstance(entrypoint, str)
        return [python, "-m", "launchers.torch_distributed", "--trial", entrypoint.strip()]
    argv = shlex.split(entrypoint) if isinstance(entrypoint, str) else list(entrypoint)
    if not argv:
        raise ValueError("the entrypoint is empty")
    if slots_per_trial > 1 and launcher_of(argv) is None:
        return [python, "-m", "launchers.torch_distributed", *argv]
    return argv


def tasks_per_slot(argv: list[str]) -> bool:
    """True when the command's ranks are Slurm tasks (``srun --mpi=pmix`` launchers): one task per slot."""
    module = _module_of(argv)
    return module is not None and module in TASK_PER_SLOT_MODULES
