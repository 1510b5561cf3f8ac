"""The cluster page in real Chromium: partitions and nodes with their GPUs (a scripted Slurm answering what
the local cluster answered, tests/unit/captured/scontrol_cluster.txt) and the queued trial runs with Slurm's
pending reason and since when. The same page against the real cluster: tests/e2e/test_webui_cluster.py."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from hpc_master.db.engine import transaction
from hpc_master.db.models import TrialRunModel
from tests.webui.conftest import UiMaster
from tests.webui.test_browser import sessions_of, shot

pytestmark = [pytest.mark.browser]


def test_cluster_page(ui_master: UiMaster, page_factory: Any) -> None:
    trial = ui_master.data["bob_trials"][0]
    with transaction(sessions_of(ui_master)) as s:
        run = s.query(TrialRunModel).filter_by(trial_id=trial).one()
        saved = (run.state, run.pending_reason, run.pending_since)
        run.state, run.pending_reason = "PENDING", "QOSMaxJobsPerUserLimit"
        run.pending_since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=3)
    try:
        ui = page_factory()
        p = ui.page
        ui.login("alice", "alice-pw")
        p.click("#top a[href='/cluster']")
        p.wait_for_selector("#nodes [data-node=node2]")
        assert "2 GPUs (a100): 1 used, 1 free" in p.inner_text("#nodes [data-node=node1]")
        assert "2 GPUs (a100): 0 used, 2 free" in p.inner_text("#nodes [data-node=node2]")
        assert p.locator("#nodes [data-node=node1] .slot.used").count() == 1
        batch = p.inner_text("#partitions tr[data-partition=batch]")
        assert "(default)" in batch and "node1, node2" in batch and "1 / 4" in batch
        assert "00:02:00" in p.inner_text("#partitions tr[data-partition=short]")
        queue = p.inner_text("#queue")
        assert f"#{trial}" in queue and "bobs-run" in queue and "QOSMaxJobsPerUserLimit" in queue
        assert "QOSMaxJobsPerUserLimit (limit)" in queue  # Slurm's reason, and its class
        assert "3m" in queue  # pending since 3 minutes
        assert "4 GPUs: 1 used, 3 free" in p.inner_text("#cluster-note")
        shot(p, "cluster")
        p.click(f"#queue a[href='/trials/{trial}']")
        p.wait_for_url(f"**/trials/{trial}")
        ui.assert_clean()
    finally:
        with transaction(sessions_of(ui_master)) as s:
            run = s.query(TrialRunModel).filter_by(trial_id=trial).one()
            run.state, run.pending_reason, run.pending_since = saved
