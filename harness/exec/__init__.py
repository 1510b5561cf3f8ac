"""Executables run inside jobs (``python -m harness.exec.run_trial``)."""
