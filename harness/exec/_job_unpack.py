"""Unpack a trial's context archive (``.tar.gz``/``.tar``/``.zip`` written by the master) safely.

Refused, with a message naming the entry: absolute paths, ``..`` components, device files and FIFOs, links whose
target is absolute or resolves outside the directory, entries written through a link, hard links to anything but
an earlier regular file of the archive, duplicate entries, and more than ``max_bytes`` of content in all (counted
while writing, so a lying header does not help). Everything is written into a fresh temporary directory next to
the destination and renamed into place only when the whole archive passed: a refused archive leaves nothing.
Setuid/setgid/sticky bits are dropped. Standard library only.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Iterator

# Every job imports this module and few unpack: typing (3 ms; mypy reads this TYPE_CHECKING like typing's) and
# the archive modules are imported only by the type checker or when an archive is opened.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import tarfile
    import zipfile
    from typing import IO

DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB unpacked (the CLI refuses contexts over 95 MB before compression)
MAX_ENTRIES = 200_000
_CHUNK = 1 << 20


class UnsafeArchiveError(Exception):
    """The archive would write outside its directory, or is too large, or is not an archive."""


def _clean_name(name: str) -> str:
    """A member name as a safe relative POSIX path, or raise."""
    if "\0" in name:
        raise UnsafeArchiveError(f"entry {name!r} has a NUL byte in its name")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":") or name.startswith("\\"):
        raise UnsafeArchiveError(f"entry {name!r} has an absolute path")
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchiveError(f"entry {name!r} has a '..' component")
    return "/".join(parts)


class _Writer:
    """Creates entries under `root`, never following a link, counting bytes against the limit."""

    def __init__(self, root: str, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.written = 0
        self.entries = 0
        self.links: list[str] = []
        self.files: set[str] = set()

    def _path(self, rel: str, what: str) -> str:
        self.entries += 1
        if self.entries > MAX_ENTRIES:
            raise UnsafeArchiveError(f"more than {MAX_ENTRIES} entries")
        parts = rel.split("/")
        for i in range(1, len(parts)):
            prefix = os.path.join(self.root, *parts[:i])
            if os.path.islink(prefix):
                raise UnsafeArchiveError(f"{what} {rel!r} is inside the link {'/'.join(parts[:i])!r}")
            if not os.path.isdir(prefix):
                os.mkdir(prefix, 0o755)
        return os.path.join(self.root, *parts)

    def directory(self, rel: str, mode: int) -> None:
        if not rel:
            return
        path = self._path(rel, "directory")
        if os.path.islink(path):
            raise UnsafeArchiveError(f"directory {rel!r} is also a link")
        if not os.path.isdir(path):
            os.mkdir(path, 0o755)
        os.chmod(path, (mode & 0o777) | 0o700)

    def file(self, rel: str, src: IO[bytes], mode: int) -> None:
        if not rel:
            raise UnsafeArchiveError("a file entry has an empty name")
        path = self._path(rel, "file")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            raise UnsafeArchiveError(f"entry {rel!r} appears twice") from None
        with os.fdopen(fd, "wb") as out:
            while True:
                chunk = src.read(_CHUNK)
                if not chunk:
                    break
                self.written += len(chunk)
                if self.written > self.max_bytes:
                    raise UnsafeArchiveError(
                        f"the context unpacks to more than {self.max_bytes} bytes (at entry {rel!r})"
                    )
                out.write(chunk)
        os.chmod(path, (mode & 0o777) | 0o600)
        self.files.add(rel)

    def symlink(self, rel: str, target: str) -> None:
        if target.startswith("/") or "\0" in target:
            raise UnsafeArchiveError(f"link {rel!r} points to the absolute path {target!r}")
        lexical = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
        if lexical == ".." or lexical.startswith("../"):
            raise UnsafeArchiveError(f"link {rel!r} points outside the context ({target!r})")
        path = self._path(rel, "link")
        try:
            os.symlink(target, path)
        except FileExistsError:
            raise UnsafeArchiveError(f"entry {rel!r} appears twice") from None
        self.links.append(rel)

    def check_links(self) -> None:
        """Links are checked again once all exist: a chain of links can escape where each alone does not."""
        real_root = os.path.realpath(self.root)
        for rel in self.links:
            real = os.path.realpath(os.path.join(self.root, rel))
            if real != real_root and not real.startswith(real_root + os.sep):
                raise UnsafeArchiveError(f"link {rel!r} resolves outside the context")


def _tar_members(tar: tarfile.TarFile, w: _Writer) -> None:
    for member in tar:
        rel = _clean_name(member.name)
        if member.isdir():
            w.directory(rel, member.mode)
        elif member.isreg():
            src = tar.extractfile(member)
            assert src is not None
            w.file(rel, src, member.mode)
        elif member.issym():
            w.symlink(rel, member.linkname)
        elif member.islnk():
            _tar_hardlink(member, rel, w)
        else:
            raise UnsafeArchiveError(f"{_refused_kind(member)} {member.name!r} is not allowed in a context")


def _tar_hardlink(member: tarfile.TarInfo, rel: str, w: _Writer) -> None:
    """A hard link becomes a copy of its target, which must be an earlier regular file of the archive."""
    target = _clean_name(member.linkname)
    if target not in w.files:
        raise UnsafeArchiveError(f"hard link {rel!r} points to {member.linkname!r}, not an earlier file")
    with open(os.path.join(w.root, *target.split("/")), "rb") as src_file:
        w.file(rel, src_file, member.mode)


def _refused_kind(member: tarfile.TarInfo) -> str:
    """What a tar member that is no directory, file or link is, for the refusal's message."""
    return "device file" if member.ischr() or member.isblk() else "FIFO" if member.isfifo() else "entry"


def _zip_members(zf: zipfile.ZipFile, w: _Writer) -> None:
    for info in zf.infolist():
        rel = _clean_name(info.filename)
        mode = (info.external_attr >> 16) & 0xFFFF
        if info.is_dir():
            w.directory(rel, mode or 0o755)
        elif stat.S_ISLNK(mode):
            if info.file_size > 4096:
                raise UnsafeArchiveError(f"link {rel!r} has an implausible target")
            w.symlink(rel, zf.read(info).decode("utf-8", "surrogateescape"))
        elif stat.S_IFMT(mode) and not stat.S_ISREG(mode):
            raise UnsafeArchiveError(f"special file {info.filename!r} is not allowed in a context")
        else:
            with zf.open(info) as src:
                w.file(rel, src, mode or 0o644)


def _open_and_unpack(archive: str, w: _Writer) -> None:
    import tarfile

    with open(archive, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"  # the master's own .tar.gz: not a zip, skip importing zipfile
    if not gzipped:
        import zipfile

        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                _zip_members(zf, w)
            return
    try:
        with tarfile.open(archive, "r:*") as tar:
            _tar_members(tar, w)
    except tarfile.TarError as e:
        raise UnsafeArchiveError(f"{archive} is not a tar or zip archive: {e}") from None


def unpack_context(archive: str, dest: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> int:
    """Unpack `archive` into `dest` (which must not exist) and return the bytes written.

    On any refusal `dest` does not exist afterwards and UnsafeArchiveError says why.
    """
    if os.path.lexists(dest):
        raise FileExistsError(dest)
    parent = os.path.dirname(os.path.abspath(dest))
    tmp = os.path.join(parent, f".{os.path.basename(dest)}.unpacking-{os.getpid()}")
    import shutil  # with bz2 and lzma: only when a context is unpacked (tarfile imports it anyway)

    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp, 0o755)
    try:
        w = _Writer(tmp, max_bytes)
        _open_and_unpack(archive, w)
        w.check_links()
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return w.written


def fingerprint(archive: str) -> str:
    """Identifies one archive file (a new context is a new file): size and modification time, in ns."""
    st = os.stat(archive)
    return f"{st.st_size}:{st.st_mtime_ns}"


def iter_tree(root: str) -> Iterator[str]:
    """Relative paths under `root` (for tests and logs)."""
    for base, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            yield os.path.relpath(os.path.join(base, name), root)
