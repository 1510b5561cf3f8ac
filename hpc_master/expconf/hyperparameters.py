"""Hyperparameter spaces, Determined v0 shape.

A hyperparameter is one of:

- ``const``: a bare value (``lr: 0.1``) or ``{type: const, val: ...}``;
- ``int``: ``{type: int, minval, maxval, count?}`` (integers, ``minval <= maxval``);
- ``double``: ``{type: double, minval, maxval, count?}``;
- ``log``: ``{type: log, minval, maxval, base: 10, count?}``, the value is ``base ** U(minval, maxval)``;
- ``categorical``: ``{type: categorical, vals: [...]}`` (at least one value);
- a nested group: a mapping without a ``type`` key, whose values are hyperparameters again.

``count`` is the number of grid points, required by the grid searcher for int/double/log.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, RootModel, Tag, model_validator

from hpc_master.expconf._base import StrictModel
from hpc_master.expconf._errors import UNION_TAGS, custom_error

HP_TYPES = ("const", "int", "double", "log", "categorical")
NESTED_TAG = "<nested>"
UNION_TAGS.update(HP_TYPES)
UNION_TAGS.add(NESTED_TAG)


class ConstHP(StrictModel):
    keep_none = True  # `val: null` is a valid constant

    type: Literal["const"] = "const"
    val: Any

    @classmethod
    def prepare(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("type") == "const":
            return data
        return {"type": "const", "val": data}


def _check_range(lo: float, hi: float) -> None:
    if lo > hi:
        raise custom_error(f"minval ({lo}) must be <= maxval ({hi})", ["minval"])


class IntHP(StrictModel):
    type: Literal["int"]
    minval: int
    maxval: int
    count: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _range(self) -> IntHP:
        _check_range(self.minval, self.maxval)
        return self


class DoubleHP(StrictModel):
    type: Literal["double"]
    minval: float
    maxval: float
    count: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _range(self) -> DoubleHP:
        _check_range(self.minval, self.maxval)
        return self


class LogHP(StrictModel):
    """Values are ``base ** u`` for ``u`` in ``[minval, maxval]`` (the bounds are exponents)."""

    type: Literal["log"]
    minval: float
    maxval: float
    base: Annotated[float, Field(gt=0)] = 10.0
    count: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _range(self) -> LogHP:
        _check_range(self.minval, self.maxval)
        if self.base == 1:
            raise custom_error("must not be 1 (every exponent would give 1)", ["base"])
        return self


class CategoricalHP(StrictModel):
    type: Literal["categorical"]
    vals: Annotated[list[Any], Field(min_length=1)]


def _hp_tag(value: Any) -> str:
    if isinstance(value, StrictModel):
        return str(getattr(value, "type", "const"))
    if isinstance(value, NestedHP):
        return NESTED_TAG
    if isinstance(value, Mapping):
        kind = value.get("type")
        if kind is None:
            return NESTED_TAG
        return kind if isinstance(kind, str) else "<invalid>"
    return "const"


class NestedHP(RootModel[dict[str, "Hyperparameter"]]):
    """A group of hyperparameters (a mapping without `type`)."""


Hyperparameter = Annotated[
    Union[  # noqa: UP007 - Annotated tags need the explicit Union
        Annotated[ConstHP, Tag("const")],
        Annotated[IntHP, Tag("int")],
        Annotated[DoubleHP, Tag("double")],
        Annotated[LogHP, Tag("log")],
        Annotated[CategoricalHP, Tag("categorical")],
        Annotated[NestedHP, Tag(NESTED_TAG)],
    ],
    Discriminator(
        _hp_tag,
        custom_error_type="config_error",
        custom_error_message=(
            "unknown hyperparameter type; expected one of 'const', 'int', 'double', 'log', 'categorical' "
            "(or a mapping without `type` for a nested group)"
        ),
        custom_error_context={"subpath": ["type"]},
    ),
]
NestedHP.model_rebuild()

LeafHP = ConstHP | IntHP | DoubleHP | LogHP | CategoricalHP


def iter_leaves(
    hps: Mapping[str, Any], prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], LeafHP]]:
    """Yield (path, leaf) for every non-group hyperparameter, depth first, in file order."""
    for name, hp in hps.items():
        if isinstance(hp, NestedHP):
            yield from iter_leaves(hp.root, (*prefix, name))
        else:
            yield (*prefix, name), hp


def hyperparameters_to_dict(hps: Mapping[str, Any]) -> dict[str, Any]:
    """Determined's shape: every leaf as ``{type: ..., ...}``, groups as plain mappings, no nulls."""
    out: dict[str, Any] = {}
    for name, hp in hps.items():
        if isinstance(hp, NestedHP):
            out[name] = hyperparameters_to_dict(hp.root)
        elif isinstance(hp, ConstHP):
            out[name] = {"type": "const", "val": hp.val}
        else:
            out[name] = hp.model_dump(mode="json", exclude_none=True)
    return out


def grid_missing_count(hps: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The path of the first int/double/log hyperparameter without `count` (the grid searcher needs it)."""
    for path, hp in iter_leaves(hps):
        if isinstance(hp, IntHP | DoubleHP | LogHP) and hp.count is None:
            return path
    return None


def const_value(hps: Mapping[str, Any], name: str) -> Any:
    """The value of top-level constant `name`, or None when absent or not a constant."""
    hp = hps.get(name)
    return hp.val if isinstance(hp, ConstHP) else None
