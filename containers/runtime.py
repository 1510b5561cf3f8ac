"""Apptainer / Singularity ``exec`` command lines: a pure builder. Standard library only (it runs inside jobs).

    argv, env = exec_command(runtime, ExecSpec(image=..., binds=..., pwd=..., gpus=True), ["python3", "x.py"],
                             passed=select_env(os.environ, user_names=...), base_env=os.environ)
    os.execvpe(argv[0], argv, env)

``--cleanenv`` keeps the host's environment out of the container, so the variables a trial needs (``SLURM_*``,
``CUDA_VISIBLE_DEVICES``, ``DET_*``, ``PYTHONPATH``, the config's ``environment_variables``) are passed back
explicitly, as ``APPTAINERENV_NAME`` (``SINGULARITYENV_NAME``) variables of the runtime's own process rather than
``--env`` options: values may hold commas (``CUDA_VISIBLE_DEVICES=0,1``), which ``--env`` splits on, and the
session token must never appear on a command line.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

RuntimeName = Literal["apptainer", "singularity"]
RUNTIMES: tuple[RuntimeName, ...] = ("apptainer", "singularity")

# Passed into the container by prefix, and by exact name.
PASSED_PREFIXES = ("SLURM_", "DET_", "PMIX_", "OMPI_", "NCCL_", "TORCH_")
PASSED_NAMES = (
    "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "ROCR_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "PYTHONPATH",
    "PYTHONUNBUFFERED",
    "USE_TORCH_DISTRIBUTED",
    "LANG",
    "LC_ALL",
    "TZ",
    "USER",
    "LOGNAME",
)
# Never passed: the container's own PATH and dynamic loader settings come from the image.
NEVER_PASSED = ("PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONHOME", "VIRTUAL_ENV")
# What the runtime's own process keeps from the host environment (it is not what the container sees).
RUNTIME_PROCESS_VARS = ("PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "XDG_RUNTIME_DIR", "LANG", "TERM")
RUNTIME_PROCESS_PREFIXES = ("APPTAINER_", "SINGULARITY_")
# Where scripts/install_apptainer.sh puts it, for nodes whose PATH lacks it.
KNOWN_LOCATIONS = {"apptainer": ("/opt/hpc-det/apptainer/usr/bin/apptainer",)}


@dataclass(frozen=True)
class ContainerRuntime:
    """Which runtime, and the command that runs it (a name looked up on ``PATH``, or a path)."""

    name: RuntimeName = "apptainer"
    command: str = ""

    def __post_init__(self) -> None:
        if self.name not in RUNTIMES:
            raise ValueError(f"unknown container runtime {self.name!r} (known: {', '.join(RUNTIMES)})")

    @property
    def program(self) -> str:
        return self.command or self.name

    @property
    def env_prefix(self) -> str:
        return "APPTAINERENV_" if self.name == "apptainer" else "SINGULARITYENV_"


def find_program(runtime: ContainerRuntime, path: str | None = None) -> str | None:
    """The runtime's executable as an absolute path, or None when this node has none."""
    found = shutil.which(runtime.program, path=path)
    if found:
        return os.path.abspath(found)
    if not runtime.command:
        for candidate in KNOWN_LOCATIONS.get(runtime.name, ()):
            if os.access(candidate, os.X_OK):
                return candidate
    return None


@dataclass(frozen=True)
class Bind:
    host: str
    container: str
    read_only: bool = False

    def option(self) -> str:
        for part in (self.host, self.container):
            if ":" in part or "," in part:
                raise ValueError(f"a bind path cannot contain ':' or ',': {part!r}")
        return f"{self.host}:{self.container}" + (":ro" if self.read_only else "")


@dataclass(frozen=True)
class ExecSpec:
    image: str  # a local .sif file or sandbox directory (see containers.images)
    pwd: str
    binds: tuple[Bind, ...] = ()
    gpus: bool = False
    extra_args: tuple[str, ...] = field(default=())


def unique_binds(binds: Iterable[Bind]) -> tuple[Bind, ...]:
    """Drop binds onto a container path already bound (the first wins)."""
    out: list[Bind] = []
    seen: set[str] = set()
    for b in binds:
        key = os.path.normpath(b.container)
        if key in seen:
            continue
        seen.add(key)
        out.append(b)
    return tuple(out)


def exec_argv(
    runtime: ContainerRuntime, spec: ExecSpec, argv: list[str], program: str | None = None
) -> list[str]:
    """``apptainer exec --cleanenv [--nv] --pwd DIR --bind H:C[:ro]... IMAGE ARGV...``"""
    if not argv:
        raise ValueError("nothing to run in the container")
    out = [program or runtime.program, "exec", "--cleanenv"]
    if spec.gpus:
        out.append("--nv")
    out += ["--pwd", spec.pwd]
    for b in unique_binds(spec.binds):
        out += ["--bind", b.option()]
    out += [*spec.extra_args, spec.image, *argv]
    return out


def select_env(env: Mapping[str, str], user_names: Iterable[str] = ()) -> dict[str, str]:
    """The variables of `env` a trial needs inside the container (see ``PASSED_*``), plus `user_names`."""
    wanted = set(user_names)
    out: dict[str, str] = {}
    for name, value in env.items():
        if name in NEVER_PASSED and name not in wanted:
            continue
        if name in wanted or name in PASSED_NAMES or name.startswith(PASSED_PREFIXES):
            out[name] = value
    return out


def runtime_env(
    runtime: ContainerRuntime, passed: Mapping[str, str], base_env: Mapping[str, str]
) -> dict[str, str]:
    """The runtime process's environment: a few host variables it needs itself, and ``<PREFIX>NAME`` for every
    variable passed into the container. Variables of other runtimes' prefixes from the host are dropped so that
    only what `passed` says reaches the container."""
    env = {
        k: v
        for k, v in base_env.items()
        if (k in RUNTIME_PROCESS_VARS or k.startswith(RUNTIME_PROCESS_PREFIXES))
        and not k.startswith(("APPTAINERENV_", "SINGULARITYENV_"))
    }
    env.setdefault("PATH", os.defpath)
    for name, value in passed.items():
        env[runtime.env_prefix + name] = value
    return env


def exec_command(
    runtime: ContainerRuntime,
    spec: ExecSpec,
    argv: list[str],
    *,
    passed: Mapping[str, str],
    base_env: Mapping[str, str],
    program: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) that run `argv` inside the image."""
    return exec_argv(runtime, spec, argv, program), runtime_env(runtime, passed, base_env)
