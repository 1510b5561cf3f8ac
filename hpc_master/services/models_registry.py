"""The model registry, as Determined's: named models, each a numbered list of versions, each a checkpoint.

Who may do what (as in Determined, less its RBAC): any user lists and reads models and versions; a model's
owner (its creator) or an admin changes, archives or deletes it and its versions; registering a checkpoint
also takes the right to read it as one's own: its experiment is the user's (or the user is an admin), so no
one registers (and thereby keeps forever) another user's checkpoint. Per-trial tokens have no say here.

A registered checkpoint is never collected: the GC (``services.checkpoints.gc``) leaves out every checkpoint a version
points at, and ``DELETE /api/v1/checkpoints`` and experiment deletion refuse them (`refuse_registered`).
Registering locks the checkpoint's row and refuses one whose deletion is under way, and the GC's claim looks
at the versions again once it holds its rows, so a registration racing a collection loses one way or the
other, never both. Deleting a version (or its model) asks for a GC of the checkpoint's experiment: it is
collectible again under the experiment's policy.

Differences from Determined, on purpose: a model's version numbers are never reused (Determined's next
version is ``max + 1``, so deleting the latest and registering again reused its number); a name is unique
regardless of case by a unique key (Determined checks before inserting); errors are 400/403/404/409 with a
code, not 500s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, delete, func, select
from sqlalchemy.orm import Session

from hpc_master.db.models import (
    CheckpointModel,
    ExperimentModel,
    ModelVersionModel,
    RegistryModel,
    TrialModel,
    UserModel,
    utcnow,
)
from hpc_master.errors import ClientError, ConflictError, NotFoundError
from hpc_master.services import access, workspaces
from hpc_master.services.access import Action, Principal
from hpc_master.services.checkpoints.views import CheckpointView, views_by_uuid
from hpc_master.services.lifecycle import request_checkpoint_gc

NAME_MAX_CHARS = 256
WORKSPACE_ID = workspaces.DEFAULT_ID
WORKSPACE_NAME = workspaces.DEFAULT_NAME
"""Determined's default workspace: every model is in it (``services.workspaces``)."""
_ID_RE = re.compile(r"[0-9]+")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")

MODEL_SORTS = {
    "SORT_BY_UNSPECIFIED": "id",
    "SORT_BY_NAME": "name",
    "SORT_BY_DESCRIPTION": "description",
    "SORT_BY_CREATION_TIME": "creation_time",
    "SORT_BY_LAST_UPDATED_TIME": "last_updated_time",
    "SORT_BY_NUM_VERSIONS": "num_versions",
    "SORT_BY_WORKSPACE": "workspace",
}
"""Determined's ``GetModelsRequest.SortBy`` (by name; its numbers are taken too, as grpc-gateway does)."""
MODEL_SORT_NUMBERS = {"0": "SORT_BY_UNSPECIFIED", "1": "SORT_BY_NAME", "2": "SORT_BY_DESCRIPTION",
                      "4": "SORT_BY_CREATION_TIME", "5": "SORT_BY_LAST_UPDATED_TIME",
                      "6": "SORT_BY_NUM_VERSIONS", "7": "SORT_BY_WORKSPACE"}  # fmt: skip
VERSION_SORTS = {"SORT_BY_UNSPECIFIED": "version", "SORT_BY_VERSION": "version",
                 "SORT_BY_CREATION_TIME": "creation_time"}  # fmt: skip
VERSION_SORT_NUMBERS = {"0": "SORT_BY_UNSPECIFIED", "3": "SORT_BY_VERSION", "4": "SORT_BY_CREATION_TIME"}
ORDERS = {"ORDER_BY_UNSPECIFIED": False, "ORDER_BY_ASC": False, "ORDER_BY_DESC": True}
ORDER_NUMBERS = {"0": "ORDER_BY_UNSPECIFIED", "1": "ORDER_BY_ASC", "2": "ORDER_BY_DESC"}


# ---------------------------------------------------------------- names, lookups, rights


def name_key(name: str) -> str:
    return name.casefold()


def check_model_name(name: str, field: str = "name") -> str:
    """Determined's rules (not blank, no runs of spaces, no slashes, not only digits: a number names a model
    by id), plus: no control characters, no leading or trailing spaces, at most 256 characters."""
    if not name.strip():
        raise ClientError("model names cannot be blank", field=field)
    if len(name) > NAME_MAX_CHARS:
        raise ClientError(f"model names are at most {NAME_MAX_CHARS} characters", field=field)
    if name != name.strip() or "  " in name:
        raise ClientError("model names cannot have leading, trailing or repeated spaces", field=field)
    if "/" in name or "\\" in name:
        raise ClientError("model names cannot have slashes", field=field)
    if _CONTROL_RE.search(name):
        raise ClientError("model names cannot have control characters", field=field)
    if _ID_RE.fullmatch(name):
        raise ClientError(
            "model names cannot be only numbers (a number names a model by its id)", field=field
        )
    return name


def find_model(session: Session, identifier: str, *, for_update: bool = False) -> RegistryModel:
    """A model by id (all digits) or by name (regardless of case), as Determined's ``modelName`` path."""
    model: RegistryModel | None = None
    if "\x00" in identifier:  # in no name (PostgreSQL would refuse the query)
        pass
    elif _ID_RE.fullmatch(identifier):
        number = int(identifier)
        if 0 < number < 2**31:
            model = session.get(RegistryModel, number, with_for_update=for_update)
    else:
        stmt = select(RegistryModel).where(RegistryModel.name_key == name_key(identifier))
        model = session.scalar(stmt.with_for_update() if for_update else stmt)
    if model is None:
        raise NotFoundError(f"model {identifier!r} not found")
    return model


def _check_not_archived(model: RegistryModel, doing: str) -> None:
    if model.archived:
        raise ConflictError(f"model {model.name!r} is archived: unarchive it to {doing}", code="archived")


def _check_name_free(session: Session, name: str, except_id: int | None = None) -> None:
    other = session.scalar(select(RegistryModel.id).where(RegistryModel.name_key == name_key(name)))
    if other is not None and other != except_id:
        raise ConflictError(
            f"a model named {name!r} already exists (names are unique regardless of case)",
            code="already_exists", field="name",
        )  # fmt: skip


def parse_sort(value: str | None, names: Mapping[str, object], numbers: Mapping[str, str], field: str) -> str:
    """A Determined enum given by name (``SORT_BY_NAME``, or ``NAME``) or number; returns its full name."""
    if value is None or value == "":
        return next(iter(names))
    raw = value.strip().upper()
    for candidate in (numbers.get(raw), raw, f"SORT_BY_{raw}", f"ORDER_BY_{raw}"):
        if candidate in names:
            return str(candidate)
    raise ClientError(f"unknown value {value[:40]!r}; one of {', '.join(names)}", field=field)


# ---------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelView:
    model: RegistryModel
    username: str
    num_versions: int


def model_views(session: Session, models: Sequence[RegistryModel]) -> list[ModelView]:
    ids = [m.id for m in models]
    counts: dict[int, int] = {}
    if ids:
        counts = {
            int(model_id): int(n)
            for model_id, n in session.execute(
                select(ModelVersionModel.model_id, func.count())
                .where(ModelVersionModel.model_id.in_(ids))
                .group_by(ModelVersionModel.model_id)
            ).all()
        }
    names = _usernames(session, {m.user_id for m in models})
    return [ModelView(m, names.get(m.user_id, ""), counts.get(m.id, 0)) for m in models]


def _usernames(session: Session, user_ids: Collection[int]) -> dict[int, str]:
    if not user_ids:
        return {}
    rows = session.execute(select(UserModel.id, UserModel.username).where(UserModel.id.in_(list(user_ids))))
    return {int(i): str(name) for i, name in rows.all()}


def create_model(
    session: Session,
    principal: Principal,
    *,
    name: str,
    description: str = "",
    metadata: dict[str, Any] | None = None,
    labels: Sequence[str] = (),
    notes: str = "",
) -> RegistryModel:
    principal.require_user()
    check_model_name(name)
    _check_name_free(session, name)
    now = utcnow()
    model = RegistryModel(
        name=name, name_key=name_key(name), description=description, metadata_=dict(metadata or {}),
        labels=list(dict.fromkeys(labels)), notes=notes, archived=False, user_id=principal.user_id,
        workspace_id=WORKSPACE_ID, last_version=0, creation_time=now, last_updated_time=now,
    )  # fmt: skip
    session.add(model)
    session.flush()
    return model


@dataclass(frozen=True)
class ModelQuery:
    """``GET /api/v1/models``' filters (Determined's): substrings of name and description (regardless of
    case), models carrying all `labels`, archived or not, by owner (names or ids), by id, by workspace."""

    sort_by: str | None = None
    order_by: str | None = None
    name: str = ""
    description: str = ""
    labels: Sequence[str] = ()
    archived: bool | None = None
    users: Sequence[str] = ()
    user_ids: Sequence[int] = ()
    model_id: int = 0
    workspace_names: Sequence[str] = ()
    workspace_ids: Sequence[int] = ()


def list_models(session: Session, query: ModelQuery) -> list[ModelView]:
    """Every model the filters keep, sorted (ties by id). Registries are small: filtered and sorted here,
    the same on every database (collations differ)."""
    sort = MODEL_SORTS[parse_sort(query.sort_by, MODEL_SORTS, MODEL_SORT_NUMBERS, "sortBy")]
    descending = ORDERS[parse_sort(query.order_by, ORDERS, ORDER_NUMBERS, "orderBy")]
    if _outside_workspace(query):
        return []
    stmt = _models_stmt(session, query)
    name, description = query.name.casefold(), query.description.casefold()
    wanted = set(query.labels)
    models = [
        m
        for m in session.scalars(stmt.order_by(RegistryModel.id))
        if name in m.name.casefold()
        and description in (m.description or "").casefold()
        and wanted <= set(m.labels or [])
    ]
    views = model_views(session, models)
    views.sort(key=lambda v: v.model.id, reverse=descending)
    views.sort(key=_MODEL_KEYS[sort], reverse=descending)  # stable: ties keep the id order
    return views


_MODEL_KEYS: dict[str, Callable[[ModelView], tuple[Any, ...]]] = {
    "id": lambda v: (0,),
    "name": lambda v: (v.model.name.casefold(), v.model.name),
    "description": lambda v: ((v.model.description or "").casefold(),),
    "creation_time": lambda v: (v.model.creation_time,),
    "last_updated_time": lambda v: (v.model.last_updated_time,),
    "num_versions": lambda v: (v.num_versions,),
    "workspace": lambda v: (v.model.workspace_id,),
}
"""The sort keys of the values of ``MODEL_SORTS``."""


def _outside_workspace(query: ModelQuery) -> bool:
    """Whether the query asks only for workspaces other than the one this master has."""
    return bool(
        (
            query.workspace_names
            and WORKSPACE_NAME.casefold() not in {n.casefold() for n in query.workspace_names}
        )
        or (query.workspace_ids and WORKSPACE_ID not in query.workspace_ids)
    )


def _models_stmt(session: Session, query: ModelQuery) -> Select[RegistryModel]:
    """The models the query's id, archived and owner filters keep (owners by name looked up here)."""
    stmt = select(RegistryModel)
    if query.model_id:
        stmt = stmt.where(RegistryModel.id == query.model_id)
    if query.archived is not None:
        stmt = stmt.where(RegistryModel.archived.is_(query.archived))
    owners: set[int] = set(query.user_ids)
    if query.users:
        names = [u for u in query.users if "\x00" not in u]
        owners |= set(session.scalars(select(UserModel.id).where(UserModel.username.in_(names))))
    if query.users or query.user_ids:
        stmt = stmt.where(RegistryModel.user_id.in_(sorted(owners)))
    return stmt


def model_labels(session: Session) -> list[str]:
    """Every label of every model, most used first (then by name)."""
    counts: dict[str, int] = {}
    for labels in session.scalars(select(RegistryModel.labels)):
        for label in labels or []:
            counts[label] = counts.get(label, 0) + 1
    return sorted(counts, key=lambda label: (-counts[label], label))


def patch_model(
    session: Session, principal: Principal, identifier: str, changes: Mapping[str, Any]
) -> RegistryModel:
    """Change a model's `name`, `description`, `metadata` (replaced), `labels` (replaced) or `notes`; the
    owner or an admin, not while archived (as Determined)."""
    model = find_model(session, identifier, for_update=True)
    access.model(principal, model)
    _check_not_archived(model, "change it")
    new_name = changes.get("name")
    if new_name is not None and new_name != model.name:
        check_model_name(new_name)
        _check_name_free(session, new_name, except_id=model.id)
        model.name, model.name_key = new_name, name_key(new_name)
    for field in ("description", "notes"):
        if changes.get(field) is not None:
            setattr(model, field, changes[field])
    if changes.get("metadata") is not None:
        model.metadata_ = dict(changes["metadata"])
    if changes.get("labels") is not None:
        model.labels = list(dict.fromkeys(changes["labels"]))
    model.last_updated_time = utcnow()
    session.flush()
    return model


def set_archived(session: Session, principal: Principal, identifier: str, archived: bool) -> None:
    model = find_model(session, identifier, for_update=True)
    access.model(principal, model)
    if model.archived != archived:
        model.archived = archived
        model.last_updated_time = utcnow()


def delete_model(session: Session, principal: Principal, identifier: str) -> None:
    """Delete a model and its versions (the owner or an admin); their checkpoints are collectible again."""
    model = find_model(session, identifier, for_update=True)
    access.model(principal, model)
    uuids = session.scalars(
        select(ModelVersionModel.checkpoint_uuid).where(ModelVersionModel.model_id == model.id)
    )
    _request_gc(session, set(uuids))
    session.execute(delete(ModelVersionModel).where(ModelVersionModel.model_id == model.id))
    session.delete(model)


def _request_gc(session: Session, uuids: Collection[str]) -> None:
    """Ask for a GC of the experiments of these (no longer registered) checkpoints."""
    if not uuids:
        return
    experiments = session.scalars(
        select(TrialModel.experiment_id)
        .join(CheckpointModel, CheckpointModel.trial_id == TrialModel.id)
        .where(CheckpointModel.uuid.in_(sorted(uuids)))
        .distinct()
    )
    for experiment_id in sorted(set(experiments)):
        request_checkpoint_gc(session, experiment_id)


# ---------------------------------------------------------------- versions


def register_version(
    session: Session,
    principal: Principal,
    identifier: str,
    checkpoint_uuid: str,
    *,
    name: str = "",
    comment: str = "",
    notes: str = "",
    metadata: dict[str, Any] | None = None,
    labels: Sequence[str] = (),
) -> tuple[RegistryModel, ModelVersionModel]:
    """Register a checkpoint as the model's next version: the model's owner or an admin, a checkpoint of
    the user's own experiment (admins: any), COMPLETED and not being deleted. The checkpoint's row is
    locked until the commit, so a GC that claims it afterwards sees the version (``checkpoint_gc.claim``)."""
    model = find_model(session, identifier, for_update=True)
    access.model(principal, model)
    _check_not_archived(model, "register versions")
    ckpt = session.get(CheckpointModel, checkpoint_uuid, with_for_update=True)
    if ckpt is None:
        raise NotFoundError(f"checkpoint {checkpoint_uuid} not found")
    owner_id = session.scalar(
        select(ExperimentModel.owner_id)
        .join(TrialModel, TrialModel.experiment_id == ExperimentModel.id)
        .where(TrialModel.id == ckpt.trial_id)
    )
    access.checkpoint(principal, checkpoint_uuid, ckpt.trial_id, owner_id or 0, Action.CHANGE)
    if ckpt.state != "COMPLETED":
        raise ConflictError(
            f"checkpoint {checkpoint_uuid} is {ckpt.state}; model versions must be COMPLETED checkpoints",
            field="checkpointUuid",
        )
    if ckpt.gc_retry_at is not None:
        raise ConflictError(
            f"checkpoint {checkpoint_uuid} is being deleted; it cannot be registered", field="checkpointUuid"
        )
    now = utcnow()
    model.last_version += 1
    model.last_updated_time = now
    version = ModelVersionModel(
        model_id=model.id, version=model.last_version, checkpoint_uuid=ckpt.uuid, name=name, comment=comment,
        notes=notes, metadata_=dict(metadata or {}), labels=list(dict.fromkeys(labels)),
        user_id=principal.user_id, creation_time=now, last_updated_time=now,
    )  # fmt: skip
    session.add(version)
    session.flush()
    return model, version


def list_versions(
    session: Session, identifier: str, *, sort_by: str | None = None, order_by: str | None = None
) -> tuple[RegistryModel, list[ModelVersionModel]]:
    model = find_model(session, identifier)
    sort = VERSION_SORTS[parse_sort(sort_by, VERSION_SORTS, VERSION_SORT_NUMBERS, "sortBy")]
    descending = ORDERS[parse_sort(order_by, ORDERS, ORDER_NUMBERS, "orderBy")]
    column = ModelVersionModel.version if sort == "version" else ModelVersionModel.creation_time
    order = [column.desc(), ModelVersionModel.id.desc()] if descending else [column, ModelVersionModel.id]
    versions = session.scalars(
        select(ModelVersionModel).where(ModelVersionModel.model_id == model.id).order_by(*order)
    )
    return model, list(versions)


def get_version(
    session: Session, identifier: str, number: int, *, for_update: bool = False
) -> tuple[RegistryModel, ModelVersionModel]:
    model = find_model(session, identifier, for_update=for_update)
    stmt = select(ModelVersionModel).where(
        ModelVersionModel.model_id == model.id, ModelVersionModel.version == number
    )
    version = session.scalar(stmt.with_for_update() if for_update else stmt)
    if version is None:
        raise NotFoundError(f"version {number} of model {model.name!r} not found")
    return model, version


def patch_version(
    session: Session, principal: Principal, identifier: str, number: int, changes: Mapping[str, Any]
) -> tuple[RegistryModel, ModelVersionModel]:
    """Change a version's `name`, `comment`, `notes`, `metadata` or `labels` (its checkpoint stays)."""
    model, version = get_version(session, identifier, number, for_update=True)
    access.model(principal, model)
    _check_not_archived(model, "change its versions")
    for field in ("name", "comment", "notes"):
        if changes.get(field) is not None:
            setattr(version, field, changes[field])
    if changes.get("metadata") is not None:
        version.metadata_ = dict(changes["metadata"])
    if changes.get("labels") is not None:
        version.labels = list(dict.fromkeys(changes["labels"]))
    version.last_updated_time = utcnow()
    session.flush()
    return model, version


def delete_version(session: Session, principal: Principal, identifier: str, number: int) -> None:
    """Delete a version (the model's owner or an admin); its checkpoint is collectible again, and a GC of
    its experiment is requested."""
    model, version = get_version(session, identifier, number, for_update=True)
    access.model(principal, model)
    uuid = version.checkpoint_uuid
    session.delete(version)
    model.last_updated_time = utcnow()
    session.flush()
    _request_gc(session, [uuid])


@dataclass(frozen=True)
class VersionView:
    version: ModelVersionModel
    model: ModelView
    checkpoint: CheckpointView
    username: str


def version_views(
    session: Session, model: RegistryModel, versions: Sequence[ModelVersionModel]
) -> list[VersionView]:
    """The versions with what their answers show: the model, the checkpoint (as every checkpoint route
    shows it: ``checkpoint_views``), the registering user's name."""
    (model_view,) = model_views(session, [model])
    checkpoints = views_by_uuid(session, [v.checkpoint_uuid for v in versions])
    names = _usernames(session, {v.user_id for v in versions})
    return [
        VersionView(v, model_view, checkpoints[v.checkpoint_uuid], names.get(v.user_id, "")) for v in versions
    ]


# ---------------------------------------------------------------- what the GC and deletions ask


def registered_checkpoints(session: Session, uuids: Iterable[str]) -> dict[str, list[tuple[str, int]]]:
    """Of these checkpoints, those a model version points at: {uuid: [(model name, version), ...]}."""
    wanted = sorted(set(uuids))
    out: dict[str, list[tuple[str, int]]] = {}
    for start in range(0, len(wanted), 1000):
        rows = session.execute(
            select(ModelVersionModel.checkpoint_uuid, RegistryModel.name, ModelVersionModel.version)
            .join(RegistryModel, RegistryModel.id == ModelVersionModel.model_id)
            .where(ModelVersionModel.checkpoint_uuid.in_(wanted[start : start + 1000]))
            .order_by(RegistryModel.name, ModelVersionModel.version)
        ).all()
        for uuid, model_name, version in rows:
            out.setdefault(uuid, []).append((model_name, int(version)))
    return out


def refuse_registered(session: Session, uuids: Iterable[str], refusal: str) -> None:
    """409 when any of these checkpoints is a model version, naming the first one's model and version and
    saying what is refused (`refusal`)."""
    registered = registered_checkpoints(session, uuids)
    if not registered:
        return
    uuid = min(registered)
    model_name, version = registered[uuid][0]
    more = f" (and {len(registered) - 1} more registered checkpoints)" if len(registered) > 1 else ""
    raise ConflictError(
        f"checkpoint {uuid} is version {version} of model {model_name!r} in the model registry{more}: "
        f"{refusal}; delete the model version first",
        code="registered",
    )
