"""The experiment config (Determined v0 plus `slurm:`) and `parse_experiment_config`, the first phase.

Phase 1, `parse_experiment_config(text_or_mapping)`: the config alone. Every section that is present must be
well-formed (a typed storage needs its paths; `slurm.sbatch_args` pass the Slurm backend's policy; with
`slurm.slots_per_node` set, `resources.slots_per_trial` must fill whole nodes). Sections may be absent, and
what Determined calls "eventually required" (`searcher.metric`, a storage's `type`) may be missing.
Phase 2, `complete.complete_experiment_config(cfg, defaults)`: merge the master's defaults, then check that
what an experiment needs to run is there. `pipeline.load_experiment_config` runs both, then a dry run of the
job script.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, field_serializer, field_validator, model_validator

from hpc_master.errors import ClientError
from hpc_master.expconf._base import StrictModel
from hpc_master.expconf._errors import config_error, custom_error, describe, format_path, to_config_error
from hpc_master.expconf._yaml import load_yaml
from hpc_master.expconf.environment import K8S_ONLY_ENVIRONMENT_FIELDS, EnvironmentConfig
from hpc_master.expconf.hyperparameters import (
    CategoricalHP,
    ConstHP,
    Hyperparameter,
    IntHP,
    grid_missing_count,
    hyperparameters_to_dict,
)
from hpc_master.expconf.resources import BindMount, ResourcesConfig
from hpc_master.expconf.searcher import (
    AnySearcher,
    GridSearcher,
    Searcher,
    check_searcher_name,
    searcher_to_dict,
)
from hpc_master.expconf.slurm import SlurmConfig
from hpc_master.expconf.storage import AnyStorage, CheckpointStorage, PartialStorage, check_storage_type
from hpc_master.expconf.units import Length, Unit, length_in
from slurm_backend.resources import slots_to_nodes

NonNegativeInt = Annotated[int, Field(ge=0)]

# Fields accepted for compatibility and dropped with a warning: path -> why.
IGNORED_FIELDS: dict[tuple[str, ...], str] = {
    **{("environment", f): "is Kubernetes-only" for f in K8S_ONLY_ENVIRONMENT_FIELDS},
    ("resources", "agent_label"): "was removed from Determined",
    ("resources", "native_parallel"): "was removed from Determined",
    ("tensorboard_storage",): "is not used (TensorBoard files go with checkpoints)",
    ("data_layer",): "was removed from Determined",
    ("integrations",): "is not supported",
}

_TRIAL_CLASS_RE = re.compile(r"^([A-Za-z_][\w.]*):([A-Za-z_]\w*)$")


class Reproducibility(StrictModel):
    experiment_seed: NonNegativeInt | None = None


class Profiling(StrictModel):
    enabled: bool = False
    begin_on_batch: NonNegativeInt | None = None
    end_after_batch: NonNegativeInt | None = None
    sync_timings: bool | None = None

    @model_validator(mode="after")
    def _order(self) -> Profiling:
        b, e = self.begin_on_batch, self.end_after_batch
        if b is not None and e is not None and b > e:
            raise custom_error(f"must be >= begin_on_batch ({b}), got {e}", ["end_after_batch"])
        return self


class LogAction(StrictModel):
    type: Literal["cancel_retries", "exclude_node"]

    @classmethod
    def prepare(cls, data: Any) -> Any:
        return {"type": data} if isinstance(data, str) else data


class LogPolicy(StrictModel):
    """Determined's `log_policies` entry: a regex over trial logs and what to do when it matches."""

    name: str | None = None
    pattern: str | None = None
    action: LogAction | None = None
    signal: str | None = None

    @field_validator("pattern")
    @classmethod
    def _regex(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return v


class ExperimentConfig(StrictModel):
    """A parsed experiment config. Build it with `parse_experiment_config`, not `model_validate`."""

    name: str | None = None
    description: str | None = None
    labels: list[str] = Field(default_factory=list)
    data: dict[str, Any] = Field(default_factory=dict)
    entrypoint: str | list[str] | None = None
    hyperparameters: dict[str, Hyperparameter] = Field(default_factory=dict)
    searcher: Searcher | None = None
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    bind_mounts: list[BindMount] = Field(default_factory=list)
    checkpoint_storage: CheckpointStorage | None = None
    checkpoint_policy: Literal["best", "all", "none"] = "best"
    records_per_epoch: NonNegativeInt = 0
    max_restarts: NonNegativeInt = 5
    min_validation_period: Length | None = None
    min_checkpoint_period: Length | None = None
    scheduling_unit: Annotated[int, Field(ge=1)] = 100
    perform_initial_validation: bool = False
    preemption_timeout: NonNegativeInt | None = None
    profiling: Profiling = Field(default_factory=Profiling)
    reproducibility: Reproducibility = Field(default_factory=Reproducibility)
    log_policies: list[LogPolicy] = Field(default_factory=list)
    workspace: str | None = None
    project: str | None = None
    debug: bool = False
    optimizations: dict[str, Any] = Field(default_factory=dict)
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)

    _warnings: list[str] = PrivateAttr(default_factory=list)

    # ---- validation ------------------------------------------------------------------------------------

    @classmethod
    def prepare(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            check_searcher_name(data.get("searcher"))
            check_storage_type(data.get("checkpoint_storage"), ["checkpoint_storage"])
        return data

    @field_validator("entrypoint", mode="before")
    @classmethod
    def _entrypoint(cls, v: Any) -> Any:
        if isinstance(v, str):
            _check_command_line(v)
            return v
        if not isinstance(v, list):
            raise ValueError(f"expected a string or a list of strings, got {describe(v)}")
        if not v:
            raise ValueError("must not be an empty list")
        for i, arg in enumerate(v):
            if not isinstance(arg, str):
                raise custom_error(f"expected a string, got {describe(arg)}", [i])
            if not arg:
                raise custom_error("must not be an empty string", [i])
        return v

    @model_validator(mode="after")
    def _cross_checks(self) -> ExperimentConfig:
        if isinstance(self.searcher, GridSearcher):
            path = grid_missing_count(self.hyperparameters)
            if path is not None:
                raise custom_error(
                    "missing required field: the grid searcher needs count for int, double and log "
                    "hyperparameters",
                    ["hyperparameters", *path, "count"],
                )
        _check_global_batch_size(self.hyperparameters.get("global_batch_size"))
        _check_slots(self.resources, self.slurm)
        return self

    # ---- dumping ---------------------------------------------------------------------------------------

    @field_serializer("hyperparameters")
    def _dump_hps(self, hps: dict[str, Any]) -> dict[str, Any]:
        return hyperparameters_to_dict(hps)

    def to_dict(self) -> dict[str, Any]:
        """A plain JSON-able dict that `parse_experiment_config` turns back into an equal config."""
        return self.model_dump(mode="json", exclude_none=True)

    def searcher_dict(self) -> dict[str, Any] | None:
        """The searcher section as a plain dict in Determined shape (see `searcher.searcher_to_dict`)."""
        return None if self.searcher is None else searcher_to_dict(self.searcher)

    def hyperparameters_dict(self) -> dict[str, Any]:
        """Hyperparameters in Determined shape: leaves as `{type: ..., ...}`, nested groups as mappings."""
        return hyperparameters_to_dict(self.hyperparameters)

    # ---- derived values ----------------------------------------------------------------------------------

    @property
    def warnings(self) -> list[str]:
        """Messages about accepted-but-ignored fields, collected while parsing (never in dumps)."""
        return self._warnings

    @property
    def global_batch_size(self) -> int | None:
        """`hyperparameters.global_batch_size` when it is a constant, else None."""
        hp = self.hyperparameters.get("global_batch_size")
        return hp.val if isinstance(hp, ConstHP) and isinstance(hp.val, int) else None

    def trial_class(self) -> tuple[str, str] | None:
        """(module, class) for the legacy `entrypoint: model_def:MyTrial` form, else None."""
        if isinstance(self.entrypoint, str):
            m = _TRIAL_CLASS_RE.match(self.entrypoint.strip())
            if m:
                return m.group(1), m.group(2)
        return None

    def entrypoint_argv(self) -> list[str] | None:
        """The command to run for script entrypoints (a string is split like a shell would); None for the
        legacy trial-class form or when unset."""
        if self.entrypoint is None or self.trial_class() is not None:
            return None
        if isinstance(self.entrypoint, list):
            return list(self.entrypoint)
        return shlex.split(self.entrypoint)

    def length_in(self, length: Length | Mapping[str, int], unit: Unit, field: str | None = None) -> int:
        """Convert a length of this experiment into `unit` with its global_batch_size and records_per_epoch."""
        return length_in(
            length,
            unit,
            global_batch_size=self.global_batch_size,
            records_per_epoch=self.records_per_epoch,
            field=field,
        )

    def searcher_max_length(self, unit: Unit) -> int | None:
        """`searcher.max_length` converted to `unit` (None when the searcher has no length in batches/
        records/epochs, e.g. a 0.38 time_metric that is not one of them)."""
        s: AnySearcher | None = self.searcher
        length = getattr(s, "max_length", None)
        if length is None:
            metric, amount = getattr(s, "time_metric", None), getattr(s, "max_time", None)
            if metric not in ("batches", "records", "epochs") or amount is None:
                return None
            length = Length.of(metric, amount)
            return self.length_in(length, unit, field="searcher.max_time")
        return self.length_in(length, unit, field="searcher.max_length")

    def checkpoint_storage_dict(self) -> dict[str, Any] | None:
        """The ``checkpoint_storage`` section with the fields the config gave (a GC-only section's unset
        fields come from the master's policy, not the model's defaults); None when there is none."""
        storage = self.checkpoint_storage
        return (
            None
            if storage is None
            else storage.model_dump(mode="json", exclude_unset=True, exclude_none=True)
        )

    @property
    def storage(self) -> AnyStorage | None:
        """The typed storage; None while unset or only GC fields (before the master's defaults are merged)."""
        storage = self.checkpoint_storage
        return None if isinstance(storage, PartialStorage) else storage


def _check_slots(resources: ResourcesConfig, slurm: SlurmConfig) -> None:
    """The node shape, when the config alone decides it (``slurm.slots_per_node``); otherwise the pool decides
    and the dry run at create checks it."""
    if slurm.slots_per_node is None:
        return
    try:
        slots_to_nodes(resources.slots_per_trial, slurm.slots_per_node, single_node=resources.is_single_node)
    except ClientError as exc:
        message = exc.message
        if "the pool's " in message:
            message = message.replace("the pool's ", "") + " (slurm.slots_per_node)"
        raise custom_error(message, ["resources", "slots_per_trial"]) from None


def _check_command_line(v: str) -> None:
    """A string entrypoint: not blank, and split into a command the way the job will split it."""
    if not v.strip():
        raise ValueError("must not be empty")
    # Split here, as the job will (`entrypoint_argv`): a quote left open must be refused at create,
    # not found by every submission of every trial.
    shown = repr(v if len(v) <= 80 else v[:77] + "...")
    try:
        argv = shlex.split(v)
    except ValueError as exc:
        raise ValueError(
            f"cannot be split into arguments like a shell would ({str(exc).lower()}): {shown}"
        ) from None
    if not argv or not argv[0]:
        raise ValueError(f"names no command to run: {shown}")


def _is_positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _check_global_batch_size(hp: Any) -> None:
    if hp is None:
        return
    where = ["hyperparameters", "global_batch_size"]
    if isinstance(hp, ConstHP):
        if not _is_positive_int(hp.val):
            raise custom_error(f"must be a positive integer, got {hp.val!r}", where)
    elif isinstance(hp, IntHP):
        if hp.minval < 1:
            raise custom_error(f"must be >= 1 (global_batch_size), got {hp.minval}", [*where, "minval"])
    elif isinstance(hp, CategoricalHP):
        for i, v in enumerate(hp.vals):
            if not _is_positive_int(v):
                raise custom_error(f"must be a positive integer, got {v!r}", [*where, "vals", i])
    else:
        raise custom_error("must be a positive integer (const, int or categorical)", where)


def _strip_ignored(raw: dict[str, Any], prefix: Sequence[str | int]) -> tuple[dict[str, Any], list[str]]:
    """Remove IGNORED_FIELDS from a copy of `raw`, returning the warnings."""
    out = dict(raw)
    warnings: list[str] = []
    for path, why in IGNORED_FIELDS.items():
        parent: Any = out
        for seg in path[:-1]:
            child = parent.get(seg) if isinstance(parent, Mapping) else None
            if not isinstance(child, Mapping):
                parent = None
                break
            child = dict(child)
            parent[seg] = child
            parent = child
        if isinstance(parent, dict) and path[-1] in parent:
            del parent[path[-1]]
            warnings.append(f"`{format_path([*prefix, *path])}` {why} and is ignored on Slurm")
    return out, warnings


def parse_experiment_config(
    source: str | bytes | Mapping[str, Any], *, field_prefix: Sequence[str | int] = ()
) -> ExperimentConfig:
    """Phase 1: parse and validate an experiment config, from YAML text or an already-loaded mapping.

    Raises `ExperimentConfigError` (a `hpc_master.errors.ConfigError`) whose `field` is the YAML path (with
    `field_prefix` in front, for configs nested in another file). Accepted-but-ignored fields are listed in
    the result's `.warnings`.
    """
    raw = load_yaml(source) if isinstance(source, str | bytes) else source
    where = format_path(field_prefix) or None
    if raw is None:
        raise config_error("the experiment config is empty", where)
    if not isinstance(raw, Mapping):
        raise config_error(
            f"the experiment config must be a mapping of fields, got {type(raw).__name__}", where
        )
    data, warnings = _strip_ignored(dict(raw), field_prefix)
    try:
        cfg = ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise to_config_error(exc, data, field_prefix) from None
    if cfg.profiling.enabled:
        warnings.append(f"`{format_path([*field_prefix, 'profiling'])}` is stored but not collected on Slurm")
    if cfg.log_policies:
        warnings.append(
            f"`{format_path([*field_prefix, 'log_policies'])}` is stored but not applied on Slurm (no log "
            "pattern cancels retries or excludes a node)"
        )
    cfg._warnings = warnings
    return cfg
