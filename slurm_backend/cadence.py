"""How often the poller asks Slurm: its interval while slurmctld answers at once, longer while it rate-limits.

Slurm ≥ 23.02 can limit each user's RPCs to slurmctld (``rl_enable`` in ``SlurmctldParameters``: a bucket of
``rl_bucket_size`` tokens, 30 by default, refilled by ``rl_refill_rate`` every ``rl_refill_period`` seconds, 2 per
second by default; one site runs 40 refilled at 4 a minute). Root and SlurmUser are exempt; a master serving as
its service account is not. An RPC over the limit is answered SLURMCTLD_COMMUNICATIONS_BACKOFF, and the client
library sleeps 1, 2, 3 … seconds and asks again until it gets through, saying so only at ``-v``::

    squeue: RPC rate limited 1 time(s). Sleeping then trying again.

The command succeeds, late; a master that kept its cadence would keep its bucket empty, and so keep every other
RPC of its account (adoption's squeue, scontrol) waiting too. So the poller's ``squeue`` runs with ``-v``, and
`PollCadence` stretches the interval: twice as long after an answer that was told to back off, 5 % shorter after
each that was not, between `interval_s` and `max_s`. It settles around the site's refill rate, whatever the site
set, without being told it. The slow way back matters: stepping back by a whole interval (TCP's additive
increase, mirrored) was told to back off 9× as often in the benchmark of tests/unit/test_slurm_cadence.py; 5 %
brings a 60 s cadence back to 5 s in 48 clean answers.
"""

from __future__ import annotations

import re

EASE = 0.95
"""The factor on the delay after an answer without backoff."""
# The client library's line for each backoff (src/common/slurm_protocol_api.c, Slurm ≥ 23.02), at -v.
_BACKED_OFF = re.compile(r"RPC rate limited (\d+) time\(s\)")


def backoffs(stderr: str) -> int:
    """How many times slurmctld told the command to back off (the last count its client printed), 0 if never."""
    counts = [int(n) for n in _BACKED_OFF.findall(stderr)]
    return max(counts, default=0)


class PollCadence:
    """The delay before the next poll, from how the last one went. Not thread-safe: the poller's lock guards it."""

    def __init__(self, interval_s: float, max_s: float) -> None:
        self.interval_s = interval_s
        self.max_s = max(max_s, interval_s)
        self.current_s = interval_s

    @property
    def stretched(self) -> bool:
        """Slurm rate-limits us lately: polls are further apart than the configured interval."""
        return self.current_s > self.interval_s

    def answered(self, backed_off: int) -> float:
        """After a poll that Slurm answered, told to back off `backed_off` times on its way."""
        if backed_off:
            self.current_s = min(self.max_s, 2 * self.current_s)
        else:
            self.current_s = max(self.interval_s, self.current_s * EASE)
        return self.current_s

    def failed(self, consecutive: int) -> float:
        """After `consecutive` polls in a row that got no answer (the controller down or not answering)."""
        return min(max(self.current_s, self.interval_s * 2.0**consecutive), self.max_s)
