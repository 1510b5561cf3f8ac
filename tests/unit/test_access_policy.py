"""Access decisions live in one place, ``hpc_master/services/access.py`` (issue 42: one permission check per
resource, the seam that teams build on). Every module of the master is read with ``ast``: outside the policy, no
code reads whether the caller is an admin (``principal.admin``) or compares the caller's id with an owner's
(``x.owner_id != principal.user_id``); it asks ``access`` instead."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "hpc_master" / "services" / "access.py"
CALLERS = frozenset({"principal", "viewer", "caller"})
"""The names the master gives whoever calls (``services.access.Principal``)."""
NOT_ACCESS = {
    (
        "hpc_master/tasks/service.py",
        "create_task",
    ): "counts the caller's own live tasks (a quota, not access)",
}
"""Comparisons with the caller's id that decide no access, each with why."""


def _caller_attribute(node: ast.AST, attrs: set[str]) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr in attrs
        and isinstance(node.value, ast.Name)
        and node.value.id in CALLERS
    )


def _decisions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[str] = []
    rel = path.relative_to(REPO).as_posix()

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if _caller_attribute(child, {"admin"}) and not isinstance(getattr(child, "ctx", None), ast.Store):
                found.append(f"{rel}:{child.lineno} ({name}): reads the caller's admin flag")
            if (
                isinstance(child, ast.Compare)
                and any(_caller_attribute(side, {"user_id"}) for side in (child.left, *child.comparators))
                and (rel, name) not in NOT_ACCESS
            ):
                found.append(f"{rel}:{child.lineno} ({name}): compares the caller's id with an owner's")
            visit(child, name)

    visit(tree, "")
    return found


def test_no_access_decision_outside_the_policy() -> None:
    modules = [
        p for p in sorted((REPO / "hpc_master").rglob("*.py")) if p != POLICY and "__pycache__" not in p.parts
    ]
    found = [line for path in modules for line in _decisions(path)]
    assert not found, "ask hpc_master/services/access.py instead:\n" + "\n".join(found)


def test_the_check_finds_a_decision() -> None:
    """The test above would fail on an inline check (so it can fail)."""
    sample = REPO / "hpc_master" / "services" / "access.py"
    assert any("admin flag" in line for line in _decisions(sample))
    assert any("compares the caller's id" in line for line in _decisions(sample))
