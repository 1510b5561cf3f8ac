"""The web UI in real Chromium against a real master driving real Slurm jobs on the local cluster: the
researcher pauses from the page (the trial's job checkpoints and ends; the page shows PAUSED), activates
(it runs again, resumed from the checkpoint), and watches the trial's logs follow live; another non-admin
user cannot act on it from the UI."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import Master, fresh_pg_database, new_master, started
from tests.e2e.test_experiments import LONG, TERMINAL_OK
from tests.slurm.fixtures import Researcher, wait_for
from tests.webui.conftest import Page
from tests.webui.conftest import browser as browser  # the chromium fixture (one per module)

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.browser, pytest.mark.postgres]


@pytest.fixture(scope="module")
def shared_master(researcher: Researcher) -> Iterator[Master]:
    """This module's master runs on PostgreSQL, as a shared install does (the other e2e modules' on SQLite;
    the pages' queries are tested on both by tests/master and tests/webui)."""
    with fresh_pg_database() as url, started(new_master(researcher, url)) as m:
        yield m


def _trial(
    master: Master, headers: dict[str, str], exp: int, pred: Any, what: str, timeout_s: float = 120
) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        trials = master.trials(headers, exp)
        if trials and pred(trials[0]):
            return trials[0]
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}\n{master.diagnose(exp)}")


def test_pause_activate_and_live_logs_from_the_ui(
    master: Master, alice: dict[str, str], browser: Any
) -> None:
    admin = master.login("admin", "admin-pw")
    user = {"username": "bob", "admin": False, "active": True, "unixUsername": master.researcher.name}
    master.api("POST", "/users", admin, json={"user": user, "password": "bob-pw"})
    exp = master.create_experiment(alice, LONG)
    ui = Page(browser, master.browser_url)
    bob = Page(browser, master.browser_url)
    try:
        p = ui.page
        ui.login("alice", "alice-pw")
        p.wait_for_selector(f"#experiments tr[data-experiment='{exp}']")
        trial = _trial(master, alice, exp, lambda t: t["stepsCompleted"] >= 5, "5 steps")

        # Logs follow live: lines keep arriving while the job runs.
        p.goto(f"/trials/{trial['id']}/logs")
        p.wait_for_selector("#logs div")
        before = p.locator("#logs div").count()
        deadline = time.monotonic() + 10
        while p.locator("#logs div").count() <= before:
            assert time.monotonic() < deadline, "no new log line in 10 s"
            p.wait_for_timeout(200)

        # The experiment page draws the trial's curve, then pause from the page.
        p.goto(f"/experiments/{exp}?group=training&metric=x")
        p.wait_for_selector("#learning-curves[data-series='1']", timeout=30_000)
        p.click("button[data-action=pause]")
        # The master first (the click reached it), then the page (it followed): a failure says which.
        assert master.wait_state(alice, exp, {"STATE_PAUSED"}, 60) == "STATE_PAUSED"
        p.wait_for_selector("#exp-state:has-text('PAUSED')", timeout=30_000)
        paused = _trial(master, alice, exp, lambda t: t["state"] == "STATE_PAUSED", "the trial to pause")
        assert _trial(master, alice, exp, lambda t: t["latestCheckpointUuid"], "a checkpoint")
        wait_for(lambda: not master.jobs_of(exp), 30, "the paused trial's Slurm job to leave Slurm")

        # Another non-admin user sees it but cannot act on it.
        bob.login("bob", "bob-pw")
        bob.page.goto(f"/experiments/{exp}")
        bob.page.wait_for_selector("button[data-action=activate]")
        assert bob.page.locator("button[data-action=activate]").is_disabled()
        assert bob.page.locator("button[data-action=kill]").is_disabled()

        # Activate: it runs again, from the checkpoint, and completes.
        p.click("button[data-action=activate]")
        p.wait_for_selector("#exp-state:has-text('ACTIVE')", timeout=30_000)
        _trial(master, alice, exp, lambda t: t["stepsCompleted"] > paused["stepsCompleted"], "progress")
        assert master.wait_state(alice, exp, TERMINAL_OK, 180) == "STATE_COMPLETED", master.diagnose(exp)
        p.wait_for_selector("#exp-state:has-text('COMPLETED')", timeout=30_000)
        ui.assert_clean()
        bob.assert_clean()
    finally:
        ui.close()
        bob.close()


def test_cluster_page_lists_the_nodes_and_their_gpus(
    master: Master, alice: dict[str, str], browser: Any
) -> None:
    """The cluster page against the real controller: node1 and node2, 2 GPUs (a100) each, in batch."""
    ui = Page(browser, master.browser_url)
    try:
        p = ui.page
        ui.login("alice", "alice-pw")
        p.goto("/cluster")
        p.wait_for_selector("#nodes [data-node=node2]", timeout=10_000)
        for node in ("node1", "node2"):
            text = p.inner_text(f"#nodes [data-node={node}]")
            assert "2 GPUs (a100)" in text and "batch" in text, text
            assert p.locator(f"#nodes [data-node={node}] .slot").count() == 2
        assert "node1, node2" in p.inner_text("#partitions tr[data-partition=batch]")
        assert p.inner_text("#cluster-error") == ""
        ui.assert_clean()
    finally:
        ui.close()
