"""Turn pydantic's ValidationError into one ConfigError that names the YAML path.

Paths are dotted, list indices are written ``[0]``: ``bind_mounts[0].host_path``. Unknown keys are reported
with the closest valid key (difflib), e.g. "`searcher.max_trails`: unknown field; did you mean `max_trials`?".

Pydantic puts the tag of a discriminated union into the error location (``searcher.adaptive_asha.max_trials``).
We drop such segments by walking the location alongside the input: a segment that is a known tag and not a key
of the input at that level is a tag, not a field.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from hpc_master.errors import ConfigError

# Tags of every discriminated union in the package (hyperparameter types, searcher names, storage types).
UNION_TAGS: set[str] = set()

# Error type of our own "this key is not a field here" errors.
UNKNOWN_FIELD = "unknown_field"
# Error type of our own errors whose message is final; ctx may carry "subpath" (appended to the location).
CONFIG_ERROR = "config_error"


class ExperimentConfigError(ConfigError):
    """A ConfigError for experiment configs; `str()` quotes the YAML path: "`searcher.metric`: ..."."""

    def __str__(self) -> str:
        if self.field:
            return f"`{self.field}`: {self.message}"
        return self.message


def config_error(message: str, field: str | None = None) -> ExperimentConfigError:
    return ExperimentConfigError(message, field=field or None)


def custom_error(message: str, subpath: Sequence[str | int] = ()) -> PydanticCustomError:
    """An error raised inside a validator; `subpath` is appended to the validator's location."""
    return PydanticCustomError(CONFIG_ERROR, message, {"subpath": list(subpath)})


def unknown_field_message(key: str, valid: Iterable[str]) -> str:
    valid = sorted(valid)
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if close:
        return f"unknown field; did you mean `{close[0]}`?"
    return "unknown field; expected one of " + ", ".join(f"`{v}`" for v in valid)


def check_unknown_keys(data: Mapping[Any, Any], valid: Iterable[str]) -> None:
    """Raise a pydantic custom error for the first key of `data` that is not in `valid`."""
    valid_set = set(valid)
    for key in data:
        if key not in valid_set:
            raise PydanticCustomError(
                UNKNOWN_FIELD,
                "unknown field",
                {"field": str(key), "message": unknown_field_message(str(key), valid_set)},
            )


def format_path(loc: Sequence[str | int]) -> str:
    out = ""
    for seg in loc:
        if isinstance(seg, int):
            out += f"[{seg}]"
        else:
            out += ("." if out else "") + str(seg)
    return out


def describe(value: Any) -> str:
    """Describe a YAML value the way a user wrote it: `string '5'`, `list`, `null`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean " + ("true" if value else "false")
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"string {shown!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _strip_tags(loc: Sequence[str | int], data: Any) -> list[str | int]:
    """Drop discriminated-union tags from `loc` by walking `data` along it."""
    out: list[str | int] = []
    cur = data
    for seg in loc:
        keep, cur = _follow(cur, seg)
        if keep:
            out.append(seg)
    return out


def _follow(cur: Any, seg: str | int) -> tuple[bool, Any]:
    """Whether `seg` stays in the path (not a union tag), and what it leads to in `cur` (None: off the data)."""
    if isinstance(cur, Mapping):
        if seg in cur:
            return True, cur[seg]
        if _is_union_tag(seg):
            return False, cur
        return True, None
    if isinstance(cur, list | tuple) and isinstance(seg, int) and 0 <= seg < len(cur):
        return True, cur[seg]
    if _is_union_tag(seg) and cur is not None:
        return False, cur
    return True, None


def _is_union_tag(seg: str | int) -> bool:
    return isinstance(seg, str) and seg in UNION_TAGS


_TYPE_WORDS = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


_BOUNDS = (
    ("greater_than_equal", "ge", ">="),
    ("greater_than", "gt", ">"),
    ("less_than_equal", "le", "<="),
    ("less_than", "lt", "<"),
)


def _num(value: Any) -> str:
    """1.0 -> "1" (bounds of float fields are floats even when the user thinks in integers)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value)


# Error kinds whose message does not depend on the error.
_FIXED_MESSAGES = {
    "missing": "missing required field",
    "too_short": "must not be empty",
    "extra_forbidden": "unknown field",
}


def _message(err: Mapping[str, Any]) -> str:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    value = err.get("input")
    if kind in _FIXED_MESSAGES:
        return _FIXED_MESSAGES[kind]
    if kind in _TYPE_WORDS:
        return f"expected {_TYPE_WORDS[kind]}, got {describe(value)}"
    if kind == "literal_error":
        return f"expected one of {ctx.get('expected')}, got {describe(value)}"
    for bound_kind, key, op in _BOUNDS:
        if kind == bound_kind:
            return f"must be {op} {_num(ctx.get(key))}, got {value!r}"
    if kind == "value_error":
        return str(ctx.get("error", err.get("msg", "")))
    if kind == UNKNOWN_FIELD:
        return str(ctx["message"])
    return str(err.get("msg", kind))


def to_config_error(
    exc: ValidationError, data: Any, prefix: Sequence[str | int] = ()
) -> ExperimentConfigError:
    """Convert the first error of `exc` (raised validating `data`) into an ExperimentConfigError."""
    err = exc.errors(include_url=False)[0]
    loc = _strip_tags(err["loc"], data)
    ctx = err.get("ctx") or {}
    if err["type"] == UNKNOWN_FIELD:
        loc.append(ctx["field"])
    loc.extend(ctx.get("subpath", ()))
    return config_error(_message(err), format_path([*prefix, *loc]))
