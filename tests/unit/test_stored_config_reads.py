"""A stored config is read in one place (issue 42): ``hpc_master.services.stored_config`` turns an experiment's or
task's stored config into its typed model, so a field has one default and one meaning. Anywhere else in the
master, a raw read of a row's config (``x.config[...]``, ``x.config.get(...)``, ``(x.config or {})...``) fails
this test; SQL over the column (``ExperimentModel.config["labels"]``) is not a read of a row."""

from __future__ import annotations

import ast

from tests.unit.test_layering import REPO

MASTER = REPO / "hpc_master"
ACCESSOR = MASTER / "services" / "stored_config.py"
MODEL_CLASSES = {"ExperimentModel", "TaskModel"}


def _is_row_config(node: ast.AST) -> bool:
    """``<expr>.config`` or ``(<expr>.config or {})``, where <expr> is not a model class (SQL) nor the master's
    own config (``state.config``, a `MasterConfig`)."""
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        return _is_row_config(node.values[0])
    if not (isinstance(node, ast.Attribute) and node.attr == "config"):
        return False
    base = node.value
    return not (isinstance(base, ast.Name) and (base.id in MODEL_CLASSES or base.id in {"state", "self"}))


def raw_reads(source: str, name: str) -> list[str]:
    """``name:line: expression`` for each raw read of a row's config in `source`."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        target = None
        if isinstance(node, ast.Subscript):
            target = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target = node.func.value
        if target is not None and _is_row_config(target):
            found.append((node.lineno, f"{name}:{node.lineno}: {ast.unparse(node)}"))
    return [text for _, text in sorted(found)]


def test_no_module_but_the_accessor_reads_a_stored_config_raw() -> None:
    found = [
        read
        for path in sorted(MASTER.rglob("*.py"))
        if path != ACCESSOR
        for read in raw_reads(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert found == [], "read it through hpc_master.services.stored_config (experiment_config, task_config)"


def test_the_check_finds_the_raw_reads_it_is_for() -> None:
    sample = (
        "a = experiment.config['searcher']\n"
        "b = experiment.config.get('max_restarts', 5)\n"
        "c = (task.config or {}).get('resources')\n"
        "d = ExperimentModel.config['labels']\n"  # SQL: not a read
        "e = state.config.get('x')\n"  # the master's config
    )
    found = [line.split(": ", 1)[1] for line in raw_reads(sample, "sample.py")]
    assert found == [
        "experiment.config['searcher']",
        "experiment.config.get('max_restarts', 5)",
        "(task.config or {}).get('resources')",
    ]


WRITERS = {
    "hpc_master/services/experiments.py",  # create: the completed config admission produced
    "hpc_master/tasks/service.py",  # create a task
    "hpc_master/services/experiment_patch.py",  # PATCH: what `stored_config.edited_config` returns
}
"""The modules that write a stored config. The accessor's cache compares only the sections ``PATCH`` may change
(`stored_config.EDITABLE`), so another writer would go unseen by it: add one here only through the accessor."""


def config_writes(source: str, name: str) -> list[str]:
    """``name:line`` of each write of a row's config: ``x.config = ...``, ``Model(config=...)``,
    ``update(...).values(config=...)`` or ``.values(**...)``."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_is_row_config(t) for t in targets):
                found.append(f"{name}:{node.lineno}")
        elif isinstance(node, ast.Call):
            func = node.func
            called = getattr(func, "attr", None) or getattr(func, "id", "")
            given = {k.arg for k in node.keywords}
            # ``.values(**values)`` may hold a config: counted, as its keys are not known here
            if ("config" in given and called in {*MODEL_CLASSES, "guarded_update"}) or (
                called == "values" and given & {"config", None}
            ):
                found.append(f"{name}:{node.lineno}")
    return sorted(found, key=lambda f: int(f.rsplit(":", 1)[1]))


GENERIC = {"hpc_master/services/common.py"}
"""``guarded_update(..., **values)``: its callers are checked instead (a ``config=`` to it counts)."""


def test_only_the_known_writers_write_a_stored_config() -> None:
    writers = {
        str(path.relative_to(REPO))
        for path in sorted(MASTER.rglob("*.py"))
        if config_writes(path.read_text(), str(path.relative_to(REPO)))
    }
    writers -= GENERIC
    assert writers == WRITERS


def test_the_writer_check_finds_writes() -> None:
    sample = (
        "experiment.config = {}\n"
        "s.add(ExperimentModel(owner_id=1, config=c))\n"
        "update(ExperimentModel).values(config=c)\n"
        "parse_master_config(config=c)\n"  # not a row
    )
    assert config_writes(sample, "s.py") == ["s.py:1", "s.py:2", "s.py:3"]
