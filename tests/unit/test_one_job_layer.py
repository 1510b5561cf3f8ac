"""One job layer: trials' and tasks' jobs reach Slurm through one call site, and everything the master does in a
user's name goes through one seam (``hpc_master.asuser``), so that the master's privilege separation replaces
one implementation.

Read with ``ast`` over every module of the rooms that are not the Slurm backend or the throwaway cluster:
- the only ``<something>cli.submit(...)`` (``SlurmCli.submit``, i.e. sbatch) is in ``SlurmJobs.submit``;
- no string that is a Slurm command about jobs (``"sbatch"``, ``"scancel"``, ``"squeue"``…) appears in what the
  master runs outside ``slurm_backend`` (which runs them): nothing builds its own Slurm command line (code that
  runs inside a user's job, as the user, is not the master's);
- in the master, only ``hpc_master.asuser`` (and the run-directory writers it wraps) imports ``userfiles``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOMS = ("hpc_master", "harness", "containers", "launchers", "determined_compat", "userfiles", "searcher")
SLURM_COMMANDS = {"sbatch", "scancel", "salloc", "squeue", "sacct", "scontrol"}
"""Commands about jobs (``srun`` is not one: `det shell open` runs it on the login node as whoever typed it)."""
JOB_SIDE = {"harness", "launchers", "determined_compat"}
"""Code that runs inside a user's job, as the user (``scontrol show hostnames``, ``srun`` for ranks)."""
SEAM = "hpc_master/asuser.py"
SEAM_IMPLEMENTATION = {SEAM, "hpc_master/trialjob_files.py", "hpc_master/helper_client.py"}


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for room in ROOMS:
        for path in sorted((REPO / room).rglob("*.py")):
            yield str(path.relative_to(REPO)), ast.parse(path.read_text(), str(path))


def _enclosing(tree: ast.Module) -> dict[ast.AST, str]:
    """Each node → the qualified name of the function (or class) it is in."""
    names: dict[ast.AST, str] = {}

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = f"{scope}.{child.name}" if scope else child.name
            names[child] = inner
            visit(child, inner)

    visit(tree, "")
    return names


def test_sbatch_has_one_call_site_for_trials_and_tasks() -> None:
    sites = []
    for rel, tree in _modules():
        scope = _enclosing(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "submit"
                and "cli" in ast.unparse(node.func.value).lower()
            ):
                sites.append(f"{rel}:{scope.get(node, '')}")
    assert sites == ["hpc_master/lifecycle/slurm_jobs.py:SlurmJobs.submit"], sites


def test_no_slurm_command_line_is_built_outside_the_slurm_backend() -> None:
    found = []
    for rel, tree in _modules():
        if rel.split("/")[0] in JOB_SIDE:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in SLURM_COMMANDS:
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert found == [], found


def test_only_the_seam_touches_users_files() -> None:
    importers = []
    for rel, tree in _modules():
        if not rel.startswith("hpc_master/"):
            continue
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if any(n == "userfiles" or n.startswith("userfiles.") for n in names):
                importers.append(("userfiles", rel))
            if any(n == "hpc_master.trialjob_files" for n in names):
                importers.append(("trialjob_files", rel))
    outside = [(what, rel) for what, rel in importers if rel not in SEAM_IMPLEMENTATION]
    assert outside == [], outside
    assert ("trialjob_files", SEAM) in importers and ("userfiles", SEAM) in importers
