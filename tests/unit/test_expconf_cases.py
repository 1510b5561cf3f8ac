"""Table tests: real-world Determined configs must parse; broken ones must fail with the exact message.

Each file in expconf_cases/bad/ starts with a line ``# expect: <message>``: the exact `str()` of the error.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_master.errors import ConfigError
from hpc_master.expconf import ExperimentConfig, parse_experiment_config

CASES = Path(__file__).parent / "expconf_cases"
GOOD = sorted((CASES / "good").glob("*.yaml"))
BAD = sorted((CASES / "bad").glob("*.yaml"))


def _parse_file(path: Path) -> ExperimentConfig:
    return parse_experiment_config(path.read_text())


def test_case_tables_are_not_empty() -> None:
    assert len(GOOD) >= 10
    assert len(BAD) >= 40


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_good_config_parses_and_round_trips(path: Path) -> None:
    cfg = _parse_file(path)
    again = parse_experiment_config(cfg.to_dict())
    assert again.model_dump() == cfg.model_dump()  # `==` would also compare the warnings
    assert again.to_dict() == cfg.to_dict()


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_config_fails_with_exact_message(path: Path) -> None:
    text = path.read_text()
    first = text.splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} must start with '# expect: <message>'"
    expected = first.removeprefix("# expect: ")
    with pytest.raises(ConfigError) as info:
        parse_experiment_config(text)
    assert str(info.value) == expected


def _good(stem: str) -> ExperimentConfig:
    return _parse_file(CASES / "good" / f"{stem}.yaml")


def test_error_carries_code_and_field() -> None:
    with pytest.raises(ConfigError) as info:
        parse_experiment_config(CASES.joinpath("bad", "unknown_searcher_field.yaml").read_text())
    assert info.value.field == "searcher.max_trails"
    assert info.value.code == "invalid_config"
    assert info.value.to_dict()["message"] == "unknown field; did you mean `max_trials`?"


def test_legacy_trial_class_entrypoint() -> None:
    cfg = _good("const_legacy_trial")
    assert cfg.trial_class() == ("model_def", "MNistTrial")
    assert cfg.entrypoint_argv() is None
    assert cfg.global_batch_size == 64
    assert cfg.searcher_dict() == {
        "name": "single",
        "metric": "validation_loss",
        "smaller_is_better": True,
        "max_length": {"batches": 937},
    }


def test_list_entrypoint_and_distributed_resources() -> None:
    cfg = _good("distributed_torch")
    assert cfg.trial_class() is None
    assert cfg.entrypoint_argv() == [
        "python3",
        "-m",
        "determined.launch.torch_distributed",
        "python3",
        "train.py",
    ]
    assert cfg.resources.slots_per_trial == 8
    assert cfg.resources.shm_size_bytes == 16 << 30
    assert cfg.slurm.time_limit_min == 2 * 24 * 60
    assert cfg.slurm.sbatch_args == ["--mem=200G", "--constraint=ib"]
    assert (cfg.slurm.partition, cfg.slurm.account, cfg.slurm.qos) == ("gpu", "proj123", "normal")
    assert (cfg.slurm.slots_per_node, cfg.slurm.gpu_type) == (4, "a100")


def test_string_entrypoint_is_split_like_a_shell() -> None:
    cfg = _good("kitchen_sink")
    assert cfg.entrypoint_argv() == ["python3", "-m", "train", "--config", "conf.yaml"]


def test_asha_037_searcher_dict_defaults() -> None:
    d = _good("adaptive_asha_037").searcher_dict()
    assert d == {
        "name": "adaptive_asha",
        "metric": "validation_loss",
        "smaller_is_better": True,
        "max_trials": 16,
        "divisor": 4.0,
        "max_concurrent_trials": 4,
        "max_length": {"epochs": 1},
        "stop_once": False,
        "promotion": "pause",
        "mode": "aggressive",
        "max_rungs": 5,
        "bracket_rungs": [],
    }


def test_asha_038_form_defaults_to_early_stopping() -> None:
    cfg = _good("adaptive_asha_038")
    d = cfg.searcher_dict()
    assert d is not None
    assert d["max_length"] == {"batches": 1000}
    assert "time_metric" not in d and "max_time" not in d  # one length form only, for the searcher package
    assert (d["promotion"], d["stop_once"]) == ("continue", True)
    assert "max_length" not in cfg.to_dict()["searcher"]  # the dump keeps the user's form


def test_hyperparameters_dict_is_determined_shape() -> None:
    hps = _good("nested_hyperparameters").hyperparameters_dict()
    assert hps == {
        "global_batch_size": {"type": "const", "val": 128},
        "optimizer": {
            "name": {"type": "categorical", "vals": ["adam", "sgd"]},
            "params": {
                "lr": {"type": "log", "minval": -4.0, "maxval": -2.0, "base": 10.0},
                "betas": {"type": "const", "val": [0.9, 0.999]},
            },
        },
        "model": {
            "layers": {"type": "const", "val": 12},
            "extra": {"type": "const", "val": {"a": 1, "b": [1, 2]}},
        },
    }


def test_images_and_variables_per_device() -> None:
    env = _good("images_per_device").environment
    assert env.image_for("cuda") == "determinedai/pytorch-ngc-dev:0.38.0"
    assert env.image_for("cpu") == "determinedai/pytorch-ngc:0.38.0"
    assert env.environment_variables.for_device("cuda") == {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "ib0"}
    assert env.environment_variables.for_device("rocm") == {}


def test_single_image_string_applies_to_every_device() -> None:
    cfg = _good("pod_spec_warning")
    assert {cfg.environment.image_for(d) for d in ("cpu", "cuda", "rocm")} == {
        "determinedai/pytorch-ngc:0.38.0"
    }
    assert cfg.environment.environment_variables.for_device("cpu") == {"A": "1"}


def test_kubernetes_fields_warn_and_are_dropped() -> None:
    cfg = _good("pod_spec_warning")
    assert cfg.warnings == [
        "`environment.pod_spec` is Kubernetes-only and is ignored on Slurm",
        "`environment.registry_auth` is Kubernetes-only and is ignored on Slurm",
        "`environment.add_capabilities` is Kubernetes-only and is ignored on Slurm",
        "`environment.proxy_ports` is Kubernetes-only and is ignored on Slurm",
    ]
    dumped = cfg.to_dict()
    assert "pod_spec" not in dumped["environment"]
    assert "warnings" not in dumped and "_warnings" not in dumped


def test_bind_mounts_and_directory_storage() -> None:
    cfg = _good("bind_mounts")
    assert [(m.host_path, m.container_path, m.read_only) for m in cfg.bind_mounts] == [
        ("/lustre/datasets/imagenet", "/data/imagenet", True),
        ("/scratch/tmp", "/tmp/scratch", False),
    ]
    assert cfg.checkpoint_storage is not None
    assert cfg.checkpoint_storage.type == "directory"
    assert cfg.checkpoint_storage.save_experiment_best == 3
    assert cfg.checkpoint_storage.save_trial_latest == 1


def test_shared_fs_storage_root() -> None:
    storage = _good("adaptive_asha_038").checkpoint_storage
    assert storage is not None and storage.type == "shared_fs"
    assert storage.root == "/scratch/det-checkpoints/mnist"
    storage = _good("kitchen_sink").checkpoint_storage
    assert storage is not None and storage.type == "shared_fs"
    assert storage.root == "/shared/ckpt/team"


def test_kitchen_sink_fields() -> None:
    cfg = _good("kitchen_sink")
    assert cfg.warnings == [
        "`tensorboard_storage` is not used (TensorBoard files go with checkpoints) and is ignored on Slurm",
        "`profiling` is stored but not collected on Slurm",
        "`log_policies` is stored but not applied on Slurm (no log pattern cancels retries or excludes a node)",
    ]
    assert cfg.reproducibility.experiment_seed == 42
    assert [p.action.type if p.action else None for p in cfg.log_policies] == [
        None,
        "exclude_node",
        "cancel_retries",
    ]
    assert cfg.min_validation_period is not None and cfg.min_validation_period.to_dict() == {"epochs": 1}
    assert cfg.checkpoint_policy == "all"
    assert cfg.optimizations == {"aggregation_frequency": 1, "mixed_precision": "O1"}
    assert cfg.searcher_max_length("batches") == 10 * 50000 // 512 + 1


def test_null_means_unset() -> None:
    cfg = parse_experiment_config("max_restarts: null\nresources: {slots_per_trial: null}\nname: null")
    assert cfg.max_restarts == 5
    assert cfg.resources.slots_per_trial == 1
    assert cfg.name is None


def test_empty_config_is_an_error() -> None:
    with pytest.raises(ConfigError, match="the experiment config is empty"):
        parse_experiment_config("")


def test_field_prefix_names_the_outer_path() -> None:
    with pytest.raises(ConfigError) as info:
        parse_experiment_config({"max_restarts": -1}, field_prefix=["task_container_defaults"])
    assert info.value.field == "task_container_defaults.max_restarts"


def test_promotion_defaults() -> None:
    base = "searcher: {name: adaptive_asha, metric: m, max_trials: 4, %s}"
    cases = {
        "max_length: {batches: 10}": ("pause", False),
        "time_metric: batches, max_time: 10": ("continue", True),
        "max_length: {batches: 10}, stop_once: true": ("continue", True),
        "time_metric: epochs, max_time: 3, stop_once: false": ("pause", False),
        "time_metric: epochs, max_time: 3, promotion: pause": ("pause", False),
        "max_length: {batches: 10}, promotion: continue": ("continue", True),
    }
    for extra, (promotion, stop_once) in cases.items():
        d = parse_experiment_config(base % extra).searcher_dict()
        assert d is not None
        assert (d["promotion"], d["stop_once"]) == (promotion, stop_once), extra
