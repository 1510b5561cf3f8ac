"""`det deploy local up|down|status`: a throwaway multi-node Slurm cluster on this machine.

Each node is its own host: a network namespace on a bridge, its own hostname (UTS namespace), its own IP and an
/etc/hosts entry, with one slurmd. Fake GPU character devices make Slurm hand out GPUs exactly as on a GPU node.
Everything `up` changes is recorded in the state file so that `down` undoes exactly that, and removes nothing
that `up` did not create (`cleanup`, `accounts`): what it keeps, it names.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from local_cluster import accounting, accounts, cleanup, hosts, render, system
from local_cluster.spec import LocalClusterSpec, get_state_dir
from local_cluster.system import LocalClusterError

log = logging.getLogger(__name__)

SITE_SLURM_DIR = Path("/etc/slurm")
CONF_FILES = ("slurm.conf", "gres.conf", "mpi.conf")
HOSTS_FILE = Path("/etc/hosts")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")


@dataclass
class Record:
    """What `up` did, so that `down` can undo exactly that."""

    spec: dict[str, object]
    started_munge: bool = False
    linked_confs: list[str] = field(default_factory=list)
    backed_up_confs: list[str] = field(default_factory=list)
    created_users: list[str] = field(default_factory=list)
    # Directories `up` created besides the daemons' own (the state directory and its missing ancestors,
    # /etc/slurm, the PMIx directory), parents first: `down` removes each only if it is empty by then.
    # A state file from before this rule holds only the topmost of the state directory's.
    created_dirs: list[str] = field(default_factory=list)
    # The daemons' own directories (`spec.daemon_dirs`) that `up` created: `down` removes them whole.
    # None in a state file from before they were recorded: all of them.
    own_dirs: list[str] | None = None
    # Each home `up` created with an account → what `useradd` put in it (`cleanup.manifest`). None in a state
    # file from before homes were recorded: then `down` compares a home with /etc/skel.
    created_homes: dict[str, dict[str, str]] | None = None

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.__dict__, indent=2))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> Record:
        return cls(**json.loads(path.read_text()))


def require_root() -> None:
    if os.geteuid() != 0:
        raise LocalClusterError(
            "det deploy local must run as root: it installs packages, creates network namespaces and starts "
            "Slurm daemons. Try: sudo det deploy local up"
        )


def is_up(state_dir: Path | None = None) -> bool:
    """Whether `up` has run and `down` has not (its daemons may have died since: see `problems`)."""
    return ((state_dir or get_state_dir()) / "state.json").exists()


def problems(spec: LocalClusterSpec) -> list[str]:
    """Why a cluster whose state file exists cannot run jobs; [] when it can.

    A state file outlives its daemons when the machine restarts or is restored from a disk image: without this
    check, `status` said "up" and every caller went on to submit jobs to a controller that was not there.
    """
    found = []
    if not system.pids_named("slurmctld"):
        found.append("slurmctld is not running")
    elif "UP" not in system.run(["scontrol", "ping"], check=False).stdout:
        found.append("slurmctld does not answer `scontrol ping`")
    in_nodes = {pid for node in spec.node_names for pid in system.pids_in_netns(node)}
    slurmd = [pid for pid in system.pids_named("slurmd") if pid in in_nodes]
    if len(slurmd) < len(spec.node_names):
        found.append(f"{len(slurmd)} of {len(spec.node_names)} slurmd running")
    if not MUNGE_SOCKET.exists() or not system.pids_named("munged"):
        found.append("munged is not running")
    return found


def is_healthy(state_dir: Path | None = None) -> bool:
    """Whether the cluster is up and its daemons run: what a test or a job submission needs."""
    state_file = (state_dir or get_state_dir()) / "state.json"
    if not state_file.exists():
        return False
    return not problems(LocalClusterSpec.from_json(Record.load(state_file).spec))


# ---- up ---------------------------------------------------------------------------------------------
def up(
    spec: LocalClusterSpec,
    *,
    install: bool = True,
    force: bool = False,
    users: tuple[str, ...] = (),
    wait_s: float = 90,
) -> None:
    require_root()
    if spec.state_file.exists():
        current = LocalClusterSpec.from_json(Record.load(spec.state_file).spec)
        stale = problems(current)
        if not stale:
            raise LocalClusterError(
                f"the local cluster is already up (state in {spec.root}); `det deploy local status` shows it, "
                "`det deploy local down` removes it"
            )
        # Left from before a restart (or its daemons died): undo what that `up` did, then start afresh.
        log.warning("the local cluster in %s is stale (%s); removing it first", spec.root, "; ".join(stale))
        for kept in down(quiet=True) or []:
            log.warning("%s", kept)
    missing = system.missing_packages(accounting=spec.accounting)
    if missing and not install:
        raise LocalClusterError(
            f"missing Debian packages: {' '.join(missing)} (drop --no-install to install them)"
        )
    _check_site_config(force)
    if system.link_exists(spec.bridge):
        raise LocalClusterError(
            f"network interface {spec.bridge} already exists; is another cluster running?"
        )
    system.install_packages(missing)

    created = cleanup.make_dirs(spec.root)
    homes: dict[str, dict[str, str]] = {}
    record = Record(
        spec=spec.to_json(),
        created_dirs=[str(d) for d in created],
        own_dirs=[str(d) for d in spec.daemon_dirs if not os.path.lexists(d)],
        created_homes=homes,
    )
    record.save(spec.state_file)  # from here on, `down` can clean up whatever follows
    try:
        _write_files(spec)
        record.created_dirs += [str(d) for d in cleanup.make_dirs(Path(render.PMIX_CLI_TMP_DIR))]
        _link_site_config(spec, record, force)
        record.save(spec.state_file)
        _update_hosts(spec)
        record.started_munge = _ensure_munge()
        record.save(spec.state_file)
        _create_network(spec)
        if spec.accounting:
            accounting.start(spec, _daemon_env(spec))
        _start_slurmctld(spec)
        for i, node in enumerate(spec.node_names):
            _start_slurmd(spec, node, i)
        for user in users:
            account = accounts.ensure(user)
            if account is not None:
                record.created_users.append(user)
                if account.skeleton is not None:
                    homes[account.home] = account.skeleton
                record.save(spec.state_file)
        if spec.accounting:
            accounting.add_users(spec, users, _daemon_env(spec))
        _wait_nodes_idle(spec, wait_s)
    except BaseException:
        log.error("bringing the cluster up failed; cleaning up")
        for kept in down(quiet=True) or []:
            log.warning("%s", kept)
        raise


def _check_site_config(force: bool) -> None:
    for name in CONF_FILES:
        site = SITE_SLURM_DIR / name
        if (site.exists() or site.is_symlink()) and not force:
            raise LocalClusterError(
                f"{site} already exists (a site Slurm configuration?); refusing to replace it. "
                "Pass --force to move it aside for as long as the local cluster is up."
            )


def _write_files(spec: LocalClusterSpec) -> None:
    for d in spec.daemon_dirs:
        if d != spec.db_dir or spec.accounting:
            d.mkdir(parents=True, exist_ok=True)
    for node in spec.node_names:
        (spec.node_dir(node) / "spool").mkdir(parents=True, exist_ok=True)
        (spec.node_dir(node) / "pmix").mkdir(parents=True, exist_ok=True)
    files = {
        "slurm.conf": render.render_slurm_conf(spec),
        "gres.conf": render.render_gres_conf(spec),
        "mpi.conf": render.render_mpi_conf(spec),
    }
    for name, text in files.items():
        (spec.etc_dir / name).write_text(text)
    for i in range(spec.gpus_per_node):
        dev = spec.gpu_device(i)
        if not dev.exists():
            os.mknod(dev, 0o666 | 0o020000, os.makedev(render.GPU_DEVICE_MAJOR, i))


def _link_site_config(spec: LocalClusterSpec, record: Record, force: bool) -> None:
    record.created_dirs += [str(d) for d in cleanup.make_dirs(SITE_SLURM_DIR)]
    for name in CONF_FILES:
        site = SITE_SLURM_DIR / name
        if site.exists() or site.is_symlink():
            if not force:  # checked before; the site may have changed since
                raise LocalClusterError(f"{site} appeared while bringing the cluster up")
            backup = site.with_name(name + ".hpc-det-backup")
            os.replace(site, backup)
            record.backed_up_confs.append(str(site))
        site.symlink_to(spec.etc_dir / name)
        record.linked_confs.append(str(site))


def _update_hosts(spec: LocalClusterSpec) -> None:
    text = HOSTS_FILE.read_text()
    HOSTS_FILE.write_text(hosts.add_block(text, render.render_hosts_block(spec)))


def _ensure_munge() -> bool:
    """Start munged unless it already runs; returns whether we started it."""
    if MUNGE_SOCKET.exists() and system.pids_named("munged"):
        return False
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        system.run(["mungekey", "--create", "--force"])
        system.run(["chown", "munge:munge", str(key)])
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    system.run(["chown", "munge:munge", "/run/munge"])
    system.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"])
    system.wait_until(MUNGE_SOCKET.exists, 10, "munged did not create its socket")
    return True


def _create_network(spec: LocalClusterSpec) -> None:
    system.create_bridge(spec.bridge, spec.controller_ip, spec.prefixlen)
    for i, node in enumerate(spec.node_names):
        system.create_node_netns(node, spec.bridge, spec.node_ip(i), spec.prefixlen, spec.controller_ip, i)


def _daemon_env(spec: LocalClusterSpec) -> dict[str, str]:
    return dict(os.environ, SLURM_CONF=str(spec.slurm_conf))


def _start_slurmctld(spec: LocalClusterSpec) -> None:
    subprocess.run(["slurmctld"], check=True, env=_daemon_env(spec), timeout=60)
    system.wait_until(
        lambda: system.run(["scontrol", "ping"], check=False).stdout.count("UP") > 0,
        30,
        f"slurmctld did not answer; see {spec.log_dir / 'slurmctld.log'}",
    )


def _start_slurmd(spec: LocalClusterSpec, node: str, index: int) -> None:
    """Start slurmd in the node's own network, UTS and mount namespaces."""
    q = shlex.quote
    pmix_dir = spec.node_dir(node) / "pmix"
    script = (
        f"hostname {q(node)} && mkdir -p {q(render.PMIX_CLI_TMP_DIR)} "
        f"&& mount --bind {q(str(pmix_dir))} {q(render.PMIX_CLI_TMP_DIR)} "
        f"&& exec slurmd -N {q(node)}"
    )
    cmd = [
        "nsenter", f"--net=/run/netns/{node}",
        "unshare", "--uts", "--mount", "--propagation", "private",
        "sh", "-c", script,
    ]  # fmt: skip
    subprocess.run(cmd, check=True, env=_daemon_env(spec), timeout=60)


def fail_node(node: str) -> None:
    """Make `node` fail as a real node does: its slurmd and everything running on it die at once.

    Slurm notices after SlurmdTimeout, marks the node DOWN and ends its jobs with NODE_FAIL.
    """
    require_root()
    spec = _current_spec()
    if node not in spec.node_names:
        raise LocalClusterError(f"no node {node!r}; the nodes are {', '.join(spec.node_names)}")
    # SIGKILL only: with a SIGTERM first, even 0.1 s was enough for a trial to checkpoint and exit cleanly,
    # and slurmstepd to report the job COMPLETED before it died: a graceful preemption, not a node failure.
    system.kill_now(system.pids_in_netns(node))


def start_node(node: str) -> None:
    """(Re)start a node's slurmd; with ReturnToService=2 a DOWN node comes back once it registers."""
    require_root()
    spec = _current_spec()
    if node not in spec.node_names:
        raise LocalClusterError(f"no node {node!r}; the nodes are {', '.join(spec.node_names)}")
    if any(p in system.pids_named("slurmd") for p in system.pids_in_netns(node)):
        return
    _start_slurmd(spec, node, spec.node_names.index(node))


def kill_controller() -> None:
    """Kill slurmctld at once (SIGKILL, as a crash does). Jobs go on running on their nodes; every Slurm
    command fails with "Unable to contact slurm controller" until `start_controller`. sacct still answers
    (slurmdbd is its own daemon)."""
    require_root()
    _current_spec()
    system.kill_now(system.pids_named("slurmctld"))


def start_controller() -> None:
    """(Re)start slurmctld, which recovers its jobs from its saved state, and wait until it answers."""
    require_root()
    spec = _current_spec()
    if not system.pids_named("slurmctld"):
        _start_slurmctld(spec)


def _current_spec() -> LocalClusterSpec:
    state_file = get_state_dir() / "state.json"
    if not state_file.exists():
        raise LocalClusterError("the local cluster is not up")
    return LocalClusterSpec.from_json(Record.load(state_file).spec)


def _wait_nodes_idle(spec: LocalClusterSpec, timeout_s: float) -> None:
    def all_idle() -> bool:
        out = system.run(["sinfo", "-N", "-h", "-o", "%N %t"], check=False).stdout
        states = {}
        for line in out.splitlines():
            name, state = line.split()
            states[name] = state
        return all(states.get(n, "").startswith("idle") for n in spec.node_names)

    system.wait_until(
        all_idle, timeout_s, f"nodes did not become idle; see {spec.log_dir}/slurmd-*.log and `sinfo -R`"
    )


# ---- down -------------------------------------------------------------------------------------------
def down(*, quiet: bool = False) -> list[cleanup.Kept] | None:
    """Undo what `up` did, removing nothing it did not create (see `cleanup`).

    Returns what it kept of what `up` created, and why (None when the cluster was not up).
    """
    require_root()
    state_file = get_state_dir() / "state.json"
    if not state_file.exists():
        if not quiet:
            log.info("the local cluster is not up")
        return None
    record = Record.load(state_file)
    spec = LocalClusterSpec.from_json(record.spec)
    if system.pids_named("slurmctld"):
        system.run(["scancel", "--full", "--quiet", "--state=PENDING,RUNNING,SUSPENDED"], check=False)
    # Daemons first (slurmd, then the step daemons and whatever jobs still run in the nodes), then slurmctld.
    system.terminate(system.pids_named("slurmd"))
    leftovers = system.pids_named("slurmstepd")
    for node in spec.node_names:
        leftovers += system.pids_in_netns(node)
    system.terminate(sorted(set(leftovers)))
    system.terminate(system.pids_named("slurmctld"))
    if spec.accounting:
        accounting.stop(spec)
    if record.started_munge:
        system.terminate(system.pids_named("munged"))
    for i, node in enumerate(spec.node_names):
        system.delete_node_netns(node, i)
    system.delete_bridge(spec.bridge)
    if HOSTS_FILE.exists() and hosts.has_block(HOSTS_FILE.read_text()):
        HOSTS_FILE.write_text(hosts.remove_block(HOSTS_FILE.read_text()))
    for link in record.linked_confs:
        p = Path(link)
        if p.is_symlink():
            p.unlink()
    for site in record.backed_up_confs:
        backup = Path(site).with_name(Path(site).name + ".hpc-det-backup")
        if backup.exists():
            os.replace(backup, site)
    kept: list[cleanup.Kept] = []
    for user in record.created_users:
        kept += accounts.remove(user, record.created_homes)
    own = spec.daemon_dirs if record.own_dirs is None else [Path(d) for d in record.own_dirs]
    for d in own:
        cleanup.remove_own_dir(d)
    for d in spec.daemon_dirs:
        if d not in own and os.path.lexists(d):
            kept.append(cleanup.Kept(str(d), "it existed before `up`"))
    state_file.with_suffix(".tmp").unlink(missing_ok=True)
    state_file.unlink()
    for d in _created_dirs_deepest_first(record, spec):
        k = cleanup.remove_if_empty(d, "`up` created it")
        if k is not None:
            kept.append(k)
    return kept


def _created_dirs_deepest_first(record: Record, spec: LocalClusterSpec) -> list[Path]:
    dirs = {Path(d) for d in record.created_dirs}
    for top in list(dirs):
        # `up` created `top`, so also every directory between it and the state directory (an older state file
        # records only the topmost).
        if spec.root.is_relative_to(top):
            p = spec.root
            while p != top:
                dirs.add(p)
                p = p.parent
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


# ---- status -----------------------------------------------------------------------------------------
def status() -> dict[str, object]:
    state_file = get_state_dir() / "state.json"
    if not state_file.exists():
        return {"up": False}
    record = Record.load(state_file)
    spec = LocalClusterSpec.from_json(record.spec)
    sinfo = system.run(["sinfo", "-N", "-h", "-o", "%N %P %t %G %c"], check=False)
    found = problems(spec)
    return {
        "up": True,
        "healthy": not found,
        "problems": found,
        "state_dir": str(spec.root),
        "controller": f"{socket.gethostname()} ({spec.controller_ip})",
        "nodes": {name: spec.node_ip(i) for i, name in enumerate(spec.node_names)},
        "gpus_per_node": spec.gpus_per_node,
        "slurmctld_running": bool(system.pids_named("slurmctld")),
        "slurmd_running": len(system.pids_named("slurmd")),
        "sinfo": sinfo.stdout.strip() or sinfo.stderr.strip(),
        "users": record.created_users,
    }
