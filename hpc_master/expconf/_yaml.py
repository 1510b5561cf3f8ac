"""YAML loading with line/column errors and duplicate keys rejected."""

from __future__ import annotations

import re
from typing import Any

import yaml

from hpc_master.expconf._errors import ExperimentConfigError, config_error


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML silently keeps the last one) and does not read
    ``1:30:00`` as the YAML 1.1 base-60 integer 5400 (YAML 1.2 dropped that; here it stays a string, so a
    Slurm time limit written without quotes means what it looks like). Floats follow YAML 1.2, so ``1e-3`` is
    a number (PyYAML's YAML 1.1 rules make it a string)."""


def _drop_sexagesimal() -> None:
    resolvers: dict[Any, Any] = {}
    for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items():
        resolvers[first] = [
            (tag, regexp)
            for tag, regexp in entries
            if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
        ]
    _StrictLoader.yaml_implicit_resolvers = resolvers
    int_re = re.compile(
        r"""^(?:[-+]?0b[0-1_]+
        |[-+]?0[0-7_]+
        |[-+]?(?:0|[1-9][0-9_]*)
        |[-+]?0x[0-9a-fA-F_]+)$""",
        re.X,
    )
    float_re = re.compile(
        r"""^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?
        |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    )
    _StrictLoader.add_implicit_resolver("tag:yaml.org,2002:int", int_re, list("-+0123456789"))
    _StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", float_re, list("-+0123456789."))


_drop_sexagesimal()


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in out:
            mark = key_node.start_mark
            raise config_error(
                f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: duplicate key {key!r}"
            )
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(text: str | bytes) -> Any:
    """Parse YAML text; errors carry the 1-based line and column."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except ExperimentConfigError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or "could not parse"
        raise config_error(f"invalid YAML{where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise config_error(f"invalid YAML: {exc}") from None
