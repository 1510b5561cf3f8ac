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

from hpc_master.api import convert, responses, responses_checkpoints
from hpc_master.api.bounds import Id, Limit, Offset
from hpc_master.api.deps import (
    AnyPrincipal,
    State,
    UserPrincipal,
    check_checkpoint_access,
    check_trial_access,
)
from hpc_master.api.schemas import DeleteCheckpointsRequest, ReportCheckpointRequest
from hpc_master.db.models import ExperimentModel, TrialModel, utcnow
from hpc_master.errors import ConflictError
from hpc_master.services import models_registry
from hpc_master.services.checkpoints import gc, views
from hpc_master.services.checkpoints import records as ckpts
from hpc_master.services.checkpoints import views as checkpoint_views
from hpc_master.services.common import get_or_404
from hpc_master.services.states import TERMINAL_TRIAL_STATES

router = APIRouter(prefix="/api/v1", tags=["checkpoints"])


@router.delete("/checkpoints", response_model=responses_checkpoints.DeletedCheckpoints)
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


@router.get("/experiments/{experiment_id}/checkpoints", response_model=responses_checkpoints.Checkpoints)
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


@router.get("/trials/{trial_id}/checkpoints", response_model=responses_checkpoints.Checkpoints)
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


@router.post("/checkpoints", tags=["harness"], response_model=responses.Empty)
def report_checkpoint(body: ReportCheckpointRequest, principal: AnyPrincipal, state: State) -> dict[str, Any]:
    c = body.checkpoint
    steps = c.metadata.get("steps_completed", 0)
    with state.tx() as session:
        check_trial_access(session, principal, c.trial_id, write=True)
        ckpts.report_checkpoint(
            session,
            ckpts.CheckpointReport(
                uuid=c.uuid,
                trial_id=c.trial_id,
                trial_run_id=c.trial_run_id,
                steps_completed=steps if isinstance(steps, int) else 0,
                resources=c.resources,
                metadata=c.metadata,
                state=c.state,
                report_time=c.report_time,
            ),
        )
    return {}


@router.get("/checkpoints/{uuid}", tags=["harness"], response_model=responses_checkpoints.CheckpointAnswer)
def get_checkpoint(uuid: str, principal: AnyPrincipal, state: State) -> dict[str, Any]:
    """Determined's ``GetCheckpoint`` (its client's ``det checkpoint describe|download``,
    ``client.get_checkpoint``), and the harness's read of a checkpoint's metadata."""
    with state.tx() as session:
        view = checkpoint_views.get_view(session, uuid)
        check_checkpoint_access(principal, view.checkpoint, view.experiment.owner_id, write=False)
        return {"checkpoint": convert.checkpoint_to_api(view, principal, state.config.checkpoint_dir())}
