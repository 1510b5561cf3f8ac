"""Image references and the per-pool SIF cache. Standard library only (it runs inside jobs).

An ``environment.image`` is one of:

- a local ``.sif`` (or ``.simg``) file: used where it is;
- a sandbox directory (an unpacked root filesystem): used where it is;
- a URI the runtime pulls (``docker://``, ``oras://``, ``library://``, ``shub://``, ``http(s)://``), or a bare
  registry name as Determined configs write them (``determinedai/pytorch-ngc:0.38.0``, taken as ``docker://``):
  pulled once into the pool's cache directory on the shared filesystem.

Pulls are serialised by an ``flock`` on a lock file beside the image, so concurrent trials (on any node of the
shared filesystem) pull once; the image is written to a temporary name and renamed into place, so a reader never
sees half an image, and a failed pull leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from containers.runtime import ContainerRuntime, find_program

DEFAULT_CACHE_SUBDIR = "images"


def default_cache_dir(job_storage_root: str) -> str:
    """A pool's image cache when no ``image_cache_dir`` is configured: ``<job_storage_root>/images``."""
    return os.path.join(job_storage_root, DEFAULT_CACHE_SUBDIR)


PULL_SCHEMES = ("docker://", "oras://", "library://", "shub://", "http://", "https://")
SIF_SUFFIXES = (".sif", ".simg")
DEFAULT_PULL_TIMEOUT_S = 3600
STDERR_TAIL_CHARS = 1500
ImageKind = Literal["sif", "sandbox", "remote"]
Puller = Callable[[str, str], None]  # (uri, destination path); raises ImagePullError


class ImageError(Exception):
    """An image cannot be used; the message names it."""

    def __init__(self, image: str, message: str) -> None:
        super().__init__(f"container image {image!r}: {message}")
        self.image = image
        self.detail = message


class ImagePullError(ImageError):
    pass


@dataclass(frozen=True)
class ImageRef:
    text: str  # as the config wrote it
    kind: ImageKind
    location: str  # a path for sif/sandbox, the URI to pull for remote

    def cache_name(self) -> str:
        """A file name for the pulled image: readable, and unique per URI."""
        body = self.location.split("://", 1)[-1]
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", body).strip("._")[:80] or "image"
        digest = hashlib.sha256(self.location.encode()).hexdigest()[:12]
        return f"{slug}-{digest}.sif"


def parse_image(text: str) -> ImageRef:
    ref = text.strip()
    if not ref:
        raise ImageError(text, "the image reference is empty")
    if ref.startswith(PULL_SCHEMES):
        return ImageRef(text, "remote", ref)
    if ref.startswith(("/", "./", "../", "~")) or ref.endswith(SIF_SUFFIXES):
        return _parse_local_image(text, ref)
    if "://" in ref:
        raise ImageError(text, f"unknown scheme (known: {', '.join(PULL_SCHEMES)})")
    return ImageRef(text, "remote", "docker://" + ref)


def _parse_local_image(text: str, ref: str) -> ImageRef:
    """A local image: a ``.sif`` file, or a sandbox directory (a trailing ``/`` or an existing directory)."""
    path = os.path.expanduser(ref)
    if path.endswith(SIF_SUFFIXES) and not path.endswith("/"):
        return ImageRef(text, "sif", path)
    if path.endswith("/") or os.path.isdir(path):
        return ImageRef(text, "sandbox", path.rstrip("/") or "/")
    return ImageRef(text, "sif", path)


# -- the cache ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def file_lock(path: str, *, timeout_s: float | None = None, poll_s: float = 0.2) -> Iterator[None]:
    """An exclusive ``flock`` on `path`, which is created and, when released, removed.

    Removing a lock file while others wait on it is safe because a waiter that gets the lock checks that the
    path still names the file it locked, and starts again when it does not."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            _flock_until(fd, path, deadline=deadline, timeout_s=timeout_s, poll_s=poll_s)
            if _names_fd(path, fd):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the holder removed it: lock the new one
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


def _flock_until(
    fd: int, path: str, *, deadline: float | None, timeout_s: float | None, poll_s: float
) -> None:
    """Take an exclusive ``flock`` on `fd`, polling every `poll_s`; ``TimeoutError`` past `deadline`."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout_s} s for the lock {path}") from None
            time.sleep(poll_s)


def _names_fd(path: str, fd: int) -> bool:
    """Whether `path` still names the file open as `fd` (the lock holder may have removed it)."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def ensure_cache_dir(path: str) -> None:
    """Create the cache directory writable by every user (sticky, like /tmp) when it is missing."""
    if os.path.isdir(path):
        return
    os.makedirs(path, exist_ok=True)
    with contextlib.suppress(PermissionError):
        os.chmod(path, 0o1777)


def runtime_puller(
    runtime: ContainerRuntime,
    *,
    timeout_s: float = DEFAULT_PULL_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> Puller:
    """``apptainer pull DEST URI``, with the runtime's layer cache in a temporary directory beside DEST."""

    def pull(uri: str, dest: str) -> None:
        program = find_program(runtime)
        if program is None:
            raise ImagePullError(uri, f"cannot pull it: {runtime.program!r} is not installed on this node")
        base = dict(os.environ if env is None else env)
        layers = tempfile.mkdtemp(prefix=".layers-", dir=os.path.dirname(dest))
        var = "APPTAINER_CACHEDIR" if runtime.name == "apptainer" else "SINGULARITY_CACHEDIR"
        base.setdefault(var, layers)
        try:
            proc = subprocess.run(
                [program, "pull", "--force", dest, uri],
                capture_output=True, text=True, timeout=timeout_s, env=base, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise ImagePullError(uri, f"the pull took longer than {timeout_s:.0f} s") from None
        finally:
            shutil.rmtree(layers, ignore_errors=True)
        if proc.returncode != 0:
            said = (proc.stderr or proc.stdout).strip()[-STDERR_TAIL_CHARS:]
            raise ImagePullError(uri, f"the pull failed ({runtime.program} exit {proc.returncode}): {said}")

    return pull


def cached_image(ref: ImageRef, cache_dir: str) -> str:
    return os.path.join(cache_dir, ref.cache_name())


def pull_into_cache(
    ref: ImageRef,
    cache_dir: str,
    pull: Puller,
    *,
    force: bool = False,
    lock_timeout_s: float | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> str:
    """The cached SIF of a remote image, pulled first unless it is there (or `force`). Concurrent callers pull once."""
    target = cached_image(ref, cache_dir)
    if not force and os.path.isfile(target):
        return target
    ensure_cache_dir(cache_dir)
    lock = os.path.join(cache_dir, f".{ref.cache_name()}.lock")
    started, wall_started = time.monotonic(), time.time()
    with file_lock(lock, timeout_s=lock_timeout_s):
        if os.path.isfile(target) and (not force or os.path.getmtime(target) >= wall_started):
            return target  # pulled (again) by someone else while we waited
        tmp = os.path.join(cache_dir, f".{ref.cache_name()}.pull-{os.getpid()}")
        log(f"pulling {ref.location} into {target}")
        try:
            pull(ref.location, tmp)
            if not os.path.isfile(tmp):
                raise ImagePullError(ref.text, "the pull reported success but wrote no image")
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except ImageError as e:
            _remove(tmp)
            raise ImagePullError(ref.text, e.detail) from None
        except BaseException:
            _remove(tmp)
            raise
    log(f"pulled {ref.location} in {time.monotonic() - started:.0f} s")
    return target


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def resolve_image(
    text: str,
    cache_dir: str | None,
    pull: Puller,
    *,
    force_pull: bool = False,
    log: Callable[[str], None] = lambda _m: None,
) -> str:
    """A local path the runtime can run for the image reference `text`; raises ImageError naming it."""
    ref = parse_image(text)
    if ref.kind == "sif":
        if not os.path.isfile(ref.location):
            raise ImageError(text, f"no such image file {ref.location}")
        if not os.access(ref.location, os.R_OK):
            raise ImageError(text, f"{ref.location} is not readable by this user")
        return ref.location
    if ref.kind == "sandbox":
        if not os.path.isdir(ref.location):
            raise ImageError(text, f"no such sandbox directory {ref.location}")
        return ref.location
    if not cache_dir:
        raise ImageError(text, "no image cache directory is configured to pull it into")
    return pull_into_cache(ref, cache_dir, pull, force=force_pull, log=log)
