"""YAML loading with line/column errors, duplicate keys rejected, and bounds on size and alias expansion.

`load_yaml` is the one way configs are read (the master's create, `det experiment create`, `det preview`,
the master config). A config is text a user controls and the master stores, decodes and validates, so:

- the text is at most `MAX_CONFIG_BYTES` (1 MiB; real configs are a few KB);
- aliases may repeat at most `MAX_ALIAS_NODES` nodes in all. PyYAML expands aliases without limit, and a
  523-byte "billion laughs" document expands to hundreds of millions of nodes once anything walks it
  (validation, JSON). Aliases are not refused outright: Determined configs use ``<<: *defaults`` merges and
  shared anchors, which repeat a few hundred nodes at most. A recursive alias (``&a [*a]``) is refused;
- values nest at most `MAX_DEPTH` (100) levels: 1,000 nested ``[`` overflow Python's stack in the parser;
- a document has at most `MAX_NODES` (100,000) values, aliases expanded (a 1 MiB ``[1,1,1,...]`` has 500,000
  and takes 8 s to parse).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from hpc_master.expconf._errors import ExperimentConfigError, config_error

MAX_CONFIG_BYTES = 1024 * 1024
"""The largest config text accepted, in bytes."""
MAX_ALIAS_NODES = 10_000
"""How many nodes aliases may repeat in one document, in all (an alias of a 3-item list repeats 4 nodes)."""
MAX_NODES = 100_000
"""How many values (scalars, lists, mappings) a document may have, aliases expanded. PyYAML parses about 65,000
a second: this bounds the time a create spends in the parser, and what the master stores and decodes."""
MAX_DEPTH = 100
"""How deeply values may nest, aliases expanded (deeper ones exhaust Python's recursion when validated)."""
_MERGE_TAG = "tag:yaml.org,2002:merge"


class YAMLConfigError(ExperimentConfigError):
    """The text is not YAML we accept; `line` and `column` (1-based) say where, when known."""

    def __init__(self, problem: str, line: int | None = None, column: int | None = None) -> None:
        where = f" at line {line}, column {column}" if line is not None else ""
        super().__init__(f"invalid YAML{where}: {problem}")
        self.problem = problem
        self.line = line
        self.column = column

    @classmethod
    def at(cls, problem: str, mark: Any) -> YAMLConfigError:
        if mark is None:
            return cls(problem)
        return cls(problem, mark.line + 1, mark.column + 1)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML silently keeps the last one) and does not read
    ``1:30:00`` as the YAML 1.1 base-60 integer 5400 (YAML 1.2 dropped that; here it stays a string, so a
    Slurm time limit written without quotes means what it looks like). Floats follow YAML 1.2, so ``1e-3`` is
    a number (PyYAML's YAML 1.1 rules make it a string).

    It also counts what aliases expand to while composing (before anything is constructed): each node's
    expanded size is remembered, and an alias adds its anchor's expanded size to the document's total."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._expanded_size: dict[int, int] = {}  # id(node) -> nodes in it once aliases are expanded
        self._alias_nodes = 0  # nodes repeated by aliases so far
        self._composed_nodes = 0  # nodes composed so far, aliases counted expanded
        self._written_keys: dict[int, set[int]] = {}  # id(mapping node) -> ids of the key nodes written in it
        self._depth = 0  # how many collections enclose the node being composed
        self._height: dict[int, int] = {}  # id(node) -> levels of nesting in it once aliases are expanded

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            return self._compose_alias(parent, index)
        if self._depth >= MAX_DEPTH:
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise YAMLConfigError.at(f"nested deeper than {MAX_DEPTH} levels", mark)
        before = self._composed_nodes
        self._depth += 1
        node: Any = super().compose_node(parent, index)
        self._depth -= 1
        self._composed_nodes += 1
        if self._composed_nodes > MAX_NODES:
            raise YAMLConfigError.at(f"the document has more than {MAX_NODES:,} values", node.start_mark)
        self._expanded_size[id(node)] = self._composed_nodes - before
        self._height[id(node)] = 1 + max((self._height[id(c)] for c in _children(node)), default=0)
        if isinstance(node, yaml.MappingNode):  # its own keys, before merges add others' (flatten_mapping)
            self._written_keys[id(node)] = {id(k) for k, _ in node.value if k.tag != _MERGE_TAG}
        return node

    def _compose_alias(self, parent: Any, index: Any) -> Any:
        """The anchored node an alias refers to, counted as expanded (size, alias total and depth bounded)."""
        event = self.peek_event()  # type: ignore[no-untyped-call]
        node: Any = super().compose_node(parent, index)  # the anchored node (or "undefined alias")
        size = self._expanded_size.get(id(node))
        if size is None:
            raise YAMLConfigError.at(
                f"the alias *{event.anchor} refers to a node that contains it (recursive alias)",
                event.start_mark,
            )
        self._alias_nodes += size
        if self._alias_nodes > MAX_ALIAS_NODES:
            raise YAMLConfigError.at(
                f"the alias *{event.anchor} expands the document past the limit of "
                f"{MAX_ALIAS_NODES:,} nodes repeated by aliases (an alias bomb?); write the values out "
                "or use fewer, smaller aliases",
                event.start_mark,
            )
        if self._depth + self._height[id(node)] > MAX_DEPTH:
            raise YAMLConfigError.at(
                f"the alias *{event.anchor} nests the document deeper than {MAX_DEPTH} levels",
                event.start_mark,
            )
        self._composed_nodes += size
        return node


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


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
    """A key written twice in one mapping is an error; a key written next to a ``<<: *base`` merge overrides
    the merged one (YAML's merge rule), as a later merged mapping's key does an earlier one's."""
    written = loader._written_keys.get(id(node))
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    seen: set[Any] = set()
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise YAMLConfigError.at("a mapping key must be a plain value", key_node.start_mark) from None
        if written is None or id(key_node) in written:
            if key in seen:
                raise YAMLConfigError.at(f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def check_config_size(text: str | bytes, limit_bytes: int = MAX_CONFIG_BYTES) -> None:
    """Refuse a config text over `limit_bytes` (counted in UTF-8), naming the limit."""
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > limit_bytes:
        raise config_error(
            f"the config is {_mib(size)}, over the limit of {_mib(limit_bytes)} ({limit_bytes:,} bytes)"
        )


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB".replace(".0 MiB", " MiB")


def load_yaml(text: str | bytes) -> Any:
    """Parse YAML text of at most `MAX_CONFIG_BYTES` whose aliases repeat at most `MAX_ALIAS_NODES` nodes.

    Errors are `ExperimentConfigError`s (`YAMLConfigError` when the text is not acceptable YAML, with the
    1-based line and column)."""
    check_config_size(text)
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except ExperimentConfigError:
        raise
    except yaml.MarkedYAMLError as exc:
        problem = exc.problem or exc.context or "could not parse"
        raise YAMLConfigError.at(problem, exc.problem_mark or exc.context_mark) from None
    except yaml.YAMLError as exc:
        raise YAMLConfigError(str(exc)) from None
