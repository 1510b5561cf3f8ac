"""Asynchronous checkpoints: the state is staged in memory, training goes on, a thread makes it durable.

``CheckpointContext.save_state(state, metadata, asynchronous=True)`` stages ``state`` (a nest of dicts, lists
and tuples of tensors and plain values, such as a ``state_dict``): every tensor is copied into a staging
buffer allocated at the first save and reused by the next ones while the state keeps its layout (pinned host
memory for a CUDA tensor, copied with ``non_blocking`` and waited for by the writer through a CUDA event), and
every other value is deep-copied. The call returns as soon as the copy is done. A background thread then
``torch.save``s the staged state under the checkpoint's incomplete name ``.<uuid>.tmp``, writes the metadata,
fsyncs, renames and registers, exactly as the synchronous ``store_path``.

- At most one save is in flight: the next asynchronous save first waits for it. The staging memory is one
  copy of the state (the buffer of a tensor that is no longer in the state is dropped at the next staging).
- A crash mid-save leaves only the incomplete directory: nothing is visible under the checkpoint's name and
  nothing is registered. An abandoned save (``_InFlight.abandon``) stops at its next write of at most
  ``WRITE_CHUNK_BYTES`` and removes its incomplete directory.
- Sharded state (``torch.distributed`` DTensor / ShardedTensor, DeepSpeed's engine) is refused with a message
  that says what to use instead.

torch is imported here, and this module only when an asynchronous save is asked for.
"""

from __future__ import annotations

import copy
import io
import logging
import os
import pathlib
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

logger = logging.getLogger("harness.core")

WRITE_CHUNK_BYTES = 16 << 20  # an abandoned writer stops within one chunk


class SaveAbandoned(Exception):
    """Raised inside the writer thread when its save was abandoned (a newer final save superseded it)."""


class StagingBuffer:
    """Copies of a state's tensors, allocated once and reused while the state keeps its layout."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self.allocated_bytes = 0  # allocated by the last ``stage`` (0 when every buffer was reused)
        self.allocations = 0  # buffers allocated since creation

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def stage(self, state: Any) -> tuple[Any, list[Any]]:
        """A copy of ``state`` whose tensors live in the buffer; and the CUDA events the writer must wait for."""
        self.allocated_bytes = 0
        used: dict[str, torch.Tensor] = {}
        memo: dict[int, Any] = {}
        devices: set[torch.device] = set()
        out = self._copy(state, "", used, memo, devices)
        self._buffers = used  # buffers of tensors no longer in the state are freed here
        events = []
        for device in devices:
            with torch.cuda.device(device):
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record()
                events.append(event)
        return out, events

    def _copy(
        self,
        obj: Any,
        key: str,
        used: dict[str, torch.Tensor],
        memo: dict[int, Any],
        devices: set[torch.device],
    ) -> Any:
        if id(obj) in memo:  # one tensor reached twice stays one tensor (tied weights)
            return memo[id(obj)]
        out: Any
        if isinstance(obj, torch.Tensor):
            out = self._copy_tensor(obj, key, used, devices)
        elif isinstance(obj, Mapping):
            items = {k: self._copy(v, f"{key}/{k}", used, memo, devices) for k, v in obj.items()}
            out = type(obj)(items) if isinstance(obj, dict) else items
        elif isinstance(obj, list):
            out = [self._copy(v, f"{key}/{i}", used, memo, devices) for i, v in enumerate(obj)]
        elif isinstance(obj, tuple):
            parts = [self._copy(v, f"{key}/{i}", used, memo, devices) for i, v in enumerate(obj)]
            out = type(obj)(*parts) if hasattr(obj, "_fields") else tuple(parts)
        else:
            if hasattr(obj, "state_dict") and callable(obj.state_dict):
                raise TypeError(
                    f"asynchronous checkpoint: {key or 'the state'} is a {type(obj).__name__}; "
                    "pass its state_dict() instead"
                )
            out = copy.deepcopy(obj)
        memo[id(obj)] = out
        return out

    def _copy_tensor(
        self, t: torch.Tensor, key: str, used: dict[str, torch.Tensor], devices: set[torch.device]
    ) -> torch.Tensor:
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise TypeError(
                f"asynchronous checkpoint: {key} is a {type(t).__name__} (sharded state); "
                "save sharded state with torch.distributed.checkpoint.async_save, or with asynchronous=False"
            )
        if t.layout != torch.strided or t.device.type not in ("cpu", "cuda"):
            return t.detach().to("cpu", copy=True)  # rare layouts: a fresh copy, not buffered
        cuda = t.device.type == "cuda"
        buf = self._buffers.pop(
            key, None
        )  # popped: a buffer that no longer fits is freed before its successor
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = None
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=cuda)
            self.allocated_bytes += buf.numel() * buf.element_size()
            self.allocations += 1
        buf.copy_(t.detach(), non_blocking=cuda)
        if cuda:
            devices.add(t.device)
        used[key] = buf
        if isinstance(t, torch.nn.Parameter):
            return torch.nn.Parameter(buf, requires_grad=t.requires_grad)
        return buf


class _CancellableFile(io.RawIOBase):
    """A write-only file that writes in chunks and raises ``SaveAbandoned`` once ``cancel`` is set."""

    def __init__(self, f: io.BufferedWriter, cancel: threading.Event) -> None:
        super().__init__()
        self._f = f
        self._cancel = cancel

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        mv = memoryview(b).cast("B")
        done = 0
        while done < len(mv):
            if self._cancel.is_set():
                raise SaveAbandoned()
            done += self._f.write(mv[done : done + WRITE_CHUNK_BYTES])
        return len(mv)

    def flush(self) -> None:
        self._f.flush()


def write_state(state: Any, path: pathlib.Path, cancel: threading.Event | None = None) -> None:
    """``torch.save(state)`` into ``path`` (a readable ``torch.load`` file), stopping early if cancelled."""
    cancel = cancel or threading.Event()
    with open(path, "wb") as f:
        try:
            torch.save(state, _CancellableFile(f, cancel))  # type: ignore[arg-type]
        except Exception as e:
            # SaveAbandoned raised inside torch's zip writer comes out as whatever the writer says next
            if cancel.is_set():
                raise SaveAbandoned() from e
            raise
        f.flush()


class InFlight:
    """One asynchronous save: staged, then written, fsynced, renamed and registered by its own thread."""

    def __init__(
        self,
        storage_id: str,
        steps: Any,
        tmp: pathlib.Path,
        final: pathlib.Path,
        write: Callable[[threading.Event], None],
        commit: Callable[[], None],
    ) -> None:
        self.storage_id = storage_id
        self.steps = steps
        self._tmp = tmp
        self._final = final
        self._write = write
        self._commit = commit
        self.cancel = threading.Event()
        self._lock = threading.Lock()
        self._committing = False
        self.abandoned = False
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.durable_s: float | None = None  # seconds from the call to registered
        self._thread = threading.Thread(target=self._run, name=f"harness-ckpt-{storage_id[:8]}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:  # the writer yields the CPU to training: this thread only, 10 steps nicer (Linux)
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + 10))
        except (AttributeError, OSError):
            pass
        try:
            self._write(self.cancel)
            with self._lock:  # past this point the save is no longer abandoned: it completes
                if self.cancel.is_set():
                    raise SaveAbandoned()
                self._committing = True
            self._commit()
            self.durable_s = time.monotonic() - self.started
            logger.info("asynchronous checkpoint %s durable after %.2fs", self.storage_id, self.durable_s)
        except SaveAbandoned:
            self.abandoned = True
            shutil.rmtree(self._tmp, ignore_errors=True)
            logger.info("asynchronous checkpoint %s abandoned; nothing registered", self.storage_id)
        except BaseException as e:
            self.error = e
            shutil.rmtree(self._tmp, ignore_errors=True)
            if self._committing:  # renamed but not registered: make it invisible again
                shutil.rmtree(self._final, ignore_errors=True)
            logger.error("asynchronous checkpoint %s failed: %s: %s", self.storage_id, type(e).__name__, e)

    def wait(self) -> None:
        """Block until the save is durable and registered (or abandoned); raise what failed it."""
        self._thread.join()
        if self.error is not None:
            raise RuntimeError(
                f"asynchronous checkpoint {self.storage_id} failed: {type(self.error).__name__}: {self.error}"
            ) from self.error

    def abandon(self) -> bool:
        """Stop the save and remove its incomplete directory; False if it was already committing (it completes)."""
        with self._lock:
            if not self._committing:
                self.cancel.set()
        self._thread.join()
        return self.abandoned
