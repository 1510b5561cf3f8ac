"""Checkpoints: their records, what their answers show, storage accounting, GC policy, deletion."""
