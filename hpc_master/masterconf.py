"""Master configuration (``master.yaml``): strict pydantic models, YAML-path errors, env overrides.

Load with :func:`load_master_config`. Unknown keys are errors with a "did you mean" hint; every error is a
:class:`~hpc_master.errors.ConfigError` whose ``field`` is the YAML path (``resource_pools.gpu.partiton``).
Environment variables override the file for quick tries (see ``ENV_OVERRIDES``).
"""

from __future__ import annotations

import difflib
import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

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


class ResourcePoolConfig(StrictModel):
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    slots_per_node: int = Field(default=1, ge=0)
    gpu_type: str | None = None
    gpu_request_style: Literal["gres", "gpus_per_node", "none"] = "gres"
    default_time_limit: str | None = None
    max_time_limit: str | None = None
    mem_per_node: str | None = None
    container: ContainerConfig | None = None


class CheckpointStorageConfig(StrictModel):
    type: Literal["shared_fs"] = "shared_fs"
    host_path: Path | None = None
    storage_path: str | None = None
    save_experiment_best: int = 0
    save_trial_best: int = 1
    save_trial_latest: int = 1


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
    default_resource_pool: str = "default"
    preemption: PreemptionConfig = PreemptionConfig()
    container: ContainerConfig = ContainerConfig()
    poll_interval_s: float = Field(default=5.0, gt=0)
    security: SecurityConfig = SecurityConfig()
    cluster_name: str = "hpc-det"

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
    return ConfigError(first["msg"], field=dotted or None)


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
