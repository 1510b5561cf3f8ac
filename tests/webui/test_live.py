"""Live pages in real Chromium: the experiment page, the trial page and the experiment list show a change
committed in the database without reloading, fetch a table again only when it changed (no timers: an idle
page makes no request), and still refresh when their change stream is cut. Latencies are printed (``-s``)
from the commit to the page showing the change; they are not asserted (a busy CI machine took 2.9 s once),
only bounded by a deadline that no page without the feature meets: the idle checks show no page polls."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import CheckpointModel, ExperimentModel, TrialModel, TrialRunModel
from hpc_master.services.metrics import MetricReport, ingest_metrics
from tests.webui.conftest import UiMaster
from tests.webui.seed import seed_experiment

pytestmark = [pytest.mark.browser]
DEADLINE_S = 15.0  # a change shows by then or never: the pages neither poll nor reload


def sessions_of(m: UiMaster) -> sessionmaker[Any]:
    return sessionmaker(m.engine, expire_on_commit=False)


class Requests:
    """The API requests a page makes, by path (query left out)."""

    def __init__(self, page: Any) -> None:
        self.paths: list[str] = []
        self.answered: list[tuple[str, int]] = []
        page.on("request", self._add)
        page.on("response", lambda r: self.answered.append((r.url.split("?")[0], r.status)))

    def _add(self, request: Any) -> None:
        path = request.url.split("?")[0]
        if "/api/v1/" in path:
            self.paths.append(path.split("/api/v1", 1)[1])

    def count(self, path: str) -> int:
        return self.paths.count(path)

    def idle(self, page: Any, seconds: float = 3.5) -> list[str]:
        """The API requests made in ``seconds`` of nothing changing (the old pages polled every 1.5-3 s)."""
        page.wait_for_timeout(500)  # the first message's fetches
        before = len(self.paths)
        page.wait_for_timeout(seconds * 1000)
        return self.paths[before:]


def shows_within(page: Any, selector: str, what: str, change: Any, limit_s: float = DEADLINE_S) -> float:
    """Commit ``change()``, then wait until ``selector`` contains ``what``; returns how long it took (s)."""
    change()
    started = time.monotonic()
    page.wait_for_function(
        "([sel, text]) => { const el = document.querySelector(sel); return !!el && el.textContent.toLowerCase().includes(text.toLowerCase()); }",
        arg=[selector, what],
        timeout=limit_s * 1000,
        polling="raf",
    )
    took = time.monotonic() - started
    print(f"live: {what!r} in {selector} after {took * 1000:.0f} ms")
    return took


def db(m: UiMaster, fn: Any) -> Any:
    def change() -> None:
        with transaction(sessions_of(m)) as s:
            fn(s)

    return change


def test_experiment_page_is_pushed(ui_master: UiMaster, page_factory: Any) -> None:
    """Trials, checkpoints and the header follow the database; idle, nothing is fetched again."""
    exp, trials = ui_master.data["asha"], ui_master.data["asha_trials"]
    ui = page_factory()
    p = ui.page
    ui.login("alice", "alice-pw")
    seen = Requests(p)
    p.goto(f"/experiments/{exp}/trials")
    p.wait_for_selector("#trials tbody tr")
    assert seen.idle(p) == []
    assert seen.count(f"/webui/experiments/{exp}/trials") >= 1

    target = trials[3]
    row = f"#trials tbody tr:has(a[href='/trials/{target}'])"
    shows_within(
        p,
        row,
        "ERROR",
        db(
            ui_master,
            lambda s: s.execute(update(TrialModel).where(TrialModel.id == target).values(state="ERROR")),
        ),
    )
    shows_within(p, "#exp-trial-counts", "error", lambda: None)  # the header's counts came with it

    def move_run(s: Any) -> None:  # as the lifecycle writes runs: through the ORM, which bumps the version
        s.query(TrialRunModel).filter_by(trial_id=target).one().node_list = "det-node7"

    shows_within(p, row, "det-node7", db(ui_master, move_run))
    shows_within(
        p,
        "#exp-state",
        "PAUSED",
        db(
            ui_master,
            lambda s: s.execute(
                update(ExperimentModel).where(ExperimentModel.id == exp).values(state="PAUSED")
            ),
        ),
    )

    p.click("a[data-tab=checkpoints]")
    p.wait_for_selector("#checkpoints tbody tr")
    uuid = "feedface-0000-4000-8000-000000000001"
    shows_within(
        p,
        "#checkpoints",
        uuid,
        db(
            ui_master,
            lambda s: s.add(CheckpointModel(uuid=uuid, trial_id=target, trial_run_id=1, steps_completed=7)),
        ),
    )
    ui.assert_clean()


def test_hyperparameters_tab_is_pushed(ui_master: UiMaster, page_factory: Any) -> None:
    """A trial's best validation changing redraws the plots (here: one trial loses its)."""
    exp, trials = ui_master.data["asha"], ui_master.data["asha_trials"]
    ui = page_factory()
    p = ui.page
    ui.login("alice", "alice-pw")
    p.goto(f"/experiments/{exp}/hyperparameters")
    p.wait_for_selector("#hp-note:has-text('trials')")
    before = int((p.text_content("#hp-note") or "").split()[0])
    with transaction(sessions_of(ui_master)) as s:
        kept = s.get(TrialModel, trials[0]).best_validation  # type: ignore[union-attr]
    shows_within(
        p,
        "#hp-note",
        f"{before - 1} trials",
        db(
            ui_master,
            lambda s: s.execute(
                update(TrialModel).where(TrialModel.id == trials[0]).values(best_validation=None)
            ),
        ),
    )
    shows_within(
        p,
        "#hp-note",
        f"{before} trials",
        db(
            ui_master,
            lambda s: s.execute(
                update(TrialModel).where(TrialModel.id == trials[0]).values(best_validation=kept)
            ),
        ),
    )
    ui.assert_clean()


def test_trial_page_is_pushed(ui_master: UiMaster, page_factory: Any) -> None:
    """New metrics reach the trial's charts, a new run and a state change its runs tab and header, a new
    checkpoint its checkpoints tab."""
    trial = ui_master.data["single_trials"][0]
    ui = page_factory()
    p = ui.page
    ui.login("alice", "alice-pw")
    seen = Requests(p)
    p.goto(f"/trials/{trial}")
    p.wait_for_selector("#trial-charts canvas")

    def report(s: Any) -> None:  # a validation at a step already trained to: only a metric row is new
        ingest_metrics(s, trial, [MetricReport(1, 205, "validation", {"avgMetrics": {"fresh_metric": 0.5}})])

    shows_within(p, "#trial-charts", "fresh_metric", db(ui_master, report))
    p.click("a[data-tab=runs]")
    p.wait_for_selector("#runs tbody tr")
    assert seen.idle(p) == []
    assert seen.count(f"/webui/trials/{trial}/changes") >= 1
    shows_within(
        p,
        "#runs",
        "424242",
        db(
            ui_master,
            lambda s: s.add(
                TrialRunModel(trial_id=trial, run_number=2, slurm_job_id="424242", state="PENDING")
            ),
        ),
    )
    shows_within(
        p,
        "#trial-state",
        "PAUSED",
        db(
            ui_master,
            lambda s: s.execute(update(TrialModel).where(TrialModel.id == trial).values(state="PAUSED")),
        ),
    )
    p.click("a[data-tab=checkpoints]")
    p.wait_for_selector("#checkpoints")
    uuid = "feedface-0000-4000-8000-000000000002"
    shows_within(
        p,
        "#checkpoints",
        uuid,
        db(
            ui_master,
            lambda s: s.add(CheckpointModel(uuid=uuid, trial_id=trial, trial_run_id=2, steps_completed=9)),
        ),
    )
    ui.assert_clean()


def test_experiment_list_is_pushed(ui_master: UiMaster, page_factory: Any) -> None:
    """A state change and a new experiment reach the list; idle, it is not fetched again."""
    bob_exp = ui_master.data["bob"]
    ui = page_factory()
    p = ui.page
    seen = Requests(p)
    ui.login("alice", "alice-pw")
    p.wait_for_selector("#experiments tr[data-experiment]")
    assert seen.idle(p) == []
    assert seen.count("/webui/changes") >= 1
    shows_within(
        p,
        f"#experiments tr[data-experiment='{bob_exp}']",
        "ERROR",
        db(
            ui_master,
            lambda s: s.execute(
                update(ExperimentModel).where(ExperimentModel.id == bob_exp).values(state="ERROR")
            ),
        ),
    )

    def new_experiment(s: Any) -> None:
        from tests.webui.seed import seed_user

        seed_experiment(s, seed_user(s, "carol", "carol-pw"), name="carols-new-run", trials=1, points=5)

    shows_within(p, "#experiments", "carols-new-run", db(ui_master, new_experiment))
    ui.assert_clean()


def test_pages_still_refresh_when_the_stream_is_cut(ui_master: UiMaster, page_factory: Any) -> None:
    """With every change stream refused, the page falls back to refreshing on a timer (and keeps trying the
    stream, backing off); when the stream is let through again, it is used."""
    exp, trials = ui_master.data["asha"], ui_master.data["asha_trials"]
    ui = page_factory()
    p = ui.page
    ui.login("alice", "alice-pw")
    seen = Requests(p)
    p.route("**/changes", lambda route: route.abort())
    p.goto(f"/experiments/{exp}/trials")
    p.wait_for_selector("#trials tbody tr")
    target = trials[4]
    shows_within(
        p,
        f"#trials tbody tr:has(a[href='/trials/{target}'])",
        "CANCELED",
        db(
            ui_master,
            lambda s: s.execute(update(TrialModel).where(TrialModel.id == target).values(state="CANCELED")),
        ),
    )
    assert seen.count(f"/webui/experiments/{exp}/changes") >= 2  # it tried again
    p.unroute("**/changes")
    deadline = time.monotonic() + 20
    path = f"/api/v1/webui/experiments/{exp}/changes"
    while not any(u.endswith(path) and status == 200 for u, status in seen.answered):
        assert time.monotonic() < deadline, "the page did not reconnect"
        p.wait_for_timeout(100)
    assert seen.idle(p) == []  # live again: no more refreshing on a timer
    ui.assert_clean(allow=("ERR_FAILED",))


def _visibility(page: Any, state: str) -> None:
    page.evaluate(
        """(state) => {
            Object.defineProperty(document, "visibilityState", { configurable: true, get: () => state });
            document.dispatchEvent(new Event("visibilitychange"));
        }""",
        state,
    )


def test_a_hidden_tab_gives_its_stream_back(ui_master: UiMaster, page_factory: Any) -> None:
    """A browser has 6 connections per server for all its tabs: a hidden tab closes its change stream, and
    when shown again reopens it and fetches what changed meanwhile."""
    exp, trials = ui_master.data["single"], ui_master.data["single_trials"]
    ui = page_factory()
    p = ui.page
    ui.login("alice", "alice-pw")
    p.goto(f"/experiments/{exp}/trials")
    p.wait_for_selector("#trials tbody tr")
    key = ("experiment", exp)
    hubs = ui_master.app.state.live_hubs
    deadline = time.monotonic() + 5
    while key not in hubs:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    _visibility(p, "hidden")
    deadline = time.monotonic() + 3
    while key in hubs:  # its only listener left: the reader stopped
        assert time.monotonic() < deadline, (
            "the hidden page kept its stream",
            {k: h.listeners for k, h in hubs.items()},
        )
        time.sleep(0.05)
    with transaction(sessions_of(ui_master)) as s:
        s.execute(update(TrialModel).where(TrialModel.id == trials[0]).values(state="STOPPING_CANCELED"))
    p.wait_for_timeout(1500)
    assert "STOPPING" not in p.inner_text("#trials")  # hidden: nothing fetched
    shows_within(p, "#trials", "STOPPING CANCELED", lambda: _visibility(p, "visible"))
    ui.assert_clean()
