"""`det e describe` shows where each trial's hyperparameters came from when the search uses
``proposals: model`` (issue 40), and keeps Determined's table otherwise."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from hpc_master.cli import experiment


class FakeSession:
    def __init__(self, searcher: dict[str, Any], proposals: list[str | None]) -> None:
        self.searcher, self.proposals = searcher, proposals

    def call(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        if path.endswith("/trials"):
            trials = [
                {"id": i + 1, "state": "STATE_COMPLETED", "hparams": {"lr": 0.01}, "proposal": p}
                for i, p in enumerate(self.proposals)
            ]
            return {"trials": trials}
        return {
            "experiment": {
                "id": 3,
                "name": "x",
                "state": "STATE_COMPLETED",
                "config": {"searcher": self.searcher},
            }
        }


def describe(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], session: FakeSession
) -> str:
    monkeypatch.setattr(experiment, "session_from_args", lambda args: session)
    assert experiment._describe(argparse.Namespace(experiment_id=3, json=False)) == 0
    return capsys.readouterr().out


def test_describe_shows_each_trials_proposal_with_proposals_model(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    searcher = {"name": "adaptive_asha", "proposals": "model"}
    out = describe(monkeypatch, capsys, FakeSession(searcher, ["random", "model", "model"]))
    header = next(line for line in out.splitlines() if "Trial ID" in line)
    assert header.rstrip().endswith("Proposal")
    rows = [line for line in out.splitlines() if line.strip().startswith(("1 ", "2 ", "3 "))]
    assert [r.split()[-1] for r in rows] == ["random", "model", "model"]


def test_describe_keeps_determineds_table_without_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = describe(monkeypatch, capsys, FakeSession({"name": "adaptive_asha"}, ["random", "random"]))
    assert "Proposal" not in out
