"""Users' slurm.sbatch_args: master-owned options refused by name, every form sbatch accepts."""

from __future__ import annotations

import pytest

from hpc_master.errors import ClientError
from slurm_backend.sbatch_args import validate_sbatch_args


@pytest.mark.parametrize(
    ("args", "normalised"),
    [
        (["--mem=4G"], ("--mem=4G",)),
        (["--mem", "4G"], ("--mem=4G",)),
        (["--constraint", "a100&ib", "--exclusive"], ("--constraint=a100&ib", "--exclusive")),
        (["-C", "ib"], ("--constraint=ib",)),
        (["-Cib"], ("--constraint=ib",)),
        (
            ["--mail-type=END,FAIL", "--mail-user", "me@example.org"],
            ("--mail-type=END,FAIL", "--mail-user=me@example.org"),
        ),
        (["--exclusive=user"], ("--exclusive=user",)),
        (["--reserv=maint"], ("--reservation=maint",)),  # getopt abbreviation
        (["-w", "node1"], ("--nodelist=node1",)),
        ([], ()),
    ],
)
def test_accepted(args: list[str], normalised: tuple[str, ...]) -> None:
    assert validate_sbatch_args(args) == normalised


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--requeue"], "--requeue is set by hpc-det: jobs never requeue; the master resubmits trials"),
        (["--no-requeue"], "--no-requeue is set by hpc-det: jobs never requeue; the master resubmits trials"),
        (["--array=1-4"], "--array is set by hpc-det: each trial is one job"),
        (["-a", "1-4"], "--array is set by hpc-det: each trial is one job"),
        (["--wrap=hostname"], "--wrap is set by hpc-det: the master writes the job script"),
        (["--parsable"], "--parsable is set by hpc-det: the master reads sbatch's output"),
        (["-o", "x.log"], "--output is set by hpc-det: trial logs are collected by the master"),
        (["--output=x.log"], "--output is set by hpc-det: trial logs are collected by the master"),
        (["-e", "x.err"], "--error is set by hpc-det: trial logs are collected by the master"),
        (["-J", "x"], "--job-name is set by hpc-det: they identify the experiment and trial"),
        (["--job-name", "x"], "--job-name is set by hpc-det: they identify the experiment and trial"),
        (["--comment=x"], "--comment is set by hpc-det: they identify the experiment and trial"),
        (
            ["--signal=B:USR1@60"],
            "--signal is set by hpc-det: the preemption signal comes from the master config",
        ),
        (["-N", "2"], "--nodes is set by hpc-det from resources.slots_per_trial and slurm.gpu_type"),
        (["-N2"], "--nodes is set by hpc-det from resources.slots_per_trial and slurm.gpu_type"),
        (["--gres=gpu:2"], "--gres is set by hpc-det from resources.slots_per_trial and slurm.gpu_type"),
        (["--gpus=2"], "--gpus is set by hpc-det from resources.slots_per_trial and slurm.gpu_type"),
        (["-G", "2"], "--gpus is set by hpc-det from resources.slots_per_trial and slurm.gpu_type"),
        (
            ["--gpus-per-node=2"],
            "--gpus-per-node is set by hpc-det from resources.slots_per_trial and slurm.gpu_type",
        ),
        (
            ["--gpus-per-task=1"],
            "--gpus-per-task is set by hpc-det from resources.slots_per_trial and slurm.gpu_type",
        ),
        (["--uid=0"], "--uid is set by hpc-det: jobs run as the user's own account"),
        (["--gid", "0"], "--gid is set by hpc-det: jobs run as the user's own account"),
        (["-D", "/tmp"], "--chdir is set by hpc-det: jobs run in the trial's directory"),
        (["--chdir=/tmp"], "--chdir is set by hpc-det: jobs run in the trial's directory"),
        (["-p", "gpu"], "--partition is set by hpc-det: use slurm.partition instead"),
        (["--partition=gpu"], "--partition is set by hpc-det: use slurm.partition instead"),
        (["--part=gpu"], "--partition is set by hpc-det: use slurm.partition instead"),  # abbreviation
        (["--no-req"], "--no-requeue is set by hpc-det: jobs never requeue; the master resubmits trials"),
        (["-A", "proj"], "--account is set by hpc-det: use slurm.account instead"),
        (["--qos=high"], "--qos is set by hpc-det: use slurm.qos instead"),
        (["-t", "60"], "--time is set by hpc-det: use slurm.time_limit instead"),
        (["--export=NONE"], "--export is set by hpc-det: use environment_variables instead"),
        (["--wait"], "--wait is set by hpc-det: the master needs a job it can watch"),
        (["-M", "other"], "--clusters is set by hpc-det: the master watches jobs on its own cluster"),
    ],
)
def test_refused_with_exact_message(args: list[str], message: str) -> None:
    with pytest.raises(ClientError) as e:
        validate_sbatch_args(args)
    assert e.value.message == message
    assert e.value.field == "slurm.sbatch_args"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--frobnicate"], "'--frobnicate' is not an sbatch option"),
        (["-Z"], "'-Z' is not an sbatch option"),
        (["--mem"], "--mem needs a value"),
        (["--contiguous=yes"], "--contiguous takes no value"),
        (
            ["train.sh"],
            "'train.sh' is not an option; sbatch_args may hold only options (the master writes the script)",
        ),
        (
            ["--mem", "4G", "extra"],
            "'extra' is not an option; sbatch_args may hold only options (the master writes the script)",
        ),
        (["--mem=4G\n#SBATCH --uid=0"], "the value of --mem may not contain a line break"),
        (
            ["--gpu"],
            "'--gpu' is ambiguous: it could be --gpu-bind, --gpu-freq, --gpus, --gpus-per-node, --gpus-per-socket, --gpus-per-task",
        ),
    ],
)
def test_malformed(args: list[str], message: str) -> None:
    with pytest.raises(ClientError) as e:
        validate_sbatch_args(args)
    assert e.value.message == message


def test_one_string_is_not_a_list() -> None:
    with pytest.raises(ClientError, match="must be a list of arguments"):
        validate_sbatch_args("--mem=4G")
