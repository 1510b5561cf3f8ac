"""Each top-level folder is one room; imports between rooms go one way only (docs/architecture.md, README's
"How the parts fit"). Every module of every room is read with ``ast`` (imports inside functions and under
``TYPE_CHECKING`` count too) and checked against these rules:

- ``det_errors`` (the one exception root) imports nothing of the project, so every room may raise its errors and
  the API maps them to HTTP once.
- ``searcher`` knows hyperparameters, metrics and trial ids only: nothing but ``det_errors``.
- ``slurm_backend`` is the only door to Slurm and "imports nothing from the master": ``det_errors`` only.
- ``containers`` (Apptainer invocation, image cache) is used by the master and by the job entry: ``det_errors`` only.
- ``harness`` runs inside jobs (standard library + optional torch): ``containers`` only (the job entry wraps a run
  in the image); never ``launchers`` or the master.
- ``launchers`` build per-node command lines inside jobs: they read the job's contracts from ``harness``.
- ``determined_compat`` (the ``determined`` package jobs get on ``PYTHONPATH``) is a facade over ``harness`` and
  ``launchers`` and nothing imports it.
- ``userfiles`` (files in directories users control, opened without following their links) is used by the master
  and, run as the user, by its per-user helper: standard library only.
- ``userhelper`` (the per-user helper: what the master does in a user's name, run as that user) uses
  ``userfiles`` only; the master imports it for its path and its checkpoint removal.
- ``local_cluster`` (``det deploy local``: packages, munge, namespaces) may use ``slurm_backend`` but not the master.
- ``hpc_master`` (service and CLI) sits on top: it may import every room except ``launchers`` and the
  ``determined`` facade (the job script names them as commands, it never imports them).

An import that crosses rooms goes through public modules and names: no path component or imported name with a
leading underscore. ``tests/``, ``bench/``, ``examples/`` and ``scripts/`` are not rooms and may import anything.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# room -> the rooms it may import (besides itself).
ALLOWED: dict[str, frozenset[str]] = {
    "det_errors": frozenset(),
    "searcher": frozenset({"det_errors"}),
    "slurm_backend": frozenset({"det_errors"}),
    "containers": frozenset({"det_errors"}),
    "userfiles": frozenset(),
    "userhelper": frozenset({"userfiles"}),
    "harness": frozenset({"containers"}),
    "launchers": frozenset({"harness"}),
    "determined_compat": frozenset({"harness", "launchers"}),
    "local_cluster": frozenset({"det_errors", "slurm_backend"}),
    "hpc_master": frozenset(
        {
            "det_errors",
            "searcher",
            "slurm_backend",
            "containers",
            "harness",
            "local_cluster",
            "userfiles",
            "userhelper",
            "webui",
        }
    ),
    "webui": frozenset(),  # static assets and a path helper
}
NOT_ROOMS = frozenset({"tests", "bench", "examples", "scripts", "docs", "build", "dist"})


def _room_of_import(module: str) -> str | None:
    top = module.split(".")[0]
    if top == "determined":
        return "determined_compat"
    return top if top in ALLOWED else None


def _module_name(room: str, path: Path) -> str:
    rel = path.relative_to(REPO / room).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    # determined_compat/ is put on PYTHONPATH: determined_compat/determined/launch/mpi.py is determined.launch.mpi
    return ".".join(parts if room == "determined_compat" else [room, *parts])


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str, list[str]]]:
    """(line, imported module, imported names) for every import, relative ones resolved."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            yield node.lineno, base, [a.name for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value, []


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))  # __all__ is public


def _room_files(room: str) -> list[Path]:
    return sorted(p for p in (REPO / room).rglob("*.py") if "__pycache__" not in p.parts)


def _violations(room: str) -> list[str]:
    out = []
    for path in _room_files(room):
        module = _module_name(room, path)
        tree = ast.parse(path.read_text(), str(path))
        for line, target, names in _imports(tree, module, path.name == "__init__.py"):
            other = _room_of_import(target)
            if other is None or other == room:
                continue
            where = f"{path.relative_to(REPO)}:{line}: imports {target}"
            if other not in ALLOWED[room]:
                out.append(f"{where}: {room} may not import {other}")
            private = [n for n in [*target.split("."), *names] if _is_private(n)]
            if private:
                out.append(f"{where}: private {private} of another room (make it a public contract)")
    return out


def test_every_top_level_package_is_a_room_with_rules() -> None:
    packages = {
        p.parent.name
        for p in REPO.glob("*/__init__.py")
        if p.parent.name not in NOT_ROOMS and not p.parent.name.startswith(".")
    }
    assert packages - set(ALLOWED) == set(), "add the new room to ALLOWED, with the rooms it may import"
    for room in ALLOWED:
        assert (REPO / room).is_dir(), room
        assert _room_files(room), room


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_room_imports_only_what_its_layer_allows(room: str) -> None:
    assert _violations(room) == []


def test_the_rules_have_no_cycle() -> None:
    """Two rooms that may import each other (directly or through others) are one room: the table is a DAG."""
    for room in ALLOWED:
        stack, seen = list(ALLOWED[room]), set()
        while stack:
            nxt = stack.pop()
            assert nxt != room, f"{room} can reach itself through the allowed imports"
            if nxt not in seen:
                seen.add(nxt)
                stack.extend(ALLOWED[nxt])


def test_master_errors_are_the_neutral_classes_so_the_api_maps_backend_errors() -> None:
    import det_errors
    from hpc_master import errors

    for name in ("DetError", "ClientError", "ConfigError", "NotFoundError", "ServerError", "SlurmError"):
        assert getattr(errors, name) is getattr(det_errors, name), name


def test_the_local_cluster_installer_is_not_in_the_slurm_backend() -> None:
    assert importlib.util.find_spec("slurm_backend.local") is None
    assert importlib.util.find_spec("local_cluster.cluster") is not None
