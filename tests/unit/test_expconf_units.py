"""Length units (records / batches / epochs) and Slurm time strings."""

from __future__ import annotations

import pytest

from hpc_master.errors import ConfigError
from hpc_master.expconf import (
    Length,
    convert_length,
    length_in,
    parse_experiment_config,
)
from slurm_backend.times import time_to_minutes


@pytest.mark.parametrize(
    ("value", "src", "dst", "expected"),
    [
        (10, "batches", "batches", 10),
        (10, "batches", "records", 320),
        (320, "records", "batches", 10),
        (321, "records", "batches", 11),  # rounds up: never train less than asked
        (2, "epochs", "records", 2000),
        (2, "epochs", "batches", 63),  # 2000 / 32 = 62.5 -> 63
        (63, "batches", "epochs", 3),  # 2016 records = 2.016 epochs -> 3
        (1000, "records", "epochs", 1),
        (0, "epochs", "batches", 0),
    ],
)
def test_convert_length(value: int, src: str, dst: str, expected: int) -> None:
    got = convert_length(value, src, dst, global_batch_size=32, records_per_epoch=1000)  # type: ignore[arg-type]
    assert got == expected


@pytest.mark.parametrize(
    ("src", "dst", "gbs", "rpe", "message"),
    [
        ("epochs", "batches", 32, None, "epochs need records_per_epoch (top-level) to convert to batches"),
        ("epochs", "records", 32, 0, "epochs need records_per_epoch (top-level) to convert to records"),
        (
            "epochs",
            "batches",
            None,
            1000,
            "epochs need hyperparameters.global_batch_size to convert to batches",
        ),
        (
            "batches",
            "records",
            None,
            1000,
            "batches need hyperparameters.global_batch_size to convert to records",
        ),
        ("batches", "epochs", 32, None, "batches need records_per_epoch (top-level) to convert to epochs"),
        (
            "records",
            "batches",
            None,
            None,
            "records need hyperparameters.global_batch_size to convert to batches",
        ),
        ("records", "epochs", None, None, "records need records_per_epoch (top-level) to convert to epochs"),
    ],
)
def test_impossible_conversions_say_what_is_missing(
    src: str, dst: str, gbs: int | None, rpe: int | None, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        convert_length(
            5,
            src,  # type: ignore[arg-type]
            dst,  # type: ignore[arg-type]
            global_batch_size=gbs,
            records_per_epoch=rpe,
            field="searcher.max_length",
        )
    assert str(info.value) == f"`searcher.max_length`: {message}"
    assert info.value.field == "searcher.max_length"


def test_length_in_accepts_plain_mapping_and_reports_bad_ones() -> None:
    assert length_in({"epochs": 3}, "records", global_batch_size=None, records_per_epoch=10) == 30
    with pytest.raises(ConfigError) as info:
        length_in({"epoch": 3}, "records", global_batch_size=None, records_per_epoch=10, field="x.len")
    assert str(info.value) == "`x.len.epoch`: unknown field; did you mean `epochs`?"


def test_length_model() -> None:
    length = Length.of("batches", 7)
    assert (length.unit, length.value, length.to_dict()) == ("batches", 7, {"batches": 7})
    assert Length.model_validate({"records": 0}).model_dump() == {"records": 0}


def _cfg(extra: str) -> str:
    return "searcher: {name: single, metric: loss, max_length: {epochs: 2}}\n" + extra


def test_experiment_conversion_uses_its_batch_size_and_records_per_epoch() -> None:
    cfg = parse_experiment_config(_cfg("records_per_epoch: 1000\nhyperparameters: {global_batch_size: 32}"))
    assert cfg.searcher_max_length("batches") == 63
    assert cfg.searcher_max_length("records") == 2000
    assert cfg.searcher_max_length("epochs") == 2


def test_experiment_conversion_without_records_per_epoch() -> None:
    cfg = parse_experiment_config(_cfg("hyperparameters: {global_batch_size: 32}"))
    with pytest.raises(ConfigError) as info:
        cfg.searcher_max_length("batches")
    assert str(info.value) == (
        "`searcher.max_length`: epochs need records_per_epoch (top-level) to convert to batches"
    )


def test_experiment_conversion_with_searched_batch_size() -> None:
    cfg = parse_experiment_config(
        _cfg(
            "records_per_epoch: 100\nhyperparameters: {global_batch_size: {type: int, minval: 8, maxval: 64}}"
        )
    )
    assert cfg.global_batch_size is None
    with pytest.raises(ConfigError, match=r"need hyperparameters\.global_batch_size"):
        cfg.searcher_max_length("batches")
    assert cfg.searcher_max_length("records") == 200


def test_038_time_metric_converts_only_for_known_units() -> None:
    base = "searcher: {name: adaptive_asha, metric: m, max_trials: 4, time_metric: %s, max_time: 4}\n"
    base += "hyperparameters: {global_batch_size: 16}\nrecords_per_epoch: 64"
    assert parse_experiment_config(base % "epochs").searcher_max_length("batches") == 16
    assert parse_experiment_config(base % "steps").searcher_max_length("batches") is None


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("90", 90),
        ("5:30", 6),  # M:S, seconds round up
        ("5:00", 5),
        ("1:30:00", 90),
        ("0:00:01", 1),
        ("2-00:00:00", 2880),
        ("1-12", 2160),  # D-H
        ("1-0:30", 1470),  # D-H:M
        (" 10 ", 10),
    ],
)
def test_slurm_time_strings(text: str, minutes: int) -> None:
    assert time_to_minutes(text) == minutes


@pytest.mark.parametrize("text", ["", "1h", "1:2:3:4", "-1", "1-", "UNLIMITED", "1.5"])
def test_bad_slurm_time_strings(text: str) -> None:
    with pytest.raises(ValueError, match="Slurm time"):
        time_to_minutes(text)


def test_time_limit_is_normalised_to_minutes() -> None:
    assert parse_experiment_config("slurm: {time_limit: 45}").slurm.time_limit_min == 45
    assert parse_experiment_config("slurm: {time_limit: '1:30:00'}").slurm.time_limit_min == 90
    # YAML 1.1 would read an unquoted 1:30:00 as the base-60 integer 5400 (= 5400 minutes!); our loader keeps it
    # a string, so it means 90 minutes with or without quotes.
    assert parse_experiment_config("slurm: {time_limit: 1:30:00}").slurm.time_limit_min == 90
    assert parse_experiment_config("slurm: {time_limit: 2-00:00:00}").to_dict()["slurm"]["time_limit"] == 2880


def test_exponent_floats_are_numbers() -> None:
    cfg = parse_experiment_config(
        "hyperparameters: {lr: 1e-3, wd: {type: double, minval: 1e-6, maxval: 1e-2}}"
    )
    assert cfg.hyperparameters_dict()["lr"] == {"type": "const", "val": 0.001}
    assert cfg.hyperparameters_dict()["wd"]["maxval"] == 0.01
