"""Runs inside the test image (scripts/build_test_image.sh): every rank prints one `SEEN {json}` line with what it
can see of the image, the bind mount and its GPUs, then the chief reports metrics and a checkpoint through
Determined's Core API (the harness is bound into the image, not installed in it)."""

import json
import os
import pathlib
import socket
import sys

import determined as det


def os_release():
    text = pathlib.Path("/etc/os-release").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def bind_state(path):
    p = pathlib.Path(path)
    content = (p / "hello.txt").read_text().strip() if (p / "hello.txt").exists() else None
    try:
        (p / "written-from-the-trial").write_text("x")
        writable = True
    except OSError:
        writable = False
    return content, writable


def main(core_context):
    info = det.get_cluster_info()
    hp = info.trial.hparams
    rank = core_context.distributed.rank
    marker = pathlib.Path("/etc/hpc-det-test-image")
    content, writable = bind_state(hp["bind"])
    print(
        "SEEN "
        + json.dumps(
            {
                "rank": rank,
                "size": core_context.distributed.size,
                "host": socket.gethostname(),
                "variant": os_release().get("VARIANT_ID"),
                "marker": marker.read_text().strip() if marker.exists() else None,
                "bind_content": content,
                "bind_writable": writable,
                "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "step_gpus": os.environ.get("SLURM_STEP_GPUS"),
                "python": sys.executable,
                "user_var": os.environ.get("FROM_CONFIG"),
            }
        ),
        flush=True,
    )
    steps = 0
    for op in core_context.searcher.operations():
        while steps < op.length:
            steps += 1
            if rank == 0:
                core_context.train.report_training_metrics(steps_completed=steps, metrics={"loss": 1 / steps})
        if rank == 0:
            core_context.train.report_validation_metrics(steps_completed=steps, metrics={"loss": 1 / steps})
            with core_context.checkpoint.store_path({"steps_completed": steps}) as (path, _uuid):
                (path / "state.json").write_text(json.dumps({"steps": steps}))
            op.report_completed(1 / steps)


if __name__ == "__main__":
    with det.core.init() as core_context:
        main(core_context)
