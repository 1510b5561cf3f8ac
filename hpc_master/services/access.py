"""Who may do what: the one access policy. Every route's permission check is a call here (issue 42; teams,
issue 39, extend these functions: a workspace member's rights become one more case, not a new check per
route). ``tests/unit/test_access_policy.py`` fails on an ownership comparison anywhere else.

| what | view | change (pause, kill, delete, edit, labels, register, archive) |
|---|---|---|
| an experiment, its trials, metrics, checkpoints | every user (configs and hyperparameters with secret-looking values masked for others: ``redact``) | its owner, an admin |
| an experiment's code (``model_def``), its trials' logs and Determined's metrics streams | its owner, an admin | — |
| a model in the registry | every user | its owner, an admin |
| a command, notebook, shell, TensorBoard (and its proxy) | its owner, an admin (others: not found) | its owner, an admin |
| a user account | every user | the user (password, display name), an admin (anything) |

A per-trial token (a job's harness) acts only on its own trial (``trial``), and reads the checkpoints of its
experiment's owner (``checkpoint``). Admins may do everything a user may.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import Select, false
from sqlalchemy.orm import QueryableAttribute, object_session

from hpc_master.db.models import ExperimentModel, RegistryModel
from hpc_master.errors import NotFoundError, PermissionDeniedError
from hpc_master.services import audit


@dataclass(frozen=True)
class Principal:
    """Who is calling: a user, or the harness of one trial (``trial_id`` set)."""

    user_id: int
    username: str
    admin: bool
    trial_id: int | None = None

    def require_user(self) -> None:
        if self.trial_id is not None:
            raise PermissionDeniedError("a per-trial token can only call its own trial's harness routes")

    def require_admin(self) -> None:
        self.require_user()
        if not self.admin:
            raise PermissionDeniedError("only an admin can do this")


Query = TypeVar("Query", bound=Select)  # type: ignore[type-arg]  # any row shape


class Action(enum.Enum):
    VIEW = "view"
    CHANGE = "change"


def owns(principal: Principal, owner_id: int | None) -> bool:
    """`principal` is the owner, or an admin (a per-trial token never is)."""
    return principal.trial_id is None and (principal.admin or principal.user_id == owner_id)


def sees_secrets(principal: Principal, owner_id: int) -> bool:
    """Whether `principal` sees an experiment's config and hyperparameters unmasked (``redact``): its owner,
    the harness of one of the owner's trials, or an admin."""
    return principal.admin or principal.user_id == owner_id


def is_own(principal: Principal, owner_id: int | None) -> bool:
    """`principal` is the owner itself (an admin is not, here: the proxy's cookie reaches only one's own)."""
    return principal.trial_id is None and principal.user_id == owner_id


def experiment(principal: Principal, row: ExperimentModel, action: Action) -> None:
    """An experiment (and what is under it: trials, metrics, checkpoints). Raises ``PermissionDeniedError``."""
    principal.require_user()
    if action is Action.CHANGE:
        if not owns(principal, row.owner_id):
            raise PermissionDeniedError(f"experiment {row.id} belongs to another user")
        _audited(principal, row, row.owner_id, f"experiment {row.id}")


def experiment_private(principal: Principal, row: ExperimentModel) -> None:
    """What only an experiment's owner (and admins) read: its uploaded code (which may hold what others should
    not see), its trials' logs, and their metrics through Determined's metrics streams."""
    principal.require_user()
    if not owns(principal, row.owner_id):
        raise PermissionDeniedError(f"experiment {row.id} belongs to another user")
    _audited(principal, row, row.owner_id, f"experiment {row.id}")


def trial(principal: Principal, trial_id: int, owner_id: int, action: Action) -> None:
    """A trial through the harness routes: a per-trial token acts on its own trial only; a user token views
    any trial and changes (reports for) the trials of experiments it may change."""
    if principal.trial_id is not None:
        if principal.trial_id != trial_id:
            raise PermissionDeniedError(
                f"this token belongs to trial {principal.trial_id}, not trial {trial_id}"
            )
        return
    if action is Action.CHANGE and not owns(principal, owner_id):
        raise PermissionDeniedError(f"trial {trial_id} belongs to another user's experiment")


def checkpoint(principal: Principal, uuid: str, trial_id: int, owner_id: int, action: Action) -> None:
    """A checkpoint: a per-trial token reads its own trial's and its experiment owner's, and changes only its
    own trial's; a user reads any and changes (deletes, registers) those of experiments it may change."""
    if principal.trial_id is not None:
        same_trial = principal.trial_id == trial_id
        if not same_trial and (action is Action.CHANGE or principal.user_id != owner_id):
            raise PermissionDeniedError(f"this token cannot access checkpoint {uuid}")
        return
    if action is Action.CHANGE and not owns(principal, owner_id):
        raise PermissionDeniedError(
            f"checkpoint {uuid} belongs to another user's experiment: only its owner (or an admin) may change it"
        )


def model(principal: Principal, row: RegistryModel) -> None:
    """Changing a model of the registry (viewing needs no check beyond a user token)."""
    principal.require_user()
    if not owns(principal, row.user_id):
        raise PermissionDeniedError(f"model {row.name!r} belongs to another user")
    _audited(principal, row, row.user_id, f"model {row.name}")


def _audited(principal: Principal, row: object, owner_id: int | None, target: str) -> None:
    """An admin's action on another user's ``row`` goes into the audit log, in the row's transaction."""
    if principal.admin and owner_id != principal.user_id:
        audit.cross_user(
            object_session(row), actor_id=principal.user_id, actor=principal.username, owner_id=owner_id,
            target=target,
        )  # fmt: skip


def task_visible(principal: Principal, owner_id: int) -> bool:
    """A task (command, notebook, shell, TensorBoard): only its owner and admins know it exists."""
    return owns(principal, owner_id)


def user_account(principal: Principal, user_id: int, *, flags: bool) -> None:
    """Changing a user: their own password and display name (`flags` False), or anything (an admin)."""
    principal.require_user()
    if not principal.admin and (principal.user_id != user_id or flags):
        raise PermissionDeniedError("only an admin can change other users or user flags")


def may_change_user(principal: Principal, user_id: int) -> bool:
    return owns(principal, user_id)


def readable_experiment_root(principal: Principal, owner_id: int, experiment_id: int) -> None:
    """An experiment's files through a TensorBoard: its owner's and admins' only (others: not found)."""
    if not owns(principal, owner_id):
        raise NotFoundError(f"experiment {experiment_id} not found among yours")


def lists_everyone(principal: Principal) -> bool:
    """Whether `principal` may list every user's rows (an admin), or only its own."""
    return principal.trial_id is None and principal.admin


def only_own(
    query: Query, owner: QueryableAttribute[int], principal: Principal, *, everyone: bool = True
) -> Query:
    """`query` narrowed to the caller's rows (`owner`: the owner id column), unless the caller is an admin and
    asks for `everyone`'s."""
    if principal.trial_id is not None:
        return query.where(false())
    if principal.admin and everyone:
        return query
    return query.where(owner == principal.user_id)
