"""Data loading for the Trial API: Determined's ``DataLoader`` spec and resumable, rank-sharded batch samplers.

Every rank gets the same number of batches per epoch (training drops the tail, validation pads by repeating
indices, as torch's DistributedSampler does), so collectives under DDP cannot hang on uneven shards. The
order of an epoch depends only on (seed, epoch), so resuming at (epoch, batch) reproduces the data position
without loading the skipped samples.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.utils.data


class DataLoader:
    """Same arguments as ``torch.utils.data.DataLoader``; the trainer shards and resumes it."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool = False,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Any = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Any = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
    ) -> None:
        if batch_sampler is not None and (batch_size != 1 or shuffle or sampler is not None or drop_last):
            raise ValueError(
                "batch_sampler is mutually exclusive with batch_size, shuffle, sampler and drop_last"
            )
        self.dataset = dataset
        self.batch_size = batch_size or 1
        self.shuffle = shuffle
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.drop_last = drop_last
        self.generator = generator
        self._loader_kwargs: dict[str, Any] = {
            "num_workers": num_workers,
            "collate_fn": collate_fn,
            "pin_memory": pin_memory,
            "timeout": timeout,
            "worker_init_fn": worker_init_fn,
            "multiprocessing_context": multiprocessing_context,
            "persistent_workers": persistent_workers and num_workers > 0,
        }
        if prefetch_factor is not None and num_workers > 0:
            self._loader_kwargs["prefetch_factor"] = prefetch_factor

    def get_data_loader(
        self, *, rank: int = 0, size: int = 1, seed: int = 0, training: bool = True
    ) -> tuple[torch.utils.data.DataLoader[Any], ShardedBatches]:
        batches = ShardedBatches(self, rank=rank, size=size, seed=seed, training=training)
        # A generator of our own: iter() draws the workers' base seed from it, not from the global RNG, so
        # where an epoch starts (or resumes) does not shift the model's random stream.
        loader = torch.utils.data.DataLoader(
            self.dataset, batch_sampler=batches, generator=batches.generator, **self._loader_kwargs
        )
        return loader, batches

    def __len__(self) -> int:
        return len(ShardedBatches(self))


class ShardedBatches(torch.utils.data.Sampler[list[int]]):
    """This rank's batches of indices for one epoch; ``set_epoch`` and ``skip`` position it."""

    def __init__(
        self, spec: DataLoader, *, rank: int = 0, size: int = 1, seed: int = 0, training: bool = True
    ):
        self._spec = spec
        self._rank, self._size, self._seed, self._training = rank, size, seed, training
        self.epoch = 0
        self._skip = 0
        self._own_generator = spec.generator is None
        self.generator: torch.Generator = spec.generator or torch.Generator()
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self._own_generator:
            self.generator.manual_seed((self._seed * 1_000_003 + epoch) * 2 + 1 + self._rank * 7919)

    def skip(self, n_batches: int) -> None:
        """Skip the first ``n_batches`` of the next iteration (resume mid-epoch)."""
        self._skip = n_batches

    def _all_batches(self) -> list[list[int]]:
        spec = self._spec
        if spec.batch_sampler is not None:
            if hasattr(spec.batch_sampler, "set_epoch"):
                spec.batch_sampler.set_epoch(self.epoch)
            return [list(b) for b in spec.batch_sampler]
        order = self._sample_order()
        bs = spec.batch_size
        out = [list(order[i : i + bs]) for i in range(0, len(order), bs)]
        if out and spec.drop_last and len(out[-1]) < bs:
            out.pop()
        return out

    def _sample_order(self) -> Sequence[int]:
        """This epoch's dataset indices: the loader's sampler, a seeded shuffle, or in order."""
        spec = self._spec
        if spec.sampler is not None:
            if hasattr(spec.sampler, "set_epoch"):
                spec.sampler.set_epoch(self.epoch)
            return list(spec.sampler)
        if spec.shuffle:
            g = torch.Generator()
            g.manual_seed(self._seed * 1_000_003 + self.epoch)
            order: list[int] = torch.randperm(len(spec.dataset), generator=g).tolist()
            return order
        return range(len(spec.dataset))

    def _my_batches(self) -> list[list[int]]:
        batches = self._all_batches()
        n, size = len(batches), self._size
        if size > 1:
            if self._training:
                batches = batches[: n - n % size]
            elif n % size and n:
                batches = batches + batches[: size - n % size]
            batches = batches[self._rank :: size]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        skip, self._skip = self._skip, 0
        yield from self._my_batches()[skip:]

    def __len__(self) -> int:
        return len(self._my_batches())
