"""The master configuration's base model and its security section (``master.yaml``'s ``security``), apart from
``masterconf`` so that each stays readable in one sitting; ``masterconf`` re-exports them."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from hpc_master.expconf._base import StrictModel as ConfigModel


class StrictModel(ConfigModel):
    """The config models' one base (``expconf._base``: unknown keys refused with the closest valid key), made
    immutable, and lax about types: environment overrides arrive as strings (``DET_LISTEN_PORT=8080``). A
    ``null`` is kept (it is not "the default" here, as it is in an experiment config)."""

    model_config = ConfigDict(extra="forbid", strict=False, frozen=True, populate_by_name=False)
    keep_none = True


class MungeLoginConfig(StrictModel):
    enabled: bool = False
    """``det user login`` with no user name logs a Unix account in with a munge credential (the site's munge,
    which Slurm uses), with no password: ``docs/security.md``, "Munge login"."""
    create_users: Literal["nobody", "everyone", "groups"] = "nobody"
    """Whether a Unix account's first munge login creates its master user (mapped to that account): for
    ``everyone``, for members of ``user_groups``, or for ``nobody`` (an admin creates users)."""
    user_groups: list[str] = Field(default_factory=list)
    """The Unix groups whose members' first login creates their master user (``create_users: groups``)."""
    admin_group: str | None = None
    """Members of this Unix group are admins, set at each munge login (others are not); unset: admin rights
    are given with ``det user edit``."""
    names: list[str] = Field(default_factory=list)
    """More host names this master is reached by (``listen.host`` and ``external_url``'s are known, and on a
    master listening on every address loopback and this machine's names): a credential names the URL ``det``
    used, and one for another address is refused."""
    unmunge: str = "unmunge"
    """The ``unmunge`` command (a path where it is not on ``PATH``)."""


class SecurityConfig(StrictModel):
    require_passwords: bool = False
    """Passwords for every login even on loopback (always so when ``listen.host`` is not loopback)."""
    token_ttl_hours: float = Field(default=24 * 7, gt=0)
    """How long a login (CLI token, web UI session) lasts."""
    munge: MungeLoginConfig = MungeLoginConfig()
    """Logins of Unix accounts with the site's munge (``det user login`` with no user name)."""
    admin_password: str | None = Field(default=None, repr=False)
    """The ``admin`` user's password at the first start of a master that requires passwords (then it is
    stored hashed, and changed with ``det user change-password``). Prefer the environment variable to a file."""
    max_streams_per_user: int = Field(default=64, ge=1, le=1_000_000)
    """How many streams one user may have open at once: log follows (``det trial logs -f``, ``det task logs
    -f``, ``det master logs -f``), metric streams (the web UI's charts, Determined's SDK's ``iter_metrics``),
    the web UI's change streams (one per open page) and long polls made with the user's own token. One more is
    refused with HTTP 429 ``too_many_streams`` and a ``Retry-After`` until one of them ends
    (``docs/security.md``)."""
    max_long_polls_per_trial: int = Field(default=256, ge=1, le=1_000_000)
    """How many long polls (``signals/preemption``, ``searcher/operation``) one trial's harness may have open
    at once with its per-trial token, counted per trial and not against its owner's streams: one or two per
    trial, but one per rank in Determined's ``WORKERS_ASK_MASTER`` preemption mode, so keep it above the
    ranks of the largest such job."""
