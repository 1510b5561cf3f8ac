"""Master configuration (``master.yaml``): strict pydantic models, YAML-path errors, env overrides.

Load with :func:`load_master_config`. Unknown keys are errors with a "did you mean" hint; every error is a
:class:`~hpc_master.errors.ConfigError` whose ``field`` is the YAML path (``resource_pools.gpu.partiton``).
Environment variables override the file for quick tries (see ``ENV_OVERRIDES``).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from hpc_master import paths
from hpc_master.errors import ConfigError
from hpc_master.expconf._errors import UNKNOWN_FIELD
from hpc_master.masterconf_security import LdapLoginConfig, MungeLoginConfig, SecurityConfig, StrictModel

__all__ = ["LdapLoginConfig", "MungeLoginConfig", "SecurityConfig", "StrictModel"]  # theirs, re-exported


class DbConfig(StrictModel):
    url: str | None = None
    """SQLAlchemy URL; ``sqlite:///path`` or ``postgresql+psycopg://user:password@host:port/db`` (a shared
    master: PostgreSQL). Default: SQLite, ``master.db`` in ``$DET_MASTER_DATA_DIR`` (default
    ``~/.local/share/hpc-det``) of the master's account. ``det master config`` masks the password."""


class ListenConfig(StrictModel):
    host: str = "127.0.0.1"
    """The address to listen on: ``0.0.0.0`` for every interface. Any address but loopback makes passwords
    required (``security.require_passwords``)."""
    port: int = Field(default=8080, ge=0, le=65535)
    """The TCP port (``det-master --port`` overrides it)."""
    forwarded_allow_ips: list[str] = Field(default_factory=list)
    """The addresses or networks (``10.0.0.5``, ``10.0.0.0/24``) of reverse proxies in front of the master
    whose ``X-Forwarded-For`` and ``X-Forwarded-Proto`` it believes: a request that comes through one of them
    counts as from the address the proxy names (login throttling, ``docs/security.md``). Empty (the default):
    those headers are ignored, from loopback too, and every request is from the address that connected, so
    nobody picks their own address with a header (uvicorn's ``FORWARDED_ALLOW_IPS`` is not read). Name only
    proxies that set the header themselves; a proxy on the master's own host (``127.0.0.1``) makes every local
    account's header believed too."""

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                ipaddress.ip_network(item.strip(), strict=False)
            except ValueError:
                raise ValueError(
                    f"expected an IP address or network such as '10.0.0.5' or '10.0.0.0/24', got {item!r}"
                    + (" (name each proxy: '*' would let any client pick its address)" if item == "*" else "")
                ) from None
        return [item.strip() for item in value]


class TlsConfig(StrictModel):
    cert: Path | None = None
    """PEM certificate (chain) to serve HTTPS with; unset: plain HTTP. Jobs verify it with their node's system
    CAs, so it must chain to a CA every compute node trusts."""
    key: Path | None = None
    """PEM private key of ``cert`` (readable by the master's account only); unset: ``cert`` holds it too."""
    generate: bool = True
    """Without ``cert``, a master that listens beyond loopback serves its web UI and tasks' pages over HTTPS
    on a port of their own (``browser_port``) with a certificate it generates (``tls/`` in its state
    directory; kept across restarts), and hands browsers a session only there: over plain HTTP the session
    would cross the network readable, and reach every port of the host. The plain port keeps serving ``det``
    and jobs, and sends browsers to the HTTPS one. Not so behind a TLS-terminating proxy (an ``https://``
    ``external_url``). ``false``: no such listener, and browsers get a session only through such a proxy."""
    browser_port: int | None = Field(default=None, ge=0, le=65535)
    """The web UI's HTTPS port when the master generates its certificate (``generate``). Default: 8443 for a
    master on 8080 (Determined's TLS port), else any free port; a port set here (or the default 8443) that is
    taken stops the master, so that nobody else's server answers at the address users keep."""


class ContainerConfig(StrictModel):
    runtime: Literal["apptainer", "singularity", "none"] = "apptainer"
    """The container runtime trials with an image run under; ``none``: images are refused."""
    command: str | None = None
    """The runtime's executable when it is not `apptainer`/`singularity` on PATH (e.g. a site module path)."""
    image: str | None = None
    """The default image of trials whose config names none (``docker://…``, a ``.sif`` or a sandbox directory);
    unset: such trials run on the node's own software."""
    image_cache_dir: Path | None = None
    """Where ``docker://`` images are pulled to, once, as SIF files (on the shared filesystem, writable by every
    user who runs trials). Default: ``images/`` under ``job_storage_root``."""


_MEM_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGTP])(?:i?B)?$", re.IGNORECASE)
_MEM_SHIFT = {"K": 10, "M": 20, "G": 30, "T": 40, "P": 50}
_GPU_TYPE_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


def pool_time_to_minutes(value: str | None) -> int | None:
    """A pool's time limit in minutes; None for none or ``UNLIMITED`` (as ``scontrol show partition`` says)."""
    # Imported here: `det` imports this module, and Slurm's code (the package) for less.
    from slurm_backend.times import limit_to_minutes

    return limit_to_minutes(value)


def pool_memory_mb(value: str | None) -> int | None:
    """``64G``, ``512M``, ``1.5T``, ``64GiB`` → MiB (Slurm's ``--mem`` unit); None for none."""
    if value is None:
        return None
    m = _MEM_RE.match(value.strip())
    if not m:
        raise ValueError(f"expected a size with a unit such as '64G' or '512M', got {value!r}")
    return int(float(m.group(1)) * (1 << _MEM_SHIFT[m.group(2).upper()])) >> 20


class ResourcePoolConfig(StrictModel):
    """One pool: a partition/account/QOS, its GPUs per node and its limits. Times and sizes are parsed when the
    master config loads (a bad one stops the master at start, not every submission)."""

    partition: str | None = None
    """The Slurm partition (``--partition``); unset: the cluster's default partition."""
    account: str | None = None
    """The Slurm account (``--account``) every job of the pool is charged to; unset: each user's default."""
    qos: str | None = None
    """The Slurm QOS (``--qos``); unset: the association's default."""
    slots_per_node: int = Field(default=1, ge=0)
    """GPUs per node: a trial's ``slots_per_trial`` up to this many runs on one node, more on whole nodes of
    this many (a multiple of it); 0: a CPU-only pool."""
    gpu_type: str | None = None
    """The GRES type (``a100`` in ``--gres=gpu:a100:4``); unset: any GPU."""
    gpu_request_style: Literal["gres", "gpus_per_node", "none"] = "gres"
    """How GPUs are asked for: ``gres`` (``--gres=gpu[:type]:N``), ``gpus_per_node`` (``--gpus-per-node``) or
    ``none`` (a CPU-only pool: trials with ``slots_per_trial: 0`` only)."""
    default_time_limit: str | None = None
    """A Slurm time (``90``, ``1:30:00``, ``2-00:00:00``; an integer is minutes) or ``UNLIMITED``."""
    max_time_limit: str | None = None
    """The longest ``slurm.time_limit`` a trial may ask for (a Slurm time, as ``default_time_limit``); a
    longer trial runs as a chain of jobs, each checkpointing before its limit."""
    mem_per_node: str | None = None
    """Memory per node, with a unit (``64G``, ``512M``): the job's ``--mem``."""
    container: ContainerConfig | None = None
    """The pool's own container settings: each key it sets overrides the top-level ``container``'s."""
    priority_nice_step: int = Field(default=10, ge=0, le=20_000_000)
    """How an experiment's ``resources.priority`` (Determined's 1 highest … 99 lowest, default 42) reaches
    Slurm: a job at the default priority competes as a plain ``sbatch`` does (nice 0), and each step below it
    lowers the job's Slurm priority by this much: ``--nice=(priority - 42) * priority_nice_step``. A priority
    above 42 also gets nice 0 (raising a job needs an operator). ``det e set priority`` re-nices pending jobs.
    Size it against the cluster's ``PriorityWeight*`` factors; 0: priorities are not passed to Slurm.
    (docs/priority.md)"""

    @field_validator("partition", "account", "qos")
    @classmethod
    def _header_value(cls, value: str | None) -> str | None:
        from slurm_backend.sbatch_args import check_header_value

        why = None if value is None else check_header_value(value)
        if why:
            raise ValueError(why)
        return value

    @field_validator("gpu_type")
    @classmethod
    def _gpu_type(cls, value: str | None) -> str | None:
        if value is not None and not _GPU_TYPE_RE.match(value):
            raise ValueError(f"may hold only letters, digits, _ . - (got {value!r})")
        return value

    @field_validator("default_time_limit", "max_time_limit", mode="before")
    @classmethod
    def _time(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | str | None):
            raise ValueError(f"expected minutes or a Slurm time such as '1:30:00', got {value!r}")
        if isinstance(value, int):
            value = str(value)
        minutes = pool_time_to_minutes(value)
        if minutes is not None and minutes < 1:
            raise ValueError(f"must be at least 1 minute, got {value!r}")
        if info.field_name == "max_time_limit" and minutes is not None:
            default = pool_time_to_minutes(info.data.get("default_time_limit"))
            if default is not None and default > minutes:
                raise ValueError(
                    f"{minutes} minutes is shorter than default_time_limit ({default} minutes): every trial "
                    "without slurm.time_limit would be refused"
                )
        return value

    @field_validator("mem_per_node", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, str | None):
            raise ValueError(f"expected a size with a unit such as '64G' or '512M', got {value!r}")
        mb = pool_memory_mb(value)
        if mb is not None and mb < 1:
            raise ValueError(f"must be at least 1M (Slurm's --mem is in MiB), got {value!r}")
        return value

    @property
    def default_time_limit_min(self) -> int | None:
        return pool_time_to_minutes(self.default_time_limit)

    @property
    def max_time_limit_min(self) -> int | None:
        return pool_time_to_minutes(self.max_time_limit)

    @property
    def mem_per_node_mb(self) -> int | None:
        return pool_memory_mb(self.mem_per_node)


class CheckpointStorageConfig(StrictModel):
    type: Literal["shared_fs"] = "shared_fs"
    """Checkpoints are directories on a filesystem every node and the master mount."""
    host_path: Path | None = None
    """The checkpoint root; jobs write into it as their owner, so it must be writable by every user (mode
    1777, or a group they share). Default: ``~/hpc-det/checkpoints`` of the master's account."""
    storage_path: str | None = None
    """A subdirectory of ``host_path`` that checkpoints go into (relative, inside ``host_path``)."""
    save_experiment_best: int = Field(default=0, ge=0)
    """Checkpoint GC keeps the N best checkpoints of each experiment (``docs/checkpoints.md``; an experiment's
    ``checkpoint_storage`` may say otherwise)."""
    save_trial_best: int = Field(default=1, ge=0)
    """Checkpoint GC keeps the N best checkpoints of each trial."""
    save_trial_latest: int = Field(default=1, ge=0)
    """Checkpoint GC keeps the N latest checkpoints of each trial (a trial resumes from its latest)."""


class PreemptionConfig(StrictModel):
    signal: str = "SIGUSR1"
    """The signal Slurm sends the batch shell before a job's time limit (``--signal=B:USR1@lead``); trials take
    it as "checkpoint and exit", then run on as a new job."""
    lead_time_s: int = Field(default=300, ge=0)
    """How many seconds before the time limit the signal comes (at most half the job's limit, at most 65535;
    Slurm may send it up to 60 s earlier): enough for a checkpoint to be written."""

    @field_validator("signal")
    @classmethod
    def _signal_name(cls, value: str) -> str:
        name = value.upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        import signal as _signal

        if not hasattr(_signal, name):
            raise ValueError(f"unknown signal {value!r}")
        return name


class TaskProxyConfig(StrictModel):
    origin: str | None = None
    """Where notebooks', TensorBoards' and other tasks' pages are served: an origin of their own, never the
    master's, so a page a user's task serves cannot use anyone's web UI session (``docs/security.md``). A host
    name of their own (``https://tasks.det.example.org``: DNS and the certificate name it, pointing at the
    master) keeps even cookies apart; a second port of the master's host (``http://det.example.org:8081``)
    does not, cookies ignore ports, but the master refuses its session from there. Default: the master's own
    host on ``listen.port + 1`` (another free port when that one is taken)."""
    port: int | None = Field(default=None, ge=0, le=65535)
    """The port the master listens on for that origin (on ``listen.host``) when it is not ``listen.port``;
    default: the origin's own (set it when a reverse proxy sits in between)."""

    @field_validator("origin")
    @classmethod
    def _an_origin(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from urllib.parse import urlsplit

        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
            raise ValueError(f"expected an origin such as 'https://tasks.det.example.org', got {value!r}")
        return f"{parts.scheme}://{parts.netloc}"


class MasterConfig(StrictModel):
    db: DbConfig = DbConfig()
    """The database."""
    listen: ListenConfig = ListenConfig()
    """Where the REST API and the web UI listen."""
    tls: TlsConfig = TlsConfig()
    """HTTPS."""
    external_url: str | None = None
    """The address jobs on the compute nodes and researchers' ``det`` use to reach the master
    (``https://det.example.org:8443``). Default: built from ``listen`` and ``tls``, which is wrong for
    ``0.0.0.0``: a shared master sets it."""
    job_storage_root: Path | None = None
    """Per-trial run directories (``exp-E/trial-T/run-R``: the job script, its logs, the unpacked context) on
    the shared filesystem. A shared master keeps each user's below their own directory, ``<root>/<account>``
    (made by the user's helper as the user, or checked: theirs, 0700 or 0750); a root naming
    ``{unix_user}`` is per user (``/scratch/{unix_user}/hpc-det``). Default: ``~/hpc-det/jobs`` of the
    master's account."""
    service_account: str | None = None
    """The unprivileged account a shared master serves as (``docs/admin.md``): started as root, it switches
    to it before it opens anything, and does what it does in a user's name through the per-user helper
    (``sudo``, the rule of ``det-master --print-sudoers``). Default: ``hpc-det`` where that account exists;
    a root master without one still runs as root (deprecated: it says so at start)."""
    checkpoint_storage: CheckpointStorageConfig = CheckpointStorageConfig()
    """The default checkpoint storage of experiments (Determined's ``shared_fs``) and its GC policy."""
    resource_pools: dict[str, ResourcePoolConfig] = Field(
        default_factory=lambda: {"default": ResourcePoolConfig()}
    )
    """Pools by name (``resources.resource_pool`` in an experiment config), each mapped to Slurm options."""
    default_resource_pool: str = Field(default="default", validate_default=True)
    """The pool of experiments that name none; one of ``resource_pools``."""
    preemption: PreemptionConfig = PreemptionConfig()
    """The warning signal before a job's time limit."""
    container: ContainerConfig = ContainerConfig()
    """Apptainer/Singularity for every pool (a pool's ``container`` overrides it key by key)."""
    poll_interval_s: float = Field(default=5.0, gt=0)
    """How often the master asks Slurm (one ``squeue`` for all jobs) how its jobs are doing."""
    tensorboard_timeout: int = Field(default=300, ge=0)
    """Seconds a TensorBoard may go without a request through the master's proxy before it is ended, freeing
    its node (Determined's default, 300); 0: never. A task's ``idle_timeout`` overrides it."""
    security: SecurityConfig = SecurityConfig()
    """Logins, passwords, and how many streams a user may hold open (``docs/security.md``)."""
    task_proxy: TaskProxyConfig = TaskProxyConfig()
    """Where tasks' pages (notebooks, TensorBoards) are served: never on the master's own origin."""
    cluster_name: str = "hpc-det"
    """The name the web UI and ``GET /api/v1/master`` show."""

    @field_validator("default_resource_pool")
    @classmethod
    def _known_pool(cls, value: str, info: ValidationInfo) -> str:
        pools = info.data.get("resource_pools")
        if pools is not None and value not in pools:
            known = ", ".join(repr(p) for p in sorted(pools)) or "none"
            raise ValueError(f"{value!r} is not one of resource_pools (known: {known})")
        return value

    def experiment_defaults(self) -> dict[str, Any]:
        """What every experiment gets unless its config says otherwise (experiment-config shaped)."""
        from hpc_master.paths import get_checkpoint_root

        storage = self.checkpoint_storage
        return {
            "checkpoint_storage": {
                "type": "shared_fs",
                "host_path": str(storage.host_path or get_checkpoint_root()),
                **({"storage_path": storage.storage_path} if storage.storage_path else {}),
                "save_experiment_best": storage.save_experiment_best,
                "save_trial_best": storage.save_trial_best,
                "save_trial_latest": storage.save_trial_latest,
            },
            "resources": {"resource_pool": self.default_resource_pool},
        }

    # Resolved views (defaults filled in from the environment at call time).
    @property
    def tensorboard_timeout_s(self) -> int | None:
        return self.tensorboard_timeout or None

    def db_url(self) -> str:
        return self.db.url or paths.get_default_db_url()

    def job_storage_dir(self) -> Path:
        return self.job_storage_root or paths.get_job_storage_root()

    def checkpoint_dir(self) -> Path:
        return self.checkpoint_storage.host_path or paths.get_checkpoint_root()

    def master_url(self) -> str:
        if self.external_url:
            return self.external_url.rstrip("/")
        scheme = "https" if self.tls.cert else "http"
        return f"{scheme}://{self.listen.host}:{self.listen.port}"

    def browsers_apart(self) -> bool:
        """Whether browsers are served over HTTPS on a port of their own, with a generated certificate
        (``tls.generate``): a master beyond loopback without a certificate of the admin's."""
        behind_tls = (self.external_url or "").startswith("https://")  # TLS ends at a proxy in front
        return (
            self.tls.cert is None and self.tls.generate and self.listens_beyond_loopback() and not behind_tls
        )

    def browser_listen_port(self) -> int | None:
        """The web UI's HTTPS port to bind (0: any free one); None without such a listener."""
        if not self.browsers_apart():
            return None
        if self.tls.browser_port is not None:
            return self.tls.browser_port
        return 8443 if self.listen.port == 8080 else 0

    def task_origin(self, bound_port: int | None = None) -> str:
        """The origin tasks' pages are served on (``task_proxy``); `bound_port`: the port the master found free
        for it when the default one was taken."""
        if self.task_proxy.origin:
            return self.task_proxy.origin
        from urllib.parse import urlsplit

        master = urlsplit(self.master_url())
        host = f"[{master.hostname}]" if master.hostname and ":" in master.hostname else master.hostname
        port = bound_port or (master.port or (443 if master.scheme == "https" else 80)) + 1
        scheme = "https" if self.browsers_apart() else master.scheme  # served beside the web UI's HTTPS
        return f"{scheme}://{host}:{port}"

    def task_listen_port(self) -> int | None:
        """The port to listen on for the task origin; None when it is the master's own (a host name of its own
        on the same port)."""
        if self.task_proxy.port is not None:
            return self.task_proxy.port
        if not self.task_proxy.origin:
            return self.listen.port + 1 if self.listen.port else 0
        port = _origin_port(self.task_proxy.origin)
        return None if port in (self.listen.port, self.tls.browser_port) else port

    @model_validator(mode="after")
    def _browsers_apart_fit(self) -> MasterConfig:
        """With browsers served apart (``browsers_apart``), tasks' pages are served beside the web UI, over
        HTTPS, never on the plain port."""
        if not self.browsers_apart():
            return self
        if self.tls.browser_port and self.tls.browser_port == self.listen.port:
            raise ValueError("tls.browser_port: the web UI's HTTPS port cannot be listen.port, the plain one")
        origin = self.task_proxy.origin
        if origin and not origin.startswith("https://"):
            raise ValueError(
                f"task_proxy.origin: {origin!r} would serve tasks' pages over plain HTTP, where this master serves "
                "browsers over HTTPS (tls.generate): use https://"
            )
        if origin and self.task_proxy.port is None and (_origin_port(origin) == self.listen.port):
            raise ValueError(
                f"task_proxy.origin: {origin!r} is on the master's plain port; give it a port of its own, or "
                "tls.browser_port (a host name of its own on the web UI's port)"
            )
        return self

    def listens_beyond_loopback(self) -> bool:
        return not is_loopback(self.listen.host)

    def passwords_required(self) -> bool:
        return self.security.require_passwords or self.listens_beyond_loopback()


@dataclass(frozen=True)
class PoolContainer:
    """Which runtime, default image and cache directory a resource pool uses. A pool's ``container:`` section
    overrides the top-level ``container:`` key by key (only the keys it sets)."""

    runtime: str  # apptainer | singularity | none
    image: str | None  # the pool's default image
    cache_dir: str | None  # None: containers.images.default_cache_dir(job storage root)
    command: str | None = None  # the runtime's executable; None: the runtime's name on PATH


def pool_container(master: MasterConfig, pool_name: str | None = None) -> PoolContainer:
    name = pool_name or master.default_resource_pool
    pool = master.resource_pools.get(name)
    top = master.container
    own = pool.container if pool is not None else None
    chosen = own.model_fields_set if own is not None else set()

    def pick(key: str) -> object:
        return getattr(own, key) if own is not None and key in chosen else getattr(top, key)

    cache = pick("image_cache_dir")
    return PoolContainer(
        runtime=str(pick("runtime")),
        image=str(pick("image")) if pick("image") else None,
        command=str(pick("command")) if pick("command") else None,
        cache_dir=str(cache) if cache else None,
    )


def _origin_port(origin: str) -> int:
    from urllib.parse import urlsplit

    parts = urlsplit(origin)
    return parts.port or (443 if parts.scheme == "https" else 80)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# env var -> dotted YAML path
ENV_OVERRIDES: dict[str, str] = {
    "DET_DB_URL": "db.url",
    "DET_LISTEN_HOST": "listen.host",
    "DET_LISTEN_PORT": "listen.port",
    "DET_EXTERNAL_URL": "external_url",
    "DET_JOB_STORAGE_ROOT": "job_storage_root",
    "DET_SERVICE_ACCOUNT": "service_account",
    "DET_CHECKPOINT_ROOT": "checkpoint_storage.host_path",
    "DET_REQUIRE_PASSWORDS": "security.require_passwords",
    "DET_TOKEN_TTL_HOURS": "security.token_ttl_hours",
    "DET_ADMIN_PASSWORD": "security.admin_password",
    "DET_LDAP_BIND_PASSWORD": "security.ldap.bind_password",
    "DET_MAX_STREAMS_PER_USER": "security.max_streams_per_user",
    "DET_POLL_INTERVAL_S": "poll_interval_s",
    "DET_TLS_CERT": "tls.cert",
    "DET_TLS_KEY": "tls.key",
    "DET_TASK_ORIGIN": "task_proxy.origin",
}


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for key in parents:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[leaf] = value


def _dotted_loc(loc: Sequence[str | int], prefix: str) -> str:
    """pydantic's ``loc`` as a dotted YAML path under `prefix`, without its ``function-...`` validator steps."""
    kept = tuple(p for p in loc if not (isinstance(p, str) and p.startswith("function-")))
    dotted = ".".join(str(p) for p in kept)
    if prefix:
        dotted = f"{prefix}.{dotted}" if dotted else prefix
    return dotted


def validation_error_to_config_error(err: ValidationError, *, prefix: str = "") -> ConfigError:
    """Translate pydantic's first error into a ConfigError naming the YAML path, with did-you-mean."""
    first = err.errors()[0]
    dotted = _dotted_loc(first["loc"], prefix)
    if first["type"] == UNKNOWN_FIELD:  # the shared StrictModel's check, with its "did you mean"
        ctx = first.get("ctx") or {}
        dotted = f"{dotted}.{ctx['field']}" if dotted else str(ctx["field"])
        return ConfigError(str(ctx["message"]), field=dotted, code="unknown_field")
    message = first["msg"]
    if first["type"] == "value_error":  # our validators' own words, without pydantic's "Value error, "
        message = str((first.get("ctx") or {}).get("error", message))
    return ConfigError(message, field=dotted or None)


def parse_master_config(data: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> MasterConfig:
    merged: dict[str, Any] = dict(data or {})
    for key, value in merged.items():
        if isinstance(value, dict):
            merged[key] = dict(value)
    for var, dotted in ENV_OVERRIDES.items():
        value = (env if env is not None else os.environ).get(var)
        if value:
            _set_dotted(merged, dotted, value)
    try:
        return MasterConfig.model_validate(merged)
    except ValidationError as err:
        raise validation_error_to_config_error(err) from None


def load_master_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> MasterConfig:
    """Read ``master.yaml`` (or no file at all: every default) and apply environment overrides."""
    data: Any = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise ConfigError(f"cannot read master config {path}: {err.strerror}") from None
        from hpc_master.expconf import (
            ExperimentConfigError,
            load_yaml,
        )  # here: `det` imports this module for less

        try:  # the strict loader of every config: duplicate keys refused, `1:30:00` stays a Slurm time
            data = load_yaml(text) or {}
        except ExperimentConfigError as err:
            raise ConfigError(f"{path}: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a mapping at the top level")
    return parse_master_config(data, env)
