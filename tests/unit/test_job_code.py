"""The master byte-compiles the packages jobs import, since jobs run as accounts that cannot write there."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hpc_master.lifecycle.job_host import JOB_PACKAGES, compile_job_code


def test_compile_job_code_writes_bytecode_for_every_job_module(tmp_path: Path) -> None:
    for package in JOB_PACKAGES:
        (tmp_path / package / "sub").mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "sub" / "mod.py").write_text("X = 1\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "skip.py").write_text("Y = 2\n")

    assert compile_job_code(str(tmp_path)) is True

    for package in JOB_PACKAGES:
        source = tmp_path / package / "sub" / "mod.py"
        assert Path(importlib.util.cache_from_source(str(source))).is_file()
    assert not (tmp_path / "other" / "__pycache__").exists()  # only what jobs import


def test_compile_job_code_reports_a_module_that_does_not_compile(tmp_path: Path) -> None:
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "broken.py").write_text("def f(:\n")
    assert compile_job_code(str(tmp_path)) is False
