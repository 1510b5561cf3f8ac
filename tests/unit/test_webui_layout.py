"""The web UI's rooms (webui/js): the router (main.js) and shared modules at the top, ``components/`` (the one
table, the detail-page shell, the checkpoints table), ``pages/`` (one module per route) and ``tabs/<page>/``
(a detail page's tabs). Read from the files themselves:

- no page imports another page; a tab imports no page and no other tab; a component imports neither;
- every page lives on the one lifecycle helper (``pageLife``, or the detail shell built on it) and returns
  its cleanup;
- one table builder: ``<table>`` is made in ``components/table.js`` only;
- the master's vocabularies are not re-typed: no state, termination reason or task state of the master's
  tables is a string in the JavaScript (``GET /api/v1/webui/vocabulary`` serves them).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpc_master.services.states import ExperimentState, RunState, TerminationReason, TrialState
from hpc_master.tasks.service import TaskState

JS = Path(__file__).resolve().parents[2] / "webui" / "js"
IMPORT = re.compile(r"""^\s*import\b[^"']*["']([^"']+)["']""", re.M)


def _modules() -> list[Path]:
    return sorted(JS.rglob("*.js"))


def _room(path: Path) -> str:
    rel = path.relative_to(JS).parts
    return rel[0] if len(rel) > 1 else "shared"


def _imports(path: Path) -> list[Path]:
    return [(path.parent / spec).resolve() for spec in IMPORT.findall(path.read_text())]


def test_the_rooms_are_as_documented() -> None:
    rooms = {_room(p) for p in _modules()}
    assert rooms == {"shared", "components", "pages", "tabs"}, rooms


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(JS)))
def test_imports_go_one_way(path: Path) -> None:
    room = _room(path)
    for target in _imports(path):
        assert target.exists(), f"{path.relative_to(JS)} imports {target}, which does not exist"
        to = _room(target)
        where = f"{path.relative_to(JS)} imports {target.relative_to(JS)}"
        if path.name == "main.js":
            continue  # the router imports the pages
        if room == "shared":
            assert to == "shared", where
        elif room == "components":
            assert to in {"shared", "components"}, where
        elif room == "tabs":
            assert to in {"shared", "components"}, f"{where}: a tab imports no page and no other tab"
        elif room == "pages":
            assert to in {"shared", "components", "tabs"}, f"{where}: no page imports another page"
            if to == "tabs":
                own = target.relative_to(JS / "tabs").parts[0]
                assert own == path.stem, f"{where}: a page opens its own tabs only"


@pytest.mark.parametrize("path", sorted((JS / "pages").glob("*.js")), ids=lambda p: p.name)
def test_every_page_is_on_the_lifecycle_helper(path: Path) -> None:
    text = path.read_text()
    assert re.search(r"^export function render\(", text, re.M), path.name
    assert "pageLife(" in text or "detailPage(" in text, f"{path.name} does not use page.js's pageLife"
    assert "setTimeout(" not in text and "setInterval(" not in text, (
        f"{path.name}: timers go through the page's life"
    )
    assert "new AbortController(" not in text, f"{path.name}: requests go through the page's life"


def test_one_table_builder() -> None:
    makers = [p.relative_to(JS) for p in _modules() if re.search(r"""h\(\s*["']table["']""", p.read_text())]
    assert makers == [Path("components/table.js")]


def test_no_vocabulary_is_retyped() -> None:
    words = {str(v) for enum in (ExperimentState, TrialState, RunState, TerminationReason) for v in enum}
    words |= {str(v) for v in TaskState} | {str(v).removeprefix("STATE_") for v in TaskState}
    found = []
    for path in _modules():
        for literal in re.findall(r"""["'`]([A-Z][A-Z_]+)["'`]""", path.read_text()):
            if literal in words:
                found.append(f"{path.relative_to(JS)}: {literal}")
    assert not found, found
