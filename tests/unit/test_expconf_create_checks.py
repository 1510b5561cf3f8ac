"""What only submission used to notice is refused when the config enters (issue: items 3 and 4).

The one pipeline (`hpc_master.admission.load_experiment_config`): strict YAML → typed model → the master's
defaults → a dry run of the trial's job script against the target pool. Here: the config alone (the Slurm
backend's sbatch-options policy, `slurm.slots_per_node`), the dry run against a master's pools, the master
config's pool times and sizes parsed at load, Determined's eventually-required fields, and `det preview`.
The API's create is tested in tests/master/test_create_dry_run.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hpc_master.admission import load_experiment_config
from hpc_master.cli.main import main
from hpc_master.errors import ConfigError
from hpc_master.expconf import PartialStorage, SharedFSStorage, parse_experiment_config
from hpc_master.masterconf import MasterConfig, parse_master_config
from hpc_master.trialjob import pool_from_master_config

BASE: dict[str, Any] = {
    "entrypoint": "python3 train.py",
    "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 100}},
    "hyperparameters": {"lr": 0.1},
}
BAD_SBATCH_ARGS = [
    (["--gres=gpu:8"], "--gres is set by hpc-det"),
    (["--nodes=4"], "--nodes is set by hpc-det"),
    (["-p", "x"], "--partition is set by hpc-det: use slurm.partition instead"),
    (["--uid=0"], "--uid is set by hpc-det: jobs run as the user's own account"),
]


def cfg_text(**overrides: Any) -> str:
    return yaml.safe_dump({**BASE, **overrides})


def master(**pools: dict[str, Any]) -> MasterConfig:
    data: dict[str, Any] = {"checkpoint_storage": {"host_path": "/shared/ck"}}
    if pools:
        data["resource_pools"] = pools
    return parse_master_config(data, env={})


GPU_MASTER = {
    "default": {"partition": "batch", "slots_per_node": 2, "max_time_limit": "2:00:00"},
    "cpu": {"slots_per_node": 0, "gpu_request_style": "none", "mem_per_node": "4G"},
}


def refused(text: str, master_config: MasterConfig | None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_experiment_config(text, master_config)
    assert info.value.code == "invalid_config"
    return info.value


# ---- item 3: the config alone ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "message"), BAD_SBATCH_ARGS)
def test_sbatch_args_are_refused_when_the_config_is_parsed(args: list[str], message: str) -> None:
    """The Slurm backend's one list of options (slurm_backend.sbatch_args), with the element's path."""
    with pytest.raises(ConfigError) as info:
        parse_experiment_config({**BASE, "slurm": {"sbatch_args": ["--exclusive", *args]}})
    assert info.value.field == "slurm.sbatch_args[1]"
    assert message in info.value.message


def test_sbatch_args_the_policy_allows_are_kept_as_written() -> None:
    cfg = parse_experiment_config({**BASE, "slurm": {"sbatch_args": ["--constraint", "ib", "--exclusive"]}})
    assert cfg.slurm.sbatch_args == ["--constraint", "ib", "--exclusive"]
    with pytest.raises(ConfigError) as info:
        parse_experiment_config({**BASE, "slurm": {"sbatch_args": ["--frobnicate"]}})
    assert (info.value.field, info.value.message) == (
        "slurm.sbatch_args[0]",
        "'--frobnicate' is not an sbatch option",
    )


def test_sbatch_arg_values_an_sbatch_line_cannot_carry_are_refused_at_parse() -> None:
    """Refused by the policy with the element's path, not by the renderer at every submission."""
    with pytest.raises(ConfigError) as info:
        parse_experiment_config({**BASE, "slurm": {"sbatch_args": ["--exclusive", "--constraint", 'a"b']}})
    assert info.value.field == "slurm.sbatch_args[1]"
    assert "may not contain a double quote or a backslash" in info.value.message


@pytest.mark.parametrize(
    ("resources", "slurm", "message"),
    [
        (
            {"slots_per_trial": 3},
            {"slots_per_node": 2},
            "slots_per_trial 3 is not a multiple of 2 slots per node",
        ),
        (
            {"slots_per_trial": 4, "is_single_node": True},
            {"slots_per_node": 2},
            "does not fit on one node (2 slots per node) and resources.is_single_node is true",
        ),
    ],
)
def test_slots_that_slurm_slots_per_node_cannot_hold_are_refused_at_parse(
    resources: dict[str, Any], slurm: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_experiment_config({**BASE, "resources": resources, "slurm": slurm})
    assert info.value.field == "resources.slots_per_trial"
    assert message in info.value.message


def test_multi_node_trials_are_legal() -> None:
    cfg = parse_experiment_config(
        {**BASE, "resources": {"slots_per_trial": 8}, "slurm": {"slots_per_node": 4}}
    )
    assert cfg.resources.slots_per_trial == 8
    checked = load_experiment_config(cfg_text(resources={"slots_per_trial": 4}), master(**GPU_MASTER))
    assert (checked.job.spec.nodes, checked.job.spec.gpus_per_node) == (2, 2)
    assert "#SBATCH --nodes=2\n" in checked.job.script


@pytest.mark.parametrize("field", ["partition", "account", "qos"])
def test_slurm_names_that_cannot_go_on_an_sbatch_line_are_refused(field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_experiment_config({**BASE, "slurm": {field: 'a"b'}})
    assert info.value.field == f"slurm.{field}"


# ---- item 3: the dry run against the master's pools -----------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"resources": {"resource_pool": "nope"}}, "resources.resource_pool", "unknown resource pool 'nope'"),
        (
            {"resources": {"slots_per_trial": 3}},
            "resources.slots_per_trial",
            "not a multiple of the pool's 2",
        ),
        (
            {"resources": {"slots_per_trial": 4, "is_single_node": True}},
            "resources.slots_per_trial",
            "does not fit on one node",
        ),
        (
            {"resources": {"slots_per_trial": 1, "resource_pool": "cpu"}},
            "resources.slots_per_trial",
            "CPU-only",
        ),
        ({"slurm": {"time_limit": "3:00:00"}}, "slurm.time_limit", "over the 'default' pool's limit of 120"),
        (
            {
                "resources": {"slots_per_trial": 0, "resource_pool": "cpu"},
                "slurm": {"sbatch_args": ["--mem=2G"]},
            },
            "slurm.sbatch_args",
            "--mem is already set by hpc-det",
        ),
    ],
)
def test_the_dry_run_refuses_what_submission_would(
    overrides: dict[str, Any], field: str, message: str
) -> None:
    err = refused(cfg_text(**overrides), master(**GPU_MASTER))
    assert err.field == field
    assert message in err.message


def test_the_dry_run_builds_the_job_of_the_target_pool() -> None:
    checked = load_experiment_config(
        cfg_text(resources={"slots_per_trial": 0, "resource_pool": "cpu"}), master(**GPU_MASTER)
    )
    assert checked.pool_known and checked.pool.name == "cpu"
    assert "#SBATCH --mem=4096\n" in checked.job.script
    assert checked.config.resources.resource_pool == "cpu"


def test_without_the_master_config_a_stand_in_pool_is_used() -> None:
    """`det preview` without --master-config: the pool's name is not checked; the config's own shape is."""
    checked = load_experiment_config(
        cfg_text(resources={"resource_pool": "anything", "slots_per_trial": 8}), None
    )
    assert not checked.pool_known
    assert (checked.job.spec.nodes, checked.job.spec.gpus_per_node) == (1, 8)
    err = refused(cfg_text(slurm={"sbatch_args": ["--nodes=4"]}), None)
    assert err.field == "slurm.sbatch_args[0]"


# ---- item 3: the master config's pool times and sizes are parsed at load --------------------------------------


@pytest.mark.parametrize(
    ("pool", "field", "message"),
    [
        ({"default_time_limit": "two hours"}, "default_time_limit", "expected minutes or a Slurm time"),
        ({"max_time_limit": "1:xx"}, "max_time_limit", "expected minutes or a Slurm time"),
        ({"max_time_limit": "0"}, "max_time_limit", "must be at least 1 minute"),
        ({"mem_per_node": "16X"}, "mem_per_node", "expected a size with a unit"),
        ({"mem_per_node": "64000"}, "mem_per_node", "expected a size with a unit"),
        ({"mem_per_node": "100K"}, "mem_per_node", "must be at least 1M"),
        (
            {"default_time_limit": "3:00:00", "max_time_limit": "1:00:00"},
            "max_time_limit",
            "60 minutes is shorter than default_time_limit (180 minutes)",
        ),
        ({"gpu_type": "a100 80g"}, "gpu_type", "may hold only letters"),
        ({"partition": "batch\nx"}, "partition", "may not contain a line break"),
    ],
)
def test_a_bad_pool_fails_when_the_master_config_loads(
    pool: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_master_config({"resource_pools": {"gpu": pool}, "default_resource_pool": "gpu"}, env={})
    assert info.value.field == f"resource_pools.gpu.{field}"
    assert message in info.value.message
    assert not info.value.message.startswith("Value error")


def test_pool_times_and_sizes_are_parsed_once() -> None:
    config = parse_master_config(
        {
            "resource_pools": {
                "gpu": {"default_time_limit": 90, "max_time_limit": "UNLIMITED", "mem_per_node": "1.5G"}
            },
            "default_resource_pool": "gpu",
        },
        env={},
    )
    pool = config.resource_pools["gpu"]
    assert (pool.default_time_limit_min, pool.max_time_limit_min, pool.mem_per_node_mb) == (90, None, 1536)
    spec = pool_from_master_config(config)
    assert (spec.default_time_limit_min, spec.max_time_limit_min, spec.mem_per_node_mb) == (90, None, 1536)


def test_the_default_pool_must_be_one_of_the_pools() -> None:
    with pytest.raises(ConfigError) as info:
        parse_master_config({"resource_pools": {"gpu": {}}}, env={})
    assert info.value.field == "default_resource_pool"
    assert "'default' is not one of resource_pools (known: 'gpu')" in info.value.message


# ---- item 4: Determined's eventually-required fields ----------------------------------------------------------


@pytest.mark.parametrize("name", ["single", "random", "grid"])
def test_searcher_metric_is_eventually_required(name: str) -> None:
    searcher: dict[str, Any] = {"name": name, "max_length": {"batches": 10}}
    if name == "random":
        searcher["max_trials"] = 2
    cfg = parse_experiment_config({**BASE, "searcher": searcher})  # a partial config parses
    assert cfg.searcher is not None and cfg.searcher.metric is None
    err = refused(cfg_text(searcher=searcher), master())
    assert err.field == "searcher.metric"


def test_max_length_in_epochs_needs_records_per_epoch() -> None:
    searcher = {"name": "single", "metric": "loss", "max_length": {"epochs": 3}}
    err = refused(cfg_text(searcher=searcher), master())
    assert err.field == "records_per_epoch"
    assert "searcher.max_length is in epochs" in err.message
    checked = load_experiment_config(cfg_text(searcher=searcher, records_per_epoch=1000), master())
    assert checked.config.records_per_epoch == 1000


def test_a_gc_only_checkpoint_storage_merges_with_the_masters_storage() -> None:
    """Determined's diffusion examples set `checkpoint_storage: {save_trial_latest: 5}` and nothing else."""
    cfg = parse_experiment_config({**BASE, "checkpoint_storage": {"save_trial_latest": 5}})
    assert isinstance(cfg.checkpoint_storage, PartialStorage) and cfg.storage is None
    checked = load_experiment_config(cfg_text(checkpoint_storage={"save_trial_latest": 5}), master())
    storage = checked.config.checkpoint_storage
    assert isinstance(storage, SharedFSStorage)
    assert (storage.host_path, storage.save_trial_latest, storage.save_trial_best) == ("/shared/ck", 5, 1)
    assert dict(checked.job.env)["DET_STORAGE_ROOT"] == "/shared/ck"
    # The stored form parses back to the same storage.
    assert parse_experiment_config(checked.config.to_dict()).checkpoint_storage == storage


def test_a_typed_storage_still_replaces_the_masters() -> None:
    own = {"type": "directory", "container_path": "/ck", "save_trial_latest": 2}
    checked = load_experiment_config(cfg_text(checkpoint_storage=own), master())
    assert checked.config.checkpoint_storage is not None
    assert checked.config.checkpoint_storage.model_dump(exclude_unset=True) == own


def test_a_storage_without_type_may_set_only_the_gc_fields() -> None:
    with pytest.raises(ConfigError) as info:
        parse_experiment_config({**BASE, "checkpoint_storage": {"host_path": "/x", "save_trial_latest": 5}})
    assert info.value.field == "checkpoint_storage.type"
    assert "'host_path' needs a type" in info.value.message


# ---- det preview ----------------------------------------------------------------------------------------------


def preview(tmp_path: Path, text: str, *extra: str) -> int:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return main(["preview", str(path), "--no-simulate", *extra])


@pytest.mark.parametrize(("args", "message"), BAD_SBATCH_ARGS)
def test_preview_refuses_sbatch_args_locally(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert preview(tmp_path, cfg_text(slurm={"sbatch_args": args})) == 2
    err = capsys.readouterr().err
    assert "`slurm.sbatch_args[0]`: " + message in err


def test_preview_refuses_slots_that_slurm_slots_per_node_cannot_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = cfg_text(resources={"slots_per_trial": 3}, slurm={"slots_per_node": 2})
    assert preview(tmp_path, text) == 2
    assert "`resources.slots_per_trial`: slots_per_trial 3 is not a multiple of 2" in capsys.readouterr().err


def test_preview_with_the_master_config_refuses_what_create_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    master_yaml = tmp_path / "master.yaml"
    master_yaml.write_text(yaml.safe_dump({"resource_pools": GPU_MASTER}))
    text = cfg_text(resources={"slots_per_trial": 3})
    assert preview(tmp_path, text) == 0  # the stand-in pool puts 3 slots on one node
    out = capsys.readouterr().out
    assert "Not checked without the master's config (--master-config FILE)" in out
    assert preview(tmp_path, text, "--master-config", str(master_yaml)) == 2
    assert "`resources.slots_per_trial`: slots_per_trial 3 is not a multiple" in capsys.readouterr().err
    text = cfg_text(resources={"slots_per_trial": 4})
    assert preview(tmp_path, text, "--master-config", str(master_yaml)) == 0
    out = capsys.readouterr().out
    assert f"Checked against {master_yaml}: its defaults and resource pool 'default'" in out
    assert "Job per trial (resource pool 'default'): 2 nodes x 2 GPUs, partition batch" in out


def test_preview_applies_determineds_eventually_required_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    no_metric = {"name": "single", "max_length": {"batches": 10}}
    assert preview(tmp_path, cfg_text(searcher=no_metric)) == 2
    assert "`searcher.metric`: missing required field" in capsys.readouterr().err
    epochs = {"name": "single", "metric": "loss", "max_length": {"epochs": 2}}
    assert preview(tmp_path, cfg_text(searcher=epochs)) == 2
    assert "`records_per_epoch`: missing required field" in capsys.readouterr().err
    assert preview(tmp_path, cfg_text(checkpoint_storage={"save_trial_latest": 5})) == 0
