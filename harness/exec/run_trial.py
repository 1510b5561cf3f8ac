"""Run a PyTorchTrial: ``python -m harness.exec.run_trial model_def:TrialClass [options]``.

On the cluster everything comes from ``DET_CLUSTER_INFO`` (hparams, config, latest checkpoint, trial seed).
Off-cluster, pass ``--config`` (an experiment YAML or JSON file), ``--hparams`` (JSON), ``--max-length`` in
batches, ``--checkpoint-dir`` and ``--latest-checkpoint`` to resume.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any


def _load_config(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        import yaml

        out: dict[str, Any] = yaml.safe_load(text) or {}
        return out
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def main(argv: list[str] | None = None) -> int:
    from harness.cluster_info import LOG_FORMAT

    parser = argparse.ArgumentParser(prog="python -m harness.exec.run_trial", description=__doc__)
    parser.add_argument("entrypoint", help="module:TrialClass")
    parser.add_argument("--config")
    parser.add_argument("--hparams", help="JSON object")
    parser.add_argument("--max-length", type=int, help="batches to train (off-cluster)")
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--latest-checkpoint", default=os.environ.get("DET_LATEST_CHECKPOINT") or None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)

    from harness.trial import run

    config = _load_config(args.config)
    hparams = json.loads(args.hparams) if args.hparams else None
    if hparams is None and config is not None:
        hparams = {
            k: v if not isinstance(v, dict) else v.get("val", v.get("minval"))
            for k, v in (config.get("hyperparameters") or {}).items()
        }
    return run(
        args.entrypoint,
        hparams=hparams,
        config=config,
        max_length=args.max_length,
        latest_checkpoint=args.latest_checkpoint,
        checkpoint_storage=args.checkpoint_dir,
    )


if __name__ == "__main__":
    sys.exit(main())
