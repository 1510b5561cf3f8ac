"""No new function of the product at radon's cyclomatic rank C or worse (complexity above 10), and the list of
those there are only shrinks (issue 42: ≤ 60, from 114). A function that grows into rank C is split before it
lands, or, where that would be worse, added to `COMPLEX` below with a reason in the commit; one that was split
comes off the list (the test says which)."""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_rank, cc_visit

REPO = Path(__file__).resolve().parents[2]
ROOMS = (
    "det_errors", "searcher", "slurm_backend", "containers", "userfiles", "userhelper", "harness", "launchers",
    "determined_compat", "local_cluster", "hpc_master", "webui",
)  # fmt: skip
COMPLEX_FILE = Path(__file__).parent / "complex_functions.txt"


def _complex() -> dict[str, int]:
    """``path::name`` → complexity, for every function and method of rank C or worse."""
    out: dict[str, int] = {}
    for room in ROOMS:
        for path in sorted((REPO / room).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            for block in cc_visit(path.read_text()):
                if cc_rank(block.complexity) >= "C":
                    out[f"{path.relative_to(REPO)}::{block.fullname}"] = block.complexity
    return out


def _listed() -> set[str]:
    lines = COMPLEX_FILE.read_text().splitlines()
    return {line.split()[0] for line in lines if line.strip() and not line.startswith("#")}


def test_no_new_function_of_rank_c_or_worse_and_the_list_only_shrinks() -> None:
    found, listed = _complex(), _listed()
    new = sorted(f"{k} ({found[k]})" for k in set(found) - listed)
    gone = sorted(listed - set(found))
    assert not new, f"split these (radon rank C or worse, complexity > 10): {new}"
    assert not gone, f"no longer complex (or renamed): take them off {COMPLEX_FILE.name}: {gone}"


def test_the_ranks_are_radon_s() -> None:
    assert (cc_rank(10), cc_rank(11), cc_rank(21)) == ("B", "C", "D")
