"""Service layer: functions that own the logic and take the DB session explicitly.

Routers (``hpc_master.api``) stay thin; the lifecycle loop calls :mod:`hpc_master.services.lifecycle`.
"""
