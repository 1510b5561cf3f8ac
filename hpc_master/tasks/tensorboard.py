"""What a TensorBoard serves: the trials of the experiments (or the trials) asked for, each directory taken
from the database's records (the experiment's checkpoint storage and the trial's ids), never from a request.

A user opens TensorBoards over their own experiments; an admin over anyone's (the server runs as the admin's
Unix account, which may not be able to read them: TensorBoard then shows those runs empty).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from harness.exec.job_plan import tensorboard_path
from hpc_master.db.models import ExperimentModel, TrialModel
from hpc_master.errors import ClientError, NotFoundError
from hpc_master.expconf import DirectoryStorage
from hpc_master.services import access
from hpc_master.services.access import Principal
from hpc_master.services.stored_config import experiment_config
from hpc_master.trialjob import checkpoint_root_of

MAX_TRIALS = 1000
"""Trials one TensorBoard serves: beyond that its page is unreadable and its start slow."""


def logdir_spec(
    session: Session,
    principal: Principal,
    experiment_ids: Sequence[int],
    trial_ids: Sequence[int],
    default_root: str,
) -> tuple[list[str], list[int]]:
    """TensorBoard's ``--logdir_spec`` argument (``name:path,…``, one run per trial, named
    ``exp-E/trial-T``) and the experiments it covers."""
    if not experiment_ids and not trial_ids:
        raise ClientError("name experiments (det tensorboard start 3 4) or trials (--trial-ids 12 13)")
    rows = _trials_asked(session, experiment_ids, trial_ids)
    if len(rows) > MAX_TRIALS:
        raise ClientError(f"{len(rows)} trials: one TensorBoard serves at most {MAX_TRIALS}")
    specs: list[str] = []
    roots: dict[int, str] = {}
    for trial_id, exp_id in sorted(rows.items()):
        if exp_id not in roots:
            roots[exp_id] = _checkpoint_root(session, principal, exp_id, default_root)
        path = tensorboard_path(roots[exp_id], exp_id, trial_id)
        if "," in path or ":" in path:
            raise ClientError(f"TensorBoard cannot take the path {path!r} (it holds ',' or ':')")
        specs.append(f"exp-{exp_id}/trial-{trial_id}:{path}")
    return [f"--logdir_spec={','.join(specs)}"], sorted(set(rows.values()))


def _trials_asked(
    session: Session, experiment_ids: Sequence[int], trial_ids: Sequence[int]
) -> dict[int, int]:
    """Trial → experiment, for every trial of `experiment_ids` and each of `trial_ids`."""
    rows: dict[int, int] = {}
    for exp_id in experiment_ids:
        if session.get(ExperimentModel, exp_id) is None:
            raise NotFoundError(f"experiment {exp_id} not found")
        for trial_id in session.scalars(select(TrialModel.id).where(TrialModel.experiment_id == exp_id)):
            rows[trial_id] = exp_id
    for trial_id in trial_ids:
        trial = session.get(TrialModel, trial_id)
        if trial is None:
            raise NotFoundError(f"trial {trial_id} not found")
        rows[trial_id] = trial.experiment_id
    return rows


def _checkpoint_root(session: Session, principal: Principal, exp_id: int, default_root: str) -> str:
    """Where the experiment keeps its trials' files, once `principal` may see it (a user: their own)."""
    exp = session.get(ExperimentModel, exp_id)
    assert exp is not None
    access.readable_experiment_root(principal, exp.owner_id, exp_id)
    config = experiment_config(exp)
    if isinstance(config.checkpoint_storage, DirectoryStorage):
        raise ClientError(
            f"experiment {exp_id} keeps its files in a directory seen only inside its image "
            "(checkpoint_storage.type: directory), which a TensorBoard cannot read"
        )
    return checkpoint_root_of(config, default_root)
