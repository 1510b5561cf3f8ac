"""Training lengths (`{batches: N}`, `{records: N}`, `{epochs: N}`) and conversions between their units.

Conversions need ``hyperparameters.global_batch_size`` (records per batch) and the top-level
``records_per_epoch``; when one is missing the error says exactly which. Conversions round *up*, so a trial
trains at least the length that was asked for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ValidationError, model_serializer, model_validator

from hpc_master.expconf._base import StrictModel
from hpc_master.expconf._errors import config_error, custom_error, to_config_error, unknown_field_message

Unit = Literal["records", "batches", "epochs"]
UNITS: tuple[Unit, ...] = ("records", "batches", "epochs")

_LENGTH_SHAPE = "expected a mapping with exactly one of `batches`, `records`, `epochs`, e.g. {batches: 1000}"


class Length(StrictModel):
    """A training length. In YAML it is a one-key mapping; in Python `.unit` and `.value`."""

    unit: Unit
    value: int

    @classmethod
    def of(cls, unit: Unit, value: int) -> Length:
        return cls.model_validate({unit: value})

    @model_validator(mode="before")
    @classmethod
    def _check_keys(cls, data: Any) -> Any:
        if isinstance(data, Length):
            return data
        if not isinstance(data, Mapping) or len(data) != 1:
            raise custom_error(_LENGTH_SHAPE)
        ((key, value),) = data.items()
        if key not in UNITS:
            raise custom_error(unknown_field_message(str(key), UNITS), [str(key)])
        if not isinstance(value, int) or isinstance(value, bool):
            raise custom_error(f"expected an integer, got {type(value).__name__} {value!r}", [key])
        if value < 0:
            raise custom_error(f"must be >= 0, got {value}", [key])
        return {"unit": key, "value": value}

    @model_serializer
    def _dump(self) -> dict[str, int]:
        return {self.unit: self.value}

    def to_dict(self) -> dict[str, int]:
        return {self.unit: self.value}


def _need(what: str, unit: str, to_unit: str, field: str | None) -> Exception:
    return config_error(f"{unit} need {what} to convert to {to_unit}", field)


def convert_length(
    value: int,
    from_unit: Unit,
    to_unit: Unit,
    *,
    global_batch_size: int | None,
    records_per_epoch: int | None,
    field: str | None = None,
) -> int:
    """Convert `value` `from_unit` into `to_unit`, rounding up.

    `global_batch_size` and `records_per_epoch` are only needed when the conversion goes through them; a value
    of None or 0 means unknown. Raises ExperimentConfigError naming `field` and the missing setting.
    """
    if from_unit == to_unit:
        return value
    gbs = global_batch_size or None
    rpe = records_per_epoch or None
    records = _into_records(value, from_unit, to_unit, gbs, rpe, field)
    return _out_of_records(records, from_unit, to_unit, gbs, rpe, field)


_GBS_NAME = "hyperparameters.global_batch_size"
_RPE_NAME = "records_per_epoch (top-level)"


def _into_records(
    value: int, from_unit: Unit, to_unit: Unit, gbs: int | None, rpe: int | None, field: str | None
) -> int:
    """Step 1 of `convert_length`: `value` `from_unit` in records."""
    if from_unit == "records":
        return value
    if from_unit == "batches":
        if gbs is None:
            raise _need(_GBS_NAME, "batches", to_unit, field)
        return value * gbs
    if rpe is None:
        raise _need(_RPE_NAME, "epochs", to_unit, field)
    return value * rpe


def _out_of_records(
    records: int, from_unit: Unit, to_unit: Unit, gbs: int | None, rpe: int | None, field: str | None
) -> int:
    """Step 2 of `convert_length`: `records` in `to_unit`, rounded up."""
    if to_unit == "records":
        return records
    if to_unit == "batches":
        if gbs is None:
            raise _need(_GBS_NAME, from_unit, to_unit, field)
        return math.ceil(records / gbs)
    if rpe is None:
        raise _need(_RPE_NAME, from_unit, to_unit, field)
    return math.ceil(records / rpe)


def length_in(
    length: Length | Mapping[str, int],
    to_unit: Unit,
    *,
    global_batch_size: int | None,
    records_per_epoch: int | None,
    field: str | None = None,
) -> int:
    """`convert_length` for a Length or a plain `{unit: N}` mapping."""
    if not isinstance(length, Length):
        try:
            length = Length.model_validate(dict(length))
        except ValidationError as exc:
            raise to_config_error(exc, dict(length), field.split(".") if field else ()) from None
    return convert_length(
        length.value,
        length.unit,
        to_unit,
        global_batch_size=global_batch_size,
        records_per_epoch=records_per_epoch,
        field=field,
    )
