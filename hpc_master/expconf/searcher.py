"""The `searcher:` section: single, random, grid, adaptive_asha, async_halving (Determined v0 fields).

Training length, two forms:

- Determined <= 0.37: ``max_length: {batches|records|epochs: N}``;
- Determined 0.38: ``time_metric: <name of a reported metric, e.g. batches>`` plus ``max_time: N``.

ASHA / async_halving need one of the two forms (not both); single/random/grid accept ``max_length`` optionally
(0.38 dropped it: the training script decides how long to train).

**Our extension, ``promotion: pause | continue``** (adaptive_asha and async_halving; the same vocabulary as the
``searcher`` package) decides what happens to a trial that finishes a rung without being promoted at once:

- ``pause``: promotion-based ASHA, Determined's ``stop_once: false``. The trial checkpoints and *pauses* (its
  Slurm job exits and frees the GPUs); if later results promote it, it is *resumed* from that checkpoint.
- ``continue``: early-stopping ASHA, Determined's ``stop_once: true`` (the only behaviour of Determined
  >= 0.38). Trials continue training by default and are stopped for good, never resumed, once a rung's
  results rank them out.

``promotion`` and ``stop_once`` are two spellings of one choice (``stop_once: true`` == ``promotion:
continue``); giving both with different meanings is an error. Default when neither is given: ``pause`` for the
<= 0.37 ``max_length`` form (Determined's default there was ``stop_once: false``) and ``continue`` for the 0.38
``time_metric`` form (as Determined 0.38 behaves). After parsing both fields are always set.

**Our extension, ``proposals: random | model``** (adaptive_asha and async_halving): where new trials'
hyperparameters come from. ``random`` (the default, Determined's behaviour) samples them; ``model``
proposes them with a TPE density model fitted to the results at the rungs so far (``searcher.proposals``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, model_validator

from hpc_master.expconf._base import StrictModel
from hpc_master.expconf._errors import UNION_TAGS, custom_error, describe
from hpc_master.expconf.units import Length

SEARCHER_NAMES = ("single", "random", "grid", "adaptive_asha", "async_halving")
UNION_TAGS.update(SEARCHER_NAMES)

# Names Determined knows but we do not run, with the reason shown to the user.
REJECTED_SEARCHERS = {
    "custom": "the 'custom' searcher is not supported (it was removed from Determined too)",
    "pbt": "the 'pbt' searcher is not supported yet",
    "adaptive": "the 'adaptive' searcher was removed from Determined; use 'adaptive_asha'",
    "adaptive_simple": "the 'adaptive_simple' searcher was removed from Determined; use 'adaptive_asha'",
    "sync_halving": "the 'sync_halving' searcher was removed from Determined; use 'async_halving'",
}

Promotion = Literal["pause", "continue"]
Proposals = Literal["random", "model"]
PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]


class _SearcherBase(StrictModel):
    metric: str | None = None
    smaller_is_better: bool = True
    source_trial_id: int | None = None
    source_checkpoint_uuid: str | None = None

    @model_validator(mode="after")
    def _check_length(self) -> Any:
        for key in ("source_trial_id", "source_checkpoint_uuid"):
            if getattr(self, key) is not None:
                raise custom_error(
                    "is not supported yet: a trial cannot start from another trial's checkpoint on this "
                    "master (it would start from scratch); leave it out",
                    [key],
                )
        length = getattr(self, "max_length", None)
        if isinstance(length, Length) and length.value < 1:
            raise custom_error(f"must be > 0, got {length.value}", ["max_length", length.unit])
        return self


class SingleSearcher(_SearcherBase):
    name: Literal["single"]
    max_length: Length | None = None


class RandomSearcher(_SearcherBase):
    name: Literal["random"]
    max_trials: PositiveInt
    max_concurrent_trials: NonNegativeInt = 16
    max_length: Length | None = None


class GridSearcher(_SearcherBase):
    name: Literal["grid"]
    max_concurrent_trials: NonNegativeInt = 16
    max_length: Length | None = None


class _HalvingBase(_SearcherBase):
    max_trials: PositiveInt
    divisor: Annotated[float, Field(gt=1)] = 4.0
    max_concurrent_trials: NonNegativeInt = 16
    max_length: Length | None = None
    time_metric: str | None = None
    max_time: PositiveInt | None = None
    stop_once: bool | None = None
    promotion: Promotion | None = None
    proposals: Proposals | None = None  # None: random (left out of the dict, as Determined has no such key)

    @model_validator(mode="after")
    def _check_form(self) -> Any:
        has_new = _check_length_form(self.max_length, self.time_metric, self.max_time)
        resolved = _resolve_promotion(self.promotion, self.stop_once, has_new=has_new)
        object.__setattr__(self, "promotion", resolved)
        object.__setattr__(self, "stop_once", resolved == "continue")
        return self

    def length(self) -> tuple[str, int]:
        """(unit or time metric name, amount) whichever form was used."""
        if self.max_length is not None:
            return self.max_length.unit, self.max_length.value
        assert self.time_metric is not None and self.max_time is not None
        return self.time_metric, self.max_time


def _check_length_form(max_length: Length | None, time_metric: str | None, max_time: int | None) -> bool:
    """Exactly one training-length form, complete; whether it is the 0.38 one (time_metric + max_time)."""
    has_new = time_metric is not None or max_time is not None
    if max_length is not None and has_new:
        raise custom_error(
            "give either max_length (Determined <= 0.37) or time_metric + max_time (0.38), not both",
            ["max_length"],
        )
    if has_new:
        if time_metric is None:
            raise custom_error("missing required field (max_time needs time_metric)", ["time_metric"])
        if max_time is None:
            raise custom_error("missing required field (time_metric needs max_time)", ["max_time"])
    elif max_length is None:
        raise custom_error(
            "missing training length: set time_metric + max_time (Determined 0.38) "
            "or max_length: {batches|records|epochs: N} (<= 0.37)",
            ["max_time"],
        )
    return has_new


def _resolve_promotion(promotion: Promotion | None, stop_once: bool | None, *, has_new: bool) -> Promotion:
    """``promotion`` from itself or ``stop_once`` (which must agree), else the default of the length form."""
    from_stop_once: Promotion | None = None
    if stop_once is not None:
        from_stop_once = "continue" if stop_once else "pause"
    if promotion is not None and from_stop_once is not None and promotion != from_stop_once:
        raise custom_error(
            f"promotion: {promotion} contradicts stop_once: {str(stop_once).lower()} "
            "(stop_once: true means promotion: continue); give only one of them",
            ["promotion"],
        )
    return promotion or from_stop_once or ("continue" if has_new else "pause")


class AdaptiveASHASearcher(_HalvingBase):
    name: Literal["adaptive_asha"]
    mode: Literal["aggressive", "standard", "conservative"] = "standard"
    max_rungs: PositiveInt = 5
    bracket_rungs: list[PositiveInt] = Field(default_factory=list)


class AsyncHalvingSearcher(_HalvingBase):
    name: Literal["async_halving"]
    num_rungs: PositiveInt


def _searcher_tag(value: Any) -> str | None:
    if isinstance(value, _SearcherBase):
        return str(getattr(value, "name", None))
    if isinstance(value, Mapping):
        name = value.get("name")
        if name in SEARCHER_NAMES:
            return str(name)
    return None


Searcher = Annotated[
    Union[  # noqa: UP007 - Annotated tags need the explicit Union
        Annotated[SingleSearcher, Tag("single")],
        Annotated[RandomSearcher, Tag("random")],
        Annotated[GridSearcher, Tag("grid")],
        Annotated[AdaptiveASHASearcher, Tag("adaptive_asha")],
        Annotated[AsyncHalvingSearcher, Tag("async_halving")],
    ],
    Discriminator(_searcher_tag),
]


def check_searcher_name(raw: Any) -> None:
    """Raise a clear error for a missing, unknown or rejected searcher name (before pydantic sees it)."""
    if raw is None:
        return
    if not isinstance(raw, Mapping):
        raise custom_error(f"expected a mapping with a name, got {describe(raw)}", ["searcher"])
    name = raw.get("name")
    if name is None:
        raise custom_error("missing required field; expected one of " + _names(), ["searcher", "name"])
    if name in REJECTED_SEARCHERS:
        raise custom_error(f"{REJECTED_SEARCHERS[name]}; expected one of {_names()}", ["searcher", "name"])
    if name not in SEARCHER_NAMES:
        raise custom_error(f"unknown searcher {name!r}; expected one of {_names()}", ["searcher", "name"])


def _names() -> str:
    return ", ".join(repr(n) for n in SEARCHER_NAMES)


AnySearcher = SingleSearcher | RandomSearcher | GridSearcher | AdaptiveASHASearcher | AsyncHalvingSearcher


def searcher_to_dict(s: AnySearcher) -> dict[str, Any]:
    """Plain JSON-able dict in Determined shape, for the searcher package.

    The length is always normalised to ``max_length: {unit: N}`` (for the 0.38 form the unit is the
    ``time_metric`` name, e.g. ``{batches: 1000}``); ``time_metric``/``max_time`` are never sent, so there is one
    form only. ASHA / async_halving always carry the resolved ``promotion`` and ``stop_once``.
    """
    out = {"name": s.name, **s.model_dump(mode="json", exclude_none=True)}
    if isinstance(s, _HalvingBase):
        unit, amount = s.length()
        out.pop("time_metric", None)
        out.pop("max_time", None)
        out["max_length"] = {unit: amount}
    return out
