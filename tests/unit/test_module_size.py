"""Every module of the product can be read in one sitting: at most 600 lines (the brief's standard; issue 42).

A module that grows past it is split by what it holds (as ``api/responses.py`` was into ``responses_checkpoints``,
``responses_tasks`` and ``responses_ui``). The product is the rooms of ``test_layering``; ``tests/``, ``bench/``,
``examples/`` and ``scripts/`` are not rooms.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_layering import ALLOWED

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 600


def _product_modules() -> list[Path]:
    """The modules of every room (``test_layering.ALLOWED``: the product's top-level folders)."""
    return [
        m
        for room in sorted(ALLOWED)
        for m in sorted((REPO / room).rglob("*.py"))
        if "__pycache__" not in m.parts
    ]


def test_no_module_is_over_600_lines() -> None:
    modules = _product_modules()
    assert len(modules) > 100  # the product was found
    long = {
        p.relative_to(REPO).as_posix(): n
        for p in modules
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these by what they hold: {long}"
