"""CheckpointContext: checkpoints on the shared filesystem, written atomically, then registered with the master.

A checkpoint is a directory ``<storage root>/<uuid>``. It is written under a hidden temporary name, every file
and directory is fsynced, it is renamed into place and only then registered (``POST /api/v1/checkpoints``), so
a crash at any point leaves no visible, half-written checkpoint. Sharded checkpoints: every rank writes its own
part in its own temporary directory; the parts are merged (conflicting file names are an error), and the chief
renames the union into place and registers it.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import fnmatch
import json
import logging
import os
import pathlib
import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from harness._http import MasterSession, retry
from harness.core._distributed import DistributedContext

if TYPE_CHECKING:
    from harness.core._async_save import InFlight, StagingBuffer

logger = logging.getLogger("harness.core")

METADATA_FILE = "metadata.json"
STATE_FILE = "state_dict.pth"
Selector = Callable[[str], bool]


class DownloadMode(enum.Enum):
    LocalWorkersShareDownload = "LOCAL_WORKERS_SHARE_DOWNLOAD"
    NoSharedDownload = "NO_SHARED_DOWNLOAD"


def _fsync_path(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: pathlib.Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            p = pathlib.Path(dirpath) / name
            if not p.is_symlink():
                _fsync_path(p)
        _fsync_path(pathlib.Path(dirpath))


def list_resources(root: pathlib.Path) -> dict[str, int]:
    """Relative path → size in bytes of every file (directories end with '/' and have size 0)."""
    out: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = pathlib.Path(dirpath).relative_to(root)
        for d in dirnames:
            out[f"{(rel / d).as_posix()}/"] = 0
        for f in filenames:
            out[(rel / f).as_posix()] = (pathlib.Path(dirpath) / f).stat().st_size
    return out


def _copy_tree(src: pathlib.Path, dst: pathlib.Path, selector: Selector | None) -> None:
    for rel, _size in sorted(list_resources(src).items()):
        if rel.endswith("/"):
            continue
        if selector is not None and not selector(rel):
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, dst / rel)


def _check_shard_views(views: list[Any], error: BaseException | None) -> None:
    """Raise when a rank failed to write its part (this rank's own `error` when it is the one), or when two ranks
    wrote the same file (or one wrote the metadata file). `views` holds every rank's ``(ok, files, metadata)``."""
    failed = [r for r, (ok, _, _) in enumerate(views) if not ok]
    if failed:
        raise error or RuntimeError(f"sharded checkpoint failed on ranks {failed}")
    owners: dict[str, int] = {}
    for r, (_, fs, _) in enumerate(views):
        for f in fs:
            if f in owners or f == METADATA_FILE:
                raise RuntimeError(f"sharded checkpoint: ranks {owners.get(f, r)} and {r} both wrote {f}")
            owners[f] = r


def _move_files(src: pathlib.Path, dst: pathlib.Path, files: list[str]) -> None:
    """Move the relative paths `files` from `src` into `dst` (created when missing)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in files:
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
        os.replace(src / f, dst / f)


def _check_save_args(filename: str, *, shard: bool, asynchronous: bool) -> None:
    """ValueError when ``save_state``'s `filename` is not a plain relative name, or it asks for an asynchronous
    sharded save."""
    name = pathlib.PurePosixPath(filename)
    if not filename or name.is_absolute() or ".." in name.parts or filename == METADATA_FILE:
        raise ValueError(f"filename: {filename!r} must be a relative name other than {METADATA_FILE}")
    if shard and asynchronous:
        raise ValueError(
            "save_state(asynchronous=True) does not take shard=True: sharded state (DeepSpeed, FSDP) is "
            "saved synchronously (store_path(shard=True)); for asynchronous sharded saves use "
            "torch.distributed.checkpoint.async_save"
        )


class CheckpointContext:
    """Stores checkpoints under ``base_path``; registers them with the master when ``session`` is set."""

    def __init__(
        self,
        dist: DistributedContext,
        base_path: str | os.PathLike[str],
        session: MasterSession | None = None,
        trial_id: int | None = None,
        trial_run_id: int = 0,
    ) -> None:
        self._dist = dist
        self._base = pathlib.Path(base_path)
        self._session = session
        self._trial_id = trial_id
        self._run_id = trial_run_id
        self._inflight: InFlight | None = None
        self._staging: StagingBuffer | None = None
        # Set by core.Context: True once should_preempt() said so; asynchronous saves then become final ones.
        self._stopping: Callable[[], bool] = lambda: False
        # Set by core.Context: waits until every metric reported so far is at the master. A checkpoint is
        # registered only after that, so a trial resumed from it never misses the metrics that led up to it.
        self._flush_metrics: Callable[[], object] = lambda: None

    @property
    def base_path(self) -> pathlib.Path:
        return self._base

    def _path(self, storage_id: str) -> pathlib.Path:
        if not storage_id or "/" in storage_id or storage_id.startswith("."):
            raise ValueError(f"invalid storage_id {storage_id!r}")
        return self._base / storage_id

    def _check_metadata(self, metadata: dict[str, Any] | None) -> dict[str, Any]:
        metadata = dict(metadata or {})
        if METADATA_FILE in metadata:
            raise ValueError(f"metadata may not have a key named {METADATA_FILE}")
        if "steps_completed" not in metadata:
            if self._session is not None:
                raise ValueError("checkpoint metadata must include 'steps_completed' (as in Determined)")
            logger.warning("checkpoint metadata has no 'steps_completed'; the cluster will refuse it")
        return metadata

    # -- writing -------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def store_path(
        self, metadata: dict[str, Any] | None = None, *, shard: bool = False
    ) -> Iterator[tuple[pathlib.Path, str]]:
        """Yield ``(path, storage_id)``: write the checkpoint's files under ``path``.

        Without ``shard`` only the chief may call it. With ``shard`` every rank must call it, and each writes
        its own files; file names must not collide across ranks.
        """
        if shard:
            with self._store_path_sharded(metadata) as out:
                yield out
            return
        if self._dist.rank != 0:
            raise RuntimeError("store_path(shard=False) may only be called on the chief (rank 0)")
        metadata = self._check_metadata(metadata)
        storage_id = str(uuid.uuid4())
        tmp = self._base / f".{storage_id}.tmp"
        tmp.mkdir(parents=True)
        try:
            yield tmp, storage_id
            self._finish(tmp, storage_id, metadata)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @contextlib.contextmanager
    def _store_path_sharded(self, metadata: dict[str, Any] | None) -> Iterator[tuple[pathlib.Path, str]]:
        dist = self._dist
        storage_id: str = dist.broadcast(str(uuid.uuid4()) if dist.rank == 0 else None)
        mine = self._base / f".{storage_id}.tmp.rank{dist.rank}"
        merged = self._base / f".{storage_id}.tmp"
        mine.mkdir(parents=True)
        error: BaseException | None = None
        try:
            yield mine, storage_id
        except BaseException as e:
            error = e
        files = [] if error is not None else [r for r in list_resources(mine) if not r.endswith("/")]
        if error is None:
            fsync_tree(mine)
        views = dist.allgather((error is None, files, metadata))
        try:
            _check_shard_views(views, error)
            merged_md = self._merge_metadata([md for _, _, md in views])
            _move_files(mine, merged, files)
        finally:
            shutil.rmtree(mine, ignore_errors=True)
        done = dist.allgather(None)  # every part is in place
        del done
        self._publish_sharded(merged, storage_id, merged_md)

    def _publish_sharded(self, merged: pathlib.Path, storage_id: str, merged_md: dict[str, Any]) -> None:
        """The chief seals, renames and registers the merged checkpoint; every rank raises when that failed."""
        dist = self._dist
        outcome: str | None = None
        if dist.rank == 0:
            try:
                self._finish(merged, storage_id, self._check_metadata(merged_md))
            except Exception as e:
                shutil.rmtree(merged, ignore_errors=True)
                outcome = f"{type(e).__name__}: {e}"
                dist.broadcast(outcome)
                raise
        outcome = dist.broadcast(outcome)
        if outcome is not None:
            raise RuntimeError(f"sharded checkpoint failed on the chief: {outcome}")

    @staticmethod
    def _merge_metadata(parts: list[dict[str, Any] | None]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for md in parts:
            for k, v in (md or {}).items():
                if k in out and out[k] != v:
                    raise ValueError(f"sharded checkpoint: ranks disagree on metadata key {k!r}")
                out[k] = v
        return out

    def _finish(self, tmp: pathlib.Path, storage_id: str, metadata: dict[str, Any]) -> None:
        self._seal(tmp, metadata)
        self._publish(tmp, storage_id, metadata)

    @staticmethod
    def _seal(tmp: pathlib.Path, metadata: dict[str, Any]) -> None:
        with open(tmp / METADATA_FILE, "w", encoding="utf-8") as f:
            json.dump(metadata, f, indent=2, sort_keys=True)
        fsync_tree(tmp)

    def _publish(self, tmp: pathlib.Path, storage_id: str, metadata: dict[str, Any]) -> None:
        final = self._path(storage_id)
        os.rename(tmp, final)
        _fsync_path(self._base)
        self._register(storage_id, list_resources(final), metadata)

    def _register(self, storage_id: str, resources: dict[str, int], metadata: dict[str, Any]) -> None:
        if self._session is None:
            return
        body = {
            "checkpoint": {
                "uuid": storage_id,
                "trialId": self._trial_id,
                "trialRunId": self._run_id,
                "reportTime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "resources": resources,
                "metadata": metadata,
                "state": "COMPLETED",
            }
        }
        session = self._session
        self._flush_metrics()
        retry(lambda: session.post("/api/v1/checkpoints", body), what=f"register checkpoint {storage_id}")
        logger.info("checkpoint %s registered", storage_id)

    def upload(
        self,
        ckpt_dir: str | os.PathLike[str] | None,
        metadata: dict[str, Any] | None = None,
        *,
        shard: bool = False,
        selector: Selector | None = None,
    ) -> str:
        """Copy ``ckpt_dir`` into a new checkpoint; returns its storage_id."""
        with self.store_path(metadata, shard=shard) as (path, storage_id):
            if ckpt_dir is not None:
                _copy_tree(pathlib.Path(ckpt_dir), path, selector)
        return storage_id

    # -- saving a state object (our extension; Determined's client has no asynchronous save) --------
    def save_state(
        self,
        state: Any,
        metadata: dict[str, Any] | None = None,
        *,
        asynchronous: bool = False,
        filename: str = STATE_FILE,
        shard: bool = False,
    ) -> str:
        """``torch.save(state)`` as ``filename`` in a new checkpoint; returns its storage_id.

        With ``asynchronous=True`` the call returns once ``state`` is staged in memory (see
        ``harness/core/_async_save.py``); the checkpoint is durable and registered later, in the background.
        ``wait()`` blocks until it is. At most one save is in flight; when the next save comes while one is:

        - it has the same ``steps_completed`` (no training step since): the one in flight is that save;
        - it is a final save (``asynchronous=False``, or any save once ``should_preempt()`` said True): the one
          in flight is abandoned (its incomplete directory removed, nothing registered) and this one is
          written at once, synchronously;
        - otherwise it waits for the one in flight, then is staged.
        """
        _check_save_args(filename, shard=shard, asynchronous=asynchronous)
        from harness.core import _async_save

        if shard:
            with self.store_path(metadata, shard=True) as (path, storage_id):
                _async_save.write_state(state, path / filename)
            return storage_id
        if self._dist.rank != 0:
            raise RuntimeError("save_state(shard=False) may only be called on the chief (rank 0)")
        metadata = self._check_metadata(metadata)
        steps = metadata.get("steps_completed")
        final = not asynchronous or self._stopping()
        same = self._settle_inflight(steps, final=final)
        if same is not None:
            return same
        if final:
            with self.store_path(metadata) as (path, storage_id):
                _async_save.write_state(state, path / filename)
            return storage_id
        return self._start_async(state, metadata, filename, steps)

    def _settle_inflight(self, steps: Any, *, final: bool) -> str | None:
        """Before a new save: the storage_id of the save in flight when it is this save (no training step since it
        started), else None once that save is completed or abandoned (or when there is none)."""
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return None
        if not inflight.done and steps is not None and inflight.steps == steps:
            if final:
                inflight.wait()
            else:
                self._inflight = inflight
            return inflight.storage_id  # no training step since it started: it is this save
        if final and not inflight.done:
            if not inflight.abandon():
                inflight.wait()  # it was already committing: it completed (or says why not)
        else:
            inflight.wait()
        return None

    def _start_async(self, state: Any, metadata: dict[str, Any], filename: str, steps: Any) -> str:
        from harness.core import _async_save

        storage_id = str(uuid.uuid4())
        tmp = self._base / f".{storage_id}.tmp"
        tmp.mkdir(parents=True)
        try:
            if self._staging is None:
                self._staging = _async_save.StagingBuffer()
            staged, events = self._staging.stage(state)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

        def write(cancel: Any) -> None:
            for event in events:
                event.synchronize()
            _async_save.write_state(staged, tmp / filename, cancel)
            if cancel.is_set():
                raise _async_save.SaveAbandoned()
            self._seal(tmp, metadata)

        self._inflight = _async_save.InFlight(
            storage_id,
            steps,
            tmp,
            self._path(storage_id),
            write,
            lambda: self._publish(tmp, storage_id, metadata),
        )
        self._inflight.start()
        return storage_id

    def wait(self) -> str | None:
        """Block until the asynchronous save in flight is durable and registered; its storage_id, or None."""
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return None
        inflight.wait()
        return None if inflight.abandoned else inflight.storage_id

    def close(self) -> None:
        """Called by ``core.Context`` on exit: a save in flight is completed, not dropped."""
        self.wait()

    # -- reading -------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def restore_path(
        self,
        storage_id: str,
        download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload,
        *,
        selector: Selector | None = None,
    ) -> Iterator[pathlib.Path]:
        """Yield the checkpoint's directory (on the shared filesystem: no copy). Treat it as read-only."""
        path = self._path(storage_id)
        if not path.is_dir():
            raise FileNotFoundError(f"checkpoint {storage_id} not found under {self._base}")
        yield path

    def download(
        self,
        storage_id: str,
        ckpt_dir: str | os.PathLike[str],
        download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload,
        *,
        selector: Selector | None = None,
    ) -> None:
        """Copy a checkpoint into ``ckpt_dir``. In the shared mode the local chief copies, the others wait."""
        src = self._path(storage_id)
        shared = DownloadMode(download_mode) == DownloadMode.LocalWorkersShareDownload
        error: str | None = None
        if not shared or self._dist.local_rank == 0:
            try:
                if not src.is_dir():
                    raise FileNotFoundError(f"checkpoint {storage_id} not found under {self._base}")
                pathlib.Path(ckpt_dir).mkdir(parents=True, exist_ok=True)
                _copy_tree(src, pathlib.Path(ckpt_dir), selector)
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
                if not shared:
                    raise
        if shared:
            errors = [e for e in self._dist.allgather_local(error) if e is not None]
            if errors:
                raise RuntimeError(f"download of {storage_id} failed: {errors[0]}")

    def get_metadata(self, storage_id: str) -> dict[str, Any]:
        path = self._path(storage_id) / METADATA_FILE
        if path.exists():
            with open(path, encoding="utf-8") as f:
                md: dict[str, Any] = json.load(f)
                return md
        if self._session is not None:
            out = self._session.get(f"/api/v1/checkpoints/{storage_id}")
            return dict(out.get("checkpoint", {}).get("metadata") or {})
        raise FileNotFoundError(f"checkpoint {storage_id} not found under {self._base}")

    def delete(self, storage_id: str, globs: list[str] | None = None) -> None:
        """Delete a checkpoint (or only the files matching ``globs``)."""
        path = self._path(storage_id)
        if globs:
            for rel in list_resources(path):
                if not rel.endswith("/") and any(fnmatch.fnmatch(rel, g) for g in globs):
                    (path / rel).unlink()
            return
        shutil.rmtree(path, ignore_errors=True)
        if self._session is not None:
            session = self._session
            retry(
                lambda: session.delete("/api/v1/checkpoints", {"checkpointUuids": [storage_id]}),
                what=f"delete checkpoint {storage_id}",
                deadline_s=60,
            )


class DummyCheckpointContext(CheckpointContext):
    """Checkpoints in a local directory, nothing registered (off-cluster)."""

    def __init__(self, dist: DistributedContext, base_path: str | os.PathLike[str]) -> None:
        super().__init__(dist, base_path, None)
