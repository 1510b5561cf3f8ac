"""containers/: golden `apptainer exec` command lines, environment passing, image references, the plan's
container section and the srun step that enters the image (DET_UPDATE_GOLDEN=1 rewrites the golden files)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from containers.images import ImageError, parse_image
from containers.job import JobContainer, container_section, node_step_argv
from containers.runtime import Bind, ContainerRuntime, ExecSpec, exec_command, select_env
from hpc_master.errors import ConfigError
from hpc_master.expconf import parse_experiment_config
from hpc_master.masterconf import parse_master_config, pool_container
from hpc_master.trialjob import JobPaths, PoolSpec, TrialJobInputs, build_trial_job, pool_from_master_config

GOLDEN = Path(__file__).parent / "golden" / "containers"

HOST_ENV = {
    "PATH": "/venv/bin:/usr/bin:/bin",
    "HOME": "/home/alice",
    "USER": "alice",
    "SHELL": "/bin/bash",
    "LD_LIBRARY_PATH": "/opt/host/lib",
    "SSH_AUTH_SOCK": "/tmp/ssh-x/agent",
    "APPTAINER_CACHEDIR": "/scratch/alice/.apptainer",
    "APPTAINERENV_STALE": "from-the-host",
    "SLURM_JOB_ID": "42",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "1",
    "SLURM_STEP_GPUS": "2,3",
    "CUDA_VISIBLE_DEVICES": "0,1",
    "DET_TRIAL_ID": "7",
    "DET_SESSION_TOKEN": "secret-token",
    "PYTHONPATH": "/opt/hpc-det/determined_compat:/opt/hpc-det",
    "MY_FLAG": "a,b=c",
    "NOT_PASSED": "x",
}


def _render(argv: list[str], env: dict[str, str]) -> str:
    lines = ["# argv", *(shlex.quote(a) for a in argv), "# environment of the runtime process"]
    lines += [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    return "\n".join(lines) + "\n"


CASES = {
    "apptainer_gpu": (
        ContainerRuntime("apptainer"),
        ExecSpec(
            image="/shared/images/pytorch.sif",
            pwd="/jobs/exp-1/trial-7/work",
            gpus=True,
            binds=(
                Bind("/datasets/imagenet", "/data", read_only=True),
                Bind("/scratch/alice", "/scratch"),
                Bind("/opt/hpc-det", "/opt/hpc-det", read_only=True),
                Bind("/jobs", "/jobs"),
                Bind("/checkpoints", "/checkpoints"),
                Bind("/other", "/data"),  # the same container path again: dropped
            ),
        ),
        ["python3", "-m", "launchers.torch_distributed", "train.py", "--lr", "0.1"],
    ),
    "apptainer_cpu": (
        ContainerRuntime("apptainer"),
        ExecSpec(
            image="/shared/images/base.sif", pwd="/jobs/exp-1/trial-8/work", binds=(Bind("/jobs", "/jobs"),)
        ),
        ["python3", "train.py"],
    ),
    "singularity_cpu_custom_command": (
        ContainerRuntime("singularity", "/usr/local/singularity-3.8/bin/singularity"),
        ExecSpec(image="/shared/images/sandbox", pwd="/w", binds=(Bind("/d", "/d", read_only=True),)),
        ["bash", "startup-hook.sh"],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_exec_command_matches_golden(name: str) -> None:
    runtime, spec, argv = CASES[name]
    passed = select_env(HOST_ENV, user_names=["MY_FLAG"])
    full, env = exec_command(runtime, spec, argv, passed=passed, base_env=HOST_ENV)
    text = _render(full, env)
    golden = GOLDEN / f"{name}.txt"
    if os.environ.get("DET_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


def test_gpu_exec_line_has_nv_ro_binds_and_no_secret() -> None:
    runtime, spec, argv = CASES["apptainer_gpu"]
    full, env = exec_command(runtime, spec, argv, passed=select_env(HOST_ENV), base_env=HOST_ENV)
    assert full[:4] == ["apptainer", "exec", "--cleanenv", "--nv"]
    assert "/datasets/imagenet:/data:ro" in full and "/other:/data" not in full
    assert full[-len(argv) - 1 :] == [spec.image, *argv]
    assert not any("secret-token" in a for a in full)  # the token travels in the environment only
    assert env["APPTAINERENV_DET_SESSION_TOKEN"] == "secret-token"
    assert env["APPTAINERENV_CUDA_VISIBLE_DEVICES"] == "0,1"  # a comma: why not --env
    assert env["APPTAINERENV_SLURM_STEP_GPUS"] == "2,3"
    assert "APPTAINERENV_STALE" not in env and "APPTAINERENV_PATH" not in env
    assert "APPTAINERENV_LD_LIBRARY_PATH" not in env and "APPTAINERENV_NOT_PASSED" not in env
    cpu_full, _ = exec_command(*CASES["apptainer_cpu"][:2], ["true"], passed={}, base_env={})
    assert "--nv" not in cpu_full


def test_select_env_passes_what_cleanenv_drops() -> None:
    got = select_env(HOST_ENV, user_names=["MY_FLAG", "PATH"])
    assert set(got) == {
        "SLURM_JOB_ID", "SLURM_NODEID", "SLURM_PROCID", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES",
        "DET_TRIAL_ID", "DET_SESSION_TOKEN", "PYTHONPATH", "MY_FLAG", "USER", "PATH",
    }  # fmt: skip
    assert "PATH" not in select_env(HOST_ENV)  # the image's own PATH, unless the config sets one


def test_bind_paths_with_separators_are_refused() -> None:
    with pytest.raises(ValueError, match="cannot contain"):
        Bind("/a:b", "/c").option()
    with pytest.raises(ValueError, match="unknown container runtime"):
        ContainerRuntime("docker")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "kind", "location"),
    [
        ("/shared/images/pytorch.sif", "sif", "/shared/images/pytorch.sif"),
        ("./img.simg", "sif", "./img.simg"),
        ("/shared/images/sandbox/", "sandbox", "/shared/images/sandbox"),
        ("docker://nvcr.io/nvidia/pytorch:24.01-py3", "remote", "docker://nvcr.io/nvidia/pytorch:24.01-py3"),
        ("oras://ghcr.io/x/y:1", "remote", "oras://ghcr.io/x/y:1"),
        ("determinedai/pytorch-ngc:0.38.0", "remote", "docker://determinedai/pytorch-ngc:0.38.0"),
        ("  python:3.11-slim ", "remote", "docker://python:3.11-slim"),
    ],
)
def test_parse_image(text: str, kind: str, location: str) -> None:
    ref = parse_image(text)
    assert (ref.kind, ref.location) == (kind, location)


def test_parse_image_sandbox_is_an_existing_directory(tmp_path: Path) -> None:
    assert parse_image(str(tmp_path)).kind == "sandbox"
    assert parse_image(str(tmp_path / "missing")).kind == "sif"  # a path: must exist when the job starts


def test_parse_image_refusals() -> None:
    with pytest.raises(ImageError, match="empty"):
        parse_image("  ")
    with pytest.raises(ImageError, match=r"'ftp://x/y'.*unknown scheme"):
        parse_image("ftp://x/y")


def test_cache_names_are_readable_and_distinct() -> None:
    a = parse_image("docker://nvcr.io/nvidia/pytorch:24.01-py3").cache_name()
    b = parse_image("docker://nvcr.io/nvidia/pytorch:24.02-py3").cache_name()
    assert a.startswith("nvcr.io_nvidia_pytorch_24.01-py3-") and a.endswith(".sif") and a != b
    assert "/" not in a


# -- master config and the trial job -----------------------------------------------------------------------


def test_pool_container_overrides_the_top_level_key_by_key() -> None:
    master = parse_master_config(
        {
            "container": {
                "runtime": "singularity",
                "image": "/img/base.sif",
                "image_cache_dir": "/shared/sif",
            },
            "resource_pools": {
                "default": {},
                "gpu": {"container": {"image": "docker://nvcr.io/nvidia/pytorch:24.01-py3"}},
                "bare": {"container": {"runtime": "none"}},
            },
        },
        env={},
    )
    assert pool_container(master).runtime == "singularity"
    gpu = pool_container(master, "gpu")
    assert (gpu.runtime, gpu.image, gpu.cache_dir) == (
        "singularity",
        "docker://nvcr.io/nvidia/pytorch:24.01-py3",
        "/shared/sif",
    )
    assert pool_container(master, "bare").runtime == "none"
    spec = pool_from_master_config(master, "gpu")
    assert spec.container_image == gpu.image and spec.image_cache_dir == "/shared/sif"


def _config(**extra: object) -> dict[str, object]:
    return {
        "entrypoint": "python3 train.py",
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 1}},
        **extra,
    }


PATHS = JobPaths("/shared/jobs", "/shared/checkpoints", "/opt/hpc-det", "/opt/hpc-det/.venv/bin/python")
TRIAL = TrialJobInputs(experiment_id=1, trial_id=2, trial_run_id=1, hparams={}, trial_seed=1, owner="alice")


def _plan(config: dict[str, object], pool: PoolSpec) -> dict[str, object]:
    job = build_trial_job(
        parse_experiment_config(config), pool, TRIAL, PATHS, master_url="http://m:8080", session_token="t"
    )
    return job.plan.to_json()  # plan.json


def test_trial_job_container_section_per_device_type() -> None:
    config = _config(
        environment={"image": {"cpu": "/img/cpu.sif", "cuda": "docker://nvcr.io/nvidia/pytorch:24.01-py3"}},
        bind_mounts=[{"host_path": "/datasets", "container_path": "/data", "read_only": True}],
        resources={"slots_per_trial": 4},
    )
    plan = _plan(config, PoolSpec(slots_per_node=2))
    assert plan["container"] == {
        "runtime": "apptainer",
        "command": "",
        "image": "docker://nvcr.io/nvidia/pytorch:24.01-py3",
        "cache_dir": "/shared/jobs/images",
        "force_pull": False,
        "gpus": True,
        "python": "python3",
        "binds": [
            ["/datasets", "/data", True],
            ["/opt/hpc-det", "/opt/hpc-det", True],
            ["/shared/jobs", "/shared/jobs", False],
            ["/shared/checkpoints", "/shared/checkpoints", False],
        ],
    }
    cpu = _plan(
        _config(environment={"image": {"cpu": "/img/cpu.sif"}}, resources={"slots_per_trial": 0}), PoolSpec()
    )
    assert cpu["container"]["image"] == "/img/cpu.sif" and cpu["container"]["gpus"] is False  # type: ignore[index]


def test_pool_default_image_and_no_image() -> None:
    assert "container" not in _plan(_config(), PoolSpec())  # without an image nothing changes
    plan = _plan(_config(), PoolSpec(container_image="/img/site.sif", image_cache_dir="/c"))
    assert plan["container"]["image"] == "/img/site.sif"  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"runs no container runtime.*'/img/x.sif'") as e:
        _plan(_config(environment={"image": "/img/x.sif"}), PoolSpec(container_runtime="none"))
    assert e.value.field == "environment.image"


def test_node_step_runs_each_task_in_the_image() -> None:
    argv = node_step_argv(
        ["python3", "-m", "launchers.torch_distributed", "train.py"],
        run_dir="/jobs/exp-1/trial-2/run-1",
        host_python="/opt/hpc-det/.venv/bin/python",
        nodes=2,
        srun_args=["--cpu-bind=none"],
    )
    assert argv == [
        "srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--cpu-bind=none",
        "/opt/hpc-det/.venv/bin/python", "-m", "containers.node_exec",
        "--spec", "/jobs/exp-1/trial-2/run-1/container.json",
        "--", "python3", "-m", "launchers.torch_distributed", "train.py",
    ]  # fmt: skip
    mpi = node_step_argv(["python3", "-m", "launchers.mpi", "x.py"], run_dir="/r", host_python="py", nodes=2,
                         tasks_per_node=4, mpi=True)  # fmt: skip
    assert mpi[:5] == ["srun", "--nodes=2", "--ntasks-per-node=4", "--kill-on-bad-exit=1", "--mpi=pmix"]


def test_job_container_round_trips_through_json() -> None:
    box = JobContainer(
        runtime=ContainerRuntime("apptainer"),
        program="/usr/local/bin/apptainer",
        image="/c/x.sif",
        image_ref="docker://x",
        binds=(Bind("/a", "/b", True),),
        gpus=True,
        pwd="/w",
        python="python3",
        user_env_names=("MY_FLAG",),
    )
    assert JobContainer.from_json(box.to_json()) == box
    full, env = box.command(["python3", "t.py"], HOST_ENV)
    assert (
        full[0] == "/usr/local/bin/apptainer"
        and "--nv" in full
        and full[-3:] == ["/c/x.sif", "python3", "t.py"]
    )
    assert env["APPTAINERENV_MY_FLAG"] == "a,b=c"


def test_container_section_binds_platform_code_read_only() -> None:
    section = container_section(
        runtime="apptainer", command=None, image="/i.sif", cache_dir=None, force_pull=True, gpus=False,
        binds=[("/jobs", "/jobs", True)], platform_root="/code", job_storage_root="/jobs", checkpoint_root=None,
    )  # fmt: skip
    # The experiment's own bind of the same container path wins; the code is read-only.
    assert section["binds"] == [["/jobs", "/jobs", True], ["/code", "/code", True]]
    assert section["force_pull"] is True


def test_the_runtime_command_comes_from_the_master_config() -> None:
    """An admin points a pool at a site's own build (e.g. a module path) with `container.command`."""
    from hpc_master.masterconf import parse_master_config, pool_container

    master = parse_master_config(
        {
            "container": {"runtime": "singularity", "command": "/opt/site/bin/singularity"},
            "resource_pools": {"default": {}, "gpu": {"container": {"runtime": "apptainer"}}},
        }
    )
    assert pool_container(master, "default").command == "/opt/site/bin/singularity"
    gpu = pool_container(master, "gpu")
    assert gpu.runtime == "apptainer" and gpu.command == "/opt/site/bin/singularity"  # inherited key by key


def test_prepull_takes_the_pools_runtime_and_cache_from_the_master_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m hpc_master.prepull` reads master.yaml; `containers.prepull` itself never imports the master."""
    from hpc_master import prepull

    config = tmp_path / "master.yaml"
    config.write_text(
        "container: {runtime: apptainer, image_cache_dir: " + str(tmp_path / "sif") + "}\n"
        "resource_pools: {default: {}, bare: {container: {runtime: none}}}\n"
    )
    assert prepull.main(["--config", str(config), "--pool", "bare", "docker://alpine:3"]) == 2
    assert "no container runtime" in capsys.readouterr().err
    assert prepull.main(["--config", str(config), str(tmp_path / "local.sif")]) == 0
    assert "a local image, nothing to pull" in capsys.readouterr().err
