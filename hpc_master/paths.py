"""Where the master keeps its files by default.

Every path derived from the environment comes from a ``get_*()`` function, read at call time, so tests (and
admins) can redirect it with an environment variable:

- ``DET_MASTER_DATA_DIR``: database directory (default ``$XDG_DATA_HOME/hpc-det`` or ``~/.local/share/hpc-det``)
- ``DET_MASTER_STATE_DIR``: pid and log files of ``det-master --daemon`` (default ``$XDG_STATE_HOME/hpc-det``
  or ``~/.local/state/hpc-det``)
- ``DET_JOB_STORAGE_ROOT``: per-trial working directories (default ``~/hpc-det/jobs``)
- ``DET_CHECKPOINT_ROOT``: checkpoint storage (default ``~/hpc-det/checkpoints``)
- ``XDG_CONFIG_HOME``: the CLI's token cache and a personal master's owner keys (default ``~/.config/hpc-det``)
"""

from __future__ import annotations

import os
from pathlib import Path


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else None


def get_home_dir() -> Path:
    return Path(os.environ.get("HOME") or Path.home())


def get_data_dir() -> Path:
    explicit = _env_path("DET_MASTER_DATA_DIR")
    if explicit is not None:
        return explicit
    xdg = _env_path("XDG_DATA_HOME")
    return (xdg if xdg is not None else get_home_dir() / ".local" / "share") / "hpc-det"


def get_state_dir() -> Path:
    explicit = _env_path("DET_MASTER_STATE_DIR")
    if explicit is not None:
        return explicit
    xdg = _env_path("XDG_STATE_HOME")
    return (xdg if xdg is not None else get_home_dir() / ".local" / "state") / "hpc-det"


def get_default_db_path() -> Path:
    return get_data_dir() / "master.db"


def get_default_db_url() -> str:
    return f"sqlite:///{get_default_db_path()}"


def get_job_storage_root() -> Path:
    return _env_path("DET_JOB_STORAGE_ROOT") or get_home_dir() / "hpc-det" / "jobs"


def get_checkpoint_root() -> Path:
    return _env_path("DET_CHECKPOINT_ROOT") or get_home_dir() / "hpc-det" / "checkpoints"


def get_pid_file() -> Path:
    return get_state_dir() / "master.pid"


def get_log_file() -> Path:
    return get_state_dir() / "master.log"


def get_config_dir() -> Path:
    xdg = _env_path("XDG_CONFIG_HOME")
    return (xdg if xdg is not None else get_home_dir() / ".config") / "hpc-det"


def get_owner_key_file(port: int) -> Path:
    """Where a personal master on loopback port `port` writes the key that proves its owner (mode 0600)."""
    return get_config_dir() / f"owner-key-{port}"
