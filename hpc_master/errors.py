"""The master's name for the project's one exception root, which lives in ``det_errors`` so that every room
(``slurm_backend``, ``containers``, ...) can raise it without importing the master. Same classes, not copies: the
API's single ``ClientError`` → HTTP mapping also catches what the lower rooms raise.
"""

from det_errors import (
    ClientError,
    ConfigError,
    ConflictError,
    DetError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ServerError,
    SlurmError,
    TooManyRequestsError,
    UnauthenticatedError,
)

__all__ = [
    "ClientError",
    "ConfigError",
    "ConflictError",
    "DetError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "ServerError",
    "SlurmError",
    "TooManyRequestsError",
    "UnauthenticatedError",
]
