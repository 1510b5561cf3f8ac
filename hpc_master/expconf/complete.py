"""Phase 2: merge the master's defaults into a parsed experiment config and check that it can run.

`defaults` is a plain mapping in experiment-config shape holding any subset of the fields, typically
``checkpoint_storage``, ``resources.resource_pool``, ``environment.image``, ``environment.environment_variables``,
``bind_mounts``, ``slurm.partition``/``account``/``qos``, ``max_restarts``. Merge rules (Determined's):

- a value the experiment sets wins; mappings merge key by key;
- lists are replaced, except ``bind_mounts`` (the defaults' mounts are added unless the experiment mounts the
  same container_path) and ``environment.environment_variables`` (defaults first, so the experiment's win);
- ``checkpoint_storage``: the experiment's whole section wins unless it has the same `type` as the default,
  or no `type` at all (only the GC fields, e.g. ``{save_trial_latest: 5}``), then they merge key by key;
  ``searcher`` and ``hyperparameters`` are never taken from defaults.

Completeness is Determined's "eventually required": ``entrypoint``, ``searcher.metric`` (every searcher, ``single``
included), ``checkpoint_storage.type``, ``records_per_epoch`` for any length in epochs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from hpc_master.expconf._errors import config_error
from hpc_master.expconf.experiment import ExperimentConfig, parse_experiment_config
from hpc_master.expconf.storage import PartialStorage
from hpc_master.expconf.units import Length

_NEVER_FROM_DEFAULTS = ("searcher", "hyperparameters", "entrypoint", "name", "description")


def _merge(default: Any, user: Any) -> Any:
    if isinstance(default, Mapping) and isinstance(user, Mapping):
        out = dict(default)
        for k, v in user.items():
            out[k] = _merge(default[k], v) if k in default else v
        return out
    return user


def merge_defaults(user: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Merge two config dicts (as dumped with `exclude_unset`); `user` wins."""
    defaults = {k: v for k, v in defaults.items() if k not in _NEVER_FROM_DEFAULTS}
    out: dict[str, Any] = _merge(defaults, user)
    _merge_storage(out, user, defaults)
    _merge_bind_mounts(out, user, defaults)
    _merge_environment_variables(out, user, defaults)
    return out


def _merge_storage(out: dict[str, Any], user: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
    """``checkpoint_storage``: merged key by key only when the types agree (or the user's has none)."""
    d_store, u_store = defaults.get("checkpoint_storage"), user.get("checkpoint_storage")
    if isinstance(u_store, Mapping) and isinstance(d_store, Mapping):
        same = u_store.get("type") in (None, d_store.get("type"))
        out["checkpoint_storage"] = _merge(d_store, u_store) if same else dict(u_store)


def _merge_bind_mounts(out: dict[str, Any], user: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
    """``bind_mounts``: the defaults' mounts first, less those whose container_path the user mounts."""
    if "bind_mounts" in user and "bind_mounts" in defaults:
        taken = {m["container_path"] for m in user["bind_mounts"]}
        extra = [m for m in defaults["bind_mounts"] if m["container_path"] not in taken]
        out["bind_mounts"] = [*extra, *user["bind_mounts"]]


def _merge_environment_variables(
    out: dict[str, Any], user: Mapping[str, Any], defaults: Mapping[str, Any]
) -> None:
    """``environment.environment_variables``: per device, the defaults' first so the user's win."""
    d_env = defaults.get("environment", {}).get("environment_variables")
    u_env = user.get("environment", {}).get("environment_variables")
    if isinstance(d_env, Mapping) and isinstance(u_env, Mapping):
        out["environment"]["environment_variables"] = {
            dev: [*d_env.get(dev, []), *u_env.get(dev, [])] for dev in {*d_env, *u_env}
        }


def _require(cond: bool, field: str, message: str) -> None:
    if not cond:
        raise config_error(message, field)


def complete_experiment_config(
    cfg: ExperimentConfig,
    defaults: Mapping[str, Any] | None = None,
    *,
    defaults_field: str = "defaults",
    experiment_seed: int | None = None,
) -> ExperimentConfig:
    """Phase 2: merge `defaults` (the master's, experiment-config shaped) into `cfg` and check completeness.

    Errors in `defaults` name their path under `defaults_field`. A missing
    ``reproducibility.experiment_seed`` is set to `experiment_seed`, or to the current time as Determined does.
    Returns a new config; `cfg` is not modified. Warnings of both inputs are kept.
    """
    defaults_cfg = parse_experiment_config(defaults or {}, field_prefix=defaults_field.split("."))
    merged = merge_defaults(
        cfg.model_dump(mode="json", exclude_unset=True),
        defaults_cfg.model_dump(mode="json", exclude_unset=True),
    )
    out = parse_experiment_config(merged)
    out._warnings = [*defaults_cfg.warnings, *cfg.warnings]
    _check_complete(out)
    _check_epoch_lengths(out)
    if out.reproducibility.experiment_seed is None:
        seed = experiment_seed if experiment_seed is not None else int(time.time()) % (2**31)
        out.reproducibility.experiment_seed = seed
    return out


def _check_complete(out: ExperimentConfig) -> None:
    """The fields every experiment needs in the end, defaults merged."""
    _require(
        out.entrypoint is not None, "entrypoint", "missing required field (the command or model_def:Trial)"
    )
    _require(out.searcher is not None, "searcher", "missing required field")
    assert out.searcher is not None
    _require(
        out.searcher.metric is not None,
        "searcher.metric",
        "missing required field (the validation metric that ranks trials)",
    )
    _require(
        out.checkpoint_storage is not None,
        "checkpoint_storage",
        "missing: set checkpoint_storage in the experiment config or in the master's defaults",
    )
    _require(
        not isinstance(out.checkpoint_storage, PartialStorage),
        "checkpoint_storage.type",
        "missing required field; expected 'shared_fs' or 'directory' (the master's defaults set no storage "
        "to merge these fields into)",
    )
    if out.trial_class() is not None:
        _require(
            out.global_batch_size is not None or "global_batch_size" in out.hyperparameters,
            "hyperparameters.global_batch_size",
            f"missing required field (trial classes such as {out.entrypoint} need it)",
        )


def _check_epoch_lengths(out: ExperimentConfig) -> None:
    """A length in epochs needs ``records_per_epoch``."""
    if not out.records_per_epoch:
        for field, length in (
            ("searcher.max_length", getattr(out.searcher, "max_length", None)),
            ("min_validation_period", out.min_validation_period),
            ("min_checkpoint_period", out.min_checkpoint_period),
        ):
            if isinstance(length, Length) and length.unit == "epochs":
                raise config_error(
                    f"missing required field: {field} is in epochs, which needs records_per_epoch "
                    "(the number of records in one epoch); set it or give the length in batches",
                    "records_per_epoch",
                )
