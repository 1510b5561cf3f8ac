"""Validate an uploaded model definition (Determined's ``[{path, type, content, mode, ...}]``) and pack it.

Nothing is written anywhere here: the result is a gzip'd tar in memory, stored with the experiment in the
same transaction, so a rejected upload leaves nothing behind.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import io
import mimetypes
import posixpath
import tarfile
from dataclasses import dataclass

from hpc_master.errors import ClientError, NotFoundError, PayloadTooLargeError

MAX_CONTEXT_BYTES = 95 * 1024 * 1024
REGULAR_TYPES = {0, ord(tarfile.REGTYPE), ord(tarfile.AREGTYPE or "\0")}
DIRECTORY_TYPES = {ord(tarfile.DIRTYPE)}


@dataclass(frozen=True)
class ContextFile:
    path: str
    is_dir: bool
    content: bytes
    mode: int
    mtime: int


def check_relative_path(path: str, field: str) -> str:
    """Return the normalised relative path, or raise naming the file."""
    if not path or "\0" in path:
        raise ClientError("empty or NUL-containing file name in the context", field=field)
    if path.startswith("/") or "\\" in path or (len(path) > 1 and path[1] == ":"):
        raise ClientError(f"context file {path!r} has an absolute path", field=field, code="path_escape")
    parts = path.split("/")
    if ".." in parts:
        raise ClientError(
            f"context file {path!r} escapes the context directory", field=field, code="path_escape"
        )
    normalised = posixpath.normpath(path)
    if normalised in (".", ""):
        raise ClientError(f"context file {path!r} names the context root", field=field)
    return normalised


def parse_model_definition(items: list[dict[str, object]]) -> list[ContextFile]:
    total = 0
    seen: set[str] = set()
    files: list[ContextFile] = []
    for index, item in enumerate(items):
        field = f"modelDefinition[{index}]"
        raw_path, path, is_dir, encoded = _checked_item(item, field)
        # Cheap size bound before decoding.
        total += len(encoded) * 3 // 4
        if total > MAX_CONTEXT_BYTES * 1.01 + 4:
            raise PayloadTooLargeError(
                f"the context is larger than {MAX_CONTEXT_BYTES // (1024 * 1024)} MB", field="modelDefinition"
            )
        content = _decoded(encoded, is_dir=is_dir, raw_path=raw_path, field=field)
        if path in seen:
            raise ClientError(f"context file {raw_path!r} appears twice", field=f"{field}.path")
        seen.add(path)
        files.append(_context_file(item, path, is_dir=is_dir, content=content))
    size = sum(len(f.content) for f in files)
    if size > MAX_CONTEXT_BYTES:
        raise PayloadTooLargeError(
            f"the context is {size / 2**20:.1f} MB; the limit is {MAX_CONTEXT_BYTES // 2**20} MB",
            field="modelDefinition",
        )
    return files


def _checked_item(item: dict[str, object], field: str) -> tuple[str, str, bool, str]:
    """One entry's path as given and normalised, whether it is a directory, and its base64 content (not
    decoded yet); raises naming the entry's field when it is not a regular file or directory at a relative
    path with text content."""
    raw_path = item.get("path")
    if not isinstance(raw_path, str):
        raise ClientError("each context file needs a string 'path'", field=f"{field}.path")
    path = check_relative_path(raw_path, f"{field}.path")
    file_type = item.get("type", ord(tarfile.REGTYPE))
    if not isinstance(file_type, int) or (
        file_type not in REGULAR_TYPES and file_type not in DIRECTORY_TYPES
    ):
        raise ClientError(
            f"context file {raw_path!r} is not a regular file or directory (links are not allowed)",
            field=f"{field}.type",
            code="unsupported_file_type",
        )
    encoded = item.get("content") or ""
    if not isinstance(encoded, str):
        raise ClientError(f"context file {raw_path!r}: content must be base64 text", field=f"{field}.content")
    return raw_path, path, file_type in DIRECTORY_TYPES, encoded


def _decoded(encoded: str, *, is_dir: bool, raw_path: str, field: str) -> bytes:
    try:
        return base64.b64decode(encoded, validate=True) if not is_dir else b""
    except (binascii.Error, ValueError):
        raise ClientError(
            f"context file {raw_path!r}: content is not valid base64", field=f"{field}.content"
        ) from None


def _context_file(item: dict[str, object], path: str, *, is_dir: bool, content: bytes) -> ContextFile:
    """The entry with its mode (the default for its kind when none is given) and mtime (0 when none)."""
    mode = item.get("mode")
    mtime = item.get("mtime")
    return ContextFile(
        path=path,
        is_dir=is_dir,
        content=content,
        mode=(mode if isinstance(mode, int) and mode > 0 else (0o755 if is_dir else 0o644)) & 0o7777,
        mtime=mtime if isinstance(mtime, int) and mtime > 0 else 0,
    )


def pack_context(files: list[ContextFile]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for f in sorted(files, key=lambda f: f.path):
            info = tarfile.TarInfo(f.path)
            info.mode = f.mode
            info.mtime = f.mtime
            if f.is_dir:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(f.content)
                tar.addfile(info, io.BytesIO(f.content))
    return buffer.getvalue()


def unpack_context_listing(archive: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return tar.getnames()


def context_tree(archive: bytes) -> list[dict[str, object]]:
    """The stored context as Determined's ``v1FileNode`` tree (``GetModelDefTree``): each directory's entries
    by name, directories that only their files imply included."""
    root: dict[str, dict[str, object]] = {}
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        for info in tar.getmembers():
            if not (info.isfile() or info.isdir()):
                continue
            level = root
            parts = posixpath.normpath(info.name).split("/")
            for depth, part in enumerate(parts):
                path = "/".join(parts[: depth + 1])
                last = depth == len(parts) - 1
                node = level.setdefault(part, _file_node(path, part, is_dir=True, size=0, mtime=0))
                if last:
                    node.update(_file_node(path, part, is_dir=info.isdir(), size=info.size, mtime=info.mtime))
                children = node.setdefault("_children", {})
                assert isinstance(children, dict)
                level = children
    return _tree_list(root)


def _file_node(path: str, name: str, *, is_dir: bool, size: int, mtime: float) -> dict[str, object]:
    when = dt.datetime.fromtimestamp(max(mtime, 0), tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "path": path,
        "name": name,
        "isDir": is_dir,
        "contentLength": 0 if is_dir else size,
        "contentType": "" if is_dir else (mimetypes.guess_type(name)[0] or "text/plain"),
        "modifiedTime": when,
    }


def _tree_list(level: dict[str, dict[str, object]]) -> list[dict[str, object]]:
    out = []
    for name in sorted(level):
        node = dict(level[name])
        children = node.pop("_children", {})
        if node["isDir"]:
            assert isinstance(children, dict)
            node["files"] = _tree_list(children)
        out.append(node)
    return out


def context_file(archive: bytes, path: str) -> bytes:
    """One regular file of the stored context, by its path there (``GetModelDefFile``); nothing outside the
    archive is read, whatever `path` says."""
    wanted = posixpath.normpath(path.lstrip("/")) if path else ""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        for info in tar.getmembers():
            if posixpath.normpath(info.name) == wanted and info.isfile():
                extracted = tar.extractfile(info)
                if extracted is not None:
                    return extracted.read()
    raise NotFoundError(f"the model definition has no file {path!r}", field="path")
