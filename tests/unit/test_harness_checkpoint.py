from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
from fake_master import FakeMaster
from parallel import run_ranks

from harness._http import MasterSession
from harness.core import (
    CheckpointContext,
    DistributedContext,
    DummyCheckpointContext,
    DummyDistributedContext,
)

REPO = Path(__file__).resolve().parents[2]


def visible(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


def test_store_restore_roundtrip_and_registration(tmp_path: Path) -> None:
    master = FakeMaster()
    ctx = CheckpointContext(
        DummyDistributedContext(), tmp_path, MasterSession(master.url, master.token), 7, 1
    )
    with ctx.store_path({"steps_completed": 5, "note": "x"}) as (path, sid):
        (path / "sub").mkdir()
        (path / "sub" / "w.bin").write_bytes(b"abc")
    assert visible(tmp_path) == [sid]
    reg = master.checkpoints[sid]
    assert reg["trialId"] == 7 and reg["trialRunId"] == 1 and reg["state"] == "COMPLETED"
    assert reg["metadata"] == {"steps_completed": 5, "note": "x"}
    assert reg["resources"]["sub/w.bin"] == 3
    assert ctx.get_metadata(sid)["steps_completed"] == 5
    with ctx.restore_path(sid) as p:
        assert (p / "sub" / "w.bin").read_bytes() == b"abc"
    ctx.download(sid, tmp_path / "dl")
    assert (tmp_path / "dl" / "sub" / "w.bin").read_bytes() == b"abc"
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    (src / "b.txt").write_text("b")
    sid2 = ctx.upload(src, {"steps_completed": 6}, selector=lambda rel: rel != "b.txt")
    assert sorted(os.listdir(tmp_path / sid2)) == ["a.txt", "metadata.json"]
    ctx.delete(sid2)
    assert sid2 not in master.checkpoints and not (tmp_path / sid2).exists()


def test_steps_completed_required_on_cluster(tmp_path: Path) -> None:
    master = FakeMaster()
    ctx = CheckpointContext(
        DummyDistributedContext(), tmp_path, MasterSession(master.url, master.token), 7, 1
    )
    with pytest.raises(ValueError, match="steps_completed"), ctx.store_path({}):
        pass
    assert visible(tmp_path) == []


def test_exception_mid_write_leaves_nothing(tmp_path: Path) -> None:
    ctx = DummyCheckpointContext(DummyDistributedContext(), tmp_path)
    with pytest.raises(RuntimeError), ctx.store_path({"steps_completed": 1}) as (path, _):
        (path / "half").write_bytes(b"x")
        raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_crash_mid_write_leaves_no_visible_checkpoint(tmp_path: Path) -> None:
    code = (
        "import os, sys\nfrom harness.core import DummyCheckpointContext, DummyDistributedContext\n"
        f"ctx = DummyCheckpointContext(DummyDistributedContext(), {str(tmp_path)!r})\n"
        "with ctx.store_path({'steps_completed': 1}) as (path, sid):\n"
        "    (path / 'model.bin').write_bytes(b'x' * 1000)\n"
        "    os._exit(9)\n"
    )
    rc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)}).returncode
    assert rc == 9
    assert visible(tmp_path) == []


def test_sharded_every_rank_writes_chief_registers_union(tmp_path: Path) -> None:
    master = FakeMaster()
    session = MasterSession(master.url, master.token)

    def fn(d: DistributedContext) -> str:
        ctx = CheckpointContext(d, tmp_path, session, 7, 1)
        md = {"steps_completed": 3} if d.rank == 0 else {"rank_note": "same"}
        with ctx.store_path(md, shard=True) as (path, sid):
            (path / f"part-{d.rank}.bin").write_bytes(bytes([d.rank]))
        return sid

    sids = run_ranks(3, fn)
    assert len(set(sids)) == 1
    sid = sids[0]
    assert visible(tmp_path) == [sid]
    assert sorted(os.listdir(tmp_path / sid)) == ["metadata.json", "part-0.bin", "part-1.bin", "part-2.bin"]
    assert set(master.checkpoints[sid]["resources"]) >= {"part-0.bin", "part-1.bin", "part-2.bin"}
    assert master.checkpoints[sid]["metadata"] == {"steps_completed": 3, "rank_note": "same"}


def test_sharded_conflict_or_rank_failure_fails_everywhere(tmp_path: Path) -> None:
    def conflict(d: DistributedContext) -> str:
        ctx = DummyCheckpointContext(d, tmp_path)
        try:
            with ctx.store_path({"steps_completed": 1}, shard=True) as (path, _):
                (path / "same.bin").write_bytes(b"x")
        except RuntimeError as e:
            return str(e)
        return "ok"

    assert all("both wrote same.bin" in r for r in run_ranks(2, conflict))

    def one_fails(d: DistributedContext) -> str:
        ctx = DummyCheckpointContext(d, tmp_path)
        try:
            with ctx.store_path({"steps_completed": 1}, shard=True) as (path, _):
                (path / f"p{d.rank}").write_bytes(b"x")
                if d.rank == 1:
                    raise OSError("disk full")
        except (RuntimeError, OSError) as e:
            return type(e).__name__
        return "ok"

    assert run_ranks(2, one_fails) == ["RuntimeError", "OSError"]
    assert visible(tmp_path) == []


def test_non_chief_store_path_refused(tmp_path: Path) -> None:
    def fn(d: DistributedContext) -> str:
        ctx = DummyCheckpointContext(d, tmp_path)
        if d.rank == 0:
            with ctx.store_path({"steps_completed": 1}) as (p, _):
                (p / "f").write_text("x")
            return "ok"
        try:
            with ctx.store_path({}):
                pass
        except RuntimeError:
            return "refused"
        return "?"

    assert run_ranks(2, fn) == ["ok", "refused"]
