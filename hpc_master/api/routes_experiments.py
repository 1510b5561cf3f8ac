"""Experiments: create, list, get, actions, trials (their checkpoints: ``routes_checkpoints``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select
from sqlalchemy.orm import Session

from hpc_master.api import convert, responses
from hpc_master.api.bounds import Id, Limit, Offset
from hpc_master.api.deps import State, UserPrincipal
from hpc_master.api.schemas import CreateExperimentRequest
from hpc_master.db.models import ExperimentModel, TrialModel, utcnow
from hpc_master.errors import ClientError, ConflictError
from hpc_master.services import experiment_list, models_registry, notify, workspaces
from hpc_master.services import experiments as exps
from hpc_master.services.access import Principal
from hpc_master.services.checkpoints import gc
from hpc_master.services.checkpoints.usage import StorageTotals, experiment_totals, trial_totals_of_experiment
from hpc_master.services.common import get_or_404
from hpc_master.services.lifecycle import set_experiment_state
from hpc_master.services.states import ExperimentState

router = APIRouter(prefix="/api/v1", tags=["experiments"])


def _trial_ids(session: Session, experiment_id: int) -> list[int]:
    return _trial_ids_of(session, [experiment_id])[experiment_id]


def _trial_ids_of(session: Session, experiment_ids: list[int]) -> dict[int, list[int]]:
    """Each experiment's trial ids, ascending, in one query (a list page made one per experiment)."""
    out: dict[int, list[int]] = {e: [] for e in experiment_ids}
    for start in range(0, len(experiment_ids), 500):  # bounded IN lists (SQLite's variable limit)
        chunk = experiment_ids[start : start + 500]
        rows = session.execute(
            select(TrialModel.experiment_id, TrialModel.id)
            .where(TrialModel.experiment_id.in_(chunk))
            .order_by(TrialModel.experiment_id, TrialModel.id)
        )
        for experiment_id, trial_id in rows:
            out[experiment_id].append(trial_id)
    return out


@router.post("/experiments", response_model=responses.CreatedExperiment)
def create_experiment(
    body: CreateExperimentRequest, principal: UserPrincipal, state: State
) -> dict[str, Any]:
    if body.template:
        raise ClientError(
            "this master has no config templates: put the settings in the experiment config "
            "(or pass them with --config)",
            code="not_supported",
            field="template",
        )
    if body.project_id not in (None, 0):
        workspaces.require_default("project", body.project_id)
    with state.tx() as session:
        experiment, parsed = exps.create_experiment(
            session,
            principal,
            config_text=body.config,
            model_definition=[f.model_dump(by_alias=False) for f in body.model_definition],
            activate=body.activate,
            parent_id=body.parent_id or None,
            validate_only=body.validate_only,
            master=state.config,
        )
        # ``warnings`` is Determined's ``LaunchWarning`` enum, which Determined's client parses (an unknown
        # value fails it after the experiment was created): none of hpc-det's. The config's warnings (parts
        # of it ignored on Slurm) are ``configWarnings``; hpc-det's ``det`` finds them when it checks the
        # config locally, before it posts.
        warnings = {"warnings": [], "configWarnings": [{"message": w} for w in parsed.warnings]}
        if experiment is None:  # validate only: Determined's master answers an empty experiment
            return {"experiment": convert.unsaved_experiment(), "config": parsed.config, **warnings}
        answer = {
            "experiment": convert.experiment_to_api(experiment, principal.username, [], viewer=principal),
            "config": parsed.config,
            **warnings,
        }
    notify.changed()  # after the commit: the loop reads committed state
    return answer


@router.get("/experiments", response_model=responses.Experiments)
def list_experiments(
    state: State,
    principal: UserPrincipal,
    archived: bool | None = None,
    users: Annotated[list[str] | None, Query()] = None,
    user_ids: Annotated[list[Id] | None, Query(alias="userIds")] = None,
    states: Annotated[list[str] | None, Query()] = None,
    name: Annotated[str | None, Query(max_length=256)] = None,
    description: Annotated[str | None, Query(max_length=1024)] = None,
    labels: Annotated[list[Annotated[str, Query(max_length=256)]] | None, Query(max_length=100)] = None,
    offset: Offset = 0,
    limit: Limit = 100,
    sort_by: Annotated[str | None, Query(alias="sortBy", max_length=64)] = None,
    order_by: Annotated[str | None, Query(alias="orderBy")] = None,
) -> dict[str, Any]:
    """Determined's ``GetExperiments``: its filters (``name`` and ``description`` match anywhere; ``labels``:
    every one), ``sortBy`` (``SORT_BY_*``; the checkpoint and metric sorts are refused) and ``orderBy``."""
    with state.tx() as session:
        rows, total = experiment_list.list_experiments(
            session,
            archived=archived,
            users=users or [],
            user_ids=user_ids or [],
            states=states or [],
            name=name,
            description=description,
            labels=labels or [],
            sort_by=sort_by,
            order_desc=(order_by or "").upper() in ("ORDER_BY_DESC", "DESC"),
            offset=offset,
            limit=limit,
        )
        totals = experiment_totals(session, [e.id for e, _ in rows])
        trial_ids = _trial_ids_of(session, [e.id for e, _ in rows])
        items = [
            convert.experiment_to_api(
                e,
                username,
                trial_ids[e.id],
                # Determined's client requires each experiment's config (masked for others' experiments).
                viewer=principal,
                storage=totals.get(e.id, StorageTotals()),
            )
            for e, username in rows
        ]
    return {"experiments": items, "pagination": convert.pagination(offset, limit, total, len(items))}


@router.get("/experiments/{experiment_id}", response_model=responses.ExperimentDetail)
def get_experiment(experiment_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    with state.tx() as session:
        experiment, username = exps.get_experiment(session, experiment_id)
        totals = experiment_totals(session, [experiment_id]).get(experiment_id, StorageTotals())
        return {
            "experiment": convert.experiment_to_api(
                experiment, username, _trial_ids(session, experiment_id), viewer=principal, storage=totals
            ),
            "jobSummary": None,
            "trialCounts": exps.trial_counts(session, experiment_id),
        }


def _action(
    state: State,
    principal: Principal,
    fn: Callable[[Session, Principal, int], ExperimentModel],
    experiment_id: int,
) -> dict[str, Any]:
    with state.tx() as session:
        fn(session, principal, experiment_id)
    notify.changed()
    return {}


@router.post("/experiments/{experiment_id}/pause", response_model=responses.Empty)
def pause(experiment_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    return _action(state, principal, exps.pause_experiment, experiment_id)


@router.post("/experiments/{experiment_id}/activate", response_model=responses.Empty)
def activate(experiment_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    return _action(state, principal, exps.activate_experiment, experiment_id)


@router.post("/experiments/{experiment_id}/cancel", response_model=responses.Empty)
def cancel(experiment_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    return _action(state, principal, exps.cancel_experiment, experiment_id)


@router.post("/experiments/{experiment_id}/kill", response_model=responses.Empty)
def kill(experiment_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    return _action(state, principal, exps.kill_experiment, experiment_id)


@router.post("/experiments/{experiment_id}/archive", response_model=responses.Empty)
def archive(experiment_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    with state.tx() as session:
        exps.set_archived(session, principal, experiment_id, True)
    return {}


@router.post("/experiments/{experiment_id}/unarchive", response_model=responses.Empty)
def unarchive(experiment_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    with state.tx() as session:
        exps.set_archived(session, principal, experiment_id, False)
    return {}


@router.delete("/experiments/{experiment_id}", response_model=responses.Empty)
def delete_experiment(experiment_id: Id, state: State, principal: UserPrincipal) -> dict[str, Any]:
    """Remove the experiment's checkpoint files (as its owner's account, ``services.checkpoints.gc``), then its
    rows; if a directory cannot be removed, the experiment is DELETE_FAILED (delete it again to retry) and
    the checkpoint's failure is recorded (the lifecycle loop retries it too). An experiment with a checkpoint
    in the model registry is refused (409): delete the model version first."""
    with state.tx() as session:
        uuids = exps.begin_delete(session, principal, experiment_id)
        models_registry.refuse_registered(session, uuids, "its experiment cannot be deleted")
        targets = gc.claim(session, uuids, utcnow(), state.config.checkpoint_dir())
    results = gc.remove(state.checkpoint_remover, targets)
    failure = None
    with state.tx() as session:
        outcome = gc.record(session, results, utcnow())
        if outcome.failed:
            uuid, error = sorted(outcome.failed.items())[0]
            more = f" (and {len(outcome.failed) - 1} more)" if len(outcome.failed) > 1 else ""
            failure = f"could not remove checkpoint {uuid}{more}: {error}"
            experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
            set_experiment_state(session, experiment, ExperimentState.DELETE_FAILED, failure)
    if failure is not None:
        raise ConflictError(f"{failure}; delete the experiment again to retry")
    with state.tx() as session:
        exps.finish_delete(session, experiment_id)
    return {}


@router.get("/experiments/{experiment_id}/trials", response_model=responses.Trials)
def experiment_trials(
    experiment_id: Id, state: State, principal: UserPrincipal, offset: Offset = 0, limit: Limit = 0
) -> dict[str, Any]:
    with state.tx() as session:
        experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
        stmt = select(TrialModel).where(TrialModel.experiment_id == experiment_id).order_by(TrialModel.id)
        trials = list(session.scalars(stmt))
        page = trials[offset:] if limit <= 0 else trials[offset : offset + limit]
        totals = trial_totals_of_experiment(session, experiment_id)
        items = [
            convert.trial_to_api(t, principal, experiment.owner_id, storage=totals.get(t.id, StorageTotals()))
            for t in page
        ]
    return {"trials": items, "pagination": convert.pagination(offset, limit, len(trials), len(items))}
