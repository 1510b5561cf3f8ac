"""torch DDP (gloo) under `python3 -m determined.launch.torch_distributed`, written as Determined's distributed
Core API tutorial is: init the process group, DistributedContext.from_torch_distributed(), det.core.init().

Every rank prints one `RESULT {json}` line: its rank, host, the DDP-averaged gradients, the parameters after the
step, the gradient its own data alone gives (so the test can check the average), and what the Core API's
allgather returned. With hparams `fail_rank: R`, rank R raises at step 3 while the others sleep outside any
collective, so that only the launchers (torchrun on the node, srun across nodes) can stop them.
"""

import json
import socket
import sys
import time

import determined as det
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(core_context):
    info = det.get_cluster_info()
    hp = info.trial.hparams
    rank = core_context.distributed.rank
    torch.manual_seed(100 + rank)  # different initial weights per rank: DDP must broadcast rank 0's
    model = torch.nn.Linear(4, 1)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(7 + rank)  # each rank has its own data shard
    x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)

    # The gradient this rank's data alone gives, from the (already broadcast) initial weights.
    local = torch.nn.Linear(4, 1)
    local.load_state_dict(model.state_dict())
    torch.nn.functional.mse_loss(local(x), y).backward()
    local_grad = [p.grad.flatten().tolist() for p in local.parameters()]
    initial = [p.detach().flatten().tolist() for p in model.parameters()]

    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    ddp_grad = [p.grad.flatten().tolist() for p in model.parameters()]
    opt.step()
    params = [p.detach().flatten().tolist() for p in model.parameters()]

    gathered = core_context.distributed.allgather({"rank": rank, "host": socket.gethostname()})
    row = {
        "rank": rank,
        "size": core_context.distributed.size,
        "local_rank": core_context.distributed.local_rank,
        "cross_rank": core_context.distributed.cross_rank,
        "host": socket.gethostname(),
        "dist_rank": dist.get_rank(),
        "dist_world": dist.get_world_size(),
        "initial": initial,
        "local_grad": local_grad,
        "ddp_grad": ddp_grad,
        "params": params,
        "gathered": gathered,
    }
    print("RESULT " + json.dumps(row), flush=True)

    steps = 1
    for op in core_context.searcher.operations():
        while steps < op.length:
            if hp.get("fail_rank") == rank and steps == 3:
                print(f"FAILING rank={rank} at={time.time():.3f}", flush=True)
                raise RuntimeError(f"rank {rank} fails on purpose")
            if hp.get("fail_rank") not in (None, rank) and steps == 3:
                while True:  # outside any collective: only the launcher can stop this rank
                    time.sleep(0.1)
            time.sleep(hp.get("sleep_s", 0))
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            steps += 1
            if rank == 0:
                core_context.train.report_training_metrics(
                    steps_completed=steps, metrics={"loss": loss.item()}
                )
        if rank == 0:
            core_context.train.report_validation_metrics(
                steps_completed=steps, metrics={"loss": loss.item(), "ranks": float(len(gathered))}
            )
            with core_context.checkpoint.store_path({"steps_completed": steps}) as (path, _):
                torch.save(model.state_dict(), path / "checkpoint.pt")
            op.report_completed(loss.item())


if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    distributed = det.core.DistributedContext.from_torch_distributed()
    with det.core.init(distributed=distributed) as core_context:
        main(core_context)
    sys.exit(0)
