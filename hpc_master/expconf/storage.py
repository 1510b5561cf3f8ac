"""The `checkpoint_storage:` section: `shared_fs` and `directory`. Object stores are rejected for now.

As in Determined, `type` is *eventually* required: a section that sets only the garbage-collection fields
(``{save_trial_latest: 5}``, as Determined's own examples do) parses as a `PartialStorage` and is merged into the
master's default storage when the experiment is created (`complete.merge_defaults`); a config that still has no
`type` after that merge is refused naming `checkpoint_storage.type`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from hpc_master.expconf._base import StrictModel
from hpc_master.expconf._errors import UNION_TAGS, custom_error, describe

STORAGE_TYPES = ("shared_fs", "directory")
PARTIAL_TAG = "partial"  # the union member of a section with no `type` (not a type a user can write)
UNION_TAGS.update(STORAGE_TYPES)
UNION_TAGS.add(PARTIAL_TAG)
UNSUPPORTED_STORAGE = ("s3", "gcs", "azure", "hdfs")

NonNegativeInt = Annotated[int, Field(ge=0)]


class _StorageBase(StrictModel):
    save_experiment_best: NonNegativeInt = 0
    save_trial_best: NonNegativeInt = 1
    save_trial_latest: NonNegativeInt = 1


GC_FIELDS = tuple(_StorageBase.model_fields)


class PartialStorage(_StorageBase):
    """A section with no `type`: only the GC fields, merged into the master's default storage at create."""


class SharedFSStorage(_StorageBase):
    """Checkpoints under ``host_path/storage_path`` on a filesystem every node mounts."""

    type: Literal["shared_fs"]
    host_path: str
    storage_path: str | None = None
    propagation: str = "rprivate"
    container_path: str | None = None
    checkpoint_path: str | None = None
    tensorboard_path: str | None = None

    @field_validator("host_path")
    @classmethod
    def _abs(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"must be an absolute path, got {v!r}")
        return v

    @model_validator(mode="after")
    def _storage_under_host(self) -> SharedFSStorage:
        sp = self.storage_path
        if sp is not None and posixpath.isabs(sp):
            host = posixpath.normpath(self.host_path)
            if posixpath.commonpath([host, posixpath.normpath(sp)]) != host:
                raise custom_error(
                    f"must be a relative directory or a subdirectory of host_path ({self.host_path})",
                    ["storage_path"],
                )
        elif sp is not None and posixpath.normpath(sp).startswith(".."):
            raise custom_error("must stay inside host_path (no leading ..)", ["storage_path"])
        return self

    @property
    def root(self) -> str:
        """The directory checkpoints go to, as seen on the hosts."""
        if self.storage_path is None:
            return self.host_path
        return posixpath.normpath(posixpath.join(self.host_path, self.storage_path))


class DirectoryStorage(_StorageBase):
    """Checkpoints in a directory as the trial sees it (usually a bind mount of a shared filesystem)."""

    type: Literal["directory"]
    container_path: str

    @field_validator("container_path")
    @classmethod
    def _abs(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"must be an absolute path, got {v!r}")
        return v


def _storage_tag(value: Any) -> str | None:
    if isinstance(value, PartialStorage):
        return PARTIAL_TAG
    if isinstance(value, _StorageBase):
        return str(getattr(value, "type", None))
    if isinstance(value, Mapping):
        if value.get("type") is None:
            return PARTIAL_TAG
        if value["type"] in STORAGE_TYPES:
            return str(value["type"])
    return None


CheckpointStorage = Annotated[
    Union[  # noqa: UP007 - Annotated tags need the explicit Union
        Annotated[SharedFSStorage, Tag("shared_fs")],
        Annotated[DirectoryStorage, Tag("directory")],
        Annotated[PartialStorage, Tag(PARTIAL_TAG)],
    ],
    Discriminator(_storage_tag),
]
AnyStorage = SharedFSStorage | DirectoryStorage


def check_storage_type(raw: Any, path: list[str | int]) -> None:
    """Clear errors for a missing, unsupported or unknown storage type (before pydantic sees it)."""
    if raw is None:
        return
    if not isinstance(raw, Mapping):
        raise custom_error(f"expected a mapping with a type, got {describe(raw)}", path)
    kind = raw.get("type")
    allowed = "expected 'shared_fs' or 'directory'"
    if kind is None:
        other = [k for k in raw if k not in GC_FIELDS and k != "type"]
        if other:
            raise custom_error(
                f"missing required field; {allowed} (without a type, checkpoint_storage may set only "
                + ", ".join(GC_FIELDS)
                + f", which merge with the master's storage; {other[0]!r} needs a type)",
                [*path, "type"],
            )
        return
    if kind in UNSUPPORTED_STORAGE:
        raise custom_error(
            f"checkpoint storage type {kind!r} is not supported yet; {allowed}", [*path, "type"]
        )
    if kind not in STORAGE_TYPES:
        raise custom_error(f"unknown checkpoint storage type {kind!r}; {allowed}", [*path, "type"])
