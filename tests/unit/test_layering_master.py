"""The rooms inside ``hpc_master`` (issue 42): its sub-packages import one another one way only, and no module of
``hpc_master`` takes part in an import cycle (imports inside functions and under ``TYPE_CHECKING`` count, as in
test_layering.py).

From the bottom: ``db`` (the ORM rows) and ``expconf`` (experiment and task configs) import no other room and
no module above them; ``services`` (what the API and the loop do with the database) builds on them;
``lifecycle`` (the loop driving searchers and the job layer) on services; ``tasks`` (commands, notebooks,
shells, TensorBoards) on the job layer of lifecycle; ``ingest`` (the metrics writer behind the API: group
commits, its SQLite worker process, the plain-row parser) on services; ``api`` (the routers) on services,
tasks and ingest. ``cli``
(``det``) talks HTTP: of the master it imports the config models only, to check a config before sending it
(and ``admission``, for ``det preview``). ``deploy`` (``det deploy local``) imports no other room. The
top-level modules (``masterconf``, ``admission``, ``trialjob``, ``taskjob``, ``asuser``, ``server``, ...) are
not rooms; ``server`` wires everything.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_layering import REPO, _imports, _module_name

MASTER = REPO / "hpc_master"

# sub-room -> the sub-rooms (or single modules of one, by dotted prefix) it may import.
ALLOWED: dict[str, frozenset[str]] = {
    "db": frozenset(),
    "expconf": frozenset(),
    "deploy": frozenset(),
    "services": frozenset({"db", "expconf"}),
    "lifecycle": frozenset({"db", "expconf", "services"}),
    "tasks": frozenset({"db", "expconf", "services", "lifecycle"}),
    "ingest": frozenset({"db", "services"}),
    "api": frozenset({"db", "expconf", "services", "tasks", "ingest"}),
    "cli": frozenset({"expconf"}),
}
# What the config package imports of the modules above it: nothing since admission (parse, complete, dry run)
# moved above it, to `hpc_master.admission` (issue 42, item 1). Stays empty.
EXPCONF_UPWARD: frozenset[str] = frozenset()
NEUTRAL = frozenset({"hpc_master.errors"})
"""The exception classes (``det_errors``'s), which every room raises."""


@functools.cache
def _modules() -> dict[str, Path]:
    return {
        _module_name("hpc_master", p): p for p in sorted(MASTER.rglob("*.py")) if "__pycache__" not in p.parts
    }


@functools.cache
def _all_edges() -> list[tuple[str, str, int]]:
    return list(_edges(_modules()))


def _edges(modules: dict[str, Path]) -> Iterator[tuple[str, str, int]]:
    """(importer, imported module of hpc_master, line): `from pkg import sub` imports the submodule only."""
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for line, target, names in _imports(tree, name, path.name == "__init__.py"):
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            for t in subs if subs and len(subs) == len(names) else [target, *subs]:
                if t in modules and t != name:
                    yield name, t, line


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (MASTER / parts[1]).is_dir() else None


def test_every_sub_package_is_a_room_with_rules() -> None:
    packages = {p.parent.name for p in MASTER.glob("*/__init__.py")}
    assert packages == set(ALLOWED), "add the new room to ALLOWED, with the rooms it may import"


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_each_room_of_the_master_imports_only_the_rooms_below_it(room: str) -> None:
    bad = []
    for importer, target, line in _all_edges():
        if _room(importer) != room:
            continue
        other = _room(target)
        if other is None:
            if room == "expconf" and target not in EXPCONF_UPWARD | NEUTRAL:
                bad.append(f"{importer}:{line} imports {target}: expconf imports no module above it")
            continue
        dotted = target.split(".", 1)[1]
        if other != room and not any(dotted == a or dotted.startswith(a + ".") or other == a
                                     for a in ALLOWED[room]):  # fmt: skip
            bad.append(f"{importer}:{line} imports {target}: {room} may not import {other}")
    assert bad == []


def test_no_module_of_the_master_is_in_an_import_cycle() -> None:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for importer, target, _ in _all_edges():
        graph[importer].add(target)
    cycles = _cycles(graph)
    assert cycles == [], " ; ".join(" -> ".join(c) for c in cycles)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
