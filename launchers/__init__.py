"""Builders of per-node command lines for torch.distributed, Horovod and MPI."""
