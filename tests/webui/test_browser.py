"""The web UI in real Chromium (Debian's package, driven by Playwright) against a real master (the app under
uvicorn) on SQLite and PostgreSQL, with experiments seeded in its database. What runs on the real Slurm
cluster (pause → the job checkpoints and ends) is in ``test_browser_cluster.py``.

``DET_WEBUI_SCREENSHOTS=DIR`` saves a screenshot of each page there (``docs/`` holds the committed ones).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, update
from sqlalchemy.orm import sessionmaker

from hpc_master.db.engine import transaction
from hpc_master.db.models import ExperimentModel, LogFileModel, SessionModel, TrialRunModel
from hpc_master.services.metrics import MetricReport, ingest_metrics
from tests.webui.conftest import UiMaster

# storage: the researcher's pages on PostgreSQL too (the rest of the UI on SQLite only)
pytestmark = [pytest.mark.browser, pytest.mark.storage]
LIVE_S = 15.0  # new metrics, state changes and log lines show by then (a deadline, not a speed figure)
SHOTS = os.environ.get("DET_WEBUI_SCREENSHOTS")


def shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"webui-{name}.png"))


def sessions_of(m: UiMaster) -> sessionmaker[Any]:
    return sessionmaker(m.engine, expire_on_commit=False)


def test_researcher_pages(ui_master: UiMaster, page_factory: Any) -> None:
    """Log in; the list shows the experiments; the experiment page draws one curve per trial; every tab
    and the trial page render; no JavaScript error anywhere."""
    ui = page_factory()
    p = ui.page
    ui.login("alice", "alice-pw")
    p.wait_for_selector("#experiments tr[data-experiment]")
    assert p.locator("#experiments").inner_text().count("digits-") == 2
    assert "bobs-run" in p.locator("#experiments").inner_text()
    shot(p, "experiments")

    exp = ui_master.data["asha"]
    p.click(f"#experiments a[href='/experiments/{exp}']")
    p.wait_for_selector("#learning-curves canvas")
    p.wait_for_selector("#learning-curves[data-series='12']")
    assert "12 trials" in p.inner_text("#curves-note")
    shot(p, "learning-curves")

    p.click("a[data-tab=search]")
    p.wait_for_selector("#rungs .rung")
    text = p.inner_text("#rungs")
    assert text.count("paused · waiting for promotion") == 2 and "resumed" in text and "promoted" in text
    shot(p, "search")

    p.click("a[data-tab=trials]")
    p.wait_for_selector("#trials tbody tr")
    assert p.locator("#trials tbody tr").count() == 12
    assert "det-node1" in p.inner_text("#trials")
    p.click("#trials th:has-text('Best val.')")  # sorts
    shot(p, "trials")

    p.click("a[data-tab=hyperparameters]")
    p.wait_for_selector("#pcoords svg g.trial")
    assert p.locator("#pcoords svg g.trial").count() == 12
    p.wait_for_selector("#hp-scatter canvas")
    shot(p, "hyperparameters")

    p.click("a[data-tab=checkpoints]")
    p.wait_for_selector("#checkpoints tbody tr")
    assert "det checkpoint download" in p.inner_text("#checkpoints")
    p.click("a[data-tab=config]")
    assert "async_halving" in p.inner_text("#config")

    trial = ui_master.data["asha_trials"][0]
    p.goto(f"/trials/{trial}")
    p.wait_for_selector("#trial-charts canvas")
    assert p.locator("#trial-charts .chart").count() == 3  # accuracy, loss, validation_loss
    shot(p, "trial")
    p.click("a[data-tab=runs]")
    p.wait_for_selector("#runs tbody tr")
    assert "trial completed" in p.inner_text("#runs")  # the master's words for SEARCHER_DONE (the vocabulary)
    ui.assert_clean()


def test_the_search_tab_shows_rung_metrics_as_reported_best_first(
    ui_master: UiMaster, page_factory: Any
) -> None:
    """An ASHA search on validation_accuracy (larger is better): the rungs show each trial's accuracy as it
    reported it (not the searcher's signed value), the highest first."""
    ui = page_factory()
    p = ui.page
    ui.login("alice", "alice-pw")
    p.goto(f"/experiments/{ui_master.data['accuracy']}")
    p.click("a[data-tab=search]")
    p.wait_for_selector("#rungs .rung[data-rung='0'] tbody tr")
    cells = p.locator("#rungs .rung[data-rung='0'] tbody tr td.num").all_inner_texts()
    assert [float(c.replace("−", "-")) for c in cells] == [0.9694, 0.9611, 0.9, 0.8], cells
    assert "−" not in p.inner_text("#rungs") and "-0." not in p.inner_text("#rungs")
    shot(p, "search-rungs")
    ui.assert_clean()


def test_actions_live_state_and_permissions(ui_master: UiMaster, page_factory: Any) -> None:
    """Pause and activate from the UI (state shown live); another non-admin user's buttons are disabled and
    the API refuses them; logging out, and an expired session, return to the login page."""
    exp = ui_master.data["single"]
    ui = page_factory()
    p = ui.page
    ui.login("alice", "alice-pw")
    p.goto(f"/experiments/{exp}")
    p.wait_for_selector("#exp-state:has-text('ACTIVE')")
    p.click("button[data-action=pause]")
    p.wait_for_selector("#exp-state:has-text('PAUSED')", timeout=LIVE_S * 1000 + 1000)
    p.click("button[data-action=activate]")
    p.wait_for_selector("#exp-state:has-text('ACTIVE')", timeout=LIVE_S * 1000 + 1000)

    # A state change made elsewhere shows without reloading.
    with transaction(sessions_of(ui_master)) as s:
        s.execute(update(ExperimentModel).where(ExperimentModel.id == exp).values(state="PAUSED"))
    p.wait_for_selector("#exp-state:has-text('PAUSED')", timeout=LIVE_S * 1000 + 500)
    with transaction(sessions_of(ui_master)) as s:
        s.execute(update(ExperimentModel).where(ExperimentModel.id == exp).values(state="ACTIVE"))

    p.click("#logout")
    p.wait_for_url("**/login")

    bob = page_factory()
    bob.login("bob", "bob-pw")
    bob.page.goto(f"/experiments/{exp}")
    bob.page.wait_for_selector("button[data-action=pause]")
    for action in ("pause", "cancel", "kill", "archive"):
        assert bob.page.locator(f"button[data-action={action}]").is_disabled()
    status = bob.page.evaluate(
        """async (exp) => {
            const csrf = (await (await fetch("/api/v1/webui/session")).json()).csrfToken;
            const r = await fetch(`/api/v1/experiments/${exp}/kill`, {method: "POST", headers: {"X-CSRF-Token": csrf}});
            return r.status;
        }""",
        exp,
    )
    assert status == 403
    # No cookie of the master is within the script's reach.
    assert "det_" not in bob.page.evaluate("document.cookie")

    # An expired session: the next request sends the page to the login page, and back after logging in.
    with transaction(sessions_of(ui_master)) as s:
        s.execute(delete(SessionModel))
    bob.page.goto(f"/experiments/{exp}/trials")
    bob.page.wait_for_url("**/login?next=*")
    bob.page.fill("input[name=username]", "bob")
    bob.page.fill("input[name=password]", "bob-pw")
    bob.page.click("button[type=submit]")
    bob.page.wait_for_url(f"**/experiments/{exp}/trials")
    ui.assert_clean(allow=("status of 401",))  # the polls in flight when alice logged out
    bob.assert_clean(allow=("status of 403", "status of 401"))


def test_live_curves_and_logs(ui_master: UiMaster, page_factory: Any, tmp_path: Path) -> None:
    """New metrics reach the learning curves, and new log lines the trial's log view, without reloading."""
    exp, (trial,) = ui_master.data["single"], ui_master.data["single_trials"]
    log = ui_master.app.state.det.config.job_storage_dir() / f"live-{tmp_path.name}" / "output.log"
    log.parent.mkdir(parents=True)  # below the job storage root: the master reads logs from nowhere else
    log.write_text("[rank=0] starting\n[rank=1] starting\n")
    with transaction(sessions_of(ui_master)) as s:
        run = s.query(TrialRunModel).filter_by(trial_id=trial).one()
        s.add(LogFileModel(trial_run_id=run.id, path=str(log)))
    ui = page_factory()
    p = ui.page
    ui.login("alice", "alice-pw")
    p.goto(f"/experiments/{exp}?group=training&metric=loss")
    p.wait_for_selector("#learning-curves canvas")
    before = p.inner_text("#curves-note")
    with transaction(sessions_of(ui_master)) as s:
        ingest_metrics(s, trial, [MetricReport(1, 50_000, "training", {"avgMetrics": {"loss": 0.01}})])
    p.wait_for_function(
        "(before) => document.querySelector('#curves-note').innerText !== before",
        arg=before,
        timeout=LIVE_S * 1000 + 500,
    )

    p.goto(f"/trials/{trial}/logs")
    p.wait_for_selector("#logs div:has-text('starting')")
    with log.open("a") as f:
        f.write("[rank=1] step 100 loss 0.5\n")
    p.wait_for_selector("#logs div:has-text('step 100')", timeout=LIVE_S * 1000 + 500)
    p.select_option("select[aria-label=rank]", "0")
    assert "step 100" not in p.inner_text("#logs")
    p.select_option("select[aria-label=rank]", "")
    p.fill("input[aria-label='search logs']", "loss")
    assert p.locator("#logs div").count() == 1
    shot(p, "logs")
    ui.assert_clean()


def test_bad_links_get_a_clear_page(ui_master: UiMaster, page_factory: Any) -> None:
    ui = page_factory()
    p = ui.page
    ui.login("alice", "alice-pw")
    p.goto("/experiments/999999")
    p.wait_for_selector("h1:has-text('No experiment 999999')")
    p.goto("/trials/not-a-number")
    p.wait_for_selector("h1:has-text('No trial not-a-number')")
    p.goto("/experiments/1/nonsense-tab")
    p.wait_for_selector("h1:has-text('No tab nonsense-tab')")
    p.goto("/what/is/this")
    p.wait_for_selector("h1:has-text('Page not found')")
    assert "Traceback" not in p.content()
    ui.assert_clean(allow=("status of 404",))
