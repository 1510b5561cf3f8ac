"""Master configuration (``master.yaml``): strict pydantic models, YAML-path errors, env overrides.

Load with :func:`load_master_config`. Unknown keys are errors with a "did you mean" hint; every error is a
:class:`~hpc_master.errors.ConfigError` whose ``field`` is the YAML path (``resource_pools.gpu.partiton``).
Environment variables override the file for quick tries (see ``ENV_OVERRIDES``).
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from hpc_master import paths
from hpc_master.errors import ConfigError


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DbConfig(StrictModel):
    url: str | None = None
    """SQLAlchemy URL; ``sqlite:///path`` or ``postgresql+psycopg://user@host:port/db``. Default: SQLite in the
    user's data directory."""


class ListenConfig(StrictModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)


class TlsConfig(StrictModel):
    cert: Path | None = None
    key: Path | None = None


class ContainerConfig(StrictModel):
    runtime: Literal["apptainer", "singularity", "none"] = "apptainer"
    command: str | None = None
    """The runtime's executable when it is not `apptainer`/`singularity` on PATH (e.g. a site module path)."""
    image: str | None = None
    image_cache_dir: Path | None = None


_UNLIMITED = ("UNLIMITED", "INFINITE")
_MEM_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGTP])(?:i?B)?$", re.IGNORECASE)
_MEM_SHIFT = {"K": 10, "M": 20, "G": 30, "T": 40, "P": 50}
_GPU_TYPE_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


def pool_time_to_minutes(value: str | None) -> int | None:
    """A pool's time limit in minutes; None for none or ``UNLIMITED`` (as ``scontrol show partition`` says)."""
    from hpc_master.expconf.slurm import slurm_time_to_minutes  # here: `det` imports this module for less

    if value is None or value.strip().upper() in _UNLIMITED:
        return None
    return slurm_time_to_minutes(value)


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
    account: str | None = None
    qos: str | None = None
    slots_per_node: int = Field(default=1, ge=0)
    gpu_type: str | None = None
    gpu_request_style: Literal["gres", "gpus_per_node", "none"] = "gres"
    default_time_limit: str | None = None
    """A Slurm time (``90``, ``1:30:00``, ``2-00:00:00``; an integer is minutes) or ``UNLIMITED``."""
    max_time_limit: str | None = None
    mem_per_node: str | None = None
    """Memory per node, with a unit (``64G``, ``512M``): the job's ``--mem``."""
    container: ContainerConfig | None = None

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
    host_path: Path | None = None
    storage_path: str | None = None
    save_experiment_best: int = Field(default=0, ge=0)
    save_trial_best: int = Field(default=1, ge=0)
    save_trial_latest: int = Field(default=1, ge=0)


class PreemptionConfig(StrictModel):
    signal: str = "SIGUSR1"
    lead_time_s: int = Field(default=300, ge=0)

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


class SecurityConfig(StrictModel):
    require_passwords: bool = False
    token_ttl_hours: float = Field(default=24 * 7, gt=0)
    admin_password: str | None = Field(default=None, repr=False)


class MasterConfig(StrictModel):
    db: DbConfig = DbConfig()
    listen: ListenConfig = ListenConfig()
    tls: TlsConfig = TlsConfig()
    external_url: str | None = None
    job_storage_root: Path | None = None
    checkpoint_storage: CheckpointStorageConfig = CheckpointStorageConfig()
    resource_pools: dict[str, ResourcePoolConfig] = Field(
        default_factory=lambda: {"default": ResourcePoolConfig()}
    )
    default_resource_pool: str = Field(default="default", validate_default=True)
    preemption: PreemptionConfig = PreemptionConfig()
    container: ContainerConfig = ContainerConfig()
    poll_interval_s: float = Field(default=5.0, gt=0)
    security: SecurityConfig = SecurityConfig()
    cluster_name: str = "hpc-det"

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
    "DET_CHECKPOINT_ROOT": "checkpoint_storage.host_path",
    "DET_REQUIRE_PASSWORDS": "security.require_passwords",
    "DET_TOKEN_TTL_HOURS": "security.token_ttl_hours",
    "DET_ADMIN_PASSWORD": "security.admin_password",
    "DET_POLL_INTERVAL_S": "poll_interval_s",
    "DET_TLS_CERT": "tls.cert",
    "DET_TLS_KEY": "tls.key",
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


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(model class or None, whether the next path element is a mapping key) for a field annotation."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin = getattr(annotation, "__origin__", None)
    args: tuple[Any, ...] = tuple(getattr(annotation, "__args__", ()))
    if origin is dict and len(args) == 2:
        inner, _ = _unwrap(args[-1])
        return inner, True
    for arg in args:  # Optional[Model] / unions
        inner, keyed = _unwrap(arg)
        if inner is not None:
            return inner, keyed
    return None, False


def _model_at(path: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that owns the last key of `path` (to suggest spellings for unknown keys)."""
    model: type[BaseModel] | None = MasterConfig
    skip_key = False
    for part in path[:-1]:
        if skip_key:
            skip_key = False
            continue
        if model is None:
            return None
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        model, skip_key = _unwrap(field.annotation)
    return None if skip_key else model


def validation_error_to_config_error(err: ValidationError, *, prefix: str = "") -> ConfigError:
    """Translate pydantic's first error into a ConfigError naming the YAML path, with did-you-mean."""
    first = err.errors()[0]
    loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    dotted = ".".join(str(p) for p in loc)
    if prefix:
        dotted = f"{prefix}.{dotted}" if dotted else prefix
    if first["type"] == "extra_forbidden":
        owner = _model_at(loc)
        message = f"unknown key {loc[-1]!r}"
        if owner is not None:
            close = difflib.get_close_matches(str(loc[-1]), list(owner.model_fields), n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
        return ConfigError(message, field=dotted, code="unknown_field")
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
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path} is not valid YAML: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a mapping at the top level")
    return parse_master_config(data, env)
