"""The SIF cache: one pull for concurrent trials (flock), temporary name + atomic rename, nothing left behind by a
failed pull, and errors that name the image. The runtime is faked: a script that behaves like `apptainer pull`."""

from __future__ import annotations

import multiprocessing
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from containers.images import (
    ImageError,
    ImagePullError,
    file_lock,
    parse_image,
    pull_into_cache,
    resolve_image,
    runtime_puller,
)
from containers.runtime import ContainerRuntime

URI = "docker://registry.example/team/trainer:1.0"


def _slow_pull(log: str, delay_s: float = 0.3):  # type: ignore[no-untyped-def]
    def pull(uri: str, dest: str) -> None:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {uri}\n")
        with open(dest, "wb") as f:  # written in pieces, like a real pull
            f.write(b"SIF-")
            f.flush()
            time.sleep(delay_s)
            f.write(b"done")

    return pull


def _worker(cache: str, log: str, out: str) -> None:
    path = pull_into_cache(parse_image(URI), cache, _slow_pull(log))
    with open(path, "rb") as f:
        data = f.read()
    with open(out, "a") as f:
        f.write(f"{path} {data.decode()}\n")


def test_concurrent_trials_pull_once(tmp_path: Path) -> None:
    cache, log, out = str(tmp_path / "cache"), str(tmp_path / "pulls.log"), str(tmp_path / "out")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_worker, args=(cache, log, out)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert len(Path(log).read_text().splitlines()) == 1  # one pull for six trials
    rows = Path(out).read_text().splitlines()
    assert (
        len(rows) == 6 and len(set(rows)) == 1 and rows[0].endswith(" SIF-done")
    )  # nobody saw half an image
    assert sorted(os.listdir(cache)) == [parse_image(URI).cache_name()]  # no lock file, no temporary file
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o1777


def test_readers_never_see_a_partial_image(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    target = cache / parse_image(URI).cache_name()
    seen: list[bytes] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if target.exists():
                seen.append(target.read_bytes())
            time.sleep(0.01)

    t = threading.Thread(target=watch)
    t.start()
    try:
        pull_into_cache(parse_image(URI), str(cache), _slow_pull(str(tmp_path / "log")))
    finally:
        done.set()
        t.join()
    assert all(s == b"SIF-done" for s in seen)


def test_cached_image_is_not_pulled_again_unless_forced(tmp_path: Path) -> None:
    cache, log = str(tmp_path / "cache"), str(tmp_path / "log")
    first = pull_into_cache(parse_image(URI), cache, _slow_pull(log, 0))
    assert pull_into_cache(parse_image(URI), cache, _slow_pull(log, 0)) == first
    assert len(Path(log).read_text().splitlines()) == 1
    pull_into_cache(parse_image(URI), cache, _slow_pull(log, 0), force=True)
    assert len(Path(log).read_text().splitlines()) == 2


def test_failed_pull_leaves_nothing_behind_and_names_the_image(tmp_path: Path) -> None:
    cache = tmp_path / "cache"

    def failing(uri: str, dest: str) -> None:
        Path(dest).write_bytes(b"half an ima")
        raise ImagePullError(uri, "connection refused")

    with pytest.raises(ImagePullError, match=rf"container image '{URI}': connection refused") as e:
        resolve_image(URI, str(cache), failing)
    assert e.value.image == URI
    assert os.listdir(cache) == []

    def interrupted(uri: str, dest: str) -> None:
        os.makedirs(dest)  # a sandbox-style half pull
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        resolve_image(URI, str(cache), interrupted)
    assert os.listdir(cache) == []


FAKE_APPTAINER = """#!/bin/sh
# pull --force DEST URI: writes part of DEST, then fails the way a registry that cannot be reached does
[ "$1" = pull ] || exit 2
printf 'partial' > "$3"
echo "$APPTAINER_CACHEDIR" > "$(dirname "$3")/../cachedir-used"
echo "FATAL:   While making image from oci registry: failed to get checksum for $4: no such host" >&2
exit 255
"""


def test_runtime_puller_failure_reports_the_runtime_and_cleans_up(tmp_path: Path) -> None:
    program = tmp_path / "bin" / "apptainer"
    program.parent.mkdir()
    program.write_text(FAKE_APPTAINER)
    program.chmod(0o755)
    cache = tmp_path / "cache"
    puller = runtime_puller(ContainerRuntime("apptainer", str(program)), env={"PATH": "/usr/bin:/bin"})
    with pytest.raises(ImagePullError) as e:
        resolve_image(URI, str(cache), puller)
    message = str(e.value)
    assert message.startswith(f"container image '{URI}': the pull failed (")
    assert "exit 255" in message and "no such host" in message
    assert os.listdir(cache) == []  # no partial image, no lock file, no layer cache
    assert (tmp_path / "cachedir-used").read_text().strip().startswith(str(cache))


def test_runtime_missing_is_a_pull_error(tmp_path: Path) -> None:
    puller = runtime_puller(ContainerRuntime("singularity", str(tmp_path / "nope")), env={})
    with pytest.raises(ImagePullError, match="is not installed"):
        resolve_image(URI, str(tmp_path / "c"), puller)


def test_local_images_must_exist(tmp_path: Path) -> None:
    sif = tmp_path / "x.sif"
    with pytest.raises(ImageError, match=rf"'{sif}': no such image file"):
        resolve_image(str(sif), None, _slow_pull(str(tmp_path / "log")))
    sif.write_bytes(b"SIF")
    assert resolve_image(str(sif), None, _slow_pull(str(tmp_path / "log"))) == str(sif)
    assert resolve_image(f"{tmp_path}/", None, _slow_pull(str(tmp_path / "log"))) == str(tmp_path)
    with pytest.raises(ImageError, match="no image cache directory"):
        resolve_image(URI, None, _slow_pull(str(tmp_path / "log")))


def test_file_lock_excludes_and_survives_removal(tmp_path: Path) -> None:
    lock = str(tmp_path / "x.lock")
    order: list[str] = []
    with file_lock(lock):
        t = threading.Thread(target=lambda: _locked(lock, order))
        t.start()
        time.sleep(0.3)
        order.append("first done")
    t.join(5)
    assert order == ["first done", "second"]
    assert not os.path.exists(lock)
    with file_lock(lock), pytest.raises(TimeoutError):  # noqa: SIM117
        with file_lock(lock, timeout_s=0.2):
            pass


def _locked(lock: str, order: list[str]) -> None:
    with file_lock(lock, poll_s=0.02):
        order.append("second")
