"""The helper's operations: each takes a request (a JSON object) and returns its answer, with the rights of the
account the helper runs as, on paths beneath its roots only."""

from __future__ import annotations

import base64
import errno
import os
import pwd
import re
import stat
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import userfiles
from userhelper import rmtree

MAX_READ_BYTES = 16 << 20
"""A log read's most (the master asks for 1 MiB at a time)."""
SLURM_TIMEOUT_S = 60.0
MAX_SCRIPT_BYTES = 4 << 20
USER_TEMPLATE = "{unix_user}"
SLURM_PATH = "/usr/local/bin:/usr/bin:/bin"
_JOB_ID = re.compile(r"\d{1,12}(_\d{1,9})?")
_SCANCEL_FLAG = re.compile(r"--signal=[A-Z0-9]{1,10}|--full|--batch|--quiet")
_NICE = re.compile(r"Nice=\d{1,9}")
_JOB_ID_ARG = re.compile(r"JobId=\d{1,12}")


class RefusedError(Exception):
    """A request the helper never carries out (outside its roots, a command not on its list)."""


class Account(NamedTuple):
    name: str
    uid: int
    gid: int
    home: str

    @classmethod
    def current(cls) -> Account:
        pw = pwd.getpwuid(os.getuid())
        return cls(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir)


class Helper:
    """The operations of one helper process: `roots` are its command line's (``{unix_user}`` filled in)."""

    def __init__(self, roots: Sequence[str], account: Account | None = None) -> None:
        self.account = account or Account.current()
        if self.account.uid == 0:
            raise RefusedError("the helper never runs as root")
        self.roots = tuple(os.path.normpath(r.replace(USER_TEMPLATE, self.account.name)) for r in roots)
        self.users_own = frozenset(  # roots that name the user: the user's directory itself
            os.path.normpath(r.replace(USER_TEMPLATE, self.account.name)) for r in roots if USER_TEMPLATE in r
        )
        if not all(os.path.isabs(r) for r in self.roots):
            raise RefusedError("the helper's --root directories must be absolute")
        self.ops: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "ping": self.ping,
            "user_dir": self.user_dir,
            "make_dirs": self.make_dirs,
            "write": self.write,
            "write_files": self.write_files,
            "exists": self.exists,
            "read": self.read,
            "read_json": self.read_json,
            "rmtree": self.rmtree,
            "slurm": self.slurm,
        }

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = self.ops.get(str(request.get("op")))
        if op is None:
            raise RefusedError(
                f"unknown operation {request.get('op')!r} (known: {', '.join(sorted(self.ops))})"
            )
        return op(request)

    # ---- paths -------------------------------------------------------------------------------------------
    def _anchor(self, request: dict[str, Any]) -> str:
        """The request's trusted directory: one of the roots or beneath one (lexically: no ``..``)."""
        anchor = _text(request, "anchor")
        for root in self.roots:
            if anchor == root:
                return anchor
            try:
                userfiles.relative_parts(root, anchor)
                return anchor
            except userfiles.UnsafePathError:
                continue
        raise RefusedError(f"{anchor} is not beneath the helper's roots ({', '.join(self.roots)})")

    def _parts(self, request: dict[str, Any], key: str = "path") -> tuple[str, tuple[str, ...]]:
        anchor = self._anchor(request)
        return anchor, userfiles.relative_parts(anchor, _text(request, key))

    # ---- operations --------------------------------------------------------------------------------------
    def ping(self, _request: dict[str, Any]) -> dict[str, Any]:
        return {"user": self.account.name, "uid": self.account.uid, "roots": list(self.roots)}

    def user_dir(self, request: dict[str, Any]) -> dict[str, Any]:
        """``<root>/<user>`` made (0750) or checked: a real directory, the user's, no one else may write it.
        A root that names the user already (``{unix_user}``) is the user's directory itself."""
        root = self._anchor({"anchor": _text(request, "root")})
        if root not in self.roots:
            raise RefusedError(f"{root} is not one of the helper's roots")
        path = root if root in self.users_own else os.path.join(root, self.account.name)
        if path == root:
            os.makedirs(path, mode=0o750, exist_ok=True)  # /scratch/{unix_user}/hpc-det: the user's own tree
        else:
            try:
                os.mkdir(path, 0o750)
            except FileExistsError:
                pass
            except (
                PermissionError
            ):  # a root-squashed or admin-kept root: its directories are made by an admin
                raise RefusedError(
                    f"{path} does not exist and {self.account.name} may not make it in {root}: an admin makes "
                    f"it once (install -d -o {self.account.name} -m 0700 {path})"
                ) from None
        st = os.lstat(path)
        problem = None
        if not stat.S_ISDIR(st.st_mode):
            problem = "is not a directory (a link, or a file)"
        elif st.st_uid != self.account.uid:
            problem = f"is owned by uid {st.st_uid}, not by {self.account.name} (uid {self.account.uid})"
        elif st.st_mode & 0o022:
            problem = f"may be written by others (mode {stat.S_IMODE(st.st_mode):o}; 0700 or 0750 expected)"
        if problem:
            raise RefusedError(f"{path} {problem}: an admin must remove or fix it")
        return {"path": path}

    def make_dirs(self, request: dict[str, Any]) -> dict[str, Any]:
        anchor, parts = self._parts(request)
        userfiles.make_dirs(anchor, parts, mode=_mode(request, 0o750), uid=self.account.uid)  # none another's
        return {}

    def write(self, request: dict[str, Any]) -> dict[str, Any]:
        anchor, parts = self._parts(request)
        data = base64.b64decode(_text(request, "data"), validate=True)
        userfiles.write_file(anchor, parts, data, mode=_mode(request, 0o640))
        return {}

    def write_files(self, request: dict[str, Any]) -> dict[str, Any]:
        """``files`` (name → [text, mode]) in the directory ``path`` (made first, 0750)."""
        anchor, parts = self._parts(request)
        files = request.get("files")
        if not isinstance(files, dict):
            raise ValueError("files: an object of name → [text, mode]")
        userfiles.make_dirs(anchor, parts, mode=0o750, uid=self.account.uid)  # refused where another's
        for name, spec in files.items():
            if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[0], str)):
                raise ValueError(f"files.{name}: [text, mode]")
            userfiles.write_file(
                anchor, (*parts, name), spec[0].encode(), mode=_mode({"mode": spec[1]}, 0o640)
            )
        return {}

    def exists(self, request: dict[str, Any]) -> dict[str, Any]:
        anchor, parts = self._parts(request)
        return {"exists": userfiles.exists(anchor, parts)}

    def read(self, request: dict[str, Any]) -> dict[str, Any]:
        anchor, parts = self._parts(request)
        offset, most = _int(request, "offset", 0), _int(request, "max_bytes", 1 << 20)
        if offset < 0 or not 0 <= most <= MAX_READ_BYTES:
            raise ValueError(f"offset >= 0 and 0 <= max_bytes <= {MAX_READ_BYTES}")
        data, st = userfiles.read_bytes(anchor, parts, offset=offset, max_bytes=most)
        return {"data": base64.b64encode(data).decode(), "size": st.st_size, "mtime": st.st_mtime}

    def read_json(self, request: dict[str, Any]) -> dict[str, Any]:
        anchor, parts = self._parts(request)
        return {"value": userfiles.read_json(anchor, parts)}

    def rmtree(self, request: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint directory (an absolute path whose name is a checkpoint uuid), without following a
        link. Anywhere, not only beneath the roots: an experiment may name its own storage path, and this
        removes nothing but a directory named as a checkpoint, with the user's rights."""
        return {"removal": rmtree.remove_dir(_text(request, "path"))}

    def slurm(self, request: dict[str, Any]) -> dict[str, Any]:
        """sbatch (the script on stdin), scancel or ``scontrol update JobId=N Nice=M``, exactly so."""
        argv = request.get("argv")
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise ValueError("argv: a list of strings")
        stdin = request.get("stdin")
        check_slurm_argv(argv, stdin)
        import subprocess  # only here: a helper that only writes files starts faster without it

        env = {"PATH": SLURM_PATH, "LANG": "C.UTF-8", "HOME": self.account.home, "USER": self.account.name,
               "LOGNAME": self.account.name}  # fmt: skip
        if os.environ.get("SLURM_CONF"):  # what the admin's sudoers (env_keep) or the root master passed on
            env["SLURM_CONF"] = os.environ["SLURM_CONF"]
        try:
            proc = subprocess.run(
                argv, input=stdin if isinstance(stdin, str) else None, capture_output=True, text=True,
                timeout=min(float(request.get("timeout_s") or SLURM_TIMEOUT_S), SLURM_TIMEOUT_S),
                env=env, cwd="/", check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"returncode": 124, "stdout": "", "stderr": f"Socket timed out: {argv[0]} ran too long"}
        except FileNotFoundError:
            return {"returncode": 127, "stdout": "", "stderr": f"{argv[0]}: command not found"}
        return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


def check_slurm_argv(argv: list[str], stdin: object) -> None:
    """The command lines the master needs, and nothing else; RefusedError otherwise."""
    name, args = argv[0], argv[1:]
    if name == "sbatch" and args == ["--parsable"]:
        if not isinstance(stdin, str) or len(stdin) > MAX_SCRIPT_BYTES:
            raise RefusedError("sbatch takes its script on stdin (at most 4 MiB)")
        return
    if _is_scancel(name, args) or _is_nice_update(name, args):
        return
    raise RefusedError(f"not a command the helper runs: {' '.join(argv)[:200]}")


def _is_scancel(name: str, args: list[str]) -> bool:
    """``scancel [FLAG...] JOB_ID``, each flag one of ``_SCANCEL_FLAG``."""
    if name != "scancel" or not args or not _JOB_ID.fullmatch(args[-1]):
        return False
    return all(_SCANCEL_FLAG.fullmatch(a) for a in args[:-1])


def _is_nice_update(name: str, args: list[str]) -> bool:
    """``scontrol update JobId=N Nice=M``."""
    if name != "scontrol" or len(args) != 3 or args[0] != "update":
        return False
    return bool(_JOB_ID_ARG.fullmatch(args[1]) and _NICE.fullmatch(args[2]))


def _text(request: dict[str, Any], key: str) -> str:
    value = request.get(key)
    if not isinstance(value, str) or not value or "\0" in value:
        raise ValueError(f"{key}: a non-empty string")
    return value


def _int(request: dict[str, Any], key: str, default: int) -> int:
    value = request.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key}: an integer")
    return value


def _mode(request: dict[str, Any], default: int) -> int:
    """A file or directory mode: permission bits only, never writable by others."""
    mode = _int(request, "mode", default)
    if mode & ~0o777 or mode & 0o002:
        raise ValueError(f"mode {mode:o}: permission bits only, not writable by others")
    return mode


def error_kind(exc: BaseException) -> str:
    """The answer's ``kind`` for an error, which the master turns back into the same exception class."""
    if isinstance(exc, userfiles.NotRegularError):
        return "not_regular"
    if isinstance(exc, userfiles.UnsafePathError):
        return "unsafe"
    if isinstance(exc, userfiles.FileTooLargeError):
        return "too_large"
    if isinstance(exc, FileNotFoundError):
        return "not_found"
    if isinstance(exc, PermissionError):
        return "permission"
    if isinstance(exc, RefusedError):
        return "refused"
    if isinstance(exc, OSError):
        return "os"
    return "bad_request"


def errno_of(exc: BaseException) -> int:
    return exc.errno if isinstance(exc, OSError) and exc.errno else errno.EINVAL
