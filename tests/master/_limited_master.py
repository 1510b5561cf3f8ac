"""The master's REST API under uvicorn with a lower body limit: ``python -m tests.master._limited_master PORT BYTES``.

For the body-limit tests, which need a real server (the test client does not stream) and would otherwise
have to send 140 MB to pass the limit. Configuration comes from the environment, as for ``det-master``.
"""

from __future__ import annotations

import sys

import uvicorn

from hpc_master.api import app as app_module
from hpc_master.masterconf import load_master_config


def main() -> None:
    port, limit = int(sys.argv[1]), int(sys.argv[2])
    app_module.MAX_BODY_BYTES = limit
    app = app_module.create_app(load_master_config(None))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
