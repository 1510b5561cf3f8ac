"""Files in directories that users control, for a process that must not trust them (a master running as root).

Every path is a trusted *anchor* (a directory from the master's own configuration or records, opened as it is)
and the components below it, which a user may have replaced with anything: each is opened with ``O_NOFOLLOW``
relative to the one above it (``dir_fd``), so a link anywhere below the anchor is refused, not followed. A file
is read only when it is a regular file (a FIFO, socket or device is refused without blocking: it is opened
``O_NONBLOCK``), and at most a bounded number of bytes. Directories are created and chowned through the
descriptor that was opened (``fchown``), and files are written under a new name (``O_EXCL``) and renamed, so
nothing is ever written through a link.

A process running as root also refuses a file whose owner is not its directory's owner: a hard link to root's
or another account's file in a user's run directory (``fs.protected_hardlinks``, on by default, forbids making
one; this holds where an admin turned it off).

Standard library only: the per-user helper (privilege separation) runs it with ``python -I``.
"""

from userfiles.beneath import (
    FileTooLargeError,
    NotRegularError,
    UnsafePathError,
    exists,
    make_dirs,
    open_dir,
    read_bytes,
    read_json,
    relative_parts,
    write_file,
)

__all__ = [
    "FileTooLargeError",
    "NotRegularError",
    "UnsafePathError",
    "exists",
    "make_dirs",
    "open_dir",
    "read_bytes",
    "read_json",
    "relative_parts",
    "write_file",
]
