"""Remove a checkpoint directory without following links (the helper's ``rmtree``; a master that runs as its
only user calls `remove_dir` in-process).

The path must end in a canonical checkpoint uuid (the master builds it from the database's record: the
experiment's storage root and the checkpoint's uuid). A link in place of a checkpoint is removed itself, and
``shutil.rmtree`` removes directories through file descriptors, never descending into a link (it refuses a
directory swapped for a link while it works).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
from typing import Any

UUID_NAME = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
ERRORS_SHOWN = 3


def _describe(path: str, exc: BaseException) -> str:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return f"{path}: {reason}"


def remove_dir(path: str) -> dict[str, Any]:
    """Remove one checkpoint directory; ``touched`` says whether anything may have been removed."""
    out: dict[str, Any] = {"path": path, "ok": False, "error": None, "touched": False}
    if not os.path.isabs(path) or not UUID_NAME.fullmatch(os.path.basename(path)):
        out["error"] = f"{path}: not a checkpoint directory (an absolute path ending in a checkpoint uuid)"
        return out
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        out["ok"] = True  # already gone
        return out
    except OSError as exc:
        out["error"] = _describe(path, exc)
        return out
    if not stat.S_ISDIR(st.st_mode):  # a link (or a file) in place of a checkpoint: only it goes
        return _remove_entry(path, out)
    out["touched"] = True
    errors = _rmtree_errors(path)
    if errors:
        more = f" (and {len(errors) - ERRORS_SHOWN} more)" if len(errors) > ERRORS_SHOWN else ""
        out["error"] = "; ".join(errors[:ERRORS_SHOWN]) + more
        return out
    out["ok"] = True
    return out


def _remove_entry(path: str, out: dict[str, Any]) -> dict[str, Any]:
    """Unlink `path` itself (not a directory: never followed); `out` filled in as `remove_dir` answers."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        out["error"] = _describe(path, exc)
        return out
    out["ok"] = out["touched"] = True
    return out


def _rmtree_errors(path: str) -> list[str]:
    """``shutil.rmtree`` the directory `path`; what could not be removed (an entry gone already is no error)."""
    errors: list[str] = []

    def on_error(_func: Any, failed: str, exc_info: Any) -> None:
        exc = exc_info[1] if isinstance(exc_info, tuple) else exc_info
        if not isinstance(exc, FileNotFoundError):
            errors.append(_describe(failed, exc))

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=on_error)
    else:
        shutil.rmtree(path, onerror=on_error)
    return errors
