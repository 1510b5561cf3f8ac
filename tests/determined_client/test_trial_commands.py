"""Determined 0.38.1's own client, unmodified, on trials: ``det t logs`` (``-f``, ``--head``, ``--tail``,
``--rank-id``, ``--level``, ``--stdtype``, ``--json``; the timestamp filters refused with a message),
``det e logs``, ``det t kill``, ``det t download`` (what its client's own bugs leave of it), and in the SDK
``Trial.logs(follow=...)`` / ``iter_logs``, ``Trial.kill()``, ``Trial.iter_metrics(group)`` and the older
``stream_training_metrics`` / ``stream_validation_metrics``, ``client.iter_trials_metrics``.

Trials, their runs, metric reports and log files are seeded in the database as the lifecycle loop and the
harness would record them (the master here has no lifecycle loop); a log is the Slurm job's output file, as
``launchers/wrap_rank.py`` writes it (``[rank=N] `` before each line)."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from hpc_master.db.models import LogFileModel, MetricModel, TrialModel, TrialRunModel
from hpc_master.services import logs as log_svc
from tests.cli.conftest import Master
from tests.determined_client.conftest import DeterminedClient, OurApi
from tests.determined_client.test_checkpoints import create_experiment as create_ckpt_experiment
from tests.determined_client.test_checkpoints import create_user as create_ckpt_user
from tests.determined_client.test_checkpoints import files
from tests.determined_client.test_checkpoints import seed as seed_checkpoints

pytestmark = pytest.mark.determined_client

PASSWORD = "Secret123pw"
ENDED = "Trial log stream ended"  # the client's closing line, after the logs
FOLLOW_TIMEOUT_S = 30.0

STDOUT = """\
[rank=0] starting
[rank=1] starting
[rank=0] INFO:root:step 1 loss 0.5
[rank=0] WARNING:root:loss went up
[rank=1] 2024-05-01 10:00:00,123 ERROR out of memory on rank 1
[rank=0] done
"""
STDERR = "[rank=1] Traceback (most recent call last):\n"


def as_user(name: str) -> dict[str, str]:
    return {"DET_USER": name, "DET_PASS": PASSWORD}


def shown(out: str) -> list[str]:
    """The log lines `det t logs` printed (without the client's closing line)."""
    return [line for line in out.splitlines() if line and ENDED not in line]


@dataclass(frozen=True)
class Seeded:
    experiment_id: int
    trial_id: int
    run_id: int


def new_user_and_experiment(our_api: OurApi, prefix: str) -> tuple[str, int]:
    name = our_api.create_user(prefix, PASSWORD)
    return name, our_api.create_experiment(our_api.login(name, PASSWORD), f"{prefix}-{name}")


def seed_trial(
    master: Master,
    experiment_id: int,
    *,
    state: str = "COMPLETED",
    run_state: str = "COMPLETED",
    logs: dict[str, Path] | None = None,
    metrics: Sequence[tuple[str, int, dict[str, object]]] = (),
) -> Seeded:
    """A trial with one run (`run_state`), its output files by stream, and metric reports (group, steps,
    metrics as the harness posts them)."""
    with Session(create_engine(master.db_url)) as session, session.begin():
        trial = TrialModel(
            experiment_id=experiment_id, request_id=f"r{uuid.uuid4().hex[:6]}", hparams={"lr": 0.1},
            state=state, steps_completed=100,
        )  # fmt: skip
        session.add(trial)
        session.flush()
        run = TrialRunModel(trial_id=trial.id, run_number=1, state=run_state, slurm_job_id="7")
        session.add(run)
        session.flush()
        for stream, path in (logs or {}).items():
            session.add(LogFileModel(trial_run_id=run.id, path=str(path), stream=stream))
        for group, steps, reported in metrics:
            session.add(MetricModel(trial_id=trial.id, trial_run_id=1, group=group, steps_completed=steps,
                                    metrics=reported))  # fmt: skip
        return Seeded(experiment_id, int(trial.id), int(run.id))


def finish(master: Master, seeded: Seeded) -> None:
    """What the lifecycle loop records when the job ends."""
    with Session(create_engine(master.db_url)) as session, session.begin():
        session.get_one(TrialRunModel, seeded.run_id).state = "COMPLETED"
        session.get_one(TrialModel, seeded.trial_id).state = "COMPLETED"


def trial_row(master: Master, trial_id: int) -> tuple[str, list[bool]]:
    with Session(create_engine(master.db_url)) as session:
        trial = session.get_one(TrialModel, trial_id)
        runs = session.scalars(select(TrialRunModel).where(TrialRunModel.trial_id == trial_id))
        return trial.state, [bool(r.preempt_requested) for r in runs]


class Follower:
    """A client process whose output lines are read as they come."""

    def __init__(self, determined: DeterminedClient, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=determined.env(env),
            cwd=determined.home, start_new_session=True,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, text: str) -> None:
        deadline = time.monotonic() + FOLLOW_TIMEOUT_S
        while not any(text in line for line in self.seen):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (self.proc.poll() is not None and self.lines.empty()):
                self.stop()
                raise AssertionError(f"{text!r} not seen; got {self.seen}; stderr: {self._err()}")
            try:
                self.seen.append(self.lines.get(timeout=min(remaining, 1.0)))
            except queue.Empty:
                continue

    def finished(self) -> tuple[int, list[str]]:
        rc = self.proc.wait(timeout=FOLLOW_TIMEOUT_S)
        time.sleep(0.1)  # let the reader drain the pipe
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        assert rc == 0, self._err()
        return rc, self.seen

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def _err(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr and self.proc.poll() is not None else ""


# ------------------------------------------------------------------------------------------------ logs


def job_dir(master: Master) -> Path:
    """Where the master reads logs from: below its job storage root (a file elsewhere is never read)."""
    jobs = master.root / "jobs" / f"seeded-{uuid.uuid4().hex[:8]}"
    jobs.mkdir(parents=True)
    return jobs


def test_trial_logs_head_tail_filters_and_json(
    determined: DeterminedClient, our_api: OurApi, tmp_path: Path
) -> None:
    name, experiment_id = new_user_and_experiment(our_api, "tlogs")
    jobs = job_dir(our_api.master)
    (jobs / "slurm-7.out").write_text(STDOUT)
    (jobs / "slurm-7.err").write_text(STDERR)
    seeded = seed_trial(
        our_api.master, experiment_id, logs={"stdout": jobs / "slurm-7.out", "stderr": jobs / "slurm-7.err"},
    )  # fmt: skip
    who, tid = as_user(name), str(seeded.trial_id)
    everything = [*STDOUT.splitlines(), *STDERR.splitlines()]

    r = determined.det("t", "logs", tid, env=who)
    assert r.rc == 0, r.err
    assert shown(r.out) == everything and ENDED in r.out
    assert shown(determined.det("t", "logs", tid, "--head", "2", env=who).out) == everything[:2]
    assert shown(determined.det("t", "logs", tid, "--tail", "2", env=who).out) == everything[-2:]
    assert shown(determined.det("t", "logs", tid, "--rank-id", "1", env=who).out) == [
        line for line in everything if line.startswith("[rank=1]")
    ]
    assert shown(determined.det("t", "logs", tid, "--level", "WARNING", env=who).out) == [
        "[rank=0] WARNING:root:loss went up",
        "[rank=1] 2024-05-01 10:00:00,123 ERROR out of memory on rank 1",
    ]
    assert shown(determined.det("t", "logs", tid, "--stdtype", "stderr", env=who).out) == STDERR.splitlines()
    assert shown(determined.det("t", "logs", tid, "--source", "master", env=who).out) == []  # all are slurm's
    r = determined.det("t", "logs", tid, "--json", "--tail", "1", env=who)
    assert r.rc == 0, r.err
    entry, _ = json.JSONDecoder().raw_decode(r.out)
    assert entry["trialId"] == seeded.trial_id and entry["rankId"] == 1 and entry["stdtype"] == "stderr"
    assert entry["message"] == STDERR and entry["level"] == "LOG_LEVEL_INFO"
    assert entry["timestamp"].endswith("Z") and entry["source"] == "slurm"

    # `det e logs` reads its first trial's logs through the same route.
    r = determined.det("e", "logs", str(experiment_id), "--head", "1", env=who)
    assert (r.rc, shown(r.out)) == (0, everything[:1]), r.err

    # What the files do not record is refused, saying so (not an empty list, not a crash).
    r = determined.det("t", "logs", tid, "--timestamp-before", "2021-10-26T23:17:12Z", env=who)
    assert r.rc == 1 and "cannot filter trial logs by timestampBefore" in r.err, r.err
    assert "Traceback" not in r.err
    r = determined.det("t", "logs", tid, "--agent-id", "node1", env=who)
    assert r.rc == 1 and "which node wrote each line" in r.err, r.err
    r = determined.det("t", "set", "log-retention", tid, "--days", "3", env=who)
    assert r.rc == 1 and "is not implemented by this master" in r.err, r.err


def test_logs_follow_with_the_cli_and_the_sdk(
    determined: DeterminedClient, our_api: OurApi, tmp_path: Path
) -> None:
    """``det t logs -f`` and the SDK's ``Trial.logs(follow=True)`` print lines as the job writes them and
    return when the trial ends."""
    name, experiment_id = new_user_and_experiment(our_api, "tfollow")
    log = job_dir(our_api.master) / "slurm-8.out"
    log.write_text("[rank=0] first\n")
    seeded = seed_trial(
        our_api.master, experiment_id, state="ACTIVE", run_state="RUNNING", logs={"stdout": log}
    )
    who = as_user(name)
    sdk = f"""
import warnings
from determined.experimental import client
warnings.simplefilter("ignore")
client.login(master={determined.master.url!r}, user={name!r}, password={PASSWORD!r})
for line in client.get_trial({seeded.trial_id}).logs(follow=True):
    print("sdk:", line, end="", flush=True)
"""
    # Unbuffered: the client prints each line without flushing, which a terminal shows at once and a pipe
    # would hold until the end.
    det_follow = [str(determined.venv / "bin" / "det"), "t", "logs", "-f", str(seeded.trial_id)]
    cli = Follower(determined, det_follow, {**who, "PYTHONUNBUFFERED": "1"})
    py = Follower(determined, [str(determined.venv / "bin" / "python"), "-u", "-c", sdk], {})
    try:
        cli.wait_for("[rank=0] first")
        py.wait_for("sdk: [rank=0] first")
        with log.open("a") as f:
            f.write("[rank=0] second\n[rank=1] third\n")
        cli.wait_for("[rank=1] third")
        py.wait_for("sdk: [rank=1] third")
        assert cli.proc.poll() is None and py.proc.poll() is None  # still following
        finish(our_api.master, seeded)
        _, cli_seen = cli.finished()
        _, py_seen = py.finished()
    finally:
        cli.stop()
        py.stop()
    lines = ["[rank=0] first", "[rank=0] second", "[rank=1] third"]
    assert shown("\n".join(cli_seen)) == lines and ENDED in cli_seen[-1]
    assert py_seen == [f"sdk: {line}" for line in lines]


# ------------------------------------------------------------------------------------------------ kill


def test_kill_with_the_cli_and_the_sdk(determined: DeterminedClient, our_api: OurApi) -> None:
    name, experiment_id = new_user_and_experiment(our_api, "tkill")
    master = our_api.master
    running = seed_trial(master, experiment_id, state="ACTIVE", run_state="RUNNING")
    queued = seed_trial(master, experiment_id, state="ACTIVE", run_state="COMPLETED")  # no live job

    other = our_api.create_user("tkillother", PASSWORD)
    r = determined.det("t", "kill", str(running.trial_id), env=as_user(other))
    assert r.rc == 1 and "belongs to another user" in r.err, r.err
    assert trial_row(master, running.trial_id) == ("ACTIVE", [False])

    r = determined.det("t", "kill", str(running.trial_id), env=as_user(name))
    assert (r.rc, r.out.strip()) == (0, f"Killed trial {running.trial_id}"), r.err
    # The job is asked to stop (the lifecycle loop then cancels it in Slurm); the trial ends when it has.
    assert trial_row(master, running.trial_id) == ("STOPPING_KILLED", [True])
    described = json.loads(
        determined.det("t", "describe", str(running.trial_id), "--json", env=as_user(name)).out
    )
    assert described["trial"]["state"] == "STATE_STOPPING_KILLED"

    got = determined.sdk(f"""
import json
from determined.experimental import client
client.login(master={determined.master.url!r}, user={name!r}, password={PASSWORD!r})
trial = client.get_trial({queued.trial_id})
trial.kill()
trial.reload()
print(json.dumps([trial.state.value, hasattr(trial, "wait")]))
""")
    assert got == ["STATE_CANCELED", False]  # 0.38.1's Trial has no wait()


# ------------------------------------------------------------------------------------------------ metrics


def test_sdk_iter_metrics(determined: DeterminedClient, our_api: OurApi) -> None:
    name, experiment_id = new_user_and_experiment(our_api, "tmetrics")
    master = our_api.master
    first = seed_trial(master, experiment_id, metrics=[
        ("training", 50, {"loss": 0.5}),
        ("training", 100, {"avgMetrics": {"loss": 0.25}, "batchMetrics": [{"loss": 0.3}, {"loss": 0.2}]}),
        ("validation", 100, {"validation_loss": 0.4}),
        ("inference", 100, {"accuracy": 0.9}),
    ])  # fmt: skip
    many = 2001  # three pages of Determined's 1,000
    second = seed_trial(
        master,
        experiment_id,
        metrics=[("validation", s, {"validation_loss": 1.0 / s}) for s in range(1, many + 1)],
    )
    got = determined.sdk(f"""
import json, warnings
from determined.experimental import client
warnings.simplefilter("ignore")
client.login(master={determined.master.url!r}, user={name!r}, password={PASSWORD!r})
trial = client.get_trial({first.trial_id})
def rows(ms):
    return [[m.trial_id, m.trial_run_id, m.steps_completed, m.group, m.metrics, m.batch_metrics,
             m.end_time.tzinfo is not None] for m in ms]
out = {{g: rows(trial.iter_metrics(g)) for g in ("training", "validation", "inference", "nothing")}}
out["legacy_training"] = rows(trial.stream_training_metrics())
out["legacy_validation"] = rows(trial.stream_validation_metrics())
both = list(client.iter_trials_metrics([{second.trial_id}, {first.trial_id}], "validation"))
out["both"] = [[m.trial_id, m.steps_completed] for m in both]
print(json.dumps(out))
""")
    assert isinstance(got, dict)
    t = first.trial_id
    assert got["training"] == [
        [t, 1, 50, "training", {"loss": 0.5}, None, True],
        [t, 1, 100, "training", {"loss": 0.25}, [{"loss": 0.3}, {"loss": 0.2}], True],
    ]
    assert got["validation"] == [[t, 1, 100, "validation", {"validation_loss": 0.4}, None, True]]
    assert got["inference"] == [[t, 1, 100, "inference", {"accuracy": 0.9}, None, True]]
    assert got["nothing"] == []
    assert got["legacy_training"] == got["training"]
    assert got["legacy_validation"] == got["validation"]
    # Trial by trial in id order, each by steps: every one of the second trial's 2,001 reports once.
    assert got["both"] == [[t, 100], *[[second.trial_id, s] for s in range(1, many + 1)]]

    url = f"{master.url}/api/v1/trials/metrics/trial_metrics"
    with httpx.stream("GET", url, params={"trialIds": second.trial_id, "group": "validation"},
                      headers=our_api.admin) as r:  # fmt: skip
        pages = [json.loads(line)["result"]["metrics"] for line in r.iter_lines() if line]
    assert r.status_code == 200 and [len(p) for p in pages] == [1000, 1000, 1]  # an admin reads anyone's


def test_trial_routes_refuse_others_and_bad_input(
    determined: DeterminedClient, our_api: OurApi, tmp_path: Path
) -> None:
    _, experiment_id = new_user_and_experiment(our_api, "tauth")
    master = our_api.master
    log = job_dir(master) / "slurm-9.out"
    log.write_text("[rank=0] private\n")
    seeded = seed_trial(master, experiment_id, logs={"stdout": log}, metrics=[("training", 1, {"loss": 1.0})])
    other = our_api.create_user("tauthother", PASSWORD)
    tid = seeded.trial_id

    got = determined.sdk(f"""
import json
from determined.experimental import client
client.login(master={determined.master.url!r}, user={other!r}, password={PASSWORD!r})
trial = client.get_trial({tid})
out = []
for read in (lambda: list(trial.iter_metrics("training")), lambda: list(trial.iter_logs())):
    try:
        read()
        out.append("read")
    except Exception as exc:
        out.append(type(exc).__name__ + ": " + str(exc))
print(json.dumps(out))
""")
    assert isinstance(got, list) and len(got) == 2
    assert all(g.startswith("ForbiddenException") and "belongs to another user" in g for g in got), got
    r = determined.det("t", "logs", str(tid), env=as_user(other))
    assert r.rc == 1 and "belongs to another user" in r.err and "private" not in r.out

    base = f"{master.url}/api/v1/trials"
    routes = [
        f"{base}/metrics/trial_metrics?trialIds={tid}&group=training",
        f"{base}/metrics/training_metrics?trialIds={tid}",
        f"{base}/metrics/validation_metrics?trialIds={tid}",
        f"{base}/{tid}/logs?limit=1&orderBy=ORDER_BY_DESC",
    ]
    theirs = our_api.login(other, PASSWORD)
    for url in routes:
        assert httpx.get(url).status_code == 401, url
        refused = httpx.get(url, headers=theirs)
        assert refused.status_code == 403 and refused.json()["code"] == "permission_denied", url
        assert httpx.get(url, headers=our_api.admin).status_code == 200, url

    def error(url: str) -> tuple[int, str, str]:
        r = httpx.get(url, headers=our_api.admin)
        body = r.json()
        assert body["message"], url
        return r.status_code, body["code"], body["field"] or ""

    metrics = f"{base}/metrics/trial_metrics"
    assert error(f"{metrics}?group=training")[:2] == (400, "invalid_argument")  # no trialIds
    assert error(f"{metrics}?trialIds={tid}&trialIds={tid}&group=training")[:2] == (400, "invalid_argument")
    assert error(f"{metrics}?trialIds=0&group=training")[0] == 400
    assert error(f"{metrics}?trialIds={2**31}&group=training")[0] == 400
    assert error(f"{metrics}?trialIds={tid}&group={'g' * 65}")[0] == 400
    assert error(f"{metrics}?trialIds={tid}")[0] == 400  # no group
    assert error(f"{metrics}?trialIds=999999&group=training")[:2] == (404, "not_found")
    assert error(f"{base}/{tid}/logs?rankIds=-1")[0] == 400
    assert error(f"{base}/{tid}/logs?levels=LOG_LEVEL_LOUD")[0] == 400
    assert error(f"{base}/{tid}/logs?limit={2**31}")[0] == 400
    assert error(f"{base}/{tid}/logs?searchText={'x' * 1025}")[0] == 400
    assert error(f"{base}/{tid}/logs?enableRegex=true&searchText=a.*")[1:] == ("not_supported", "enableRegex")
    assert error(f"{base}/{tid}/logs?follow=true&orderBy=ORDER_BY_DESC")[0] == 400
    assert error(f"{base}/{tid}/logs?timestampAfter=2024-01-01T00:00:00Z")[1:] == (
        "not_supported", "timestampAfter",
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ download


def test_trial_download_as_the_0_38_1_client_does_it(
    determined: DeterminedClient, our_api: OurApi, tmp_path: Path
) -> None:
    """``det t download`` works only as far as Determined 0.38.1's client lets it: it lists the trial's
    checkpoints best (``--best``) or latest (``--latest``) first, then downloads the *last* of the list, and
    with a single checkpoint it finds none; ``--uuid`` fails the client's own argument check. These asserts
    pin that documented behaviour (``docs/determined-client.md``); ``det checkpoint download UUID`` works."""
    master = our_api.master
    name = create_ckpt_user(our_api, "tdl")
    who = as_user(name)
    experiment_id = create_ckpt_experiment(our_api, name)
    seeded = seed_checkpoints(master, experiment_id, master.checkpoint_root, [{50: 0.3, 100: 0.5}, {10: 0.1}])
    (c50, c100), _ = seeded.uuids
    two, one = (str(t) for t in seeded.trial_ids)

    r = determined.det("t", "download", two, "--latest", "-o", str(tmp_path / "latest"), "-q", env=who)
    assert (r.rc, r.out.strip()) == (0, str(tmp_path / "latest")), r.err
    assert files(tmp_path / "latest") == files(master.checkpoint_root / c50)  # the earliest, not c100

    r = determined.det("t", "download", two, "--best", "-o", str(tmp_path / "best"), "-q", env=who)
    assert r.rc == 0, r.err
    assert files(tmp_path / "best") == files(master.checkpoint_root / c100)  # the worst (0.5), not c50

    r = determined.det("t", "download", one, "--latest", "-o", str(tmp_path / "one"), env=who)
    assert r.rc == 1 and "No downloadable checkpoint found" in r.err

    r = determined.det("t", "download", two, "--uuid", c100, "-o", str(tmp_path / "uuid"), env=who)
    assert r.rc == 1 and "exactly one of --latest, --best, or --uuid must be set" in r.err

    r = determined.det("checkpoint", "download", c100, "-o", str(tmp_path / "direct"), "-q", env=who)
    assert r.rc == 0, r.err
    assert files(tmp_path / "direct") == files(master.checkpoint_root / c100)


def test_long_logs_are_read_in_pieces(tmp_path: Path) -> None:
    """The master reads a file a bounded piece at a time (``max_bytes``), each line exactly once; a line longer
    than a piece comes in pieces rather than never (no client needed)."""
    path = tmp_path / "slurm-1.out"
    path.write_text("[rank=0] one\n[rank=1] ERROR: two\n" + "x" * 25 + "\nlast")
    sources = [log_svc.LogSource(1, path, tmp_path)]
    cursor = log_svc.LogCursor(offsets={})
    got: list[str] = []
    while True:
        lines, more = log_svc.read_new_lines(7, sources, cursor, final=False, max_bytes=20)
        got += [str(line["log"]) for line in lines]
        if not more:
            break
    assert got == ["[rank=0] one", "[rank=1] ERROR: two", "x" * 20, "x" * 5]  # "last" is not complete yet
    lines, more = log_svc.read_new_lines(7, sources, cursor, final=True, max_bytes=20)
    assert ([line["log"] for line in lines], more) == (["last"], False)
    assert [line["id"] for line in lines] == [5]
    first = log_svc.read_new_lines(7, sources, log_svc.LogCursor(offsets={}), max_bytes=100)[0]
    assert [(e["rankId"], e["level"]) for e in first[:2]] == [(0, "LOG_LEVEL_INFO"), (1, "LOG_LEVEL_ERROR")]
