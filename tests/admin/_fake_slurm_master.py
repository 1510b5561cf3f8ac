"""``det-master`` itself (``hpc_master.server.main``) with Slurm replaced by the in-memory `FakeCluster`:

    python -m tests.admin._fake_slurm_master [det-master arguments]

For tests of the real process (signals, shutdown order, restarts) with a lifecycle loop that submits jobs,
on machines without Slurm. Jobs start as soon as they are submitted and never end by themselves.
"""

from __future__ import annotations

import functools
import getpass
import pwd
import sys
from collections.abc import Callable
from typing import Any

import slurm_backend
from hpc_master import helper_client, server
from slurm_backend.fake import FakeCluster


def main() -> int:
    cluster = FakeCluster(master_user=getpass.getuser(), uid=lambda user: pwd.getpwnam(user).pw_uid)
    cluster.auto_schedule = True
    slurm_backend.SlurmCli = functools.partial(slurm_backend.SlurmCli, runner=cluster)  # type: ignore[misc]

    def user_runner(_helper: object) -> Callable[..., Any]:
        """A command as a user (the per-user helper's, for a master that acts for its users): the fake's
        ``runuser`` form."""
        return lambda user, argv, stdin, timeout_s: cluster(["runuser", "-u", user, "--", *argv], stdin,
                                                             timeout_s, {})  # fmt: skip

    helper_client.slurm_runner = user_runner  # type: ignore[assignment]
    return server.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
