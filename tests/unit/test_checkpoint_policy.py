"""The checkpoint GC policy (``services.checkpoints.policy``): Determined's semantics on small hand-made cases."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from hpc_master.services.checkpoints.policy import (
    CheckpointFacts,
    GCPolicy,
    checkpoints_to_delete,
    checkpoints_to_keep,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def trial(trial_id: int, metrics: dict[int, float | None]) -> list[CheckpointFacts]:
    """One checkpoint per step (uuid ``t{trial}-{step}``), reported in step order."""
    return [
        CheckpointFacts(f"t{trial_id}-{steps}", trial_id, steps, T0 + dt.timedelta(seconds=steps), metric)
        for steps, metric in metrics.items()
    ]


def delete(ckpts: list[CheckpointFacts], policy: GCPolicy, *, smaller: bool = True, **kw: object) -> set[str]:
    trials = {c.trial_id for c in ckpts}
    out = checkpoints_to_delete(
        ckpts, policy, smaller_is_better=smaller, collectable_trials=kw.get("collectable", trials),  # type: ignore[arg-type]
        protected=kw.get("protected", ()),  # type: ignore[arg-type]
    )  # fmt: skip
    return set(out)


def test_defaults_keep_each_trials_best_and_latest() -> None:
    ckpts = trial(1, {5: 0.5, 10: 0.2, 15: 0.4, 20: 0.3}) + trial(2, {5: 0.1, 10: 0.6})
    assert GCPolicy() == GCPolicy(save_experiment_best=0, save_trial_best=1, save_trial_latest=1)
    assert delete(ckpts, GCPolicy()) == {"t1-5", "t1-15"}  # trial 2: 5 is its best, 10 its latest


def test_larger_is_better_flips_the_best() -> None:
    ckpts = trial(1, {5: 0.5, 10: 0.2, 15: 0.4, 20: 0.3})
    assert delete(ckpts, GCPolicy(), smaller=False) == {"t1-10", "t1-15"}


def test_experiment_best_only_keeps_one_checkpoint_of_the_whole_search() -> None:
    ckpts = trial(1, {5: 0.5, 10: 0.2}) + trial(2, {5: 0.15, 10: 0.3}) + trial(3, {5: 0.9})
    only_best = GCPolicy(save_experiment_best=1, save_trial_best=0, save_trial_latest=0)
    assert checkpoints_to_keep(ckpts, only_best, smaller_is_better=True) == {"t2-5"}
    assert delete(ckpts, only_best) == {c.uuid for c in ckpts} - {"t2-5"}


def test_the_three_counts_keep_their_union() -> None:
    ckpts = trial(1, {1: 0.9, 2: 0.1, 3: 0.8, 4: 0.7, 5: 0.6}) + trial(2, {1: 0.05, 2: 0.5})
    policy = GCPolicy(save_experiment_best=2, save_trial_best=1, save_trial_latest=2)
    # experiment best 2: t2-1, t1-2; trial 1 best: t1-2, latest 2: t1-5, t1-4; trial 2 best t2-1, latest t2-2.
    assert checkpoints_to_keep(ckpts, policy, smaller_is_better=True) == {
        "t2-1",
        "t1-2",
        "t1-5",
        "t1-4",
        "t2-2",
    }


def test_determineds_own_e2e_expectations() -> None:
    """Determined's ``test_gc_checkpoints`` fixtures: ten checkpoints at 100..1000 batches, a metric that falls
    (resp. rises) with the steps, best 3 and latest 2 kept."""
    policy = GCPolicy(save_experiment_best=0, save_trial_best=3, save_trial_latest=2)
    falling = trial(1, {s: 1.0 / s for s in range(100, 1001, 100)})
    rising = trial(1, {s: float(s) for s in range(100, 1001, 100)})
    kept = {c.steps_completed for c in falling} - {int(u.split("-")[1]) for u in delete(falling, policy)}
    assert kept == {800, 900, 1000}
    kept = {c.steps_completed for c in rising} - {int(u.split("-")[1]) for u in delete(rising, policy)}
    assert kept == {100, 200, 300, 900, 1000}


def test_a_checkpoint_without_validation_is_never_among_the_best() -> None:
    ckpts = trial(1, {5: None, 10: 0.5, 15: None, 20: math.nan})
    # 10 is the only ranked one (NaN: a diverged loss counts as no metric); 20 is the latest.
    assert delete(ckpts, GCPolicy()) == {"t1-5", "t1-15"}
    assert delete(ckpts, GCPolicy(save_trial_latest=0)) == {"t1-5", "t1-15", "t1-20"}


def test_ranks_are_strict_so_n_means_n_directories() -> None:
    """Two checkpoints at the same step (one saved before its validation, one after): one is the latest."""
    ckpts = [
        CheckpointFacts("first", 1, 10, T0, 0.3),
        CheckpointFacts("second", 1, 10, T0 + dt.timedelta(seconds=1), 0.3),
        CheckpointFacts("older", 1, 5, T0 - dt.timedelta(seconds=1), 0.3),
    ]
    keep = checkpoints_to_keep(
        ckpts, GCPolicy(save_trial_best=1, save_trial_latest=1), smaller_is_better=True
    )
    assert keep == {"second", "older"}  # latest: the one reported last; best among equals: reported first
    assert len(checkpoints_to_keep(ckpts, GCPolicy(0, 0, 1), smaller_is_better=True)) == 1


def test_only_collectable_trials_lose_checkpoints_and_a_protected_latest_stays() -> None:
    running = trial(1, {5: 0.5, 10: 0.4, 15: 0.45})
    paused = trial(2, {5: 0.9, 10: 0.8, 15: 0.95})
    nothing = GCPolicy(0, 0, 0)
    # Trial 1 runs (not collectable): its checkpoints stay, yet still rank against the others'.
    got = delete(running + paused, nothing, collectable={2}, protected={"t2-15"})
    assert got == {"t2-5", "t2-10"}  # the paused trial's latest (t2-15) is what it resumes from
    assert delete(running + paused, GCPolicy(1, 0, 0), collectable={1, 2}) == {
        c.uuid for c in running + paused
    } - {"t1-10"}


@pytest.mark.parametrize(
    ("storage", "expected"),
    [
        (None, GCPolicy(2, 3, 4)),
        ({"save_trial_best": 0}, GCPolicy(2, 0, 4)),
        ({"save_trial_latest": -1, "save_experiment_best": True}, GCPolicy(2, 3, 4)),  # not counts: ignored
        ({"save_experiment_best": 1, "save_trial_best": 0, "save_trial_latest": 0}, GCPolicy(1, 0, 0)),
    ],
)
def test_policy_of_a_config_falls_back_to_the_masters(storage: object, expected: GCPolicy) -> None:
    assert GCPolicy.of(storage, GCPolicy(2, 3, 4)) == expected
    assert GCPolicy.of(None) == GCPolicy()
