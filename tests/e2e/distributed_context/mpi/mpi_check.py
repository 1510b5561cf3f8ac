"""mpi4py under `python3 -m launchers.mpi` (srun --mpi=pmix, one rank per slot), with the Core API on top.

Every rank prints one `RESULT {json}` line: MPI's rank/size/host, an allreduce of rank+1, MPI's allgather of
the hosts, and the Core API's allgather of the ranks (DistributedContext.from_mpi4py).
"""

import json
import socket

import determined as det
from mpi4py import MPI


def main(core_context, comm):
    rank = comm.Get_rank()
    total = comm.allreduce(rank + 1, op=MPI.SUM)
    hosts = comm.allgather(socket.gethostname())
    gathered = core_context.distributed.allgather(core_context.distributed.rank)
    row = {
        "rank": rank,
        "size": comm.Get_size(),
        "host": socket.gethostname(),
        "allreduce": total,
        "hosts": hosts,
        "core_rank": core_context.distributed.rank,
        "local_rank": core_context.distributed.local_rank,
        "cross_rank": core_context.distributed.cross_rank,
        "gathered": gathered,
    }
    print("RESULT " + json.dumps(row), flush=True)
    for op in core_context.searcher.operations():
        comm.Barrier()
        if rank == 0:
            core_context.train.report_validation_metrics(op.length, {"allreduce": float(total)})
            op.report_completed(float(total))


if __name__ == "__main__":
    comm = MPI.COMM_WORLD
    distributed = det.core.DistributedContext.from_mpi4py(comm)
    with det.core.init(distributed=distributed) as core_context:
        main(core_context, comm)
