"""YAML loading with line/column errors and duplicate keys rejected."""

from __future__ import annotations

from typing import Any

import yaml

from hpc_master.expconf._errors import ExperimentConfigError, config_error


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML silently keeps the last one)."""


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
