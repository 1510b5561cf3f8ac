"""Project-wide test policy.

Tests that need a real service (Slurm, PostgreSQL, Apptainer) skip when it is absent on a developer's machine,
but CI sets DET_TEST_REQUIRE_ALL=1 and then a missing service is a failure, never a silent skip.
"""

from __future__ import annotations

import os

import pytest


def require(condition: bool, what: str) -> None:
    """Skip (or, under DET_TEST_REQUIRE_ALL=1, fail) when a real service the test needs is missing."""
    if condition:
        return
    if os.environ.get("DET_TEST_REQUIRE_ALL") == "1":
        pytest.fail(f"{what} is required (DET_TEST_REQUIRE_ALL=1) but not available")
    pytest.skip(f"{what} not available")


# Fixtures for tests on the real Slurm cluster (`cluster`, `researcher`, `shared_dir`), shared by tests/slurm
# and tests/e2e.
# The leak gate (tests/leakgate.py): a test that leaves a job, a process or a core dump behind fails.
pytest_plugins = ["tests.slurm.fixtures", "tests.leakgate"]
