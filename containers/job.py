"""Trials inside images: the plan's ``container`` section (written by the master) and what the job entry does with
it. Standard library only (the job entry imports it).

The master puts ``plan["container"]`` (see :func:`container_section`) in ``plan.json`` when the experiment's
``environment.image`` for the job's device type, or the resource pool's default image, is set. The job entry then

1. resolves the image on the batch node (:func:`prepare`): a local ``.sif``/sandbox must exist, a ``docker://``
   image is pulled once into the pool's cache; a failure fails the job with a message naming the image;
2. writes ``container.json`` into the run directory: the resolved runtime program, image, binds and ``--nv``;
3. runs the startup hook inside the image (``apptainer exec … bash startup-hook.sh``) and the entrypoint as one
   ``srun`` step with a task per node (a task per slot for ``srun --mpi=pmix`` launchers), each task being
   ``python -m containers.node_exec --spec container.json -- ARGV``, which enters the image with that task's own
   ``SLURM_*`` variables. Inside, the launchers see an ``srun`` step and run their node's ranks directly.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from containers.images import resolve_image, runtime_puller
from containers.runtime import (
    Bind,
    ContainerRuntime,
    ExecSpec,
    exec_command,
    find_program,
    select_env,
    unique_binds,
)

SPEC_FILE = "container.json"
CONTAINER_PYTHON = "python3"  # the image's interpreter; the platform's code comes from a bind mount


class ContainerSetupError(Exception):
    """The job cannot enter its image; the message says why and names the image."""


def container_section(
    *,
    runtime: str,
    command: str | None,
    image: str,
    cache_dir: str | None,
    force_pull: bool,
    gpus: bool,
    binds: Iterable[tuple[str, str, bool]],
    platform_root: str,
    job_storage_root: str,
    checkpoint_root: str | None,
) -> dict[str, Any]:
    """``plan.json``'s ``container`` section (pure; the master calls it). The platform's code, the job storage
    root and the checkpoint storage are bound at their own paths, read-only for the code; the experiment's
    ``bind_mounts`` follow."""
    ours: list[tuple[str, str, bool]] = [
        (platform_root, platform_root, True),
        (job_storage_root, job_storage_root, False),
    ]
    if checkpoint_root:
        ours.append((checkpoint_root, checkpoint_root, False))
    all_binds = unique_binds(Bind(h, c, ro) for h, c, ro in [*list(binds), *ours])
    return {
        "runtime": runtime,
        "command": command or "",
        "image": image,
        "cache_dir": cache_dir,
        "force_pull": force_pull,
        "gpus": gpus,
        "python": CONTAINER_PYTHON,
        "binds": [[b.host, b.container, b.read_only] for b in all_binds],
    }


@dataclass(frozen=True)
class JobContainer:
    """A resolved container section: everything needed to run a command in the image on any node."""

    runtime: ContainerRuntime
    program: str  # the runtime's executable on this node
    image: str  # a local path (a pulled image's cached .sif)
    image_ref: str  # as the config wrote it
    binds: tuple[Bind, ...]
    gpus: bool
    pwd: str
    python: str
    user_env_names: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime.name,
            "command": self.runtime.command,
            "program": self.program,
            "image": self.image,
            "image_ref": self.image_ref,
            "binds": [[b.host, b.container, b.read_only] for b in self.binds],
            "gpus": self.gpus,
            "pwd": self.pwd,
            "python": self.python,
            "user_env_names": list(self.user_env_names),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobContainer:
        return cls(
            runtime=ContainerRuntime(data["runtime"], data.get("command") or ""),
            program=str(data["program"]),
            image=str(data["image"]),
            image_ref=str(data.get("image_ref") or data["image"]),
            binds=tuple(Bind(str(h), str(c), bool(ro)) for h, c, ro in data["binds"]),
            gpus=bool(data["gpus"]),
            pwd=str(data["pwd"]),
            python=str(data.get("python") or CONTAINER_PYTHON),
            user_env_names=tuple(data.get("user_env_names") or ()),
        )

    def command(
        self, argv: list[str], env: Mapping[str, str], *, pwd: str | None = None
    ) -> tuple[list[str], dict[str, str]]:
        """(argv, environment) that run `argv` in the image, passing `env`'s trial variables in."""
        spec = ExecSpec(image=self.image, pwd=pwd or self.pwd, binds=self.binds, gpus=self.gpus)
        passed = select_env(env, self.user_env_names)
        return exec_command(self.runtime, spec, argv, passed=passed, base_env=env, program=self.program)


def prepare(
    plan: Mapping[str, Any],
    run_dir: str,
    env: Mapping[str, str],
    *,
    log: Callable[[str], None] = print,
) -> JobContainer | None:
    """Resolve (pull) the plan's image and write ``container.json``; None when the plan runs no image."""
    section = plan.get("container")
    if not section:
        return None
    image = str(section["image"])
    runtime, program = _find_runtime(section, image, env)
    path = _resolve_section_image(section, image, runtime, env, log)
    box = JobContainer(
        runtime=runtime,
        program=program,
        image=path,
        image_ref=image,
        binds=tuple(Bind(str(h), str(c), bool(ro)) for h, c, ro in section.get("binds") or ()),
        gpus=bool(section.get("gpus")),
        pwd=str(plan["workdir"]),
        python=str(section.get("python") or CONTAINER_PYTHON),
        user_env_names=tuple(str(k) for k in (plan.get("user_env") or {})),
    )
    spec_path = os.path.join(run_dir, SPEC_FILE)
    tmp = f"{spec_path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(box.to_json(), f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, spec_path)
    where = "" if path == image else f" ({path})"
    log(f"running in the image {image}{where} with {runtime.name} ({program})")
    return box


def _find_runtime(
    section: Mapping[str, Any], image: str, env: Mapping[str, str]
) -> tuple[ContainerRuntime, str]:
    """The section's container runtime and its executable on this node's ``PATH``; ContainerSetupError when the
    runtime is unknown or not installed."""
    try:
        runtime = ContainerRuntime(section["runtime"], section.get("command") or "")
    except ValueError as e:
        raise ContainerSetupError(f"cannot run the image {image!r}: {e}") from None
    program = find_program(runtime, env.get("PATH"))
    if program is None:
        raise ContainerSetupError(
            f"cannot run the image {image!r}: the container runtime {runtime.program!r} is not installed on "
            f"{os.uname().nodename} (not on PATH)"
        )
    return runtime, program


def _resolve_section_image(
    section: Mapping[str, Any],
    image: str,
    runtime: ContainerRuntime,
    env: Mapping[str, str],
    log: Callable[[str], None],
) -> str:
    """The local path of the section's image, pulled into the cache when remote; ContainerSetupError naming the
    image when that fails."""
    from containers.images import ImageError

    try:
        return resolve_image(
            image,
            section.get("cache_dir"),
            runtime_puller(runtime, env=env),
            force_pull=bool(section.get("force_pull")),
            log=log,
        )
    except (ImageError, OSError, TimeoutError) as e:
        message = str(e) if isinstance(e, ImageError) else f"container image {image!r}: {e}"
        raise ContainerSetupError(message) from None


def node_step_argv(
    argv: list[str],
    *,
    run_dir: str,
    host_python: str,
    nodes: int,
    tasks_per_node: int = 1,
    mpi: bool = False,
    srun_args: Iterable[str] = (),
) -> list[str]:
    """One ``srun`` step whose tasks each enter the image (pure)."""
    out = ["srun", f"--nodes={nodes}", f"--ntasks-per-node={tasks_per_node}", "--kill-on-bad-exit=1"]
    if mpi:
        out.append("--mpi=pmix")
    out += [
        *srun_args,
        host_python,
        "-m",
        "containers.node_exec",
        "--spec",
        posixpath.join(run_dir, SPEC_FILE),
    ]
    return [*out, "--", *argv]
