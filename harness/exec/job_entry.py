"""The first thing every trial job runs: ``python -m harness.exec.job_entry --run-dir DIR``. Standard library only.

1. reads the run directory the master wrote (``plan.json``, ``session_token``, ``cluster_info.template.json``;
   layout in ``harness.exec.job_plan``, documents in ``harness.exec.job_contract``) and builds the environment (the config's ``environment_variables``,
   then the ``DET_*`` variables, which win; ``PYTHONPATH`` keeps ours first);
2. resolves ``container_addrs`` from ``SLURM_JOB_NODELIST`` and writes ``cluster_info.json`` (one file for all
   nodes: the harness takes ``container_rank`` from ``SLURM_NODEID``);
3. unpacks the context archive into the trial's ``work/`` directory, once per trial (refusing unsafe archives);
4. runs ``startup-hook.sh`` with bash in ``work/`` when present; a non-zero exit fails the job;
   with a container image (``JobPlan.container``, see ``containers.job``) the image is resolved (pulled) first,
   the hook runs inside it, and the entrypoint runs as one ``srun`` step whose tasks each enter the image;
5. runs the entrypoint (see ``resolve_entrypoint``) in its own process group, forwarding SIGTERM, SIGINT, SIGHUP
   and the preemption signals to it (to the process alone when it is one of our launchers, which forward
   themselves; to the whole group otherwise), and waits;
6. writes ``exit.json`` atomically (``job_contract.ExitRecord``): ``{"exitCode", "signal", "preempted",
   "reason", "finishedAt", "stage", "slurmJobId"}``. It exits 0 on success and on a clean preemption (a preemption signal was forwarded or the
   harness acknowledged one, and the entrypoint exited 0), the entrypoint's code otherwise (128+N when killed
   by signal N), and 1 when the job could not be set up.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

from harness.exec import job_plan as plan_files
from harness.exec._job_unpack import DEFAULT_MAX_BYTES, UnsafeArchiveError, fingerprint, unpack_context
from harness.exec.child_wait import wait_child
from harness.exec.job_contract import ClusterInfoDoc, ContractError, ExitRecord, JobPlan
from harness.exec.job_nodes import NodeListError, container_addrs

# Every job starts this module before its entrypoint, so what it imports is paid on every launch: typing,
# datetime, shutil (with bz2 and lzma) and the container modules are kept off that path (type-only imports
# here, the rest imported where a rare branch needs them). `typing` itself costs 3 ms: TYPE_CHECKING is
# spelled out, which mypy treats like typing's.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import types
    from typing import Any

    from containers.job import JobContainer

    _Handler = Callable[[int, types.FrameType | None], Any] | int | signal.Handlers | None

SETUP_FAILED = 1


class JobEntryError(Exception):
    """The job cannot start; the message says why (it goes to the log and to exit.json)."""

    def __init__(self, message: str, stage: str) -> None:
        super().__init__(message)
        self.stage = stage


def log(message: str) -> None:
    print(f"[job_entry] {message}", flush=True)


def signal_number(name: str) -> int:
    text = name.strip().upper()
    if text.isdigit():
        return int(text)
    return int(signal.Signals[text if text.startswith("SIG") else "SIG" + text])


# -- the run directory ---------------------------------------------------------------------------------------


def load_plan(run_dir: str) -> JobPlan:
    path = os.path.join(run_dir, plan_files.PLAN_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise JobEntryError(f"cannot read the job plan {path}: {e}", "plan") from None
    try:
        return JobPlan.from_json(data)
    except ContractError as e:
        raise JobEntryError(f"{path}: {e.detail}", "plan") from None


def read_token(run_dir: str) -> str:
    path = os.path.join(run_dir, plan_files.TOKEN_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""
    except OSError as e:
        raise JobEntryError(f"cannot read the session token {path}: {e}", "plan") from None


def _path_list(*values: str | None) -> str:
    seen: list[str] = []
    for value in values:
        for part in (value or "").split(os.pathsep):
            if part and part not in seen:
                seen.append(part)
    return os.pathsep.join(seen)


def build_environment(plan: JobPlan, token: str, base: Mapping[str, str], addrs: list[str]) -> dict[str, str]:
    """The entrypoint's environment: inherited, then the config's variables, then ours."""
    ours, user = plan.env, plan.user_env
    env = {**base, **user, **ours}
    env["PYTHONPATH"] = _path_list(ours.get("PYTHONPATH"), user.get("PYTHONPATH"), base.get("PYTHONPATH"))
    python_bin = os.path.dirname(plan.python)
    # `python3 train.py` in an entrypoint means the platform's interpreter, as in Determined's images.
    env["PATH"] = _path_list(python_bin, user.get("PATH"), base.get("PATH") or os.defpath)
    env["DET_SESSION_TOKEN"] = token
    if addrs and not env.get("DET_CHIEF_IP"):
        env["DET_CHIEF_IP"] = addrs[0]
    return env


def write_json_atomic(path: str, obj: Any, mode: int = 0o644) -> None:
    """Readers see the old file or the whole new one (write, then rename). Not fsynced: both files are read
    after this process has closed them (the harness in this job, the master after the job ended), which
    close-to-open consistency covers on a shared filesystem; after a node crash the run is a node failure
    whatever the file says, and an fsync cost every job tens of milliseconds on a busy disk."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_cluster_info(run_dir: str, addrs: list[str]) -> str:
    template = os.path.join(run_dir, plan_files.CLUSTER_INFO_TEMPLATE_FILE)
    try:
        with open(template, encoding="utf-8") as f:
            info = ClusterInfoDoc.from_json(json.load(f))
    except ContractError as e:
        raise JobEntryError(f"{template}: {e.detail}", "cluster_info") from None
    except (OSError, ValueError) as e:
        raise JobEntryError(f"cannot read {template}: {e}", "cluster_info") from None
    path = os.path.join(run_dir, plan_files.CLUSTER_INFO_FILE)
    write_json_atomic(path, info.on_nodes(addrs).to_json(), 0o600)
    return path


def prepare_workdir(plan: JobPlan) -> str:
    """Unpack the context into the trial's work directory unless an earlier run of this trial did."""
    workdir = plan.workdir
    trial_dir = os.path.dirname(workdir)
    marker = os.path.join(trial_dir, plan_files.UNPACKED_MARKER)
    archive = plan.context_archive
    os.makedirs(trial_dir, exist_ok=True)
    if not archive:
        os.makedirs(workdir, exist_ok=True)
        return workdir
    if os.path.exists(marker) and os.path.isdir(workdir):
        log(f"context already unpacked in {workdir} by an earlier run")
        return workdir
    if os.path.lexists(workdir):  # an unpack that did not finish (no marker): start again
        import shutil

        shutil.rmtree(workdir)
    try:
        size = unpack_context(archive, workdir, max_bytes=plan.max_context_bytes or DEFAULT_MAX_BYTES)
        stamp = fingerprint(archive)
    except UnsafeArchiveError as e:
        raise JobEntryError(f"the context archive was refused: {e}", "context") from None
    except OSError as e:
        raise JobEntryError(f"cannot unpack the context archive {archive}: {e}", "context") from None
    with open(marker, "w", encoding="utf-8") as f:
        f.write(stamp + "\n")
    log(f"unpacked the context ({size} bytes) into {workdir}")
    return workdir


# -- running children with signal forwarding ------------------------------------------------------------------


class Supervisor:
    """Runs one child at a time in its own process group and forwards the signals this process receives."""

    def __init__(self, preempt_signal: int) -> None:
        self.preempt_signals = {int(signal.SIGTERM), preempt_signal}
        self.forwarded = sorted(
            {int(signal.SIGTERM), int(signal.SIGINT), int(signal.SIGHUP), preempt_signal, int(signal.SIGUSR2)}
        )
        self.received: list[int] = []
        self.child: subprocess.Popen[bytes] | None = None
        self.group = True
        self.killed_by: int | None = None
        self._old: dict[int, _Handler] = {}

    def install(self) -> None:
        for sig in self.forwarded:
            self._old[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        self._old.clear()

    def _handle(self, signum: int, _frame: types.FrameType | None) -> None:
        self.received.append(signum)
        self._forward(signum)

    def _forward(self, signum: int) -> None:
        child = self.child
        if child is None or child.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.group:
                os.killpg(child.pid, signum)
            else:
                os.kill(child.pid, signum)

    @property
    def preemption_requested(self) -> bool:
        return any(s in self.preempt_signals for s in self.received)

    @property
    def first_signal(self) -> int | None:
        return self.received[0] if self.received else None

    def run(self, argv: list[str], *, cwd: str, env: Mapping[str, str], group: bool = True) -> int:
        """Run `argv`; its exit code, 128+N when killed by signal N."""
        self.group = group
        try:
            self.child = subprocess.Popen(argv, cwd=cwd, env=dict(env), start_new_session=True)
        except OSError as e:
            raise JobEntryError(f"cannot start {argv[0]!r}: {e.strerror}", "entrypoint") from None
        for signum in list(self.received):  # arrived between fork and now
            self._forward(signum)
        rc = wait_child(self.child)
        self.killed_by = -rc if rc < 0 else None
        return 128 - rc if rc < 0 else rc


def run_startup_hook(
    sup: Supervisor, workdir: str, env: Mapping[str, str], box: JobContainer | None = None
) -> None:
    hook = os.path.join(workdir, plan_files.STARTUP_HOOK)
    if not os.path.isfile(hook):
        return
    log(f"running {plan_files.STARTUP_HOOK}")
    argv = ["bash", hook]
    if box is not None:
        argv, env = box.command(argv, env, pwd=workdir)
    code = sup.run(argv, cwd=workdir, env=env)
    if code != 0 and not sup.preemption_requested:
        raise JobEntryError(
            f"{plan_files.STARTUP_HOOK} failed with exit code {code}; the entrypoint was not started "
            "(its output is above)",
            "startup_hook",
        )


# -- container images (containers.job) -------------------------------------------------------------------------


def enter_image(plan: JobPlan, run_dir: str, env: Mapping[str, str]) -> JobContainer | None:
    """The plan's image, resolved (pulled when needed); None without one."""
    if not plan.container:
        return None
    from containers.job import ContainerSetupError, prepare

    try:
        return prepare(plan.to_json(), run_dir, env, log=log)
    except ContainerSetupError as e:
        raise JobEntryError(str(e), "image") from None


def in_image(
    box: JobContainer,
    argv: list[str],
    plan: JobPlan,
    run_dir: str,
    addrs: list[str],
    env: dict[str, str],
) -> tuple[list[str], dict[str, str]]:
    """The entrypoint as one srun step whose tasks each enter the image (directly off Slurm)."""
    from containers.job import node_step_argv

    if "SLURM_JOB_ID" not in env:
        return box.command(argv, env)
    per_slot = plan_files.tasks_per_slot(argv)
    step = node_step_argv(
        argv,
        run_dir=run_dir,
        host_python=plan.python,
        nodes=max(1, len(addrs)),
        tasks_per_node=int(env.get("SLURM_NTASKS_PER_NODE") or 1) if per_slot else 1,
        mpi=per_slot,
        srun_args=shlex.split(env.get("DET_SRUN_ARGS", "")),
    )
    return step, env


# -- the exit record --------------------------------------------------------------------------------------------


def exit_record(*, code: int, stage: str, reason: str, preempted: bool, signum: int | None) -> ExitRecord:
    return ExitRecord(
        exit_code=code,
        signal=signal_name(signum),
        preempted=preempted,
        reason=reason,
        stage=stage,
        slurm_job_id=os.environ.get("SLURM_JOB_ID"),
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def signal_name(signum: int | None) -> str | None:
    if not signum:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def describe_exit(code: int, killed_by: int | None) -> str:
    if killed_by:
        return f"the entrypoint was killed by {signal_name(killed_by)} (exit code {code})"
    return f"the entrypoint exited with code {code}"


def run_job(run_dir: str, base_env: Mapping[str, str]) -> tuple[int, ExitRecord]:
    """Everything but the exit record's writing; returns (exit code, record)."""
    stage = "plan"
    sup: Supervisor | None = None
    try:
        plan = load_plan(run_dir)
        sup = Supervisor(signal_number(plan.preempt_signal or "SIGUSR1"))
        sup.install()
        token = read_token(run_dir)
        stage = "cluster_info"
        addrs = _node_addrs(base_env, stage)
        write_cluster_info(run_dir, addrs)
        env = build_environment(plan, token, base_env, addrs)
        stage = "context"
        workdir = prepare_workdir(plan)
        stage = "image"
        box = enter_image(plan, run_dir, env)
        stage = "startup_hook"
        run_startup_hook(sup, workdir, env, box)
        stage = "entrypoint"
        if sup.preemption_requested:
            reason = "preempted before the entrypoint started"
            return 0, exit_record(code=0, stage=stage, reason=reason, preempted=True, signum=sup.first_signal)
        argv = _entrypoint_argv(plan, box, stage)
        launcher = plan_files.launcher_of(argv) or ""
        ours = launcher.startswith(("launchers.", "determined.launch."))
        if box is not None:
            argv, env = in_image(box, argv, plan, run_dir, addrs, env)
            ours = True  # srun (or the runtime) forwards signals to what runs inside
        log(f"running {' '.join(argv)} in {workdir}")
        code = sup.run(argv, cwd=workdir, env=env, group=not ours)
    except JobEntryError as e:
        log(f"error: {e}")
        signum = sup.first_signal if sup else None
        return SETUP_FAILED, exit_record(
            code=SETUP_FAILED, stage=e.stage, reason=str(e), preempted=False, signum=signum
        )
    finally:
        if sup is not None:
            sup.uninstall()
    return code, _entrypoint_exit_record(code, sup, run_dir, stage)


def _node_addrs(base_env: Mapping[str, str], stage: str) -> list[str]:
    """The job's node addresses (``container_addrs``); JobEntryError at `stage` when they cannot be found."""
    try:
        return container_addrs(base_env)
    except (NodeListError, OSError, subprocess.SubprocessError) as e:
        raise JobEntryError(f"cannot find the job's node addresses: {e}", stage) from None


def _entrypoint_argv(plan: JobPlan, box: JobContainer | None, stage: str) -> list[str]:
    """The plan's entrypoint as argv, run by the image's interpreter in an image; JobEntryError at `stage` when
    it cannot be resolved."""
    try:
        return plan_files.resolve_entrypoint(
            plan.entrypoint, plan.slots_per_trial, box.python if box else plan.python
        )
    except ValueError as e:
        raise JobEntryError(str(e), stage) from None


def _entrypoint_exit_record(code: int, sup: Supervisor, run_dir: str, stage: str) -> ExitRecord:
    """The exit record once the entrypoint exited with `code`: a clean exit after a preemption signal (forwarded,
    or acknowledged by the harness) is a preemption."""
    acked = os.path.exists(os.path.join(run_dir, plan_files.PREEMPT_ACK_FILE))
    preempted = code == 0 and (acked or sup.preemption_requested)
    if preempted:
        reason = "preempted: the entrypoint exited cleanly after a preemption signal"
    elif code == 0:
        reason = "completed"
    else:
        reason = describe_exit(code, sup.killed_by)
    signum = sup.first_signal or sup.killed_by
    return exit_record(code=code, stage=stage, reason=reason, preempted=preempted, signum=signum)


def parse_run_dir(argv: list[str]) -> str:
    """``--run-dir DIR`` (what every job script passes, parsed without importing argparse); anything else
    goes to argparse for its usage message and exit code 2."""
    if len(argv) == 2 and argv[0] == "--run-dir" and argv[1]:
        return argv[1]
    if len(argv) == 1 and argv[0].startswith("--run-dir=") and len(argv[0]) > len("--run-dir="):
        return argv[0].partition("=")[2]
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m harness.exec.job_entry", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--run-dir", required=True, help="the run directory the master wrote")
    return str(parser.parse_args(argv).run_dir)


def main(argv: list[str] | None = None) -> int:
    run_dir = os.path.abspath(parse_run_dir(sys.argv[1:] if argv is None else argv))
    code, record = run_job(run_dir, dict(os.environ))
    try:
        write_json_atomic(os.path.join(run_dir, plan_files.EXIT_FILE), record.to_json())
    except OSError as e:
        log(f"cannot write {plan_files.EXIT_FILE}: {e}")
    log(f"{record.reason} (exit code {code})")
    return code


if __name__ == "__main__":
    sys.exit(main())
