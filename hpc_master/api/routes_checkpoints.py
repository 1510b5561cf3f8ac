"""Checkpoint garbage collection and deletion, on Determined's routes:

- ``PATCH /api/v1/experiments/{id}`` (``v1PatchExperiment``: ``checkpointStorage`` with ``saveExperimentBest``,
  ``saveTrialBest``, ``saveTrialLatest``; ``name``, ``description``, ``labels``, ``resources``): sets the GC
  policy, collected at once (``services.experiment_patch``);
- ``GET /api/v1/experiments/{id}/preview_gc?save_experiment_best=…`` (Determined serves it without the
  ``/api/v1`` prefix, as its CLI calls it; both are here): what a policy would delete, in Determined's shape;
- ``DELETE /api/v1/checkpoints`` (``checkpointUuids``): delete checkpoints now, as their owner's account;
  never one registered in the model registry (409, as Determined refuses them);
- ``GET /api/v1/experiments/{id}/checkpoints`` and ``GET /api/v1/trials/{id}/checkpoints`` (``sortByAttr``,
  ``sortByMetric``, ``orderBy``, ``states``, ``offset``, ``limit``): Determined's checkpoint lists, each
  checkpoint as ``GET /api/v1/checkpoints/{uuid}`` gives it (``convert.checkpoints_to_api``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select

from hpc_master.api import convert, responses
from hpc_master.api.bounds import Count32, Id, Limit, Offset
from hpc_master.api.deps import AnyPrincipal, State, UserPrincipal, check_checkpoint_access
from hpc_master.api.schemas import DeleteCheckpointsRequest, PatchExperimentRequest
from hpc_master.db.models import ExperimentModel, TrialModel, UserModel, utcnow
from hpc_master.errors import ClientError, ConflictError
from hpc_master.services import models_registry, notify
from hpc_master.services.checkpoints import gc, views
from hpc_master.services.checkpoints import records as ckpts
from hpc_master.services.checkpoints.policy import GCPolicy
from hpc_master.services.checkpoints.usage import StorageTotals, experiment_totals
from hpc_master.services.common import get_or_404
from hpc_master.services.experiment_patch import patch_experiment
from hpc_master.services.experiments import searcher_metric
from hpc_master.services.states import TERMINAL_TRIAL_STATES
from hpc_master.services.stored_config import experiment_config

router = APIRouter(prefix="/api/v1", tags=["checkpoints"])
legacy = APIRouter(include_in_schema=False)
"""Determined's own CLI asks for ``/experiments/{id}/preview_gc`` (no ``/api/v1``)."""


@router.patch("/experiments/{experiment_id}", response_model=responses.ExperimentAnswer)
def patch(
    experiment_id: Id, body: PatchExperimentRequest, principal: UserPrincipal, state: State
) -> dict[str, Any]:
    if body.id is not None and body.id != experiment_id:
        raise ClientError(f"the body's id {body.id} is not experiment {experiment_id}", field="id")
    if body.notes:
        raise ClientError("this master keeps no experiment notes (use the description)", field="notes")
    storage = body.checkpoint_storage
    # A resources field sent as null goes back to its default; one left out keeps its value.
    resources = body.resources.model_dump(include=body.resources.model_fields_set) if body.resources else None
    with state.tx() as session:
        experiment = patch_experiment(
            session, principal, experiment_id, name=body.name, description=body.description,
            labels=body.labels, gc_policy=storage.model_dump() if storage is not None else None,
            resources=resources,
        )  # fmt: skip
        owner = get_or_404(session, UserModel, experiment.owner_id, "user")
        trial_ids = session.scalars(select(TrialModel.id).where(TrialModel.experiment_id == experiment_id))
        totals = experiment_totals(session, [experiment_id]).get(experiment_id)
        answer = {
            "experiment": convert.experiment_to_api(
                experiment,
                owner.username,
                sorted(trial_ids),
                viewer=principal,
                storage=totals or StorageTotals(),
            )
        }
    notify.changed()  # the loop collects under the new policy at once
    return answer


@router.get("/experiments/{experiment_id}/preview_gc", response_model=responses.PreviewGC)
@legacy.get("/experiments/{experiment_id}/preview_gc", response_model=responses.PreviewGC)
def preview_gc(
    experiment_id: Id,
    principal: UserPrincipal,
    state: State,
    save_experiment_best: Count32 | None = None,
    save_trial_best: Count32 | None = None,
    save_trial_latest: Count32 | None = None,
) -> dict[str, Any]:
    """The checkpoints a policy would delete now; a field left out is the experiment's own."""
    given = {"save_experiment_best": save_experiment_best, "save_trial_best": save_trial_best,
             "save_trial_latest": save_trial_latest}  # fmt: skip
    with state.tx() as session:
        experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
        default = GCPolicy(**state.config.checkpoint_storage.model_dump(include=set(given)))
        config = experiment_config(experiment)
        policy = GCPolicy.of({**gc.experiment_policy(config, default).as_dict(),
                              **{k: v for k, v in given.items() if v is not None}})  # fmt: skip
        items = gc.preview(session, experiment_id, policy)
        metric_name, _ = searcher_metric(config)
        checkpoints = [_previewed(p) for p in items]
    return {"checkpoints": checkpoints, "metric_name": metric_name, "policy": policy.as_dict()}


def _previewed(p: gc.Previewed) -> dict[str, Any]:
    """Determined's ``CheckpointByUUIDs`` row shape (its CLI reads these keys), plus size and metric."""
    c = p.checkpoint
    validation = p.validation.get("avgMetrics", p.validation) if p.validation else None
    return {
        "UUID": c.uuid,
        "TrialID": c.trial_id,
        "StepsCompleted": c.steps_completed,
        "State": c.state,
        "ReportTime": convert.iso(c.report_time),
        "Resources": c.resources,
        "Metadata": c.metadata_,
        "ValidationMetrics": validation,
        "SearcherMetric": p.metric,
        "Size": c.size_bytes or 0,
    }


@router.delete("/checkpoints", response_model=responses.DeletedCheckpoints)
def delete_checkpoints(
    body: DeleteCheckpointsRequest, principal: AnyPrincipal, state: State
) -> dict[str, Any]:
    """Delete checkpoints now (their owner or an admin; a trial's own harness its trial's). The latest
    checkpoint of a trial that can still run is refused (it resumes from it), except to that trial itself;
    a checkpoint registered in the model registry is refused (409 naming the model and version).
    Answers ``{}``, or the failures (``failed``: uuid and error), which stay recorded and are retried."""
    uuids = list(dict.fromkeys(body.checkpoint_uuids))
    with state.tx() as session:
        for uuid in uuids:
            ckpt = ckpts.get_checkpoint(session, uuid)
            trial = get_or_404(session, TrialModel, ckpt.trial_id, "trial")
            experiment = get_or_404(session, ExperimentModel, trial.experiment_id, "experiment")
            check_checkpoint_access(principal, ckpt, experiment.owner_id, write=True)
            if (
                trial.latest_checkpoint == uuid
                and trial.state not in TERMINAL_TRIAL_STATES
                and principal.trial_id != trial.id
            ):
                raise ConflictError(
                    f"checkpoint {uuid} is the latest of trial {trial.id}, which is {trial.state} and would "
                    "resume from it; delete it once the trial has ended",
                    field="checkpointUuids",
                )
        models_registry.refuse_registered(session, uuids, "a registered checkpoint is never deleted")
        targets = gc.claim(session, uuids, utcnow(), state.config.checkpoint_dir())
    results = gc.remove(state.checkpoint_remover, targets)
    with state.tx() as session:
        outcome = gc.record(session, results, utcnow())
    if not outcome.failed:
        return {}
    return {"failed": [{"uuid": u, "error": e} for u, e in sorted(outcome.failed.items())]}


SortByAttr = Annotated[str | None, Query(alias="sortByAttr", max_length=64)]
SortBy = Annotated[str | None, Query(alias="sortBy", max_length=64)]
SortByMetric = Annotated[str | None, Query(alias="sortByMetric", max_length=256)]
OrderBy = Annotated[str | None, Query(alias="orderBy", max_length=64)]
StatesParam = Annotated[list[Annotated[str, Query(max_length=64)]] | None, Query(max_length=16)]


def _listing(
    sort_by_attr: str | None,
    sort_by: str | None,
    sort_by_metric: str | None,
    order_by: str | None,
    states: list[str] | None,
    offset: int,
    limit: int,
) -> views.CheckpointQuery:
    return views.CheckpointQuery(
        sort_by_attr=sort_by_attr or sort_by, sort_by_metric=sort_by_metric, order_by=order_by,
        states=states or (), offset=offset, limit=limit,
    )  # fmt: skip


@router.get("/experiments/{experiment_id}/checkpoints", response_model=responses.Checkpoints)
def experiment_checkpoints(
    experiment_id: Id,
    state: State,
    principal: UserPrincipal,
    sort_by_attr: SortByAttr = None,
    sort_by: SortBy = None,
    sort_by_metric: SortByMetric = None,
    order_by: OrderBy = None,
    states: StatesParam = None,
    offset: Offset = 0,
    limit: Limit = 0,
) -> dict[str, Any]:
    """Determined's ``GetExperimentCheckpoints`` (``sortBy``: the name older clients send for
    ``sortByAttr``); with no sort, best first by the searcher metric. Orders: ``views.sort_views``."""
    query = _listing(sort_by_attr, sort_by, sort_by_metric, order_by, states, offset, limit)
    with state.tx() as session:
        page = views.experiment_checkpoints(session, experiment_id, query)
        items = convert.checkpoints_to_api(page.views, principal, state.config.checkpoint_dir())
    return {"checkpoints": items, "pagination": convert.pagination(offset, limit, page.total, len(items))}


@router.get("/trials/{trial_id}/checkpoints", response_model=responses.Checkpoints)
def trial_checkpoints(
    trial_id: Id,
    state: State,
    principal: UserPrincipal,
    sort_by_attr: SortByAttr = None,
    sort_by: SortBy = None,
    sort_by_metric: SortByMetric = None,
    order_by: OrderBy = None,
    states: StatesParam = None,
    offset: Offset = 0,
    limit: Limit = 0,
) -> dict[str, Any]:
    """Determined's ``GetTrialCheckpoints`` (its SDK's ``Trial.list_checkpoints``, ``top_checkpoint``; its
    CLI's ``det trial download``): as the experiment's list, for one trial."""
    query = _listing(sort_by_attr, sort_by, sort_by_metric, order_by, states, offset, limit)
    with state.tx() as session:
        page = views.trial_checkpoints(session, trial_id, query)
        items = convert.checkpoints_to_api(page.views, principal, state.config.checkpoint_dir())
    return {"checkpoints": items, "pagination": convert.pagination(offset, limit, page.total, len(items))}
