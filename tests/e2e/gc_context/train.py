"""Checkpoint GC end to end: a Core API script (the ≤0.37 searcher-operations form) that validates and
checkpoints every 3 steps. Its loss is lowest at step `peak`, so a trial's best checkpoint is not its latest
(unless `peak` is the last step), and the search's best is the trial with the smallest `peak`, at that step.
It returns as soon as should_preempt() is true after a checkpoint, and resumes from its latest checkpoint."""

import json
import logging
import time

import determined as det


def loss(steps, peak):
    return abs(steps - peak) + 0.01 * peak


def main(core_context):
    info = det.get_cluster_info()
    hp = info.trial.hparams
    steps = 0
    if info.latest_checkpoint:
        with core_context.checkpoint.restore_path(info.latest_checkpoint) as path:
            steps = json.loads((path / "state.json").read_text())["steps"]
        print(f"resumed from {info.latest_checkpoint} at step {steps}", flush=True)
    for op in core_context.searcher.operations():
        while steps < op.length:
            time.sleep(hp["sleep_s"])
            steps += 1
            if steps % 3:
                continue
            value = loss(steps, hp["peak"])
            core_context.train.report_validation_metrics(
                steps_completed=steps, metrics={"validation_loss": value}
            )
            with core_context.checkpoint.store_path({"steps_completed": steps}) as (path, _uuid):
                (path / "state.json").write_text(json.dumps({"steps": steps}))
            op.report_progress(steps)
            if core_context.preempt.should_preempt():
                print(f"preempted at step {steps}", flush=True)
                return
        op.report_completed(loss(steps, hp["peak"]))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    with det.core.init() as core_context:
        main(core_context)
