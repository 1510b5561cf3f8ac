"""Read a searcher section in Determined's config shape into a frozen, normalised ``SearcherConfig``.

Accepts both length forms: ≤0.37 ``max_length: {batches: 1000}`` (also ``records``/``epochs``) and
0.38 ``time_metric: batches, max_time: 1000``. Defaults are Determined's. Keys this package does not
use (``source_trial_id``, ``source_checkpoint_uuid``, ...) are ignored: strict validation of the
experiment config belongs to the config package, not here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

METHODS = ("single", "random", "grid", "adaptive_asha", "async_halving")
MODES = ("aggressive", "standard", "conservative")
PROMOTIONS = ("pause", "continue")
PROPOSALS = ("random", "model")

_DEFAULT_MAX_CONCURRENT = 16
_DEFAULT_DIVISOR = 4.0
_DEFAULT_MAX_RUNGS = 5


@dataclass(frozen=True)
class SearcherConfig:
    name: str
    metric: str
    smaller_is_better: bool
    unit: str
    max_length: int | None
    max_trials: int
    max_concurrent_trials: int
    divisor: float = _DEFAULT_DIVISOR
    mode: str = "standard"
    max_rungs: int = _DEFAULT_MAX_RUNGS
    num_rungs: int = 0
    bracket_rungs: tuple[int, ...] = ()
    promotion: str = "pause"
    proposals: str = field(default="random", repr=False)
    """Our key: ``random`` (Determined's sampling) or ``model`` (``searcher.proposals``). Left out of
    ``repr`` so that the config digest of a search without it is what it always was."""

    @property
    def stop_once(self) -> bool:
        return self.promotion == "continue"


def _length(cfg: Mapping[str, Any]) -> tuple[str, int | None]:
    if "max_time" in cfg or "time_metric" in cfg:
        if "max_length" in cfg:
            raise ValueError("searcher: give either max_length or time_metric/max_time, not both")
        if cfg.get("max_time") is None:
            return str(cfg.get("time_metric") or "batches"), None
        return str(cfg.get("time_metric") or "batches"), _positive_int(cfg["max_time"], "max_time")
    raw = cfg.get("max_length")
    if raw is None:
        return "batches", None
    if isinstance(raw, Mapping):
        if len(raw) != 1:
            raise ValueError(f"searcher.max_length: expected one unit, got {dict(raw)!r}")
        ((unit, units),) = raw.items()
        return str(unit), _positive_int(units, f"max_length.{unit}")
    return "batches", _positive_int(raw, "max_length")


def _positive_int(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value or value < 1:
        raise ValueError(f"searcher.{field}: expected a positive integer, got {value!r}")
    return int(value)


def _int(cfg: Mapping[str, Any], key: str, default: int, minimum: int) -> int:
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"searcher.{key}: expected an integer ≥ {minimum}, got {value!r}")
    return value


def _promotion(cfg: Mapping[str, Any]) -> str:
    stop_once = cfg.get("stop_once")
    promotion = cfg.get("promotion")
    if promotion is None:
        return "continue" if stop_once else "pause"
    if promotion not in PROMOTIONS:
        raise ValueError(f"searcher.promotion: expected one of {PROMOTIONS}, got {promotion!r}")
    if stop_once is not None and bool(stop_once) != (promotion == "continue"):
        raise ValueError(
            f"searcher: stop_once={stop_once} contradicts promotion={promotion!r} "
            "(stop_once: true is promotion: continue)"
        )
    return str(promotion)


def _proposals(cfg: Mapping[str, Any], name: str) -> str:
    proposals = cfg.get("proposals")
    if proposals is None:
        return "random"
    if proposals not in PROPOSALS:
        raise ValueError(f"searcher.proposals: expected one of {PROPOSALS}, got {proposals!r}")
    if proposals == "model" and name not in ("adaptive_asha", "async_halving"):
        raise ValueError(
            f"searcher.proposals: 'model' needs adaptive_asha or async_halving, not {name!r} "
            "(it learns from the results at ASHA's rungs)"
        )
    return str(proposals)


def _max_trials(cfg: Mapping[str, Any], name: str) -> int:
    """1 for ``single``; required for the others but ``grid`` (0 when unset: ``grid`` ignores it)."""
    max_trials = 1 if name == "single" else _int(cfg, "max_trials", 0 if name == "grid" else -1, 1)
    if max_trials == -1:
        raise ValueError(f"searcher.max_trials: required for {name}")
    return max_trials


def _divisor(cfg: Mapping[str, Any]) -> float:
    divisor = cfg.get("divisor", _DEFAULT_DIVISOR)
    if isinstance(divisor, bool) or not isinstance(divisor, int | float) or divisor <= 1:
        raise ValueError(f"searcher.divisor: expected a number > 1, got {divisor!r}")
    return float(divisor)


def _bracket_rungs(cfg: Mapping[str, Any]) -> tuple[int, ...]:
    brackets = cfg.get("bracket_rungs") or ()
    if not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in brackets):
        raise ValueError(f"searcher.bracket_rungs: expected positive integers, got {brackets!r}")
    return tuple(int(b) for b in brackets)


def parse_searcher_config(cfg: Mapping[str, Any]) -> SearcherConfig:
    name = cfg.get("name")
    if name not in METHODS:
        raise ValueError(f"searcher.name: expected one of {METHODS}, got {name!r}")
    unit, max_length = _length(cfg)
    if name in ("adaptive_asha", "async_halving") and max_length is None:
        raise ValueError(f"searcher: {name} needs max_length (or max_time)")
    max_trials = _max_trials(cfg, name)
    mct_default = 1 if name == "single" else _DEFAULT_MAX_CONCURRENT
    divisor = _divisor(cfg)
    mode = cfg.get("mode", "standard")
    if mode not in MODES:
        raise ValueError(f"searcher.mode: expected one of {MODES}, got {mode!r}")
    brackets = _bracket_rungs(cfg)
    num_rungs = _int(cfg, "num_rungs", 0, 1)
    if name == "async_halving" and num_rungs == 0:
        raise ValueError("searcher.num_rungs: required for async_halving")
    return SearcherConfig(
        name=str(name),
        metric=str(cfg.get("metric") or ""),
        smaller_is_better=bool(cfg.get("smaller_is_better", True)),
        unit=unit,
        max_length=max_length,
        max_trials=max_trials,
        max_concurrent_trials=_int(cfg, "max_concurrent_trials", mct_default, 0),
        divisor=divisor,
        mode=str(mode),
        max_rungs=_int(cfg, "max_rungs", _DEFAULT_MAX_RUNGS, 1),
        num_rungs=num_rungs,
        bracket_rungs=brackets,
        promotion=_promotion(cfg),
        proposals=_proposals(cfg, str(name)),
    )
