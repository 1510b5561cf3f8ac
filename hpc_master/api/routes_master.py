"""The master's own configuration (admins): ``GET /api/v1/master/config``, as Determined's ``det master config``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from hpc_master.api.deps import State, UserPrincipal
from hpc_master.services.master_config import effective_config

router = APIRouter(prefix="/api/v1", tags=["master"])


@router.get("/master/config")
async def get_master_config(state: State, principal: UserPrincipal) -> dict[str, Any]:
    """The effective configuration (file, environment and command line merged, defaults resolved), secrets
    masked. Admins only: it names the database, the storage paths and the cluster's pools."""
    principal.require_admin()
    return {"config": effective_config(state.config)}
