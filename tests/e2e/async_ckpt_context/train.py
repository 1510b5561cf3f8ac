"""A Core API script that checkpoints asynchronously (``save_state(asynchronous=True)``) every 5 steps.

Its state holds a ``Slow`` value whose pickling, in the harness's writer thread, takes ``write_s`` seconds, so a
save is observably in flight while training goes on (nothing in the harness is slowed for tests). On
``should_preempt()`` it makes the final save (synchronous: a stale save in flight is abandoned, one with the
same steps is the final one) and returns. It prints what the tests read:
``async save started at step N: UUID``, ``preempted at step N: UUID``, ``resumed from UUID at step N``.
"""

import logging
import time

import determined as det
import torch


class Slow:
    write_s = 0.0

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        time.sleep(Slow.write_s)
        return (Slow, ())


def main(core_context):
    info = det.get_cluster_info()
    hp = info.trial.hparams
    Slow.write_s = hp.get("write_s", 2.0)
    state = {"w": torch.zeros(256), "steps": 0, "slow": Slow()}
    ckpt = core_context.checkpoint
    if info.latest_checkpoint:
        with ckpt.restore_path(info.latest_checkpoint) as path:
            state = torch.load(path / "state_dict.pth", weights_only=False)
        print(f"resumed from {info.latest_checkpoint} at step {state['steps']}", flush=True)
    for op in core_context.searcher.operations():
        while state["steps"] < op.length:
            time.sleep(hp.get("sleep_s", 0.1))
            state["w"] += 1
            state["steps"] += 1
            steps = state["steps"]
            core_context.train.report_training_metrics(
                steps_completed=steps, metrics={"w": float(state["w"][0])}
            )
            if steps % 5 == 0:
                uuid = ckpt.save_state(state, {"steps_completed": steps}, asynchronous=True)
                print(f"async save started at step {steps}: {uuid}", flush=True)
                op.report_progress(steps)
            if core_context.preempt.should_preempt():
                inflight = ckpt._inflight  # for the tests: was a save in flight when the stop came?
                print(f"in flight at preemption: {inflight is not None and not inflight.done}", flush=True)
                uuid = ckpt.save_state(state, {"steps_completed": steps})
                print(f"preempted at step {steps}: {uuid}", flush=True)
                return
        core_context.train.report_validation_metrics(
            steps_completed=state["steps"], metrics={"validation_loss": 1.0 / state["steps"]}
        )
        ckpt.save_state(state, {"steps_completed": state["steps"]})
        op.report_completed(1.0 / state["steps"])
    print(f"done at step {state['steps']} w={float(state['w'][0])}", flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    with det.core.init() as core_context:
        main(core_context)
