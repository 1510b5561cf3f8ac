"""Checkpoint garbage collection and deletion, on Determined's routes:

- ``PATCH /api/v1/experiments/{id}`` (``v1PatchExperiment``: ``checkpointStorage`` with ``saveExperimentBest``,
  ``saveTrialBest``, ``saveTrialLatest``; ``name``, ``description``): sets the GC policy, collected at once;
- ``GET /api/v1/experiments/{id}/preview_gc?save_experiment_best=…`` (Determined serves it without the
  ``/api/v1`` prefix, as its CLI calls it; both are here): what a policy would delete, in Determined's shape;
- ``DELETE /api/v1/checkpoints`` (``checkpointUuids``): delete checkpoints now, as their owner's account.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy import select

from hpc_master.api import convert
from hpc_master.api.bounds import Count32, Id
from hpc_master.api.deps import AnyPrincipal, State, UserPrincipal, check_checkpoint_access
from hpc_master.api.schemas import DeleteCheckpointsRequest, PatchExperimentRequest
from hpc_master.db.models import ExperimentModel, TrialModel, UserModel, utcnow
from hpc_master.errors import ClientError, ConflictError
from hpc_master.services import checkpoint_gc as gc
from hpc_master.services import checkpoints as ckpts
from hpc_master.services import notify
from hpc_master.services.checkpoint_policy import GCPolicy
from hpc_master.services.checkpoint_usage import StorageTotals, experiment_totals
from hpc_master.services.common import get_or_404
from hpc_master.services.experiment_patch import patch_experiment
from hpc_master.services.states import TERMINAL_TRIAL_STATES

router = APIRouter(prefix="/api/v1", tags=["checkpoints"])
legacy = APIRouter(include_in_schema=False)
"""Determined's own CLI asks for ``/experiments/{id}/preview_gc`` (no ``/api/v1``)."""


@router.patch("/experiments/{experiment_id}")
def patch(
    experiment_id: Id, body: PatchExperimentRequest, principal: UserPrincipal, state: State
) -> dict[str, Any]:
    if body.id is not None and body.id != experiment_id:
        raise ClientError(f"the body's id {body.id} is not experiment {experiment_id}", field="id")
    storage = body.checkpoint_storage
    with state.tx() as session:
        experiment = patch_experiment(
            session, principal, experiment_id, name=body.name, description=body.description,
            gc_policy=storage.model_dump() if storage is not None else None,
        )  # fmt: skip
        owner = get_or_404(session, UserModel, experiment.owner_id, "user")
        trial_ids = session.scalars(select(TrialModel.id).where(TrialModel.experiment_id == experiment_id))
        totals = experiment_totals(session, [experiment_id]).get(experiment_id)
        answer = {
            "experiment": convert.experiment_to_api(
                experiment, owner.username, sorted(trial_ids), storage=totals or StorageTotals()
            )
        }
    notify.changed()  # the loop collects under the new policy at once
    return answer


@router.get("/experiments/{experiment_id}/preview_gc")
@legacy.get("/experiments/{experiment_id}/preview_gc")
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
        policy = GCPolicy.of({**gc.experiment_policy(experiment.config, default).as_dict(),
                              **{k: v for k, v in given.items() if v is not None}})  # fmt: skip
        items = gc.preview(session, experiment_id, policy)
        metric_name = (experiment.config.get("searcher") or {}).get("metric")
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


@router.delete("/checkpoints")
def delete_checkpoints(
    body: DeleteCheckpointsRequest, principal: AnyPrincipal, state: State
) -> dict[str, Any]:
    """Delete checkpoints now (their owner or an admin; a trial's own harness its trial's). The latest
    checkpoint of a trial that can still run is refused (it resumes from it), except to that trial itself.
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
        targets = gc.claim(session, uuids, utcnow(), state.config.checkpoint_dir())
    results = gc.remove(state.checkpoint_remover, targets)
    with state.tx() as session:
        outcome = gc.record(session, results, utcnow())
    if not outcome.failed:
        return {}
    return {"failed": [{"uuid": u, "error": e} for u, e in sorted(outcome.failed.items())]}
