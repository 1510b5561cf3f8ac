"""Host-level operations for the local cluster: commands, network namespaces, processes, packages.

Every command is an argv list (never a shell string built from input); the one `sh -c` used to start a node
gets only names and paths this package generated, each passed through `shlex.quote`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

# Debian packages the local cluster needs, keyed by a file that proves each is installed.
PACKAGES: dict[str, str] = {
    "slurm-wlm": "/usr/sbin/slurmctld",
    "munge": "/usr/sbin/munged",
    "libpmix2": "/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so.2",
    "openmpi-bin": "/usr/bin/mpirun",
    "libopenmpi-dev": "/usr/include/x86_64-linux-gnu/openmpi/mpi.h",
    "iproute2": "/usr/sbin/ip",
    "util-linux": "/usr/bin/nsenter",
}
# Needed only with accounting (slurmdbd + MariaDB), the default.
ACCOUNTING_PACKAGES: dict[str, str] = {
    "slurmdbd": "/usr/sbin/slurmdbd",
    "mariadb-server": "/usr/sbin/mariadbd",
}


class LocalClusterError(RuntimeError):
    """A clear, user-facing failure of `det deploy local`."""


class CommandError(LocalClusterError):
    """A command the local cluster needed failed."""


def wait_until(predicate: Callable[[], object], timeout_s: float, message: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.25)
    raise LocalClusterError(message)


def run(
    cmd: Sequence[str], *, check: bool = True, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    log.debug("run: %s", " ".join(cmd))
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s, check=False)
    if check and proc.returncode != 0:
        raise CommandError(
            f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc


def missing_packages(*, accounting: bool) -> list[str]:
    wanted = {**PACKAGES, **(ACCOUNTING_PACKAGES if accounting else {})}
    return [pkg for pkg, probe in wanted.items() if not Path(probe).exists()]


def install_packages(packages: list[str]) -> None:
    if not packages:
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages], check=True, env=env
    )


# ---- network ----------------------------------------------------------------------------------------
def link_exists(name: str) -> bool:
    return run(["ip", "link", "show", name], check=False).returncode == 0


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def create_bridge(bridge: str, ip: str, prefixlen: int) -> None:
    run(["ip", "link", "add", bridge, "type", "bridge"])
    run(["ip", "addr", "add", f"{ip}/{prefixlen}", "dev", bridge])
    run(["ip", "link", "set", bridge, "up"])


def create_node_netns(node: str, bridge: str, ip: str, prefixlen: int, gateway: str, index: int) -> None:
    host_if, node_if = f"detv{index}h", f"detv{index}n"
    run(["ip", "netns", "add", node])
    run(["ip", "link", "add", host_if, "type", "veth", "peer", "name", node_if])
    run(["ip", "link", "set", node_if, "netns", node])
    run(["ip", "link", "set", host_if, "master", bridge])
    run(["ip", "link", "set", host_if, "up"])
    ns = ["nsenter", f"--net=/run/netns/{node}"]
    run([*ns, "ip", "link", "set", "lo", "up"])
    run([*ns, "ip", "link", "set", node_if, "name", "eth0"])
    run([*ns, "ip", "addr", "add", f"{ip}/{prefixlen}", "dev", "eth0"])
    run([*ns, "ip", "link", "set", "eth0", "up"])
    run([*ns, "ip", "route", "add", "default", "via", gateway])


def delete_node_netns(node: str, index: int) -> None:
    if link_exists(f"detv{index}h"):
        run(["ip", "link", "del", f"detv{index}h"], check=False)
    if netns_exists(node):
        run(["ip", "netns", "del", node], check=False)


def delete_bridge(bridge: str) -> None:
    if link_exists(bridge):
        run(["ip", "link", "del", bridge], check=False)


# ---- processes -------------------------------------------------------------------------------------
def pids_named(name: str) -> list[int]:
    """Live pids whose executable name is `name` (from /proc, so it works in any namespace; no zombies)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if comm == name and pid_alive(int(entry.name)):
            pids.append(int(entry.name))
    return pids


def pids_in_netns(node: str) -> list[int]:
    proc = run(["ip", "netns", "pids", node], check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    state = _proc_state(pid)
    return state not in ("Z", "X", None)


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def terminate(pids: list[int], *, timeout_s: float = 10) -> None:
    """SIGTERM, wait, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
            time.sleep(0.1)
        pids = [p for p in pids if pid_alive(p)]
        if not pids:
            return


def kill_now(pids: list[int]) -> None:
    """SIGKILL every process at once (a power cut, as far as they can tell) and wait until they are gone."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.02)


def which(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(Path(d, name)) for d in ("/usr/sbin", "/sbin") if Path(d, name).exists()), None
    )
