"""Phase 2 (merge the master's defaults, check completeness), the searcher contract, and round-trip properties."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc_master.errors import ConfigError
from hpc_master.expconf import complete_experiment_config, parse_experiment_config

GOOD = sorted((Path(__file__).parent / "expconf_cases" / "good").glob("*.yaml"))

DEFAULTS: dict[str, Any] = {
    "checkpoint_storage": {"type": "shared_fs", "host_path": "/shared/ckpt", "save_trial_best": 3},
    "resources": {"resource_pool": "default"},
    "environment": {
        "image": {"cpu": "docker://cpu:1", "cuda": "docker://cuda:1"},
        "environment_variables": {"cuda": ["NCCL_DEBUG=WARN", "SITE=1"]},
        "pod_spec": {"spec": {}},
    },
    "bind_mounts": [
        {"host_path": "/datasets", "container_path": "/datasets", "read_only": True},
        {"host_path": "/site/tmp", "container_path": "/tmp/x"},
    ],
    "slurm": {"partition": "gpu", "account": "default-acct"},
    "max_restarts": 1,
}

MINIMAL = """
entrypoint: python3 train.py
searcher: {name: single, metric: loss}
"""


def _complete(text: str, defaults: dict[str, Any] | None = None) -> Any:
    return complete_experiment_config(parse_experiment_config(text), defaults, experiment_seed=7)


def test_defaults_fill_what_the_experiment_leaves_out() -> None:
    cfg = _complete(MINIMAL, DEFAULTS)
    assert cfg.checkpoint_storage.type == "shared_fs"
    assert cfg.checkpoint_storage.host_path == "/shared/ckpt"
    assert cfg.resources.resource_pool == "default"
    assert cfg.environment.image_for("cuda") == "docker://cuda:1"
    assert cfg.slurm.partition == "gpu"
    assert cfg.max_restarts == 1
    assert cfg.reproducibility.experiment_seed == 7
    assert cfg.warnings == ["`defaults.environment.pod_spec` is Kubernetes-only and is ignored on Slurm"]


def test_experiment_values_win_and_lists_merge() -> None:
    cfg = _complete(
        MINIMAL
        + """
max_restarts: 0
resources: {resource_pool: a100, slots_per_trial: 4}
slurm: {account: mine}
environment:
  image: docker://mine:2
  environment_variables: {cuda: [NCCL_DEBUG=INFO]}
bind_mounts:
  - {host_path: /mine, container_path: /tmp/x}
reproducibility: {experiment_seed: 3}
""",
        DEFAULTS,
    )
    assert cfg.max_restarts == 0
    assert (cfg.resources.resource_pool, cfg.resources.slots_per_trial) == ("a100", 4)
    assert (cfg.slurm.partition, cfg.slurm.account) == ("gpu", "mine")
    assert cfg.environment.image_for("cpu") == "docker://mine:2"
    assert cfg.environment.environment_variables.for_device("cuda") == {"NCCL_DEBUG": "INFO", "SITE": "1"}
    assert [(m.host_path, m.container_path) for m in cfg.bind_mounts] == [
        ("/datasets", "/datasets"),
        ("/mine", "/tmp/x"),
    ]
    assert cfg.reproducibility.experiment_seed == 3


def test_checkpoint_storage_merges_only_with_the_same_type() -> None:
    same = _complete(MINIMAL + "checkpoint_storage: {type: shared_fs, host_path: /mine}", DEFAULTS)
    assert (same.checkpoint_storage.host_path, same.checkpoint_storage.save_trial_best) == ("/mine", 3)
    other = _complete(MINIMAL + "checkpoint_storage: {type: directory, container_path: /ckpt}", DEFAULTS)
    assert other.checkpoint_storage.type == "directory"
    assert other.checkpoint_storage.save_trial_best == 1


def test_complete_does_not_modify_its_input() -> None:
    cfg = parse_experiment_config(MINIMAL)
    before = cfg.to_dict()
    complete_experiment_config(cfg, DEFAULTS)
    assert cfg.to_dict() == before


def test_seed_defaults_to_something() -> None:
    cfg = complete_experiment_config(parse_experiment_config(MINIMAL), DEFAULTS)
    assert isinstance(cfg.reproducibility.experiment_seed, int)


@pytest.mark.parametrize(
    ("text", "defaults", "expected"),
    [
        (
            MINIMAL,
            {},
            "`checkpoint_storage`: missing: set checkpoint_storage in the experiment config or in "
            "the master's defaults",
        ),
        ("entrypoint: x.py", DEFAULTS, "`searcher`: missing required field"),
        (
            "searcher: {name: single, metric: m}",
            DEFAULTS,
            "`entrypoint`: missing required field (the command or model_def:Trial)",
        ),
        (
            "entrypoint: x.py\nsearcher: {name: random, max_trials: 3}",
            DEFAULTS,
            "`searcher.metric`: missing required field (the validation metric that ranks trials)",
        ),
        (
            "entrypoint: model_def:Trial\nsearcher: {name: single, metric: m}",
            DEFAULTS,
            "`hyperparameters.global_batch_size`: missing required field (trial classes such as "
            "model_def:Trial need it)",
        ),
        (
            MINIMAL.replace("metric: loss", "metric: loss, max_length: {epochs: 2}"),
            DEFAULTS,
            "`records_per_epoch`: missing required field: searcher.max_length is in epochs, which needs "
            "records_per_epoch (the number of records in one epoch); set it or give the length in batches",
        ),
        (
            MINIMAL + "min_validation_period: {epochs: 1}",
            DEFAULTS,
            "`records_per_epoch`: missing required field: min_validation_period is in epochs, which needs "
            "records_per_epoch (the number of records in one epoch); set it or give the length in batches",
        ),
        (
            MINIMAL,
            {"checkpoint_storage": {"type": "s3", "bucket": "b"}},
            "`defaults.checkpoint_storage.type`: checkpoint storage type 's3' is not supported yet; "
            "expected 'shared_fs' or 'directory'",
        ),
        (
            MINIMAL,
            {"resources": {"resource_pol": "x"}},
            "`defaults.resources.resource_pol`: unknown field; did you mean `resource_pool`?",
        ),
    ],
)
def test_completeness_errors(text: str, defaults: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        _complete(text, defaults)
    assert str(info.value) == expected


def test_defaults_field_prefix() -> None:
    with pytest.raises(ConfigError) as info:
        complete_experiment_config(
            parse_experiment_config(MINIMAL), {"max_restarts": -2}, defaults_field="task_container_defaults"
        )
    assert info.value.field == "task_container_defaults.max_restarts"


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_good_configs_complete_with_defaults(path: Path) -> None:
    cfg = parse_experiment_config(path.read_text())
    done = complete_experiment_config(cfg, DEFAULTS, experiment_seed=1)
    assert done.checkpoint_storage is not None


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_searcher_package_accepts_our_searcher_dict(path: Path) -> None:
    """Contract with searcher/: it reads the plain dict from `searcher_dict()`."""
    searcher_config = pytest.importorskip("searcher.config")
    parse = getattr(searcher_config, "parse_searcher_config", None)
    if parse is None:
        pytest.skip("searcher.config.parse_searcher_config not available")
    d = parse_experiment_config(path.read_text()).searcher_dict()
    assert d is not None
    parsed = parse(d)
    assert parsed.name == d["name"]
    if "promotion" in d:
        assert parsed.promotion == d["promotion"]
    if "max_length" in d:
        ((unit, amount),) = d["max_length"].items()
        assert (parsed.unit, parsed.max_length) == (unit, amount)


# ---- properties ------------------------------------------------------------------------------------------

_names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(lambda s: s != "type")
_scalars = st.one_of(
    st.integers(-1000, 1000), st.floats(-1e6, 1e6, allow_nan=False), st.booleans(), st.text(max_size=8)
)


@st.composite
def _leaf_hp(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["bare", "const", "int", "double", "log", "categorical"]))
    count = draw(st.none() | st.integers(1, 10))
    if kind == "bare":
        return draw(_scalars)
    if kind == "const":
        return {"type": "const", "val": draw(_scalars | st.none() | st.lists(_scalars, max_size=3))}
    if kind == "categorical":
        return {"type": "categorical", "vals": draw(st.lists(_scalars, min_size=1, max_size=4))}
    bound: st.SearchStrategy[float] = (
        st.integers(-100, 100) if kind == "int" else st.floats(-10, 10, allow_nan=False)
    )
    lo, hi = sorted(draw(st.lists(bound, min_size=2, max_size=2)))
    hp: dict[str, Any] = {"type": kind, "minval": lo, "maxval": hi}
    if count is not None:
        hp["count"] = count
    if kind == "log" and draw(st.booleans()):
        hp["base"] = draw(st.sampled_from([2, 2.718281828, 10]))
    return hp


_hps = st.recursive(
    st.dictionaries(_names, _leaf_hp(), max_size=4),
    lambda inner: st.dictionaries(_names, _leaf_hp() | inner.filter(bool), max_size=3),
    max_leaves=10,
)

_searchers = st.one_of(
    st.fixed_dictionaries({"name": st.just("single"), "metric": st.just("loss")}),
    st.fixed_dictionaries(
        {"name": st.just("random"), "metric": st.just("acc"), "max_trials": st.integers(1, 50)},
        optional={
            "smaller_is_better": st.booleans(),
            "max_length": st.fixed_dictionaries({"batches": st.integers(1, 9)}),
        },
    ),
    st.fixed_dictionaries(
        {
            "name": st.just("adaptive_asha"),
            "metric": st.just("loss"),
            "max_trials": st.integers(1, 50),
            "time_metric": st.sampled_from(["batches", "epochs", "steps"]),
            "max_time": st.integers(1, 10_000),
        },
        optional={
            "mode": st.sampled_from(["aggressive", "standard", "conservative"]),
            "divisor": st.floats(1.5, 8),
            "stop_once": st.booleans(),
            "bracket_rungs": st.lists(st.integers(1, 5), max_size=3),
        },
    ),
    st.fixed_dictionaries(
        {
            "name": st.just("async_halving"),
            "metric": st.just("loss"),
            "max_trials": st.integers(1, 50),
            "num_rungs": st.integers(1, 6),
            "max_length": st.sampled_from([{"batches": 100}, {"records": 6400}, {"epochs": 2}]),
        },
        optional={"promotion": st.sampled_from(["pause", "continue"])},
    ),
)

_configs = st.fixed_dictionaries(
    {"hyperparameters": _hps, "searcher": _searchers},
    optional={
        "entrypoint": st.one_of(
            st.just("python3 train.py"), st.lists(st.text("abc-", min_size=1), min_size=1)
        ),
        "labels": st.lists(st.text(max_size=5), max_size=3),
        "records_per_epoch": st.integers(0, 10**6),
        "resources": st.fixed_dictionaries(
            {}, optional={"slots_per_trial": st.integers(0, 16), "priority": st.integers(1, 99)}
        ),
        "environment": st.fixed_dictionaries(
            {}, optional={"image": st.just("docker://x"), "environment_variables": st.just(["A=1"])}
        ),
        "slurm": st.fixed_dictionaries(
            {}, optional={"time_limit": st.integers(1, 10_000) | st.sampled_from(["1:00:00", "3-00:00:00"])}
        ),
        "checkpoint_storage": st.just({"type": "shared_fs", "host_path": "/a", "storage_path": "b"}),
    },
)


@settings(max_examples=150, deadline=None)
@given(_configs)
def test_to_dict_round_trips(raw: dict[str, Any]) -> None:
    cfg = parse_experiment_config(raw)
    dumped = cfg.to_dict()
    again = parse_experiment_config(dumped)
    assert again.to_dict() == dumped
    assert again == cfg
    assert again.searcher_dict() == cfg.searcher_dict()
    assert again.hyperparameters_dict() == cfg.hyperparameters_dict()
