"""``det-master``: run the master (FastAPI under uvicorn), in the foreground or as a personal daemon."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hpc_master import paths
from hpc_master.errors import ClientError, DetError
from hpc_master.masterconf import MasterConfig, load_master_config

log = logging.getLogger("hpc_master")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="det-master", description="Run the hpc-det master.")
    parser.add_argument("--config", type=Path, help="master.yaml (default: built-in defaults)")
    parser.add_argument("--host", help="listen address (overrides listen.host)")
    parser.add_argument("--port", type=int, help="listen port (overrides listen.port)")
    parser.add_argument(
        "--daemon", action="store_true", help="run in the background (pid/log in the state dir)"
    )
    parser.add_argument(
        "--stop", action="store_true", help="stop the background master started with --daemon"
    )
    parser.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def resolve_config(args: argparse.Namespace) -> MasterConfig:
    config = load_master_config(args.config)
    if args.host or args.port is not None:
        listen = config.listen.model_copy(
            update={k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
        )
        config = config.model_copy(update={"listen": listen})
    return config


def read_pid() -> int | None:
    try:
        pid = int(paths.get_pid_file().read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def stop_daemon(timeout_s: float = 15.0) -> int:
    pid = read_pid()
    if pid is None:
        print("no background master is running", file=sys.stderr)
        paths.get_pid_file().unlink(missing_ok=True)
        return 1
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        print(f"master (pid {pid}) did not stop within {timeout_s:.0f} s", file=sys.stderr)
        return 1
    paths.get_pid_file().unlink(missing_ok=True)
    print(f"stopped master (pid {pid})")
    return 0


def start_daemon(argv: list[str]) -> int:
    existing = read_pid()
    if existing is not None:
        print(f"a background master is already running (pid {existing})", file=sys.stderr)
        return 1
    state_dir = paths.get_state_dir()
    state_dir.mkdir(parents=True, exist_ok=True)
    child_argv = [a for a in argv if a != "--daemon"]
    log_file = paths.get_log_file()
    with open(log_file, "ab") as out, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hpc_master.server", *child_argv],
            stdin=devnull,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    paths.get_pid_file().write_text(f"{proc.pid}\n")
    time.sleep(0.5)
    if proc.poll() is not None:
        print(f"the master exited at once; see {log_file}", file=sys.stderr)
        paths.get_pid_file().unlink(missing_ok=True)
        return 1
    print(f"master running in the background (pid {proc.pid}); log: {log_file}")
    return 0


KEEP_ALIVE_S = 75


def raise_open_files_limit() -> int:
    """Raise the soft limit on open files to the hard one: a master serving a thousand trials holds a few
    thousand connections, and login nodes often start services with a soft limit of 1024. The new limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft


def serve(config: MasterConfig, log_level: str = "info") -> None:
    import uvicorn

    from hpc_master.api.app import create_app
    from hpc_master.services.curve_keeper import CurveKeeper

    app = create_app(config)
    app.state.det.writer.start(worker=True)  # on SQLite, its ingest worker is ready for the first batch
    raise_open_files_limit()
    loop = make_lifecycle_loop(app.state.det)
    loop.start()
    keeper = CurveKeeper(app.state.curves, app.state.det.tx)  # the web UI's curves, ready before asked
    keeper.start()
    uvicorn.run(
        app,
        host=config.listen.host,
        port=config.listen.port,
        log_level=log_level,
        ssl_certfile=str(config.tls.cert) if config.tls.cert else None,
        ssl_keyfile=str(config.tls.key) if config.tls.key else None,
        access_log=False,
        # Each trial keeps up to three connections alive (its main thread, metrics, preemption watch) and
        # often calls less than every 5 s (uvicorn's default): reconnecting would cost every such call.
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    loop.stop()
    keeper.stop()


def make_lifecycle_loop(state: Any) -> Any:
    """The loop that drives searchers and Slurm jobs (Slurm's command-line tools must be on PATH)."""
    from hpc_master.lifecycle.jobs import JobDriver
    from hpc_master.lifecycle.loop import LifecycleLoop
    from hpc_master.services.checkpoint_gc import CheckpointCollector
    from hpc_master.services.checkpoint_policy import GCPolicy
    from slurm_backend import Poller, SlurmCli

    config = state.config
    cli = SlurmCli()
    poller = Poller(cli, interval_s=config.poll_interval_s)
    jobs = JobDriver(state.sessions, config, cli, poller, cluster_id=state.cluster_id)
    storage = config.checkpoint_storage
    collector = CheckpointCollector(
        state.sessions,
        default_root=config.checkpoint_dir(),
        default_policy=GCPolicy(
            storage.save_experiment_best, storage.save_trial_best, storage.save_trial_latest
        ),
        remover=state.checkpoint_remover,
    )
    interval_s = min(2.0, config.poll_interval_s)
    return LifecycleLoop(state.sessions, jobs, interval_s=interval_s, collector=collector)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.stop:
        return stop_daemon()
    try:
        config = resolve_config(args)
        if args.daemon:
            return start_daemon(argv)
        if config.passwords_required() and config.listens_beyond_loopback():
            log.info("listening beyond loopback (%s): passwords are required", config.listen.host)
        serve(config, args.log_level)
    except ClientError as err:
        print(f"det-master: {err}", file=sys.stderr)
        if os.environ.get("DET_DEBUG"):
            raise
        return 2
    except DetError as err:
        print(f"det-master: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
