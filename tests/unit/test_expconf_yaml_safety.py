"""Config texts are untrusted: the YAML loader bounds their size and what aliases expand to, and an entrypoint
that cannot be split like a shell would is refused at parse time (issue 18, items 2 and 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_master.cli.experiment import load_config
from hpc_master.cli.main import main
from hpc_master.errors import ConfigError
from hpc_master.expconf import (
    MAX_ALIAS_NODES,
    MAX_CONFIG_BYTES,
    MAX_DEPTH,
    MAX_NODES,
    ExperimentConfigError,
    YAMLConfigError,
    load_yaml,
    parse_experiment_config,
)

HEAD = """\
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: {batches: 10}}
hyperparameters: {lr: 0.1}
"""


def alias_bomb(levels: int, width: int) -> str:
    """`levels` lists under `data:`, each holding `width` aliases of the one before: width**levels leaves."""
    lines = [HEAD.rstrip("\n"), "data:", f"  l0: &l0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


BILLION_LAUGHS = alias_bomb(9, 9)  # 9**9 = 387 million leaves once expanded
SMALL_BOMB = alias_bomb(5, 10)  # 100,000 leaves: slow to store and decode, and far past the bound


def test_the_billion_laughs_is_refused_at_the_alias_that_crosses_the_bound() -> None:
    assert len(BILLION_LAUGHS.encode()) < 1024
    with pytest.raises(YAMLConfigError) as info:
        load_yaml(BILLION_LAUGHS)
    err = info.value
    assert err.code == "invalid_config"
    assert f"{MAX_ALIAS_NODES:,} nodes repeated by aliases" in err.message
    # l1, l2, l3 repeat 9 * 10, 9 * 91 and 9 * 820 nodes (8,289); the first *l3 in l4 (line 9) adds 7,381.
    assert (err.line, err.column) == (9, 12)
    assert err.message.startswith("invalid YAML at line 9, column 12: the alias *l3 expands the document")


def test_an_alias_bomb_is_refused_by_the_config_parser() -> None:
    with pytest.raises(ExperimentConfigError, match="repeated by aliases"):
        parse_experiment_config(SMALL_BOMB)


def test_a_recursive_alias_is_refused() -> None:
    with pytest.raises(
        YAMLConfigError, match=r"line 1, column 11: the alias \*a refers to a node that contains"
    ):
        load_yaml("a: &a [1, *a]\n")


def test_merge_keys_and_small_aliases_still_work() -> None:
    text = (
        HEAD
        + """\
data:
  defaults: &defaults {batch: 32, workers: 4, paths: &paths [/data/a, /data/b]}
  train: {<<: *defaults, shuffle: true}
  eval:
    <<: *defaults
    batch: 64
  more_paths: *paths
"""
    )
    cfg = parse_experiment_config(text)
    assert cfg.data["train"] == {"batch": 32, "workers": 4, "paths": ["/data/a", "/data/b"], "shuffle": True}
    assert cfg.data["eval"] == {"batch": 64, "workers": 4, "paths": ["/data/a", "/data/b"]}  # written wins
    assert cfg.data["more_paths"] == ["/data/a", "/data/b"]


def test_aliases_up_to_the_bound_are_accepted() -> None:
    # One list of 99 items (100 nodes) repeated 100 times: exactly MAX_ALIAS_NODES nodes repeated.
    def text(copies: int) -> str:
        return "base: &b [" + ", ".join(["1"] * 99) + "]\ncopies: [" + ", ".join(["*b"] * copies) + "]\n"

    assert len(load_yaml(text(100))["copies"]) == 100
    with pytest.raises(YAMLConfigError, match="repeated by aliases"):
        load_yaml(text(101))


def test_deep_nesting_is_refused_before_it_exhausts_the_stack() -> None:
    assert MAX_DEPTH == 100
    assert load_yaml("[" * 100 + "]" * 100) is not None
    with pytest.raises(YAMLConfigError, match="line 1, column 101: nested deeper than 100 levels"):
        load_yaml("[" * 100_000 + "]" * 100_000)  # a RecursionError (a 500 at create) before
    # Aliases count expanded: the top mapping and 40 lists around an alias 60 levels deep are 101 levels.
    text = "a: &a " + "[" * 60 + "]" * 60 + "\nb: " + "[" * 40 + "*a" + "]" * 40 + "\n"
    with pytest.raises(YAMLConfigError, match=r"line 2, column 44: the alias \*a nests the document deeper"):
        load_yaml(text)
    load_yaml(text.replace("[*a]", "*a"))  # 100 levels: fine


def test_a_document_of_too_many_values_is_refused() -> None:
    assert MAX_NODES == 100_000

    def flat(items: int) -> str:  # the top mapping, its key and the list: 3 values more
        return "x: [" + ",".join(["1"] * items) + "]\n"

    assert len(load_yaml(flat(MAX_NODES - 3))["x"]) == MAX_NODES - 3
    with pytest.raises(YAMLConfigError, match="the document has more than 100,000 values"):
        load_yaml(flat(MAX_NODES - 2))


def test_duplicate_keys_are_still_refused_next_to_a_merge() -> None:
    with pytest.raises(YAMLConfigError, match="line 2, column 19: duplicate key 'a'"):
        load_yaml("d: &d {a: 0}\nx: {<<: *d, a: 1, a: 2}\n")


def test_an_oversized_config_is_refused_naming_the_limit() -> None:
    assert MAX_CONFIG_BYTES == 1024 * 1024
    padding = "# " + "x" * (MAX_CONFIG_BYTES - len(HEAD) - 3) + "\n"
    assert parse_experiment_config(HEAD + padding).entrypoint == "python3 train.py"  # exactly at the limit
    with pytest.raises(ExperimentConfigError) as info:
        parse_experiment_config(HEAD + padding + "#\n")
    assert info.value.code == "invalid_config"
    assert info.value.message == "the config is 1 MiB, over the limit of 1 MiB (1,048,576 bytes)"
    # Counted in bytes, not characters: 600,000 two-byte characters are 1.1 MiB.
    with pytest.raises(ExperimentConfigError, match=r"the config is 1\.1 MiB, over the limit of 1 MiB"):
        load_yaml("# " + "é" * 600_000 + "\n")


@pytest.mark.parametrize(
    ("entrypoint", "problem"),
    [
        ('python3 train.py "unterminated', "no closing quotation"),
        ("python3 train.py --name 'x", "no closing quotation"),
        ("python3 train.py \\", "no escaped character"),
        ("''", "names no command to run"),
    ],
)
def test_an_entrypoint_that_cannot_be_split_is_refused(entrypoint: str, problem: str) -> None:
    with pytest.raises(ExperimentConfigError) as info:
        parse_experiment_config({"entrypoint": entrypoint})
    assert info.value.field == "entrypoint"
    assert problem in info.value.message
    assert str(info.value).startswith("`entrypoint`: ")


def test_entrypoints_that_split_are_accepted() -> None:
    cfg = parse_experiment_config({"entrypoint": "python3 train.py --name 'a b' \"c d\""})
    assert cfg.entrypoint_argv() == ["python3", "train.py", "--name", "a b", "c d"]
    assert parse_experiment_config({"entrypoint": "model_def:MyTrial"}).trial_class() == (
        "model_def",
        "MyTrial",
    )
    assert parse_experiment_config({"entrypoint": ["python3", "it's fine"]}).entrypoint_argv() == [
        "python3",
        "it's fine",
    ]


# ---- the CLI reads configs with the same loader -------------------------------------------------------


def test_cli_create_refuses_an_alias_bomb_before_sending_anything(tmp_path: Path) -> None:
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(SMALL_BOMB)
    with pytest.raises(ConfigError) as info:
        load_config(cfg, [])
    assert str(info.value).startswith(f"{cfg}: not valid YAML (line ")
    assert "repeated by aliases" in str(info.value)


def test_cli_create_refuses_an_oversized_config(tmp_path: Path) -> None:
    cfg = tmp_path / "big.yaml"
    cfg.write_text(HEAD + "# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError, match=r"big\.yaml: the config is 1 MiB, over the limit of 1 MiB"):
        load_config(cfg, [])


def test_cli_create_accepts_merge_keys(tmp_path: Path) -> None:
    cfg = tmp_path / "merge.yaml"
    cfg.write_text(HEAD + "data:\n  d: &d {a: 1, b: 2}\n  e: {<<: *d, b: 3}\n")
    text, warnings = load_config(cfg, ["data.f=[1, 2]"])
    assert warnings == []
    assert load_yaml(text)["data"] == {"d": {"a": 1, "b": 2}, "e": {"a": 1, "b": 3}, "f": [1, 2]}


def test_preview_refuses_an_alias_bomb(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(SMALL_BOMB)
    assert main(["preview", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "invalid YAML at line" in err and "repeated by aliases" in err


def test_preview_refuses_an_unsplittable_entrypoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "ep.yaml"
    cfg.write_text(HEAD.replace("python3 train.py", 'python3 train.py "unterminated'))
    assert main(["preview", str(cfg)]) == 2
    assert "`entrypoint`: cannot be split into arguments like a shell would" in capsys.readouterr().err
