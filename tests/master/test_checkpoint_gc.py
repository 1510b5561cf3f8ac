"""Checkpoint GC against the database and real directories, on SQLite and PostgreSQL: the policy applied when
trials pause or end, a paused trial's latest checkpoint kept, failures recorded and retried with backoff,
files removed as the owner's Unix account (as root), storage totals."""

from __future__ import annotations

import datetime as dt
import os
import pwd
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from hpc_master.api.convert import checkpoint_to_api
from hpc_master.db.engine import transaction
from hpc_master.db.models import (
    CheckpointGCRequestModel,
    CheckpointModel,
    MetricModel,
    TrialModel,
    UserModel,
)
from hpc_master.services import experiments as exps
from hpc_master.services import lifecycle
from hpc_master.services.access import Principal
from hpc_master.services.checkpoints import gc
from hpc_master.services.checkpoints.gc import CheckpointCollector, retry_delay
from hpc_master.services.checkpoints.policy import GCPolicy
from hpc_master.services.checkpoints.records import CheckpointReport, report_checkpoint
from hpc_master.services.checkpoints.remover import CheckpointRemover, Owner, Removal
from hpc_master.services.checkpoints.usage import experiment_totals, trial_totals
from hpc_master.services.checkpoints.views import CheckpointQuery, experiment_checkpoints, get_view
from hpc_master.services.experiment_patch import patch_experiment
from hpc_master.services.states import TerminationReason, TrialState
from tests.conftest import require

from .helpers import CONFIG

pytestmark = pytest.mark.storage  # checkpoint claims and deletions, the GC migration

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
LOSSES = {5: 0.5, 10: 0.2, 15: 0.4, 20: 0.3}  # best at 10, latest at 20


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


@pytest.fixture
def root() -> Path:
    path = Path(os.environ["DET_CHECKPOINT_ROOT"])
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make_owner(sessions: sessionmaker[Session], unix: str | None = None) -> Principal:
    name = f"u{uuid.uuid4().hex[:8]}"
    with transaction(sessions) as s:
        user = UserModel(username=name, password_hash="", admin=False, unix_username=unix)
        s.add(user)
        s.flush()
        return Principal(user_id=user.id, username=name, admin=False)


def new_experiment(sessions: sessionmaker[Session], owner: Principal, config: str = CONFIG) -> int:
    with transaction(sessions) as s:
        exp, _ = exps.create_experiment(s, owner, config_text=config, model_definition=[], activate=True)
        assert exp is not None
        return exp.id


def running_trial(sessions: sessionmaker[Session], exp_id: int, request_id: str) -> tuple[int, int]:
    """A trial with a live (pending) run: (trial id, run id)."""
    with transaction(sessions) as s:
        trial = lifecycle.create_trial(s, exp_id, request_id, {"lr": 0.1})
        return trial.id, lifecycle.allocate_trial_run(s, trial.id).id


def add_checkpoints(
    sessions: sessionmaker[Session], root: Path, trial_id: int, losses: dict[int, float], size: int = 10
) -> dict[int, str]:
    """A directory (one file of `size` bytes) and a registered checkpoint per step, each with a validation."""
    out = {}
    with transaction(sessions) as s:
        for steps, loss in losses.items():
            ckpt = str(uuid.uuid4())
            (root / ckpt).mkdir(parents=True)
            (root / ckpt / "model.pt").write_bytes(b"x" * size)
            s.add(MetricModel(trial_id=trial_id, trial_run_id=1, group="validation", steps_completed=steps,
                              metrics={"avgMetrics": {"validation_loss": loss}}))  # fmt: skip
            report_checkpoint(
                s,
                CheckpointReport(
                    uuid=ckpt, trial_id=trial_id, trial_run_id=1, steps_completed=steps,
                    resources={"model.pt": size, "sub/": 0}, metadata={"steps_completed": steps},
                    report_time=T0 + dt.timedelta(seconds=steps),
                ),
            )  # fmt: skip
            out[steps] = ckpt
    return out


def finish(sessions: sessionmaker[Session], run_id: int, reason: TerminationReason) -> None:
    with transaction(sessions) as s:
        lifecycle.finish_trial_run(s, run_id, reason)


def on_disk(root: Path, uuids: dict[int, str]) -> set[int]:
    return {steps for steps, u in uuids.items() if (root / u).exists()}


def states(sessions: sessionmaker[Session], uuids: dict[int, str]) -> dict[int, str]:
    with transaction(sessions) as s:
        return {steps: s.get(CheckpointModel, u).state for steps, u in uuids.items()}  # type: ignore[union-attr]


def collector(
    sessions: sessionmaker[Session], root: Path, clock: Clock, remover: CheckpointRemover | None = None
) -> CheckpointCollector:
    return CheckpointCollector(
        sessions, default_root=root, remover=remover or CheckpointRemover(as_owner=False), min_interval_s=0,
        clock=clock,
    )  # fmt: skip


def pending_requests(sessions: sessionmaker[Session]) -> int:
    with transaction(sessions) as s:
        return int(s.scalar(select(func.count()).select_from(CheckpointGCRequestModel)) or 0)


# ---------------------------------------------------------------- the policy, applied


def test_a_trial_that_ends_keeps_its_best_and_latest_and_the_rest_are_deleted_on_disk(
    sessions: sessionmaker[Session], root: Path, clock: Clock
) -> None:
    owner = make_owner(sessions)
    exp_id = new_experiment(sessions, owner)
    done_trial, done_run = running_trial(sessions, exp_id, "a")
    live_trial, _ = running_trial(sessions, exp_id, "b")
    done = add_checkpoints(sessions, root, done_trial, LOSSES)
    live = add_checkpoints(sessions, root, live_trial, {5: 0.9, 10: 0.8, 15: 0.7, 20: 0.95})
    gc_ = collector(sessions, root, clock)
    assert gc_.run_once().deleted == [] and on_disk(root, done) == {5, 10, 15, 20}  # nothing ended yet

    finish(sessions, done_run, TerminationReason.SEARCHER_DONE)
    assert pending_requests(sessions) >= 1
    outcome = gc_.run_once()
    assert sorted(outcome.deleted) == sorted([done[5], done[15]])
    assert on_disk(root, done) == {10, 20}  # its best (0.2) and its latest
    assert on_disk(root, live) == {5, 10, 15, 20}  # a trial that runs is never collected
    assert states(sessions, done) == {5: "DELETED", 10: "COMPLETED", 15: "DELETED", 20: "COMPLETED"}
    assert pending_requests(sessions) == 0
    with transaction(sessions) as s:  # every list shows it
        page = experiment_checkpoints(s, exp_id, CheckpointQuery())
        listed = {v.checkpoint.uuid: v.checkpoint.state for v in page.views}
        assert listed[done[5]] == "DELETED" and listed[done[10]] == "COMPLETED"
        kept = experiment_totals(s, [exp_id])[exp_id]
        assert (kept.count, kept.size_bytes, kept.deleted_count, kept.deleted_bytes) == (6, 60, 2, 20)
        per_trial = trial_totals(s, [done_trial, live_trial])
        assert per_trial[done_trial].count == 2 and per_trial[live_trial].count == 4


def test_a_paused_trial_keeps_its_latest_checkpoint_and_resumes_from_it(
    sessions: sessionmaker[Session], root: Path, clock: Clock
) -> None:
    owner = make_owner(sessions)
    nothing_kept = (
        CONFIG + "checkpoint_storage: {save_experiment_best: 0, save_trial_best: 0, save_trial_latest: 0}\n"
    )
    exp_id = new_experiment(sessions, owner, nothing_kept)
    trial_id, run_id = running_trial(sessions, exp_id, "a")
    ckpts = add_checkpoints(sessions, root, trial_id, {5: 0.5, 10: 0.2, 15: 0.4})
    gc_ = collector(sessions, root, clock)
    with transaction(sessions) as s:
        exps.pause_experiment(s, owner, exp_id)  # the trial is PAUSED at once, its job still checkpointing
    gc_.run_once()
    assert on_disk(root, ckpts) == {5, 10, 15}  # its job runs: nothing collected yet
    finish(sessions, run_id, TerminationReason.PAUSED_BY_USER)  # the job exits: the trial waits, paused
    gc_.run_once()
    assert on_disk(root, ckpts) == {15}  # the policy keeps nothing, but the latest is what it resumes from
    with transaction(sessions) as s:
        exps.activate_experiment(s, owner, exp_id)
        trial = s.get(TrialModel, trial_id)
        assert trial is not None and trial.state == TrialState.ACTIVE
        assert trial.latest_checkpoint == ckpts[15]
        run_id = lifecycle.allocate_trial_run(s, trial_id).id  # resubmitted from its latest checkpoint
        assert trial.steps_completed == 15
    assert (root / ckpts[15] / "model.pt").is_file()
    finish(sessions, run_id, TerminationReason.SEARCHER_DONE)
    gc_.run_once()
    assert on_disk(root, ckpts) == set()  # ended: its latest goes too
    assert set(states(sessions, ckpts).values()) == {"DELETED"}


def test_a_new_policy_applies_to_ended_trials_and_the_experiments_best_survives(
    sessions: sessionmaker[Session], root: Path, clock: Clock
) -> None:
    owner = make_owner(sessions)
    exp_id = new_experiment(sessions, owner)
    runs = [running_trial(sessions, exp_id, r) for r in ("a", "b")]
    a = add_checkpoints(sessions, root, runs[0][0], LOSSES)
    b = add_checkpoints(sessions, root, runs[1][0], {5: 0.15, 10: 0.6})
    for _, run_id in runs:
        finish(sessions, run_id, TerminationReason.SEARCHER_DONE)
    gc_ = collector(sessions, root, clock)
    gc_.run_once()
    assert (on_disk(root, a), on_disk(root, b)) == ({10, 20}, {5, 10})
    with transaction(sessions) as s:
        assert gc.preview(s, exp_id, GCPolicy(1, 0, 0))[0].checkpoint.uuid == a[10]
        patch_experiment(s, owner, exp_id, gc_policy={"save_experiment_best": 1, "save_trial_best": 0,
                                                      "save_trial_latest": 0})  # fmt: skip
    gc_.run_once()
    assert (on_disk(root, a), on_disk(root, b)) == (set(), {5})  # 0.15: the search's best
    with transaction(sessions) as s:
        storage = s.scalar(select(TrialModel.experiment_id).where(TrialModel.id == runs[0][0]))
        assert storage == exp_id
        config = exps.get_experiment(s, exp_id)[0].config
        assert config["checkpoint_storage"]["save_experiment_best"] == 1
        assert config["checkpoint_storage"]["host_path"] == str(root)  # the rest of the section kept


def test_requests_come_from_every_way_a_trial_or_experiment_stops(sessions: sessionmaker[Session]) -> None:
    owner = make_owner(sessions)
    exp_id = new_experiment(sessions, owner)
    trial_id, run_id = running_trial(sessions, exp_id, "a")
    assert pending_requests(sessions) == 0
    with transaction(sessions) as s:
        exps.cancel_experiment(s, owner, exp_id)  # STOPPING_CANCELED: the job still runs
    assert pending_requests(sessions) == 0
    finish(sessions, run_id, TerminationReason.CANCELED_BY_USER)  # trial CANCELED, experiment CANCELED
    assert pending_requests(sessions) == 2
    with transaction(sessions) as s:
        assert s.get(TrialModel, trial_id).state == TrialState.CANCELED  # type: ignore[union-attr]


# ---------------------------------------------------------------- failures: recorded and retried


class FlakyRemover(CheckpointRemover):
    """Fails the first `failures` removals (some files gone), then removes as the master does."""

    def __init__(self, failures: int) -> None:
        super().__init__(as_owner=False)
        self.failures = failures
        self.calls = 0

    def remove(self, owner: Owner, paths: Sequence[Path]) -> dict[Path, Removal]:
        self.calls += 1
        if self.calls <= self.failures:
            return {
                p: Removal(ok=False, error=f"{p}/model.pt: Permission denied", touched=True) for p in paths
            }
        return super().remove(owner, paths)


def test_a_failed_deletion_is_recorded_and_retried_with_backoff_until_it_succeeds(
    sessions: sessionmaker[Session], root: Path, clock: Clock
) -> None:
    owner = make_owner(sessions)
    exp_id = new_experiment(sessions, owner)
    trial_id, run_id = running_trial(sessions, exp_id, "a")
    ckpts = add_checkpoints(sessions, root, trial_id, LOSSES)
    finish(sessions, run_id, TerminationReason.SEARCHER_DONE)
    remover = FlakyRemover(failures=2)
    gc_ = collector(sessions, root, clock, remover)
    assert gc_.run_once().failed.keys() == {ckpts[5], ckpts[15]}

    def row(steps: int) -> CheckpointModel:
        with transaction(sessions) as s:
            got = s.get(CheckpointModel, ckpts[steps])
            assert got is not None
            return got

    failed = row(5)
    assert failed.state == "PARTIALLY_DELETED" and failed.gc_attempts == 1
    assert "Permission denied" in (failed.gc_error or "")
    assert failed.gc_retry_at == T0 + dt.timedelta(seconds=30)
    with transaction(sessions) as s:
        shown = checkpoint_to_api(get_view(s, failed.uuid), Principal(0, "admin", admin=True), root)
    assert shown["state"] == "STATE_PARTIALLY_DELETED" and shown["deletion"]["attempts"] == 1

    gc_.run_once()  # not due yet: nothing tried
    assert remover.calls == 1 and row(5).gc_attempts == 1
    clock.advance(31)
    gc_.run_once()  # second failure: the wait doubles
    assert remover.calls == 2 and row(5).gc_attempts == 2
    assert row(5).gc_retry_at == clock.now + dt.timedelta(seconds=60)
    clock.advance(61)
    outcome = gc_.run_once()
    assert sorted(outcome.deleted) == sorted([ckpts[5], ckpts[15]])
    done = row(5)
    assert (done.state, done.gc_error, done.gc_retry_at) == ("DELETED", None, None)
    assert on_disk(root, ckpts) == {10, 20}
    assert retry_delay(1) == dt.timedelta(seconds=30) and retry_delay(30) == dt.timedelta(hours=1)


def test_an_owner_without_a_unix_account_is_a_recorded_failure_not_a_root_deletion(
    sessions: sessionmaker[Session], root: Path, clock: Clock
) -> None:
    owner = make_owner(sessions, unix=None)
    exp_id = new_experiment(sessions, owner)
    trial_id, run_id = running_trial(sessions, exp_id, "a")
    ckpts = add_checkpoints(sessions, root, trial_id, {5: 0.5, 10: 0.2, 15: 0.4})
    finish(sessions, run_id, TerminationReason.SEARCHER_DONE)
    gc_ = collector(sessions, root, clock, CheckpointRemover(as_owner=True))
    failed = gc_.run_once().failed
    assert list(failed) == [ckpts[5]] and "no Unix account" in failed[ckpts[5]]
    assert on_disk(root, ckpts) == {5, 10, 15}
    with transaction(sessions) as s:
        row = s.get(CheckpointModel, ckpts[5])
        assert row is not None and row.state == "COMPLETED"  # nothing was touched
        assert row.gc_attempts == 1 and row.gc_retry_at == T0 + dt.timedelta(seconds=30)


def test_collecting_never_waits_for_the_files(
    sessions: sessionmaker[Session], root: Path, clock: Clock
) -> None:
    """`step()` (the loop's) starts a removal in the collector's thread and returns; a later step records it."""
    release = threading.Event()

    class SlowRemover(CheckpointRemover):
        def remove(self, owner: Owner, paths: Sequence[Path]) -> dict[Path, Removal]:
            release.wait(30)
            return super().remove(owner, paths)

    owner = make_owner(sessions)
    exp_id = new_experiment(sessions, owner)
    trial_id, run_id = running_trial(sessions, exp_id, "a")
    ckpts = add_checkpoints(sessions, root, trial_id, LOSSES)
    finish(sessions, run_id, TerminationReason.SEARCHER_DONE)
    gc_ = collector(sessions, root, clock, SlowRemover(as_owner=False))
    try:
        started = time.monotonic()
        gc_.step()
        gc_.step()  # the removal is still in progress: nothing to wait for
        assert time.monotonic() - started < 5
        assert set(states(sessions, ckpts).values()) == {"COMPLETED"}
        release.set()
        deadline = time.monotonic() + 20
        while states(sessions, ckpts)[5] != "DELETED" and time.monotonic() < deadline:
            time.sleep(0.05)
            gc_.step()
        assert states(sessions, ckpts) == {5: "DELETED", 10: "COMPLETED", 15: "DELETED", 20: "COMPLETED"}
    finally:
        release.set()
        gc_.close()


# ---------------------------------------------------------------- as the owner's Unix account


@pytest.fixture
def researcher_storage() -> Iterator[tuple[str, Path]]:
    """A storage root the researcher owns on the shared test directory (as root, with the researcher account)."""
    require(os.geteuid() == 0, "root (removing as another account needs a root master)")
    name = os.environ.get("DET_TEST_USER", "researcher")
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        require(False, f"the {name!r} account")
        raise
    base = Path(os.environ.get("DET_TEST_SHARED_DIR", "/var/tmp/hpc-det-tests"))
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o1777)
    storage = base / f"gc-{uuid.uuid4().hex[:10]}"
    storage.mkdir()
    os.chown(storage, pw.pw_uid, pw.pw_gid)
    try:
        yield name, storage
    finally:
        shutil.rmtree(storage, ignore_errors=True)


@pytest.mark.root
@pytest.mark.slurm  # the researcher account is the cluster's: not while the exclusive lane takes it down and up
def test_a_root_master_deletes_as_the_owner_and_never_follows_a_link(
    sessions: sessionmaker[Session], root: Path, clock: Clock, researcher_storage: tuple[str, Path]
) -> None:
    account, storage = researcher_storage
    pw = pwd.getpwnam(account)
    owner = make_owner(sessions, unix=account)
    config = (
        CONFIG
        + f"checkpoint_storage: {{type: shared_fs, host_path: {storage}, save_trial_best: 0, save_trial_latest: 1}}\n"
    )
    exp_id = new_experiment(sessions, owner, config)
    trial_id, run_id = running_trial(sessions, exp_id, "a")
    ckpts = add_checkpoints(sessions, storage, trial_id, {5: 0.5, 10: 0.2, 15: 0.4})
    for path in [storage / u for u in ckpts.values()]:
        for p in (path, path / "model.pt"):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    # A directory the owner cannot empty (root's, inside their checkpoint): only root could delete it.
    locked = storage / ckpts[5] / "locked"
    locked.mkdir()
    (locked / "root-file").write_text("root's")
    # A link in place of a checkpoint, to root's files elsewhere: the link goes, never what it points to.
    outside = root / "precious"
    outside.mkdir(parents=True)
    (outside / "keep").write_text("keep me")
    shutil.rmtree(storage / ckpts[10])
    (storage / ckpts[10]).symlink_to(outside)
    finish(sessions, run_id, TerminationReason.SEARCHER_DONE)

    gc_ = collector(sessions, root, clock, CheckpointRemover(as_owner=True))
    outcome = gc_.run_once()
    assert outcome.deleted == [ckpts[10]]
    assert "Permission denied" in outcome.failed[ckpts[5]]
    assert not (storage / ckpts[10]).is_symlink() and (outside / "keep").read_text() == "keep me"
    assert (locked / "root-file").exists() and not (storage / ckpts[5] / "model.pt").exists()
    assert states(sessions, ckpts) == {5: "PARTIALLY_DELETED", 10: "DELETED", 15: "COMPLETED"}

    os.chown(locked, pw.pw_uid, pw.pw_gid)  # the admin fixes the permissions; the retry finishes the job
    clock.advance(31)
    assert gc_.run_once().deleted == [ckpts[5]]
    assert not (storage / ckpts[5]).exists() and (storage / ckpts[15]).is_dir()


# ---------------------------------------------------------------- the migration and the master's defaults


def test_the_migration_records_the_size_of_checkpoints_already_there(blank_url: str) -> None:
    from alembic import command
    from sqlalchemy import text

    from hpc_master.db.engine import make_engine
    from hpc_master.db.migrate import alembic_config, upgrade_to_head

    engine = make_engine(blank_url)
    try:
        with engine.begin() as conn:
            cfg = alembic_config(engine)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0003")
        with engine.begin() as conn:
            now = dt.datetime(2026, 1, 1)
            conn.execute(text("INSERT INTO users (id, username, password_hash, admin, active, created_at) "
                              "VALUES (1, 'u', '', false, true, :t)"), {"t": now})  # fmt: skip
            conn.execute(text("INSERT INTO experiments (id, owner_id, name, description, state, config_text, config, "
                              "archived, resource_pool, version, start_time) VALUES (1, 1, '', '', 'COMPLETED', '', "
                              "'{}', false, 'default', 0, :t)"), {"t": now})  # fmt: skip
            conn.execute(text("INSERT INTO trials (id, experiment_id, request_id, hparams, seed, state, restarts, "
                              "run_id, steps_completed, searcher_done, version, start_time) VALUES (1, 1, 'r', '{}', "
                              "0, 'COMPLETED', 0, 1, 5, false, 0, :t)"), {"t": now})  # fmt: skip
            for u, resources in (("a", '{"model.pt": 1000, "opt/": 0, "opt/s.pt": 24}'), ("b", "{}")):
                conn.execute(text("INSERT INTO checkpoints (uuid, trial_id, trial_run_id, steps_completed, state, "
                                  "resources, metadata, report_time) VALUES (:u, 1, 1, 5, 'COMPLETED', :r, '{}', :t)"),
                             {"u": u, "r": resources, "t": now})  # fmt: skip
        upgrade_to_head(engine)
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT uuid, size_bytes, gc_attempts FROM checkpoints ORDER BY uuid")
            ).all()
        assert [tuple(r) for r in rows] == [("a", 1024, 0), ("b", 0, 0)]
    finally:
        engine.dispose()


def test_the_masters_default_policy_is_counts() -> None:
    from hpc_master.errors import ConfigError
    from hpc_master.masterconf import parse_master_config

    with pytest.raises(ConfigError):
        parse_master_config({"checkpoint_storage": {"save_trial_best": -1}}, env={})
