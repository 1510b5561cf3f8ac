"""The master's effective configuration as admins see it (``GET /api/v1/master/config``, ``det master config``).

Effective: the file, the environment overrides and ``det-master --host/--port`` merged, with the defaults that
depend on the master's account resolved (the database URL, the job storage and checkpoint roots, the external
URL). Secrets are masked with ``redact.MASK``: a database URL's password and secret-looking query parameters,
and every string whose key names a secret (``security.admin_password``; ``redact.looks_secret``, as in other
users' experiment configs; ``token_ttl_hours`` is a number, not a secret).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from hpc_master.masterconf import MasterConfig
from hpc_master.services.redact import MASK, looks_secret


def mask_url(url: str) -> str:
    """``postgresql+psycopg://det:s3cret@db/det?sslpassword=x`` → the same with ``********`` for the secrets."""
    parts = urlsplit(url)
    netloc = _mask_netloc(parts.netloc)
    query = _mask_query(parts.query)
    if netloc == parts.netloc and query == parts.query:
        return url
    # Not urlunsplit: it drops the empty authority of ``sqlite:////abs/path``.
    return (
        f"{parts.scheme}://{netloc}{parts.path}"
        + (f"?{query}" if query else "")
        + (f"#{parts.fragment}" if parts.fragment else "")
    )


def _mask_netloc(netloc: str) -> str:
    """``user:pass@host`` → ``user:********@host``; a netloc without a password as it is."""
    userinfo, at, host = netloc.rpartition("@")
    if at and ":" in userinfo:
        return f"{userinfo.split(':', 1)[0]}:{MASK}@{host}"
    return netloc


def _mask_query(query: str) -> str:
    """The query string with the non-empty values of secret-looking parameters masked (re-encoded when non-empty)."""
    if not query:
        return query
    pairs = parse_qsl(query, keep_blank_values=True)
    return urlencode([(k, MASK if looks_secret(k) and v else v) for k, v in pairs], safe="*/")


def effective_config(config: MasterConfig) -> dict[str, Any]:
    data = config.model_dump(mode="json")
    data["db"]["url"] = mask_url(config.db_url())
    data["job_storage_root"] = str(config.job_storage_dir())
    data["checkpoint_storage"]["host_path"] = str(config.checkpoint_dir())
    data["external_url"] = config.master_url()
    masked: dict[str, Any] = _mask_secrets(data)
    return masked


def _mask_secrets(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: MASK if looks_secret(str(k)) and isinstance(v, str) and v else _mask_secrets(v)
            for k, v in node.items()
        }
    return node
