"""SlurmCli with a fake runner: argv, retries with backoff, error mapping, submission as another user."""

from __future__ import annotations

import getpass
from collections.abc import Sequence

import pytest

from hpc_master.errors import ConfigError, SlurmError
from slurm_backend.cli import CommandResult, SlurmCli, SubmitRefusedError


class FakeRunner:
    def __init__(self, *results: CommandResult) -> None:
        self.results = list(results)
        self.calls: list[tuple[list[str], str | None, dict[str, str]]] = []

    def __call__(
        self, argv: Sequence[str], stdin: str | None, timeout_s: float, env: dict[str, str]
    ) -> CommandResult:
        self.calls.append((list(argv), stdin, env))
        return self.results.pop(0)


def make(*results: CommandResult) -> tuple[SlurmCli, FakeRunner, list[float]]:
    runner = FakeRunner(*results)
    sleeps: list[float] = []
    return SlurmCli(runner=runner, retries=3, backoff_s=1.0, sleep=sleeps.append), runner, sleeps


OK = CommandResult(0, "", "")
TIMEOUT = CommandResult(1, "", "slurm_load_jobs error: Socket timed out on send/recv operation")
DOWN = CommandResult(
    1, "", "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"
)


def test_submit_passes_the_script_on_stdin_and_parses_the_id() -> None:
    cli, runner, _ = make(CommandResult(0, "42\n", ""))
    assert cli.submit("#!/bin/bash\ntrue\n") == "42"
    argv, stdin, env = runner.calls[0]
    assert argv == ["sbatch", "--parsable"]
    assert stdin == "#!/bin/bash\ntrue\n"
    assert set(env) <= {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "SLURM_CONF"}


def test_submit_as_self_needs_no_runuser() -> None:
    cli, runner, _ = make(CommandResult(0, "42\n", ""))
    cli.submit("x", as_user=getpass.getuser())
    assert runner.calls[0][0] == ["sbatch", "--parsable"]


def test_submit_as_another_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 0)
    cli, runner, _ = make(CommandResult(0, "43;cluster\n", ""))
    assert cli.submit("x", as_user="alice") == "43"
    assert runner.calls[0][0] == ["runuser", "-u", "alice", "--", "sbatch", "--parsable"]


def test_submit_as_another_user_without_root_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    cli, _, _ = make()
    with pytest.raises(ConfigError, match="cannot submit jobs as 'someone-else'"):
        cli.submit("x", as_user="someone-else")


def test_submit_retries_when_the_controller_was_unreachable() -> None:
    cli, runner, sleeps = make(DOWN, DOWN, CommandResult(0, "7\n", ""))
    assert cli.submit("x") == "7"
    assert len(runner.calls) == 3 and sleeps == [
        1.0
    ]  # first failure outside the retry loop, then 1 s backoff


def test_submit_does_not_blindly_retry_an_ambiguous_timeout() -> None:
    cli, runner, _ = make(CommandResult(1, "", "sbatch: error: Socket timed out on send/recv operation"))
    with pytest.raises(SlurmError, match="Socket timed out") as e:
        cli.submit("x")
    assert len(runner.calls) == 1
    assert "Socket timed out" in e.value.stderr


def test_submit_error_carries_slurms_message() -> None:
    bad = CommandResult(
        1,
        "",
        "sbatch: error: invalid partition specified: nosuch\nsbatch: error: Batch job submission failed: Invalid partition name specified\n",
    )
    cli, runner, _ = make(bad)
    with pytest.raises(SubmitRefusedError) as e:
        cli.submit("x")
    assert e.value.message == "Slurm refused the job: Invalid partition name specified"
    assert "invalid partition specified: nosuch" in e.value.stderr
    assert len(runner.calls) == 1


def test_other_submit_errors_are_slurm_errors() -> None:
    cli, _, _ = make(CommandResult(1, "", "sbatch: error: Something unexpected\n"))
    with pytest.raises(SlurmError, match="Something unexpected") as e:
        cli.submit("x")
    assert e.value.command == ["sbatch", "--parsable"]


def test_transient_errors_back_off_exponentially_then_raise() -> None:
    cli, runner, sleeps = make(TIMEOUT, TIMEOUT, TIMEOUT, TIMEOUT)
    with pytest.raises(SlurmError, match="Socket timed out"):
        cli.squeue(["1"])
    assert len(runner.calls) == 4 and sleeps == [1.0, 2.0, 4.0]


def test_squeue_one_call_for_many_ids_and_unknown_single_id() -> None:
    cli, runner, _ = make(
        CommandResult(0, "3|RUNNING|None|node1|2026-11-22T18:01:19|NONE\n", ""),
        CommandResult(1, "", "slurm_load_jobs error: Invalid job id specified\n"),
    )
    assert set(cli.squeue(["3", "12", "4"])) == {"3"}
    assert runner.calls[0][0] == [
        "squeue",
        "-v",
        "--noheader",
        "--states=all",
        "--jobs=3,4,12",
        "--format=%A|%T|%r|%N|%S|%e",
    ]
    assert cli.squeue(["99999"]) == {}
    assert len(runner.calls) == 2


def test_sacct_without_accounting_is_none() -> None:
    cli, _, _ = make(CommandResult(1, "", "Slurm accounting storage is disabled\n"))
    assert cli.sacct(["1"]) is None


def test_signal_and_cancel_argv() -> None:
    cli, runner, _ = make(OK, OK, OK)
    cli.signal("5", "USR1")
    cli.signal("5", "TERM", batch_only=False)
    cli.cancel("5")
    assert [c[0] for c in runner.calls] == [
        ["scancel", "--signal=USR1", "--batch", "5"],
        ["scancel", "--signal=TERM", "--full", "5"],
        ["scancel", "5"],
    ]


def test_job_ids_are_validated() -> None:
    cli, _, _ = make()
    with pytest.raises(SlurmError, match="not a Slurm job id"):
        cli.cancel("5; rm -rf /")


def test_find_by_comment_reconciles_a_lost_submission() -> None:
    out = "5|hpc-det:exp=3,trial=7,run=2\n6|hpc-det:exp=3,trial=7,run=20\n7|(null)\n"
    cli, runner, _ = make(CommandResult(0, out, ""))
    assert cli.find_by_comment("hpc-det:exp=3,trial=7,run=2", user="alice") == ["5"]  # exact match only
    assert runner.calls[0][0] == ["squeue", "--noheader", "--states=all", "--format=%A|%k", "--user=alice"]
