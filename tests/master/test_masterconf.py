"""Master config: strict keys with did-you-mean, YAML paths in errors, env overrides, security rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from hpc_master import paths
from hpc_master.api.app import create_app
from hpc_master.errors import ConfigError
from hpc_master.masterconf import load_master_config, parse_master_config

from .helpers import login


def test_defaults_use_user_directories(tmp_path: Path) -> None:
    config = parse_master_config({}, env={})
    assert config.db_url() == f"sqlite:///{tmp_path / 'data' / 'master.db'}"
    assert (config.listen.host, config.listen.port) == ("127.0.0.1", 8080)
    assert config.checkpoint_dir() == paths.get_checkpoint_root()
    assert not config.passwords_required()


def test_unknown_key_names_the_path_and_suggests(tmp_path: Path) -> None:
    path = tmp_path / "master.yaml"
    path.write_text("resource_pools:\n  gpu:\n    partiton: a100\n")
    with pytest.raises(ConfigError) as info:
        load_master_config(path, env={})
    assert info.value.field == "resource_pools.gpu.partiton"
    assert "did you mean `partition`" in info.value.message
    with pytest.raises(ConfigError) as info:
        parse_master_config({"listen": {"prot": 1}}, env={})
    assert info.value.field == "listen.prot" and "`port`" in info.value.message
    with pytest.raises(ConfigError) as info:
        parse_master_config({"resource_pools": {"gpu": {"gpu_request_style": "magic"}}}, env={})
    assert info.value.field == "resource_pools.gpu.gpu_request_style"


def test_invalid_yaml_and_signal(tmp_path: Path) -> None:
    path = tmp_path / "master.yaml"
    path.write_text("db: [\n")
    with pytest.raises(ConfigError):
        load_master_config(path, env={})
    assert parse_master_config({"preemption": {"signal": "usr2"}}, env={}).preemption.signal == "SIGUSR2"
    with pytest.raises(ConfigError) as info:
        parse_master_config({"preemption": {"signal": "SIGNOPE"}}, env={})
    assert info.value.field == "preemption.signal"


def test_env_overrides_file() -> None:
    env = {"DET_DB_URL": "sqlite:////tmp/x.db", "DET_LISTEN_PORT": "9000", "DET_LISTEN_HOST": "0.0.0.0"}
    config = parse_master_config({"listen": {"port": 1234}}, env=env)
    assert config.db_url() == "sqlite:////tmp/x.db" and config.listen.port == 9000
    assert config.passwords_required()  # beyond loopback


def test_required_passwords_refuse_blank_admin(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    config = parse_master_config({"db": {"url": url}, "security": {"require_passwords": True}}, env={})
    with pytest.raises(ConfigError) as info:
        create_app(config)
    assert info.value.field == "security.admin_password"
    config = parse_master_config(
        {"db": {"url": url}, "security": {"require_passwords": True}}, env={"DET_ADMIN_PASSWORD": "s3cret"}
    )
    with TestClient(create_app(config)) as client:
        assert (
            client.post("/api/v1/auth/login", json={"username": "admin", "password": ""}).status_code == 401
        )
        assert (
            client.post("/api/v1/auth/login", json={"username": "determined", "password": ""}).status_code
            == 401
        )
        login(client, "admin", "s3cret")


def test_the_task_origin_is_never_the_masters_own() -> None:
    """Tasks' pages (issue 35): by default a second port of the master's host; or a host name of their own,
    on the master's port (one listener, told apart by Host) or another; anything but an origin is refused."""
    config = parse_master_config({"listen": {"port": 8080}}, env={})
    assert config.task_origin() == "http://127.0.0.1:8081" and config.task_listen_port() == 8081
    assert config.task_origin(bound_port=40001) == "http://127.0.0.1:40001"  # 8081 was taken
    shared = {"listen": {"host": "0.0.0.0", "port": 8443}, "external_url": "https://det.example.org:8443"}
    named = parse_master_config(
        {**shared, "task_proxy": {"origin": "https://tasks.det.example.org:8443/"}}, env={}
    )
    assert named.task_origin() == "https://tasks.det.example.org:8443" and named.task_listen_port() is None
    apart = parse_master_config({**shared, "task_proxy": {"origin": "https://det.example.org:9443"}}, env={})
    assert apart.task_listen_port() == 9443
    behind = {"origin": "https://tasks.det.example.org", "port": 8444}
    assert parse_master_config({**shared, "task_proxy": behind}, env={}).task_listen_port() == 8444
    env = {"DET_TASK_ORIGIN": "http://tasks.localhost:8080"}
    assert parse_master_config({}, env=env).task_origin() == "http://tasks.localhost:8080"
    for bad in ("tasks.det.example.org", "ftp://tasks.example.org", "https://tasks.example.org/proxy/"):
        with pytest.raises(ConfigError) as info:
            parse_master_config({"task_proxy": {"origin": bad}}, env={})
        assert info.value.field == "task_proxy.origin" and "expected an origin" in info.value.message


def test_a_master_beyond_loopback_serves_browsers_apart_unless_tls_is_the_admins() -> None:
    """Issue 35: without a certificate of the admin's, a master beyond loopback serves browsers over HTTPS on
    a port of their own (8443 beside Determined's 8080), and tasks' pages beside them over HTTPS."""
    shared = parse_master_config({"listen": {"host": "0.0.0.0", "port": 8080}}, env={})
    assert shared.browsers_apart() and shared.browser_listen_port() == 8443
    assert shared.task_origin().startswith("https://")
    other = parse_master_config({"listen": {"host": "10.0.0.5", "port": 9000}}, env={})
    assert other.browser_listen_port() == 0  # any free port, said in the log and by the redirects
    fixed = {"listen": {"host": "10.0.0.5", "port": 9000}, "tls": {"browser_port": 9443}}
    assert parse_master_config(fixed, env={}).browser_listen_port() == 9443
    for not_apart in (
        {"listen": {"host": "127.0.0.1", "port": 8080}},  # a personal master on loopback
        {"listen": {"host": "0.0.0.0"}, "tls": {"cert": "/etc/det/cert.pem"}},  # the admin's certificate
        {"listen": {"host": "0.0.0.0"}, "external_url": "https://det.example.org"},  # TLS ends at a proxy
        {"listen": {"host": "0.0.0.0"}, "tls": {"generate": False}},
    ):
        config = parse_master_config(not_apart, env={})
        assert not config.browsers_apart() and config.browser_listen_port() is None, not_apart
    bad = [
        ({"tls": {"browser_port": 8080}}, "tls.browser_port"),
        ({"task_proxy": {"origin": "http://tasks.example.org:9001"}}, "task_proxy.origin"),
        ({"task_proxy": {"origin": "https://tasks.example.org:8080"}}, "task_proxy.origin"),
    ]
    for extra, field in bad:
        with pytest.raises(ConfigError) as info:
            parse_master_config({"listen": {"host": "0.0.0.0", "port": 8080}, **extra}, env={})
        assert field in info.value.message, info.value
