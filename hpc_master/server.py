"""``det-master``: run the master (FastAPI under uvicorn), in the foreground or as a personal daemon."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpc_master import owner_key, paths
from hpc_master.errors import ClientError, DetError
from hpc_master.masterconf import MasterConfig, load_master_config

if TYPE_CHECKING:
    import uvicorn

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
    parser.add_argument(
        "--check-config", type=Path, metavar="MASTER_YAML",
        help="validate a master.yaml (with this environment's DET_* overrides) and exit, touching nothing: "
        "0 and 'ok', or 2 and the field",
    )  # fmt: skip
    parser.add_argument(
        "--print-systemd-unit", action="store_true",
        help="print det-master.service for this installation (docs/admin.md) and exit",
    )  # fmt: skip
    parser.add_argument(
        "--print-sudoers", action="store_true",
        help="print the sudoers rule that lets the service account run the per-user helper (docs/admin.md)",
    )  # fmt: skip
    parser.add_argument(
        "--users-group", default="hpc-det-users", help="with --print-sudoers: the group of the master's users"
    )
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


def stop_daemon(timeout_s: float = 90.0) -> int:
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


DAEMON_READY_TIMEOUT_S = 300.0
"""How long ``--daemon`` waits for the master to serve before it returns."""


def login_link(config: MasterConfig) -> str | None:
    """A personal master's web UI address that logs its owner in: the owner's key (``hpc_master.owner_key``)
    in the URL's fragment, which the browser keeps to itself and the login page sends once. None for a master
    that requires passwords. Printed to the owner's terminal only, never logged: it is a secret."""
    if config.passwords_required():
        return None
    key = owner_key.read(config.listen.port)
    if key is None:
        return None
    host = f"[{config.listen.host}]" if ":" in config.listen.host else config.listen.host
    scheme = "https" if config.tls.cert else "http"
    return f"{scheme}://{host}:{config.listen.port}/login#key={key}"


def start_daemon(argv: list[str], config: MasterConfig) -> int:
    existing = read_pid()
    if existing is not None:
        print(f"a background master is already running (pid {existing})", file=sys.stderr)
        return 1
    state_dir = paths.get_state_dir()
    state_dir.mkdir(parents=True, exist_ok=True)
    child_argv = [a for a in argv if a != "--daemon"]
    log_file = paths.get_log_file()
    from hpc_master.systemd import ReadyListener

    ready = ReadyListener()  # the child says READY=1 once it serves, as to systemd (Type=notify)
    with open(log_file, "ab") as out, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hpc_master.server", *child_argv],
            stdin=devnull,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "NOTIFY_SOCKET": ready.address},
        )
    paths.get_pid_file().write_text(f"{proc.pid}\n")
    try:
        is_ready = ready.wait(lambda: proc.poll() is None, DAEMON_READY_TIMEOUT_S)
    finally:
        ready.close()
    if proc.poll() is not None:
        print(f"the master exited (status {proc.returncode}); see {log_file}", file=sys.stderr)
        paths.get_pid_file().unlink(missing_ok=True)
        return 1
    if not is_ready:
        print(
            f"the master (pid {proc.pid}) is still starting after {DAEMON_READY_TIMEOUT_S:.0f} s (migrating a "
            f"large database?); see {log_file}",
            file=sys.stderr,
        )
        return 0
    print(f"master running in the background (pid {proc.pid}); log: {log_file}")
    link = login_link(config)
    if link:
        print(
            f"Web UI: {link}\n  (this link logs you in as determined until the master restarts; keep it to yourself)"
        )
    return 0


KEEP_ALIVE_S = 75
GRACEFUL_SHUTDOWN_S = 5
"""How long a stop waits for requests in flight. Long polls and streams (log follows, the web UI's change
streams) do not end by themselves: they are cut then, and their clients reconnect once the master is back."""
LOOP_STOP_S = 60
"""How long a stop waits for the lifecycle loop to finish its tick (Slurm commands time out after 30 s)."""


def raise_open_files_limit() -> int:
    """Raise the soft limit on open files to the hard one: a master serving a thousand trials holds a few
    thousand connections, and login nodes often start services with a soft limit of 1024. The new limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft


def uvicorn_config(app: Any, config: MasterConfig, log_level: str = "info") -> uvicorn.Config:
    """How uvicorn serves the master."""
    import uvicorn

    proxies = config.listen.forwarded_allow_ips
    return uvicorn.Config(
        app,
        host=config.listen.host,
        port=config.listen.port,
        log_level=log_level,
        log_config=None,  # uvicorn's lines go through the master's handler and format (journald's too)
        ssl_certfile=str(config.tls.cert) if config.tls.cert else None,
        ssl_keyfile=str(config.tls.key) if config.tls.key else None,
        access_log=False,
        # Each trial keeps up to three connections alive (its main thread, metrics, preemption watch) and
        # often calls less than every 5 s (uvicorn's default): reconnecting would cost every such call.
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        # uvicorn's default believes X-Forwarded-For from loopback: on a login node, anyone could then pick the
        # address their logins are throttled by. Only the proxies the admin names are believed.
        proxy_headers=bool(proxies),
        forwarded_allow_ips=list(proxies),
    )


def serve(config: MasterConfig, log_level: str = "info") -> None:
    """Run until SIGTERM or SIGINT, then stop in order, leaving nothing half-written: uvicorn stops listening,
    drains requests (at most ``GRACEFUL_SHUTDOWN_S``) and runs the app's shutdown (the metrics writer stores
    what it queued and stops its ingest worker; SQLite's WAL checkpointer stops); then the lifecycle loop
    finishes its tick (and the checkpoint GC its claim), the curve keeper saves the learning curves, and the
    database connections close. Under systemd (``Type=notify``) it reports when it is ready and stopping."""
    from hpc_master import paths
    from hpc_master.api.app import create_app
    from hpc_master.service_account import become, identity_for
    from hpc_master.services.curves.keeper import CurveKeeper
    from hpc_master.systemd import ExitSignals, NotifyingServer, sd_notify

    identity = identity_for(config)
    become(identity, [paths.get_data_dir(), paths.get_state_dir()])  # before it opens anything
    signals = ExitSignals()
    signals.install()  # from here on a SIGTERM stops the master in order; a migration under way completes
    sd_notify("STATUS=starting: migrating the database")
    app = create_app(config)
    state = app.state.det
    state.acts_for_users, state.helper_via = identity.acts_for_users, identity.via
    state.checkpoint_remover.as_owner = identity.acts_for_users
    link = login_link(config)  # the owner key was written by create_app
    if link and sys.stderr.isatty():
        print(f"Web UI: {link}  (logs you in as determined until the master restarts)", file=sys.stderr)
    uv_config = uvicorn_config(app, config, log_level)
    task_sockets = _task_origin_socket(config, state)
    browsers = _browser_listener(app, config, state, log_level, task_sockets)
    server = NotifyingServer(uv_config, companions=browsers)
    signals.server = server
    sockets = [uv_config.bind_socket(), *([] if browsers else task_sockets)]
    state.writer.start(worker=True)  # on SQLite, its ingest worker is ready for the first batch
    raise_open_files_limit()
    loop = make_lifecycle_loop(state)
    app.state.loop = loop  # for /health and /metrics (api/observability.py)
    loop.start()
    keeper = CurveKeeper(app.state.curves, state.tx)  # the web UI's curves, ready before asked
    keeper.start()
    try:
        if not signals.received:
            server.run(sockets=sockets)  # returns once stopped and drained, the app's shutdown run
        if server.companion_failed:
            raise SystemExit("the master stopped: its HTTPS listener for browsers did not start (above)")
    finally:
        state.close()  # the app's shutdown if uvicorn did not run it (a signal first, or a second one); idempotent
        loop.stop(timeout_s=LOOP_STOP_S)
        if loop.running():
            log.warning(
                "the lifecycle loop did not finish its tick in %d s; the next start reconciles", LOOP_STOP_S
            )
        keeper.stop()
        state.engine.dispose()
        sd_notify("STATUS=stopped")
        log.info("stopped")


def _browser_listener(
    app: Any, config: MasterConfig, state: Any, log_level: str, task_sockets: list[socket.socket]
) -> list[tuple[Any, list[socket.socket]]]:
    """The web UI's HTTPS listener of a master that serves browsers apart (``api/browser_origin.py``), with
    the task origin's socket beside it, and the certificate the master generates (``browser_tls``)."""
    port = config.browser_listen_port()
    if port is None:
        return []
    from urllib.parse import urlsplit

    from hpc_master import browser_tls, paths
    from hpc_master.systemd import CompanionServer

    hosts = [
        config.listen.host,
        urlsplit(config.master_url()).hostname or "",
        urlsplit(state.task_origin).hostname or "",
    ]
    try:
        cert = browser_tls.ensure(paths.get_state_dir() / "tls", hosts)
    except browser_tls.CertificateError as e:
        raise SystemExit(str(e)) from None
    sock = _bind(config.listen.host, port, "the web UI over HTTPS (tls.browser_port)", fallback=False)
    state.browser_port = sock.getsockname()[1]
    where = config.master_url().rsplit(":", 1)[0].replace("http://", "https://", 1)
    log.info(
        "the web UI at %s:%d over HTTPS (certificate %s, generated: SHA-256 %s); browsers on the plain port are "
        "sent there", where, state.browser_port, cert.cert, cert.fingerprint,
    )  # fmt: skip
    uv = uvicorn_config(app, config, log_level)
    uv.lifespan, uv.ssl_certfile, uv.ssl_keyfile = "off", str(cert.cert), str(cert.key)
    return [(CompanionServer(uv), [sock, *task_sockets])]


def _bind(host: str, port: int, what: str, *, fallback: bool) -> socket.socket:
    """A listening socket on ``host:port`` (a free port instead when ``fallback`` and that one is taken)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        if not fallback:
            sock.close()
            raise SystemExit(f"cannot listen on {host}:{port} for {what}: {e}") from None
        sock.bind((host, 0))
    sock.set_inheritable(True)
    return sock


def _task_origin_socket(config: MasterConfig, state: Any) -> list[socket.socket]:
    """The listener of the task origin (``task_proxy``) when it is a port of its own; the default port
    (``listen.port + 1``) gives way to a free one when taken, and the task origin says which."""
    port = config.task_listen_port()
    if port is None:
        log.info("tasks' pages at %s (by host name, on the master's port)", state.task_origin)
        return []
    fixed = bool(config.task_proxy.origin or config.task_proxy.port is not None)
    sock = _bind(config.listen.host, port, "tasks' pages (task_proxy)", fallback=not fixed)
    state.task_port = sock.getsockname()[1]
    if not config.task_proxy.origin:
        state.task_origin = config.task_origin(bound_port=state.task_port)
    log.info("tasks' pages at %s", state.task_origin)
    return [sock]


def make_lifecycle_loop(state: Any) -> Any:
    """The loop that drives searchers and Slurm jobs (Slurm's command-line tools must be on PATH)."""
    from hpc_master.asuser import AsUser, HelperRunFiles, RunFiles
    from hpc_master.helper_client import HelperPool, UserHelper, slurm_runner
    from hpc_master.lifecycle.job_host import PLATFORM_ROOT
    from hpc_master.lifecycle.jobs import JobDriver
    from hpc_master.lifecycle.loop import LifecycleLoop
    from hpc_master.lifecycle.slurm_jobs import SlurmJobs
    from hpc_master.paths import get_job_storage_root
    from hpc_master.services.checkpoints.gc import CheckpointCollector
    from hpc_master.services.checkpoints.policy import GCPolicy
    from hpc_master.services.logs import helper_reader
    from hpc_master.tasks.driver import TaskDriver
    from slurm_backend import Poller, SlurmCli

    config = state.config
    job_root = str(config.job_storage_root or get_job_storage_root())
    # Everything done in a user's name, for trials and tasks alike (hpc_master.asuser): by the per-user helper
    # as the user, where the master acts for its users.
    roots = [job_root, str(config.checkpoint_dir())]  # what `det-master --print-sudoers` names
    helper = UserHelper(roots, via=state.helper_via) if state.acts_for_users else None
    pool = HelperPool(helper) if helper is not None else None
    cli = SlurmCli(user_runner=slurm_runner(helper) if helper else None)
    poller = Poller(cli, interval_s=config.poll_interval_s)
    if helper is not None and state.checkpoint_remover.as_owner:
        state.checkpoint_remover.helper = helper
    # A service account cannot open its users' logs: their helpers read them. A root master (deprecated) reads
    # them itself, through `userfiles` (never through a link, never from a FIFO): a long-lived helper of each
    # user who ever followed a log would keep their account busy (`det deploy local down` could not remove
    # the quickstart's researcher while its root master ran).
    if pool is not None and state.helper_via == "sudo":
        state.log_reader = helper_reader(pool, job_root)
    as_user = AsUser(
        HelperRunFiles(job_root, helper, pool) if helper else RunFiles(job_root),
        SlurmJobs(cli, poller),
        checkpoints=state.checkpoint_remover,
        acts_for_users=state.acts_for_users,
        helper=helper,
    )
    jobs = JobDriver(state.sessions, config, cli, poller, cluster_id=state.cluster_id, as_user=as_user)
    storage = config.checkpoint_storage
    collector = CheckpointCollector(
        state.sessions,
        default_root=config.checkpoint_dir(),
        default_policy=GCPolicy(
            storage.save_experiment_best, storage.save_trial_best, storage.save_trial_latest
        ),
        remover=as_user.checkpoints,
    )
    tasks = TaskDriver(
        state.sessions,
        config,
        cli,
        poller,
        job_storage_root=jobs.job_storage_root,
        platform_root=PLATFORM_ROOT,
        python=jobs.python,
        master_url=jobs.master_url,
        cluster_id=state.cluster_id,
        as_user=as_user,
    )
    interval_s = min(2.0, config.poll_interval_s)
    return LifecycleLoop(state.sessions, jobs, interval_s=interval_s, collector=collector, tasks=tasks)


def report_error(err: DetError, config_path: Path | None) -> None:
    """``det-master: [master.yaml: ]field: message`` on stderr (an error's priority for journald)."""
    from hpc_master.systemd import error_line

    where = f"{config_path}: " if config_path is not None and getattr(err, "field", None) else ""
    print(error_line(f"det-master: {where}{err}"), file=sys.stderr)


def print_sudoers(args: argparse.Namespace) -> int:
    """``--print-sudoers``: the rule for this config's roots and this installation's Python."""
    from hpc_master.service_account import DEFAULT_ACCOUNT, sudoers

    try:
        config = resolve_config(args)
        text = sudoers(
            config, account=config.service_account or DEFAULT_ACCOUNT, users_group=args.users_group
        )
    except DetError as err:
        report_error(err, args.config)
        return 2
    sys.stdout.write(text)
    return 0


def check_config(args: argparse.Namespace) -> int:
    """``--check-config``: the file as the master would load it; no database, no socket, no Slurm."""
    try:
        resolve_config(argparse.Namespace(**{**vars(args), "config": args.check_config}))
    except DetError as err:
        report_error(err, args.check_config)
        return 2
    print("ok")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from hpc_master.systemd import configure_logging

    configure_logging(args.log_level)
    if args.stop:
        return stop_daemon()
    if args.check_config is not None:
        return check_config(args)
    if args.print_sudoers:
        return print_sudoers(args)
    if args.print_systemd_unit:
        from hpc_master.deploy import systemd_unit

        sys.stdout.write(systemd_unit(args.config.resolve() if args.config else None))
        return 0
    return _run_master(args, argv)


def _run_master(args: argparse.Namespace, argv: list[str]) -> int:
    """Serve in the foreground, or start as a daemon (``--daemon``); the exit status."""
    try:
        config = resolve_config(args)
        if args.daemon:
            return start_daemon(argv, config)
        if config.passwords_required() and config.listens_beyond_loopback():
            log.info("listening beyond loopback (%s): passwords are required", config.listen.host)
        serve(config, args.log_level)
    except ClientError as err:
        report_error(err, args.config)
        if os.environ.get("DET_DEBUG"):
            raise
        return 2
    except DetError as err:
        report_error(err, args.config)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
