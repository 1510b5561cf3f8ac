"""DistributedContext: rank information plus gather/allgather/broadcast (global and per-node)."""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING, Any

from harness import cluster_info

if TYPE_CHECKING:  # imported by the first multi-rank context: a one-rank trial never needs it (pickle, hmac)
    from harness.core._star import StarClient, StarServer

logger = logging.getLogger("harness.core")

DEFAULT_PUB_PORT = 12360
DEFAULT_PULL_PORT = 12365


def _default_port() -> int:
    return int(os.environ.get("DET_DIST_PORT") or DEFAULT_PUB_PORT)


def _connect_timeout_s() -> float:
    return float(os.environ.get("DET_DIST_CONNECT_TIMEOUT_S") or 600)


class DistributedContext:
    """Rank information and simple pickled-object collectives across all ranks of a trial.

    ``rank/size`` are global, ``local_*`` are per node, ``cross_*`` count nodes. Whenever the job spans more
    than one node, ``chief_ip`` (where rank 0 runs) is required. The chief listens on ``pub_port`` (default
    ``DET_DIST_PORT`` or 12360, plus ``DET_UNIQUE_PORT_OFFSET``); ``pull_port`` is accepted for Determined
    compatibility and unused. The collectives are not a replacement for NCCL/gloo collectives.
    """

    def __init__(
        self,
        *,
        rank: int,
        size: int,
        local_rank: int,
        local_size: int,
        cross_rank: int,
        cross_size: int,
        chief_ip: str | None = None,
        pub_port: int | None = None,
        pull_port: int = DEFAULT_PULL_PORT,
        port_offset: int | None = None,
        force_tcp: bool = False,
        connect_timeout_s: float | None = None,
    ) -> None:
        if not (0 <= rank < size and 0 <= local_rank < local_size and 0 <= cross_rank < cross_size):
            raise ValueError(
                f"inconsistent ranks: rank={rank}/{size} local_rank={local_rank}/{local_size} "
                f"cross_rank={cross_rank}/{cross_size}"
            )
        self.rank, self.size = rank, size
        self.local_rank, self.local_size = local_rank, local_size
        self.cross_rank, self.cross_size = cross_rank, cross_size
        self._is_chief = rank == 0
        self._is_local_chief = local_rank == 0
        if port_offset is None:
            port_offset = 0 if pub_port is not None else cluster_info.get_port_offset()
        self._pub_port = (pub_port if pub_port is not None else _default_port()) + port_offset
        self._pull_port = pull_port + port_offset
        if local_size != size:
            if chief_ip is None:
                raise ValueError(
                    f"local_size != size ({local_size} != {size}) but no chief_ip was provided; when the job "
                    "spans several nodes, chief_ip (or DET_CHIEF_IP) is required"
                )
            self._chief_ip = chief_ip
        else:
            self._chief_ip = "127.0.0.1"
        self._timeout_s = connect_timeout_s if connect_timeout_s is not None else _connect_timeout_s()
        self._closed = False
        self._server: StarServer | None = None
        self._client: StarClient | None = None
        self._local_server: StarServer | None = None
        self._local_client: StarClient | None = None
        self._local_is_global = False
        self._init_ipc()

    # -- setup ---------------------------------------------------------------------------------------
    def _init_ipc(self) -> None:
        if self.size < 2:
            return
        from harness.core._star import StarClient, StarServer, get_secret

        secret = get_secret()
        if self._is_chief:
            host = "127.0.0.1" if self.local_size == self.size else ""
            logger.debug("chief listening on port %d for %d workers", self._pub_port, self.size - 1)
            self._server = StarServer(self.size - 1, host, self._pub_port, secret)
            self._server.accept_all(self._timeout_s)
        else:
            self._client = StarClient(self._chief_ip, self._pub_port, self.rank, secret, self._timeout_s)
        self._init_local_ipc(secret)

    def _init_local_ipc(self, secret: bytes) -> None:
        """The per-node star, once the global one is up; the local chiefs tell their ports to their nodes' other
        ranks in one allgather over the global star."""
        from harness.core._star import StarServer

        if self.local_size < 2:
            if self.cross_size > 1 and self.size > self.cross_size:
                _ = self.allgather(None)  # take part in the local chiefs' address exchange
            return
        if self.local_size == self.size and self.local_rank == self.rank:
            self._local_is_global = True  # one node: the global star is the local star
            return
        if self._is_local_chief:
            local = StarServer(self.local_size - 1, "127.0.0.1", 0, secret)
            self._local_server = local
            _ = self.allgather((self.cross_rank, local.port))
            local.accept_all(self._timeout_s)
        else:
            self._connect_local_chief(secret)

    def _connect_local_chief(self, secret: bytes) -> None:
        """A local worker: learn this node's local chief's port (allgather) and connect to it."""
        from harness.core._star import StarClient

        chiefs = [x for x in self.allgather(None) if x is not None and x[0] == self.cross_rank]
        if len(chiefs) != 1:
            raise RuntimeError(f"expected one local chief for node {self.cross_rank}, got {chiefs}")
        self._local_client = StarClient("127.0.0.1", chiefs[0][1], self.local_rank, secret, self._timeout_s)

    @classmethod
    def from_torch_distributed(cls, chief_ip: str | None = None) -> DistributedContext:
        """Ranks from the environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, ...)."""
        size = int(os.environ["WORLD_SIZE"])
        local_size = int(os.environ["LOCAL_WORLD_SIZE"])
        return cls(
            rank=int(os.environ["RANK"]),
            size=size,
            local_rank=int(os.environ["LOCAL_RANK"]),
            local_size=local_size,
            cross_rank=int(os.environ.get("GROUP_RANK") or 0),
            cross_size=int(os.environ.get("GROUP_WORLD_SIZE") or max(1, size // local_size)),
            chief_ip=chief_ip or cluster_info.get_chief_ip() or os.environ.get("MASTER_ADDR"),
        )

    @classmethod
    def from_horovod(cls, hvd: Any, chief_ip: str | None = None) -> DistributedContext:
        return cls(
            rank=hvd.rank(),
            size=hvd.size(),
            local_rank=hvd.local_rank(),
            local_size=hvd.local_size(),
            cross_rank=hvd.cross_rank(),
            cross_size=hvd.cross_size(),
            chief_ip=chief_ip or cluster_info.get_chief_ip(),
        )

    @classmethod
    def from_deepspeed(cls, chief_ip: str | None = None) -> DistributedContext:
        return cls(
            rank=int(os.environ["RANK"]),
            size=int(os.environ["WORLD_SIZE"]),
            local_rank=int(os.environ["LOCAL_RANK"]),
            local_size=int(os.environ["LOCAL_SIZE"]),
            cross_rank=int(os.environ["CROSS_RANK"]),
            cross_size=int(os.environ["CROSS_SIZE"]),
            chief_ip=chief_ip or cluster_info.get_chief_ip(),
        )

    @classmethod
    def from_mpi4py(cls, comm: Any = None, chief_ip: str | None = None) -> DistributedContext:
        """Ranks from an mpi4py communicator (default ``MPI.COMM_WORLD``); nodes are told apart by hostname."""
        if comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        rank, size = comm.Get_rank(), comm.Get_size()
        hosts: list[str] = comm.allgather(socket.gethostname())
        nodes = list(dict.fromkeys(hosts))
        me = hosts[rank]
        return cls(
            rank=rank,
            size=size,
            local_rank=hosts[:rank].count(me),
            local_size=hosts.count(me),
            cross_rank=nodes.index(me),
            cross_size=len(nodes),
            chief_ip=chief_ip or cluster_info.get_chief_ip(),
        )

    # -- info ----------------------------------------------------------------------------------------
    def get_rank(self) -> int:
        return self.rank

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_size(self) -> int:
        return self.size

    def get_num_agents(self) -> int:
        return self.cross_size

    # -- collectives ---------------------------------------------------------------------------------
    def gather(self, stuff: Any) -> list[Any] | None:
        """The chief gets everyone's ``stuff`` in rank order; workers get ``None``. A barrier for all."""
        if self.size < 2:
            return [stuff]
        if self._server is not None:
            out = [stuff, *self._server.gather()]
            self._server.broadcast(None)
            return out
        assert self._client is not None
        self._client.send(stuff)
        self._client.recv()
        return None

    def allgather(self, stuff: Any) -> list[Any]:
        if self.size < 2:
            return [stuff]
        if self._server is not None:
            out = [stuff, *self._server.gather()]
            self._server.broadcast(out)
            return out
        assert self._client is not None
        self._client.send(stuff)
        result: list[Any] = self._client.recv()
        return result

    def broadcast(self, stuff: Any) -> Any:
        """Every rank gets the chief's ``stuff``."""
        if self.size < 2:
            return stuff
        if self._server is not None:
            self._server.broadcast(stuff)
            return stuff
        assert self._client is not None
        return self._client.recv()

    def _local(self) -> tuple[StarServer | None, StarClient | None]:
        if self._local_is_global:
            return self._server, self._client
        return self._local_server, self._local_client

    def gather_local(self, stuff: Any) -> list[Any] | None:
        if self.local_size < 2:
            return [stuff]
        server, client = self._local()
        if server is not None:
            out = [stuff, *server.gather()]
            server.broadcast(None)
            return out
        assert client is not None
        client.send(stuff)
        client.recv()
        return None

    def allgather_local(self, stuff: Any) -> list[Any]:
        if self.local_size < 2:
            return [stuff]
        server, client = self._local()
        if server is not None:
            out = [stuff, *server.gather()]
            server.broadcast(out)
            return out
        assert client is not None
        client.send(stuff)
        result: list[Any] = client.recv()
        return result

    def broadcast_local(self, stuff: Any = None) -> Any:
        if self.local_size < 2:
            return stuff
        server, client = self._local()
        if server is not None:
            server.broadcast(stuff)
            return stuff
        assert client is not None
        return client.recv()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for end in (self._local_server, self._local_client, self._server, self._client):
            if end is not None:
                end.close()

    def __enter__(self) -> DistributedContext:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


class DummyDistributedContext(DistributedContext):
    """A single-rank DistributedContext: every collective returns at once, as the real one does at size 1."""

    def __init__(self) -> None:
        super().__init__(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1, pub_port=0)
