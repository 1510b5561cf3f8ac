"""What a trial's or task's job needs from the master's host: the platform's code (compiled once, as the jobs'
users cannot write its ``__pycache__``), the URL jobs reach the master at, the Unix account a job runs as, the
image cache's directory."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import hpc_master
from harness.exec.job_contract import JobPlan
from hpc_master.errors import ClientError
from hpc_master.masterconf import MasterConfig

PLATFORM_ROOT = str(Path(hpc_master.__file__).resolve().parents[1])
JOB_PACKAGES = (
    "harness",
    "containers",
    "launchers",
    "determined_compat",
)  # what jobs import from the platform's install


def compile_job_code(root: str = PLATFORM_ROOT) -> bool:
    """Compile the job-side packages' bytecode into their ``__pycache__``.

    Jobs import these packages as their owner's Unix account, which usually cannot write to the master's
    install, so without bytecode compiled here every job compiles them from source again (measured: 18 ms of
    the job entry's 89 ms start). ``pip install`` compiles at install time; a source checkout or an editable
    install does not. Best effort: what cannot be written (a read-only install) stays as it is. Returns
    whether everything compiled.
    """
    import compileall

    ok = True
    for package in JOB_PACKAGES:
        path = os.path.join(root, package)
        if os.path.isdir(path):
            ok = bool(compileall.compile_dir(path, quiet=2)) and ok
    return ok


def master_url_for_jobs(config: MasterConfig) -> str:
    """The URL jobs on the compute nodes use to reach the master (`external_url` when the admin set it)."""
    if config.external_url:
        return config.external_url.rstrip("/")
    scheme = "https" if config.tls.cert else "http"
    host = config.listen.host
    if host in ("0.0.0.0", "::", ""):
        import socket

        host = socket.getfqdn()
    return f"{scheme}://{host}:{config.listen.port}"


def ensure_image_cache(plan: JobPlan) -> None:
    """A trial in a pulled image needs the pool's cache directory, which its owner may not be able to create."""
    cache_dir = (plan.container or {}).get("cache_dir")
    if cache_dir:
        from containers.images import ensure_cache_dir

        ensure_cache_dir(str(cache_dir))


def job_account(owner_name: str, unix_user: str | None) -> tuple[int, int]:
    """(uid, gid) of the Unix account a user's jobs run as (a root master's jobs: trials' and tasks')."""
    if not unix_user:
        raise ClientError(
            f"user {owner_name!r} has no Unix account to run jobs as; an admin sets one with "
            f"`det user edit {owner_name} --unix-username NAME`",
            code="no_unix_account",
        )
    try:
        pw = pwd.getpwnam(unix_user)
    except KeyError:
        raise ClientError(f"Unix account {unix_user!r} does not exist on the master's host") from None
    if pw.pw_uid == 0:
        raise ClientError("jobs never run as root; give the user a non-root Unix account")
    return pw.pw_uid, pw.pw_gid
