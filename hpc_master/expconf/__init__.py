"""Experiment configuration: Determined's experiment config v0 plus a `slurm:` section.

Every config text is read with `load_yaml` (duplicate keys refused, at most 1 MiB, alias expansion bounded).
Two phases::

    cfg = parse_experiment_config(yaml_text)            # the config alone; raises ExperimentConfigError
    cfg = complete_experiment_config(cfg, defaults)     # merge master defaults, check it can run

Configs from users enter through `hpc_master.admission.load_experiment_config`, which runs both phases
and then a dry run of the trial's job script against the target pool (not imported here: it needs the job
builder, which needs this package).

Consumers that must not depend on pydantic (the searcher) use `cfg.searcher_dict()` and
`cfg.hyperparameters_dict()`; `cfg.to_dict()` round-trips through `parse_experiment_config`.
"""

from hpc_master.expconf._errors import ExperimentConfigError
from hpc_master.expconf._yaml import (
    MAX_ALIAS_NODES,
    MAX_CONFIG_BYTES,
    MAX_DEPTH,
    MAX_NODES,
    YAMLConfigError,
    load_yaml,
)
from hpc_master.expconf.complete import complete_experiment_config, merge_defaults
from hpc_master.expconf.environment import EnvironmentConfig, EnvironmentVariablesMap, ImageMap
from hpc_master.expconf.experiment import (
    ExperimentConfig,
    LogPolicy,
    Profiling,
    Reproducibility,
    parse_experiment_config,
)
from hpc_master.expconf.hyperparameters import (
    CategoricalHP,
    ConstHP,
    DoubleHP,
    IntHP,
    LogHP,
    NestedHP,
    hyperparameters_to_dict,
)
from hpc_master.expconf.resources import BindMount, Device, ResourcesConfig, memory_bytes
from hpc_master.expconf.searcher import (
    SEARCHER_NAMES,
    AdaptiveASHASearcher,
    AsyncHalvingSearcher,
    GridSearcher,
    RandomSearcher,
    SingleSearcher,
    searcher_to_dict,
)
from hpc_master.expconf.slurm import SlurmConfig
from hpc_master.expconf.storage import DirectoryStorage, PartialStorage, SharedFSStorage
from hpc_master.expconf.units import UNITS, Length, Unit, convert_length, length_in

__all__ = [
    "MAX_ALIAS_NODES",
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "SEARCHER_NAMES",
    "UNITS",
    "AdaptiveASHASearcher",
    "AsyncHalvingSearcher",
    "BindMount",
    "CategoricalHP",
    "ConstHP",
    "Device",
    "DirectoryStorage",
    "DoubleHP",
    "EnvironmentConfig",
    "EnvironmentVariablesMap",
    "ExperimentConfig",
    "ExperimentConfigError",
    "GridSearcher",
    "ImageMap",
    "IntHP",
    "Length",
    "LogHP",
    "LogPolicy",
    "NestedHP",
    "PartialStorage",
    "Profiling",
    "RandomSearcher",
    "Reproducibility",
    "ResourcesConfig",
    "SharedFSStorage",
    "SingleSearcher",
    "SlurmConfig",
    "Unit",
    "YAMLConfigError",
    "complete_experiment_config",
    "convert_length",
    "hyperparameters_to_dict",
    "length_in",
    "load_yaml",
    "memory_bytes",
    "merge_defaults",
    "parse_experiment_config",
    "searcher_to_dict",
]
