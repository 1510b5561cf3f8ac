"""What other users see of an experiment's config: everything, but values that look secret.

Everyone on a master may look at every experiment (Determined's team view), and people put tokens in configs:
``environment.environment_variables`` (``WANDB_API_KEY=…``) above all. For anyone but the owner and admins,
every environment variable's value is masked, and so is the value of any key, anywhere, whose words name a
secret (``password``, ``api_key``, ``secretAccessKey``, ``hf_token``; not ``max_tokens`` or ``key_dim``).
"""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Any

MASK = "********"
SECRET_WORDS = frozenset({"password", "passwd", "passphrase", "secret", "token", "credential", "credentials"})
SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key")})
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")


def key_words(key: str) -> list[str]:
    """``secretAccessKey`` → secret, access, key; ``HF_TOKEN`` → hf, token."""
    return [w.lower() for w in _WORD.findall(key)]


def looks_secret(key: str) -> bool:
    words = key_words(key)
    if any(w in SECRET_WORDS for w in words) or "apikey" in words:
        return True
    return any(pair in SECRET_PAIRS for pair in pairwise(words))


def _mask_env_entries(value: Any) -> Any:
    """``["K=V", …]`` (or one such list per accelerator kind) with every V masked."""
    if isinstance(value, list):
        return [f"{e.split('=', 1)[0]}={MASK}" if isinstance(e, str) else MASK for e in value]
    if isinstance(value, dict):
        return {k: _mask_env_entries(v) for k, v in value.items()}
    return MASK


def _mask(value: Any) -> Any:
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if k == "environment_variables":
                out[k] = _mask_env_entries(v)
            elif isinstance(k, str) and looks_secret(k) and not isinstance(v, dict | list):
                out[k] = MASK if v not in (None, "") else v
            else:
                out[k] = _mask(v)
        return out
    if isinstance(value, list):
        return [_mask(v) for v in value]
    return value


def masked_config(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of `config` with secret-looking values masked (the stored config is not changed)."""
    masked: dict[str, Any] = _mask(config)
    return masked
