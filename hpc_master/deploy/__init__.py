"""Files for installing a shared master as a service: ``det-master.service`` (systemd), shipped in the package.

``det-master [--config PATH] --print-systemd-unit`` prints the unit for this installation: its ``ExecStart``
names this installation's ``det-master`` and the given config (default ``/etc/hpc-det/master.yaml``), its
``EnvironmentFile`` the ``master.env`` beside that config (the secrets: ``DET_DB_URL``, ``DET_ADMIN_PASSWORD``).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

UNIT_FILE = Path(__file__).with_name("det-master.service")
DEFAULT_CONFIG = "/etc/hpc-det/master.yaml"
_EXEC_START = "ExecStart="
_ENVIRONMENT_FILE = "EnvironmentFile="


def det_master_command() -> list[str]:
    """This installation's ``det-master``: the script beside the interpreter (a virtual environment's bin/),
    else the interpreter running the module."""
    script = Path(sys.executable).with_name("det-master")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-m", "hpc_master.server"]


def systemd_unit(config: str | Path | None = None, command: list[str] | None = None) -> str:
    """The shipped unit with ``ExecStart`` set to `command` (default: this installation's) and `config`, and
    ``EnvironmentFile`` to ``master.env`` beside `config`."""
    config = Path(config or DEFAULT_CONFIG)
    argv = [*(command or det_master_command()), "--config", str(config)]
    lines = UNIT_FILE.read_text().splitlines()
    _replace(lines, _EXEC_START, shlex.join(argv))
    _replace(lines, _ENVIRONMENT_FILE, "-" + shlex.quote(str(config.parent / "master.env")))
    return "\n".join(lines) + "\n"


def _replace(lines: list[str], key: str, value: str) -> None:
    found = [i for i, line in enumerate(lines) if line.startswith(key)]
    if len(found) != 1:
        raise RuntimeError(f"{UNIT_FILE} must have one {key} line")
    lines[found[0]] = key + value.replace("%", "%%")  # % starts a systemd specifier
