"""Experiments: create, list, get, edit (``PATCH``: name, description, labels, resources and the checkpoint GC
policy, collected at once), the actions, their trials, what a GC policy would delete (``preview_gc``, also
without the ``/api/v1`` prefix, as Determined's CLI asks), the searcher's best validation (the harness asks),
and the routes below that Determined's CLI and SDK call (tagged ``determined-compat``). Their checkpoints'
list is in ``routes_checkpoints``; their metric streams in ``routes_ui``.

The experiment routes that Determined's CLI and SDK call and hpc-det's ``det`` does not (paths, fields and
answers are Determined's, ``determined/common/api/bindings.py``; ``docs/determined-client.md``):

- ``GET /api/v1/experiments/{id}/model_def`` (``GetModelDef``: ``det e download-model-def``, the SDK's
  ``Experiment.download_code()``): the context uploaded with the experiment, as the master stored it, a
  gzip'd tar in ``b64Tgz``;
- ``GET /api/v1/experiments/{id}/file_tree`` and ``POST /api/v1/experiments/{id}/file`` (``GetModelDefTree``,
  ``GetModelDefFile``): its files, and one of them;
- ``PUT`` and ``DELETE /api/v1/experiments/{id}/labels/{label}`` (the SDK's ``add_label``, ``remove_label``).

The context is read from the database only, never from a path a request names. Only the experiment's owner
and admins may read it (it is code, which may hold what other users should not see, as the config's
secret-looking values are masked for them) or change its labels.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from hpc_master.api import convert, responses, responses_checkpoints
from hpc_master.api.bounds import Count32, Id, Limit, Offset
from hpc_master.api.deps import AnyPrincipal, State, UserPrincipal
from hpc_master.api.schemas import ApiModel, CreateExperimentRequest, PatchExperimentRequest
from hpc_master.db.models import ExperimentModel, TrialModel, UserModel, utcnow
from hpc_master.errors import ClientError, ConflictError, NotFoundError, PermissionDeniedError
from hpc_master.services import access, experiment_list, harness, models_registry, notify, workspaces
from hpc_master.services import context as ctx
from hpc_master.services import experiments as exps
from hpc_master.services.access import Principal
from hpc_master.services.checkpoints import gc
from hpc_master.services.checkpoints.policy import GCPolicy
from hpc_master.services.checkpoints.usage import StorageTotals, experiment_totals, trial_totals_of_experiment
from hpc_master.services.common import get_or_404
from hpc_master.services.experiment_patch import MAX_LABEL_CHARS, change_label, patch_experiment
from hpc_master.services.experiments import searcher_metric
from hpc_master.services.lifecycle import set_experiment_state
from hpc_master.services.states import ExperimentState
from hpc_master.services.stored_config import experiment_config

router = APIRouter(prefix="/api/v1", tags=["experiments"])
legacy = APIRouter(include_in_schema=False)
"""Determined's own CLI asks for ``/experiments/{id}/preview_gc`` (no ``/api/v1``)."""


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


@router.get("/experiments/{experiment_id}/preview_gc", response_model=responses_checkpoints.PreviewGC)
@legacy.get("/experiments/{experiment_id}/preview_gc", response_model=responses_checkpoints.PreviewGC)
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


@router.get(
    "/experiments/{experiment_id}/searcher/best_searcher_validation_metric",
    tags=["harness"],
    response_model=responses.BestMetric,
)
def best_searcher_validation_metric(
    experiment_id: Id, principal: AnyPrincipal, state: State
) -> dict[str, Any]:
    with state.tx() as session:
        if principal.trial_id is not None:
            trial = get_or_404(session, TrialModel, principal.trial_id, "trial")
            if trial.experiment_id != experiment_id:
                raise PermissionDeniedError("this token belongs to another experiment")
        return {"metric": harness.best_searcher_validation(session, experiment_id)}


LabelPath = Annotated[str, Path(min_length=1, max_length=MAX_LABEL_CHARS)]


class ModelDefFileRequest(ApiModel):
    """Determined's ``v1GetModelDefFileRequest``."""

    experiment_id: Id | None = None
    path: str = ""


def _stored_context(session: Session, principal: Principal, experiment_id: int) -> bytes:
    experiment = get_or_404(session, ExperimentModel, experiment_id, "experiment")
    access.experiment_private(principal, experiment)
    archive = experiment.context_archive
    if archive is None:
        raise NotFoundError(f"experiment {experiment_id} has no stored model definition")
    return archive


@router.get(
    "/experiments/{experiment_id}/model_def", tags=["determined-compat"], response_model=responses.ModelDef
)
def model_def(experiment_id: Id, principal: UserPrincipal, state: State) -> Response:
    with state.tx() as session:
        archive = _stored_context(session, principal, experiment_id)
    # Up to the context's limit (95 MB): written out directly rather than through the JSON encoder.
    body = b'{"b64Tgz":"' + base64.b64encode(archive) + b'"}'
    return Response(content=body, media_type="application/json")


@router.get(
    "/experiments/{experiment_id}/file_tree", tags=["determined-compat"], response_model=responses.FileTree
)
def file_tree(experiment_id: Id, principal: UserPrincipal, state: State) -> dict[str, Any]:
    with state.tx() as session:
        archive = _stored_context(session, principal, experiment_id)
    return {"files": ctx.context_tree(archive)}


@router.post(
    "/experiments/{experiment_id}/file", tags=["determined-compat"], response_model=responses.FileContent
)
def model_def_file(
    experiment_id: Id, body: ModelDefFileRequest, principal: UserPrincipal, state: State
) -> dict[str, Any]:
    if body.experiment_id not in (None, experiment_id):
        raise ClientError(
            f"the body's experimentId {body.experiment_id} is not experiment {experiment_id}",
            field="experimentId",
        )
    if not 1 <= len(body.path) <= 4096:
        raise ClientError("path is 1 to 4096 characters", field="path")
    with state.tx() as session:
        archive = _stored_context(session, principal, experiment_id)
    return {"file": base64.b64encode(ctx.context_file(archive, body.path)).decode()}


@router.put(
    "/experiments/{experiment_id}/labels/{label}", tags=["determined-compat"], response_model=responses.Labels
)
def put_label(experiment_id: Id, label: LabelPath, principal: UserPrincipal, state: State) -> dict[str, Any]:
    with state.tx() as session:
        return {"labels": change_label(session, principal, experiment_id, label, add=True)}


@router.delete(
    "/experiments/{experiment_id}/labels/{label}", tags=["determined-compat"], response_model=responses.Labels
)
def delete_label(
    experiment_id: Id, label: LabelPath, principal: UserPrincipal, state: State
) -> dict[str, Any]:
    with state.tx() as session:
        return {"labels": change_label(session, principal, experiment_id, label, add=False)}
