"""What a local cluster looks like: a pure description, derived paths and addresses."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from pathlib import Path

DEFAULT_STATE_DIR = "/var/lib/hpc-det/local-slurm"
# The partitions every local cluster has. `batch` is the default and can be preempted by `urgent`;
# `short` has a 2-minute time limit so tests can exercise time-limit chaining.
PARTITION_DEFAULT = "batch"
PARTITION_URGENT = "urgent"
PARTITION_SHORT = "short"


def get_state_dir() -> Path:
    """The directory that holds the cluster's configuration, spool and logs (env override for tests)."""
    return Path(os.environ.get("DET_LOCAL_SLURM_DIR", DEFAULT_STATE_DIR))


@dataclasses.dataclass(frozen=True)
class LocalClusterSpec:
    nodes: int = 2
    gpus_per_node: int = 2
    cpus_per_node: int = 4
    mem_per_node_mb: int = 4096
    gpu_type: str = "a100"
    grace_time_s: int = 10
    short_max_time_min: int = 2
    cluster_name: str = "detlocal"
    bridge: str = "detbr0"
    subnet: str = "10.77.0.0/24"
    controller_host: str = "localhost"
    state_dir: str = DEFAULT_STATE_DIR
    # Accounting (slurmdbd + a private MariaDB on loopback) so that `sacct` knows finished jobs.
    accounting: bool = True
    # Below the ephemeral range (32768-60999), so that no client socket can hold it when MariaDB starts (CI saw
    # 53306 taken right after the fast lane had opened thousands of connections).
    accounting_db_port: int = 23306

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= 64:
            raise ValueError(f"nodes must be between 1 and 64, not {self.nodes}")
        if not 0 <= self.gpus_per_node <= 16:
            raise ValueError(f"gpus per node must be between 0 and 16, not {self.gpus_per_node}")
        if not 1 <= self.cpus_per_node <= 256:
            raise ValueError(f"cpus per node must be between 1 and 256, not {self.cpus_per_node}")

    # ---- derived names and addresses -------------------------------------------------------------
    @property
    def node_names(self) -> list[str]:
        return [f"node{i}" for i in range(1, self.nodes + 1)]

    @property
    def _net(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    @property
    def controller_ip(self) -> str:
        return str(self._net.network_address + 1)

    def node_ip(self, index: int) -> str:
        """Address of node `index` (0-based): .11, .12, ..."""
        return str(self._net.network_address + 11 + index)

    @property
    def prefixlen(self) -> int:
        return self._net.prefixlen

    @property
    def node_list(self) -> str:
        return "node1" if self.nodes == 1 else f"node[1-{self.nodes}]"

    # ---- paths -----------------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return Path(self.state_dir)

    @property
    def etc_dir(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc_dir / "slurm.conf"

    @property
    def dev_dir(self) -> Path:
        return self.root / "dev"

    def gpu_device(self, index: int) -> Path:
        return self.dev_dir / f"nvidia{index}"

    def node_dir(self, node: str) -> Path:
        return self.root / "nodes" / node

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def db_dir(self) -> Path:
        return self.root / "mariadb"

    @property
    def db_socket(self) -> Path:
        return self.db_dir / "mariadb.sock"

    @property
    def daemon_dirs(self) -> list[Path]:
        """The daemons' own directories (configuration, devices, logs, slurmctld state, pid files, node spool,
        accounting database): `down` removes the ones `up` created with everything in them."""
        root = self.root
        return [
            self.etc_dir,
            self.dev_dir,
            self.log_dir,
            root / "ctld",
            root / "run",
            root / "nodes",
            self.db_dir,
        ]

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> LocalClusterSpec:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})  # type: ignore[arg-type]
