"""A script written against Determined's Core API (the ≤0.37 searcher-operations form).

It "trains" a counter: every step adds `increment_by`; the validation loss falls as the counter grows, so
the searcher prefers larger increments. It checkpoints every 5 steps and returns as soon as should_preempt()
is true, so Slurm preemption, time limits and pauses all resume from the latest checkpoint.
"""

import json
import logging
import os
import time

import determined as det


def load(core_context, info):
    if not info.latest_checkpoint:
        return 0, 0
    with core_context.checkpoint.restore_path(info.latest_checkpoint) as path:
        state = json.loads((path / "state.json").read_text())
    print(f"resumed from {info.latest_checkpoint} at step {state['steps']}", flush=True)
    return state["x"], state["steps"]


def save(core_context, x, steps):
    with core_context.checkpoint.store_path({"steps_completed": steps}) as (path, _uuid):
        (path / "state.json").write_text(json.dumps({"x": x, "steps": steps}))


def main(core_context):
    info = det.get_cluster_info()
    hp = info.trial.hparams
    if hp.get("fail"):
        raise SystemExit(f"failing on purpose (run {os.environ.get('DET_TRIAL_RUN_ID')})")
    x, steps = load(core_context, info)
    for op in core_context.searcher.operations():
        while steps < op.length:
            time.sleep(hp.get("sleep_s", 0.05))
            x += hp["increment_by"]
            steps += 1
            core_context.train.report_training_metrics(steps_completed=steps, metrics={"x": x})
            if steps % 5 == 0:
                save(core_context, x, steps)
                op.report_progress(steps)
                if core_context.preempt.should_preempt():
                    print(f"preempted at step {steps}", flush=True)
                    return
        loss = 1.0 / (1.0 + x)
        core_context.train.report_validation_metrics(steps_completed=steps, metrics={"validation_loss": loss})
        save(core_context, x, steps)
        op.report_completed(loss)
    print(f"done: x={x} steps={steps}", flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    with det.core.init() as core_context:
        main(core_context)
