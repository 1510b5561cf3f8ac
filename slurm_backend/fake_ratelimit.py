"""slurmctld's per-user RPC rate limit (Slurm ≥ 23.02, ``SlurmctldParameters=rl_enable``) for `FakeCluster`.

Our local cluster runs Slurm 22.05, which has no such limit, so the fast suite drives the poller's cadence
against this model of it (slurm.conf(5)): each user has a bucket of `bucket_size` tokens, full at first and
refilled by `refill_rate` tokens every `refill_period_s` seconds; an RPC takes a token, and an RPC that finds the
bucket empty is told to back off. Root and the SlurmUser are exempt. The client library then sleeps 1, 2, 3 …
seconds and sends the RPC again, printing at ``-v`` the line `backoff_line` makes; only then does the command
answer. sacct talks to slurmdbd, which has no such limit.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

# Commands whose RPCs go to slurmctld.
LIMITED = frozenset({"sbatch", "squeue", "scontrol", "scancel"})


def backoff_line(command: str, times: int) -> str:
    """The client library's line (src/common/slurm_protocol_api.c) at ``-v``."""
    return f"{command}: RPC rate limited {times} time(s). Sleeping then trying again.\n"


@dataclass
class RpcRateLimit:
    bucket_size: int = 30
    refill_rate: int = 2
    refill_period_s: float = 1.0
    told_to_back_off: int = 0
    """RPCs answered SLURMCTLD_COMMUNICATIONS_BACKOFF so far (slurmctld logs each: "RPC rate limit exceeded")."""
    served: int = 0
    _buckets: dict[int, tuple[float, float]] = field(default_factory=dict)  # uid → (tokens, refilled at)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, uid: int, now: float) -> bool:
        """Whether an RPC of `uid` at `now` (seconds) gets through; it takes a token if so."""
        if uid == 0:
            return True
        with self._lock:
            tokens, at = self._buckets.get(uid, (float(self.bucket_size), now))
            periods = math.floor((now - at) / self.refill_period_s)
            if periods > 0:
                tokens = min(float(self.bucket_size), tokens + periods * self.refill_rate)
                at += periods * self.refill_period_s
            if tokens >= 1:
                self._buckets[uid] = (tokens - 1, at)
                self.served += 1
                return True
            self._buckets[uid] = (tokens, at)
            self.told_to_back_off += 1
            return False
