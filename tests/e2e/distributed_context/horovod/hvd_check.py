"""Horovod (torch) under `python3 -m determined.launch.horovod` (srun --mpi=pmix, one rank per slot), with the
Core API on top (DistributedContext.from_horovod). Every rank prints one `RESULT {json}` line."""

import json
import socket

import determined as det
import horovod.torch as hvd
import torch


def main(core_context):
    t = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    gathered = core_context.distributed.allgather(hvd.rank())
    row = {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "cross_rank": hvd.cross_rank(),
        "host": socket.gethostname(),
        "allreduce": t.item(),
        "gathered": gathered,
    }
    print("RESULT " + json.dumps(row), flush=True)
    for op in core_context.searcher.operations():
        if hvd.rank() == 0:
            core_context.train.report_validation_metrics(op.length, {"allreduce": t.item()})
            op.report_completed(t.item())


if __name__ == "__main__":
    torch.set_num_threads(1)
    hvd.init()
    distributed = det.core.DistributedContext.from_horovod(hvd)
    with det.core.init(distributed=distributed) as core_context:
        main(core_context)
