"""The tasks page in real Chromium: your commands, notebooks, TensorBoards and shells with their state and
Slurm job, an Open link only to a server that answers, Kill from the page, and nobody else's tasks. The tasks
running for real on the local cluster: tests/e2e/test_commands.py and test_notebooks.py."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from hpc_master.db.engine import transaction
from hpc_master.db.models import TaskModel
from tests.webui.conftest import UiMaster
from tests.webui.test_browser import sessions_of, shot

pytestmark = [pytest.mark.browser]


def test_tasks_page(ui_master: UiMaster, page_factory: Any) -> None:
    alice = ui_master.login("alice", "alice-pw")

    def launch(plural: str, config: dict[str, Any]) -> str:
        r = httpx.post(f"{ui_master.url}/api/v1/{plural}", headers=alice, json={"config": config})
        assert r.status_code == 200, r.text
        return str(next(iter(v for k, v in r.json().items() if k not in ("config", "warnings")))["id"])

    cmd = launch("commands", {"entrypoint": "python3 train.py --epochs 3", "resources": {"slots": 0}})
    nb = launch("notebooks", {})
    with transaction(sessions_of(ui_master)) as s:  # as the driver leaves them once Slurm runs them
        for task_id, node, address in ((cmd, "node1", None), (nb, "node2", "10.0.0.2:8888")):
            task = s.get(TaskModel, task_id)
            assert task is not None
            task.state, task.slurm_job_id, task.node_list, task.service_address = (
                "STATE_RUNNING",
                "41",
                node,
                address,
            )
    bob = ui_master.login("bob", "bob-pw")
    bobs = httpx.post(
        f"{ui_master.url}/api/v1/commands", headers=bob, json={"config": {"entrypoint": "true"}}
    )
    assert bobs.status_code == 200
    ui = page_factory()
    p = ui.page
    ui.login("alice", "alice-pw")
    p.click("#top a[href='/tasks']")
    p.wait_for_selector(f"#tasks tr[data-task='{nb}']")
    assert p.locator("#tasks tr[data-task]").count() == 2  # not bob's
    row = p.inner_text(f"#tasks tr[data-task='{cmd}']")
    assert "Command (python3 train.py --epochs 3)" in row and "RUNNING" in row and "node1" in row
    assert (
        p.locator(f"#tasks tr[data-task='{cmd}'] [data-open]").count() == 0
    )  # a command has nothing to open
    assert p.get_attribute(f"#tasks [data-open='{nb}']", "href") == f"/proxy/{nb}/"
    shot(p, "tasks")
    p.click(f"#tasks [data-kill='{cmd}']")
    p.wait_for_selector(f"#tasks tr[data-task='{cmd}'] .state.TERMINATING")
    state = httpx.get(f"{ui_master.url}/api/v1/commands/{cmd}", headers=alice).json()["command"]["state"]
    assert state == "STATE_TERMINATING"
    ui.assert_clean()
