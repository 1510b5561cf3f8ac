"""HTTP API: thin FastAPI routers over :mod:`hpc_master.services`."""

from hpc_master.api.app import create_app

__all__ = ["create_app"]
