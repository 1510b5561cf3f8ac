"""The `environment:` section.

`image` and `environment_variables` take either one value for every device type or a mapping per device type
(``cpu``, ``cuda``, ``rocm``; Determined's older ``gpu`` key is accepted as ``cuda``). Both are normalised to
the per-device mapping. Kubernetes-only fields are dropped with a warning by the experiment parser.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator

from hpc_master.expconf._base import StrictModel
from hpc_master.expconf._errors import check_unknown_keys, custom_error, describe

DeviceType = Literal["cpu", "cuda", "rocm"]
DEVICE_TYPES: tuple[DeviceType, ...] = ("cpu", "cuda", "rocm")

# Accepted for compatibility and ignored, with a warning.
K8S_ONLY_ENVIRONMENT_FIELDS = (
    "pod_spec",
    "registry_auth",
    "add_capabilities",
    "drop_capabilities",
    "proxy_ports",
    "ports",
)

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _per_device(data: Any) -> Any:
    """Accept a per-device mapping (with `gpu` as an alias of `cuda`) or one value for all device types."""
    if isinstance(data, Mapping):
        check_unknown_keys(data, (*DEVICE_TYPES, "gpu"))
        out = {k: v for k, v in data.items() if k != "gpu" and v is not None}
        if data.get("gpu") is not None:
            if "cuda" in out:
                raise custom_error("give cuda or its old name gpu, not both", ["gpu"])
            out["cuda"] = data["gpu"]
        return out
    if data is not None and not isinstance(data, str | list):
        raise custom_error(
            f"expected a value or a mapping per device type (cpu, cuda, rocm), got {describe(data)}"
        )
    return {d: data for d in DEVICE_TYPES}


class ImageMap(StrictModel):
    """Container image per device type: `docker://…` / registry name (pulled once into a SIF cache) or a `.sif`."""

    cpu: str | None = None
    cuda: str | None = None
    rocm: str | None = None

    @classmethod
    def prepare(cls, data: Any) -> Any:
        return _per_device(data)

    def for_device(self, device: DeviceType) -> str | None:
        return getattr(self, device)  # type: ignore[no-any-return]


def _check_env_list(v: list[str]) -> list[str]:
    for i, item in enumerate(v):
        name = item.split("=", 1)[0]
        if "=" not in item or not _ENV_NAME_RE.match(name):
            raise custom_error(f"expected NAME=value, got {item!r}", [i])
    return v


class EnvironmentVariablesMap(StrictModel):
    """`NAME=value` strings per device type."""

    cpu: list[str] = Field(default_factory=list)
    cuda: list[str] = Field(default_factory=list)
    rocm: list[str] = Field(default_factory=list)

    @classmethod
    def prepare(cls, data: Any) -> Any:
        return _per_device(data)

    @field_validator("cpu", "cuda", "rocm")
    @classmethod
    def _pairs(cls, v: list[str]) -> list[str]:
        return _check_env_list(v)

    def for_device(self, device: DeviceType) -> dict[str, str]:
        """The variables for `device` as a dict (later entries win)."""
        items: list[str] = getattr(self, device)
        return dict(item.split("=", 1) for item in items)


class EnvironmentConfig(StrictModel):
    image: ImageMap | None = None
    environment_variables: EnvironmentVariablesMap = Field(default_factory=EnvironmentVariablesMap)
    force_pull_image: bool = False

    def image_for(self, device: DeviceType) -> str | None:
        return None if self.image is None else self.image.for_device(device)
