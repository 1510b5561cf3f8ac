"""DeepSpeed ZeRO-1 training under ``python3 -m determined.launch.deepspeed``, written as Determined's DeepSpeed
users write Core API scripts: ``deepspeed.init_distributed()``, ``DistributedContext.from_deepspeed()``,
``det.core.init()``, the engine's own ``save_checkpoint``/``load_checkpoint`` inside a sharded ``store_path``.

Every rank prints ``RESULT {json}`` after ``deepspeed.initialize`` (its rank, host, DeepSpeed's world size and
ZeRO stage, its own random initial weights and the engine's weights, which DeepSpeed broadcast from rank 0) and
``FINAL {json}`` at the end (the weights after training). Each rank's batch is a function of (step, rank), so a
run paused and resumed from its checkpoint trains on the same data as an uninterrupted one. With hparams
``fail_rank: R``, rank R exits 3 at step 3 while the others wait in the next all-reduce: only the launchers
(DeepSpeed's per node, srun across nodes) can stop them.
"""

import json
import os
import socket
import sys
import time

import deepspeed
import determined as det
import torch

TRUE_W = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 4, generator=g)
    return x, x @ TRUE_W


def weights(model: torch.nn.Module) -> list[float]:
    return [x for p in model.parameters() for x in p.detach().flatten().tolist()]


def save(core_context, engine, steps: int) -> str:
    with core_context.checkpoint.store_path({"steps_completed": steps}, shard=True) as (path, storage_id):
        engine.save_checkpoint(str(path), tag="ds", client_state={"steps_completed": steps})
    return storage_id


def main(core_context) -> None:
    info = det.get_cluster_info()
    hp = info.trial.hparams
    rank = core_context.distributed.rank
    torch.manual_seed(100 + rank)  # different initial weights per rank: DeepSpeed must broadcast rank 0's
    model = torch.nn.Linear(4, 1)
    own_initial = weights(model)
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
        "zero_optimization": {"stage": 1},
        "zero_allow_untested_optimizer": True,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    steps = 0
    if info.latest_checkpoint:
        with core_context.checkpoint.restore_path(info.latest_checkpoint) as path:
            _, client_state = engine.load_checkpoint(str(path), tag="ds")
        steps = int(client_state["steps_completed"])
        print(f"resumed from {info.latest_checkpoint} at step {steps} global_steps={engine.global_steps}")
    row = {
        "rank": rank,
        "host": socket.gethostname(),
        "size": core_context.distributed.size,
        "local_rank": core_context.distributed.local_rank,
        "cross_rank": core_context.distributed.cross_rank,
        "env_rank": int(os.environ["RANK"]),
        "ds_world": engine.world_size,
        "zero_stage": engine.zero_optimization_stage(),
        "own_initial": own_initial,
        "engine_weights": weights(engine.module),
        "steps": steps,
    }
    print("RESULT " + json.dumps(row), flush=True)
    try:  # asynchronous saves do not cover sharded (DeepSpeed) state: refused, saying what to use instead
        core_context.checkpoint.save_state({}, {"steps_completed": steps}, shard=True, asynchronous=True)
    except ValueError as e:
        print(f"ASYNC REFUSED {e}", flush=True)

    for op in core_context.searcher.operations():
        while steps < op.length:
            if hp.get("fail_rank") == rank and steps == 3:
                print(f"FAILING rank={rank} at={time.time():.3f}", flush=True)
                sys.exit(3)
            x, y = batch(steps, rank)
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            steps += 1
            time.sleep(hp.get("sleep_s", 0))
            if rank == 0:
                core_context.train.report_training_metrics(
                    steps_completed=steps, metrics={"loss": loss.item()}
                )
            if core_context.preempt.should_preempt():
                uuid = save(core_context, engine, steps)
                print(f"preempted at step {steps}: checkpoint {uuid}", flush=True)
                return
        if rank == 0:
            core_context.train.report_validation_metrics(steps_completed=steps, metrics={"loss": loss.item()})
        save(core_context, engine, steps)
        if rank == 0:
            op.report_completed(loss.item())
    print("FINAL " + json.dumps({"rank": rank, "weights": weights(engine.module)}), flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    deepspeed.init_distributed()
    distributed = det.core.DistributedContext.from_deepspeed()
    with det.core.init(distributed=distributed) as core_context:
        main(core_context)
    sys.exit(0)
