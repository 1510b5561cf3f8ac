"""A personal master's login link in real Chromium: the link det-master prints at start logs its owner in as
`determined` and leaves neither the key in the address bar nor a way in with a wrong key."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from hpc_master.db.engine import make_engine
from hpc_master.masterconf import MasterConfig, parse_master_config
from hpc_master.server import login_link
from tests.webui.conftest import Page, free_port, serve

pytestmark = [pytest.mark.browser]


@pytest.fixture(scope="module")
def personal_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterConfig]:
    """A master as `det-master --daemon` runs one for its owner: loopback, no passwords required."""
    from hpc_master.api.app import create_app

    tmp = tmp_path_factory.mktemp("personal")
    saved = {k: os.environ.get(k) for k in ("HOME", "DET_MASTER_DATA_DIR", "DET_MASTER_STATE_DIR")}
    os.environ.update(HOME=str(tmp / "home"), DET_MASTER_DATA_DIR=str(tmp / "data"),
                      DET_MASTER_STATE_DIR=str(tmp / "state"))  # fmt: skip
    port = free_port()
    url = f"sqlite:///{tmp / 'master.db'}"
    config = parse_master_config({"db": {"url": url}, "listen": {"host": "127.0.0.1", "port": port}}, env={})
    assert not config.passwords_required()
    engine = make_engine(url)
    server, thread = serve(create_app(config, engine=engine), port)
    try:
        yield config
    finally:
        server.should_exit = True
        thread.join(10)
        engine.dispose()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_the_login_link_logs_the_owner_in_and_leaves_no_key_behind(
    personal_master: MasterConfig, browser: Any
) -> None:
    link = login_link(personal_master)
    assert link is not None and "#key=" in link
    base = link.split("/login", 1)[0]
    ui = Page(browser, base)
    try:
        p = ui.page
        p.goto(link)
        p.wait_for_url("**/experiments*")
        p.wait_for_selector("#whoami")
        assert p.inner_text("#whoami").startswith("determined")
        assert "key=" not in p.url
        assert not [e for e in p.evaluate("history.length && [location.href]") if "key=" in e]
        ui.assert_clean()
    finally:
        ui.close()


def test_a_wrong_key_logs_nobody_in(personal_master: MasterConfig, browser: Any) -> None:
    link = login_link(personal_master)
    assert link is not None
    ui = Page(browser, link.split("/login", 1)[0])
    try:
        p = ui.page
        p.goto(link[:-4] + "AAAA")
        p.wait_for_selector(".login .error:not(:empty)")
        assert "/login" in p.url and "key=" not in p.url
        assert p.locator("#whoami").count() == 0
        ui.assert_clean(allow=("401",))
    finally:
        ui.close()
