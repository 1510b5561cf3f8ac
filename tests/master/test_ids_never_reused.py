"""Ids are never reused (issue 31): a deleted experiment's, trial's or model's id is not given to the next one, on a
database migrated from every earlier revision as on a new one. SQLite needs ``AUTOINCREMENT`` for it (migration
0008 rebuilds the tables, keeping every row); PostgreSQL's sequences never go back."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, func, select, text

from hpc_master.db.engine import make_engine, make_sessionmaker, transaction
from hpc_master.db.migrate import alembic_config, upgrade_to_head
from hpc_master.db.models import (
    CheckpointModel,
    ExperimentModel,
    RegistryModel,
    TrialModel,
    TrialRunModel,
    UserModel,
)
from hpc_master.services import experiments as exps
from hpc_master.services import lifecycle
from hpc_master.services.access import Principal

from .helpers import CONFIG

pytestmark = pytest.mark.storage


def _upgrade(engine: Engine, revision: str) -> None:
    with engine.begin() as conn:
        cfg = alembic_config(engine)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def _counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            model.__tablename__: conn.scalar(select(func.count()).select_from(model)) or 0
            for model in (ExperimentModel, TrialModel, TrialRunModel, CheckpointModel, RegistryModel)
        }


def _copy_rows(source: Engine, target: Engine) -> None:
    """Every row of `source` (at head) into `target` (at an older revision), with the columns that revision
    has: the rows an older master wrote, without running today's models against yesterday's schema."""
    from sqlalchemy import MetaData

    from hpc_master.db.models import Base

    old = MetaData()
    old.reflect(target)
    with source.connect() as src, target.begin() as dst:
        for table in Base.metadata.sorted_tables:
            if table.name not in old.tables:
                continue
            keep = set(old.tables[table.name].c.keys())
            rows = [
                {k: v for k, v in row.items() if k in keep} for row in src.execute(table.select()).mappings()
            ]
            if rows:
                dst.execute(old.tables[table.name].insert(), rows)
            if rows and target.dialect.name == "postgresql" and "id" in keep:  # as if the rows were inserted
                dst.execute(text(f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), "
                                 f"(SELECT max(id) FROM {table.name}))"))  # fmt: skip


def test_a_deleted_id_is_not_given_again_after_the_migration(blank_url: str, tmp_path: Path) -> None:
    engine = make_engine(blank_url)
    scratch = make_engine(f"sqlite:///{tmp_path}/head.db")
    upgrade_to_head(scratch)
    sessions = make_sessionmaker(scratch)
    try:
        _upgrade(engine, "0007")  # the schema every earlier migration made
        with transaction(sessions) as s:
            user = UserModel(username="alice", password_hash="", admin=False)
            s.add(user)
            s.flush()
            owner = Principal(user_id=user.id, username="alice", admin=False)
        ids = []
        for _ in range(2):
            with transaction(sessions) as s:
                exp, _ = exps.create_experiment(
                    s, owner, config_text=CONFIG, model_definition=[], activate=True
                )
                assert exp is not None
                trial = lifecycle.create_trial(s, exp.id, "r1", {"lr": 0.1})
                run = lifecycle.allocate_trial_run(s, trial.id)
                s.add(CheckpointModel(uuid=f"ck-{trial.id}", trial_id=trial.id, trial_run_id=run.id))
                ids.append((exp.id, trial.id))
        with transaction(sessions) as s:
            s.add(RegistryModel(name="m", name_key="m", user_id=owner.user_id))
        _copy_rows(scratch, engine)
        sessions = make_sessionmaker(engine)
        before = _counts(engine)

        upgrade_to_head(engine)

        assert _counts(engine) == before  # the rebuild kept every row; nothing cascaded from a dropped table
        if engine.dialect.name == "sqlite":
            with engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1  # on again for the master
                assert conn.exec_driver_sql("PRAGMA foreign_key_check").all() == []

        newest_exp, newest_trial = ids[-1]
        with transaction(sessions) as s:
            exps.finish_delete(s, newest_exp)  # the trial goes with it (ON DELETE CASCADE)
            s.execute(text("DELETE FROM models"))
        with transaction(sessions) as s:
            exp, _ = exps.create_experiment(s, owner, config_text=CONFIG, model_definition=[], activate=True)
            assert exp is not None
            trial = lifecycle.create_trial(s, exp.id, "r1", {"lr": 0.1})
            model = RegistryModel(name="m2", name_key="m2", user_id=owner.user_id)
            s.add(model)
            s.flush()
            assert exp.id > newest_exp
            assert trial.id > newest_trial
            assert model.id > 1
    finally:
        engine.dispose()
        scratch.dispose()


def test_a_new_database_never_reuses_ids(engine: Engine) -> None:
    sessions = make_sessionmaker(engine)
    with transaction(sessions) as s:
        user = UserModel(username="bob", password_hash="", admin=False)
        s.add(user)
        s.flush()
        owner = Principal(user_id=user.id, username="bob", admin=False)
    with transaction(sessions) as s:
        exp, _ = exps.create_experiment(s, owner, config_text=CONFIG, model_definition=[], activate=True)
        assert exp is not None
        first = exp.id
    with transaction(sessions) as s:
        exps.finish_delete(s, first)
    with transaction(sessions) as s:
        exp, _ = exps.create_experiment(s, owner, config_text=CONFIG, model_definition=[], activate=True)
        assert exp is not None
        assert exp.id > first
