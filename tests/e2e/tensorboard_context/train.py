"""A Core API trial that reports metrics (which the harness writes as TensorBoard scalars) and writes one scalar
of its own to get_tensorboard_path() with torch's SummaryWriter."""

import determined as det
from torch.utils.tensorboard import SummaryWriter

with det.core.init() as core_context:
    steps = 0
    for op in core_context.searcher.operations():
        while steps < op.length:
            steps += 1
            core_context.train.report_training_metrics(steps_completed=steps, metrics={"loss": 1.0 / steps})
        core_context.train.report_validation_metrics(steps_completed=steps, metrics={"validation_loss": 0.5})
        op.report_completed(0.5)
    writer = SummaryWriter(str(core_context.train.get_tensorboard_path()))
    writer.add_scalar("custom/accuracy", 0.75, steps)
    writer.close()
