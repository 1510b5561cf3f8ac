"""Open, read, create and write beneath a trusted directory without following what a user put there."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from collections.abc import Sequence
from typing import Any

StrPath = str | os.PathLike[str]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_LINK_ERRNOS = frozenset({errno.ELOOP, errno.ENOTDIR, errno.EMLINK})
MAX_JSON_BYTES = 1 << 20
"""``exit.json``, ``service.json`` and the like are a few hundred bytes: a larger one is refused."""


class UnsafePathError(OSError):
    """A component is a link, not what it must be, or owned by an account it must not be."""


class NotRegularError(UnsafePathError):
    """The file is a FIFO, socket, device or directory: never read (a FIFO would block the reader)."""


class FileTooLargeError(OSError):
    """The file is larger than its reader accepts."""


def relative_parts(anchor: StrPath, path: StrPath) -> tuple[str, ...]:
    """The components of `path` below `anchor` (both absolute). A ``..`` anywhere, or a path that is not below
    `anchor`, raises UnsafePathError: the walk never climbs."""
    anchor_s, path_s = os.fspath(anchor), os.fspath(path)
    if not (os.path.isabs(anchor_s) and os.path.isabs(path_s)):
        raise UnsafePathError(errno.EINVAL, "both paths must be absolute", path_s)
    a = _components(anchor_s)
    p = _components(path_s)
    if ".." in a or ".." in p or p[: len(a)] != a or len(p) == len(a):
        raise UnsafePathError(errno.EXDEV, f"not below {anchor_s}", path_s)
    return tuple(p[len(a) :])


def _components(path: str) -> list[str]:
    """The components of a POSIX path, without empty ones and ``.`` (``..`` kept)."""
    return [c for c in path.split("/") if c not in ("", ".")]


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UnsafePathError(errno.EINVAL, "not a single path component", name)


def _refuse_link(e: OSError, name: str) -> OSError:
    if e.errno in _LINK_ERRNOS:
        return UnsafePathError(e.errno, "a link or not a directory (never followed)", name)
    return e


def open_dir(
    anchor: StrPath,
    parts: Sequence[str],
    *,
    create: bool = False,
    mode: int = 0o750,
    uid: int | None = None,
    gid: int | None = None,
    keep: int = 0,
) -> int:
    """A descriptor of the directory ``anchor/parts…``, each component opened without following a link.

    With `create`, missing components are made with exactly `mode`; with `uid`, each component of `parts` is
    then owned by `uid` (and `gid`): chowned through its own descriptor when it is still the caller's, refused
    when it belongs to anyone else; except the first `keep` components, which must stay the caller's (shared
    parents that no user may rename or fill). The caller closes the descriptor."""
    fd = os.open(anchor, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, name in enumerate(parts):
            _check_name(name)
            made = False
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, mode, dir_fd=fd)
                    made = True
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                raise _refuse_link(e, name) from None
            os.close(fd)
            fd = child
            if made:
                os.fchmod(fd, mode)  # exactly `mode`, whatever the umask
            if uid is not None and index < keep:
                if os.fstat(fd).st_uid != os.geteuid():
                    raise UnsafePathError(
                        errno.EPERM, f"must be uid {os.geteuid()}'s, not another account's", name
                    )
            elif uid is not None:
                _own(fd, name, uid, gid)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _own(fd: int, name: str, uid: int, gid: int | None) -> None:
    st = os.fstat(fd)
    if st.st_uid == uid and (gid is None or st.st_gid == gid):
        return
    if st.st_uid not in (uid, os.geteuid()):
        raise UnsafePathError(errno.EPERM, f"owned by uid {st.st_uid}, neither the user's nor ours", name)
    os.fchown(fd, uid, -1 if gid is None else gid)


def make_dirs(
    anchor: StrPath,
    parts: Sequence[str],
    *,
    mode: int = 0o750,
    uid: int | None = None,
    gid: int | None = None,
    keep: int = 0,
) -> None:
    """``anchor/parts…`` exists, each component a real directory (owned by `uid`/`gid` when given, but for the
    first `keep`: see ``open_dir``)."""
    os.close(open_dir(anchor, parts, create=True, mode=mode, uid=uid, gid=gid, keep=keep))


def _open_file(anchor: StrPath, parts: Sequence[str]) -> tuple[int, os.stat_result]:
    if not parts:
        raise UnsafePathError(errno.EINVAL, "no file named", os.fspath(anchor))
    dir_fd = open_dir(anchor, parts[:-1])
    try:
        _check_name(parts[-1])
        try:
            fd = os.open(parts[-1], _READ_FLAGS, dir_fd=dir_fd)
        except OSError as e:
            raise _refuse_link(e, parts[-1]) from None
        dir_owner = os.fstat(dir_fd).st_uid
    finally:
        os.close(dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegularError(errno.EINVAL, "not a regular file (never read)", parts[-1])
    if os.geteuid() == 0 and st.st_uid != dir_owner:
        os.close(fd)
        raise UnsafePathError(
            errno.EPERM,
            f"owned by uid {st.st_uid}, in a directory of uid {dir_owner} (never read)",
            parts[-1],
        )
    return fd, st


def read_bytes(
    anchor: StrPath, parts: Sequence[str], *, offset: int = 0, max_bytes: int
) -> tuple[bytes, os.stat_result]:
    """At most `max_bytes` of the regular file ``anchor/parts…`` from `offset`, and its status (``st_size``,
    ``st_mtime``) as of the read."""
    fd, st = _open_file(anchor, parts)
    try:
        chunks: list[bytes] = []
        want = max_bytes
        while want > 0:
            chunk = os.pread(fd, min(want, 1 << 20), offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
            want -= len(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)


def read_json(anchor: StrPath, parts: Sequence[str], *, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in the regular file ``anchor/parts…``; FileTooLargeError past `max_bytes`."""
    data, _ = read_bytes(anchor, parts, max_bytes=max_bytes + 1)
    if len(data) > max_bytes:
        raise FileTooLargeError(errno.EFBIG, f"larger than {max_bytes} bytes", parts[-1])
    return json.loads(data)


def exists(anchor: StrPath, parts: Sequence[str]) -> bool:
    """Whether ``anchor/parts…`` names anything (a link counts: it is not followed); False when a directory
    on the way is a link or missing."""
    try:
        dir_fd = open_dir(anchor, parts[:-1])
    except OSError:
        return False
    try:
        os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
        return True
    except OSError:
        return False
    finally:
        os.close(dir_fd)


def write_file(
    anchor: StrPath,
    parts: Sequence[str],
    data: bytes,
    *,
    mode: int = 0o640,
    uid: int | None = None,
    gid: int | None = None,
) -> None:
    """``anchor/parts…`` holds `data` (exactly `mode`, owned by `uid`/`gid` when given): written under a new
    name in the same directory and renamed over the old one, so a reader sees all or none of it and whatever
    stood there (a link included) is replaced, never written through. The directories must exist."""
    dir_fd = open_dir(anchor, parts[:-1])
    try:
        name = parts[-1]
        _check_name(name)
        tmp = f".{name}.{secrets.token_hex(6)}"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd
        )
        try:
            try:
                os.fchmod(fd, mode)  # not narrowed by the umask
                if uid is not None:
                    os.fchown(fd, uid, -1 if gid is None else gid)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)
