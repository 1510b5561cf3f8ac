"""What other users see of an experiment's config and its trials' hyperparameters: everything, but values that
look secret.

Everyone on a master may look at every experiment (Determined's team view), and people put tokens in configs
and hyperparameters: ``environment.environment_variables`` (``WANDB_API_KEY=…``) above all, or an ``api_key``
hyperparameter. ``shown`` is the one place that decides what a caller sees, for every route and page that
answers a config or hyperparameters: the experiment's owner and admins see the values; for anyone else every
environment variable's value is masked, and so is every value under a key, anywhere, whose words name a secret
(``password``, ``api_key``, ``secretAccessKey``, ``hf_token``; not ``max_tokens`` or ``key_dim``). A secret
key's value that is a mapping or a list (a hyperparameter's definition, ``api_key: {type: const, val: …}``)
keeps its shape with every value in it masked, but for a definition's ``type``.
"""

from __future__ import annotations

import re
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from hpc_master.expconf.hyperparameters import HP_TYPES
from hpc_master.services import access

if TYPE_CHECKING:
    from hpc_master.services.access import Principal

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


def _mask_all(value: Any) -> Any:
    """A secret key's value: its shape kept, every value in it masked (an empty one stays empty), but a
    hyperparameter definition's ``type`` (``const``, ``categorical``, …: its kind, not its value)."""
    if isinstance(value, dict):
        return {
            k: v if k == "type" and isinstance(v, str) and v in HP_TYPES else _mask_all(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_mask_all(v) for v in value]
    return MASK if value not in (None, "") else value


def _mask(value: Any) -> Any:
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if k == "environment_variables":
                out[k] = _mask_env_entries(v)
            elif isinstance(k, str) and looks_secret(k):
                out[k] = _mask_all(v)
            else:
                out[k] = _mask(v)
        return out
    if isinstance(value, list):
        return [_mask(v) for v in value]
    return value


def masked(value: dict[str, Any]) -> dict[str, Any]:
    """A copy of `value` (a config, hyperparameters) with secret-looking values masked; `value` is unchanged."""
    out: dict[str, Any] = _mask(value)
    return out


def reveals(viewer: Principal, owner_id: int) -> bool:
    """Whether `viewer` sees the secrets of an experiment (and its trials) that `owner_id` owns."""
    return access.sees_secrets(viewer, owner_id)


def shown(value: dict[str, Any], viewer: Principal, owner_id: int) -> dict[str, Any]:
    """The one redaction point: an experiment's config, or one of its trials' hyperparameters, as `viewer`
    may see it: unchanged for the experiment's owner (`owner_id`) and admins, ``masked`` for anyone else."""
    return value if reveals(viewer, owner_id) else masked(value)
