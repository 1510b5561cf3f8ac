"""The project's one exception root, importable by every room; it imports nothing of the project.

Every error a user can cause is a `ClientError` carrying a stable `code`, a human `message` and, where it
applies, the offending `field` path (for example ``searcher.max_trials``). HTTP mapping happens once, in the
API layer (``hpc_master.api.app``); the CLI prints `str(error)` without a traceback unless ``DET_DEBUG`` is set.
"""

from __future__ import annotations


class DetError(Exception):
    """Root of every error raised on purpose by this project."""


class ClientError(DetError):
    """The caller did something wrong; retrying the same request will fail the same way."""

    http_status = 400
    default_code = "invalid_argument"

    def __init__(self, message: str, *, code: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.field = field

    def __str__(self) -> str:
        if self.field:
            return f"{self.field}: {self.message}"
        return self.message

    def to_dict(self) -> dict[str, str | None]:
        return {"code": self.code, "message": self.message, "field": self.field}


class ConfigError(ClientError):
    """A configuration file (experiment or master) is invalid. `field` is the YAML path."""

    default_code = "invalid_config"


class NotFoundError(ClientError):
    http_status = 404
    default_code = "not_found"


class UnauthenticatedError(ClientError):
    http_status = 401
    default_code = "unauthenticated"


class PermissionDeniedError(ClientError):
    http_status = 403
    default_code = "permission_denied"


class ConflictError(ClientError):
    http_status = 409
    default_code = "conflict"


class PayloadTooLargeError(ClientError):
    http_status = 413
    default_code = "payload_too_large"


class TooManyRequestsError(ClientError):
    """The caller is over a limit: the same request may succeed after ``retry_after_s`` seconds (HTTP 429
    with a ``Retry-After`` header)."""

    http_status = 429
    default_code = "too_many_requests"

    def __init__(
        self, message: str, *, retry_after_s: float, code: str | None = None, field: str | None = None
    ) -> None:
        super().__init__(message, code=code, field=field)
        self.retry_after_s = retry_after_s


class ServerError(DetError):
    """Something failed on our side or in a system we call (Slurm, the database)."""


class SlurmError(ServerError):
    """A Slurm command failed; `stderr` holds what Slurm said."""

    def __init__(self, message: str, *, command: list[str] | None = None, stderr: str = "") -> None:
        super().__init__(message)
        self.command = command or []
        self.stderr = stderr
