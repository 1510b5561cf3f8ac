"""The master's REST API alone (no lifecycle loop), under uvicorn: ``python -m tests.cli._api_master PORT``.

The fast CLI tests use it so that no experiment they create is ever turned into Slurm jobs: they seed trials
in the database themselves. Configuration comes from the environment (``DET_DB_URL`` and the other
``ENV_OVERRIDES``), exactly as for ``det-master``.
"""

from __future__ import annotations

import os
import sys

import uvicorn

from hpc_master.api.app import create_app
from hpc_master.masterconf import load_master_config
from hpc_master.systemd import configure_logging


def main() -> None:
    port = int(sys.argv[1])
    configure_logging("info")  # as det-master: to the output, and to the ring `det master logs` reads
    config = load_master_config(None, env={**os.environ, "DET_LISTEN_PORT": str(port)})
    uvicorn.run(create_app(config), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
