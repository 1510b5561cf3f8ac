"""Golden tests of rendered sbatch scripts (DET_UPDATE_GOLDEN=1 rewrites the golden files)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hpc_master.errors import ClientError
from slurm_backend.render import render_sbatch_script, sbatch_line
from slurm_backend.spec import JobSpec

GOLDEN = Path(__file__).parent / "golden" / "slurm_backend"
BASE: dict[str, Any] = {
    "job_name": "det-exp3-trial7",
    "comment": "hpc-det:exp=3,trial=7,run=2",
    "output_path": "/shared/det/exp3/trial7/run2/slurm-%j.log",
    "workdir": "/shared/det/exp3/trial7",
    "commands": (("/opt/det/venv/bin/python", "-m", "harness.entry", "--trial", "7"),),
}
SPECS = {
    "one_gpu": JobSpec(**BASE, gpus_per_node=1),
    "two_nodes_gres_type": JobSpec(
        **BASE, nodes=2, gpus_per_node=2, gpu_type="a100", cpus_per_task=4, mem_per_node_mb=16000
    ),
    "gpus_per_node_style": JobSpec(
        **BASE, nodes=2, gpus_per_node=4, gpu_type="h100", gpu_request_style="gpus_per_node"
    ),
    "cpu_only": JobSpec(**BASE, gpus_per_node=0, gpu_request_style="none", cpus_per_task=8),
    "everything": JobSpec(
        job_name="det exp 3 #7",  # a space and a '#' in an #SBATCH value: double-quoted
        comment="hpc-det:exp=3,trial=7,run=2",
        output_path="/shared/det/exp 3/slurm-%j.log",
        workdir="/shared/det/exp3/trial7",
        partition="gpu",
        account="proj-42",
        qos="high",
        time_limit_min=240,
        gpus_per_node=2,
        preempt_signal="SIGUSR1",
        preempt_lead_s=120,
        env=(("DET_TRIAL_ID", "7"), ("DET_HPARAMS", '{"lr": 0.1, "name": "it\'s $HOME"}')),
        extra_sbatch_args=("--constraint", "a100&ib", "--exclusive", "--mail-type=END"),
        commands=(
            ("mkdir", "-p", "/shared/det/exp 3"),
            ("srun", "--ntasks-per-node=1", "python3", "-c", "print('hi; rm -rf /')"),
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_render_matches_golden(name: str) -> None:
    text = render_sbatch_script(SPECS[name])
    golden = GOLDEN / f"{name}.sbatch"
    if os.environ.get("DET_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


def test_every_script_refuses_requeue_and_has_no_user_string_unquoted() -> None:
    for spec in SPECS.values():
        text = render_sbatch_script(spec)
        assert "#SBATCH --no-requeue\n" in text
        assert text.startswith("#!/bin/bash\n")
    text = render_sbatch_script(SPECS["everything"])
    assert "exec srun --ntasks-per-node=1 python3 -c 'print('\"'\"'hi; rm -rf /'\"'\"')'\n" in text


@pytest.mark.parametrize("field", ["job_name", "comment", "output_path", "workdir"])
def test_newline_in_header_value_is_refused(field: str) -> None:
    spec = JobSpec(**{**BASE, field: "x\n#SBATCH --uid=0"})
    with pytest.raises(ClientError, match="may not contain a line break"):
        render_sbatch_script(spec)


def test_quote_in_header_value_is_refused() -> None:
    with pytest.raises(ClientError, match="double quote"):
        sbatch_line("job-name", 'a"b')


def test_extra_arg_conflicting_with_spec_is_refused() -> None:
    spec = JobSpec(**BASE, mem_per_node_mb=1000, extra_sbatch_args=("--mem=2G",))
    with pytest.raises(ClientError, match="--mem is already set by hpc-det for this job"):
        render_sbatch_script(spec)


def test_spec_refuses_master_owned_extra_args() -> None:
    with pytest.raises(ClientError, match="--gres is set by hpc-det"):
        JobSpec(**BASE, extra_sbatch_args=("--gres=gpu:8",))


def test_spec_validation() -> None:
    with pytest.raises(ClientError, match="CPU-only"):
        JobSpec(**BASE, gpus_per_node=2, gpu_request_style="none")
    with pytest.raises(ClientError, match="nodes must be a whole number"):
        JobSpec(**BASE, nodes=0)
    with pytest.raises(ClientError, match="not a valid environment variable name"):
        JobSpec(**BASE, env=(("A-B", "1"),))
    with pytest.raises(ClientError, match="gpu_type"):
        JobSpec(**BASE, gpus_per_node=1, gpu_type="a100 --uid=0")
