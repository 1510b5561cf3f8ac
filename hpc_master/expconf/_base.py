"""The base of every config model (experiment, task, and master: `masterconf.StrictModel` relaxes the types):
strict types, unknown keys rejected with "did you mean"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

from hpc_master.expconf._errors import check_unknown_keys


class StrictModel(BaseModel):
    """Strict config model.

    - Unknown keys are rejected with the closest valid key (checked before pydantic's own ``extra="forbid"``).
    - A key set to ``null`` means "not set" (as in Determined's schemas, where every optional field is
      nullable and null means the default); models whose fields may legitimately hold null opt out with
      ``keep_none = True``.
    - Types are strict: ``"5"`` is not an integer, ``1`` is not a boolean (an integer is a valid number).
    """

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=False)

    keep_none: ClassVar[bool] = False

    @classmethod
    def valid_keys(cls) -> set[str]:
        return {f.alias or name for name, f in cls.model_fields.items()}

    @classmethod
    def prepare(cls, data: Any) -> Any:
        """Hook: reshape raw input (e.g. a bare value into a mapping) before keys are checked."""
        return data

    @model_validator(mode="before")
    @classmethod
    def _check_keys(cls, data: Any) -> Any:
        data = cls.prepare(data)
        if isinstance(data, Mapping):
            check_unknown_keys(data, cls.valid_keys())
            if not cls.keep_none:
                data = {k: v for k, v in data.items() if v is not None}
        return data
