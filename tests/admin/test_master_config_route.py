"""``GET /api/v1/master/config`` (``det master config``): the effective configuration, for admins only, with
every secret masked."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine

from hpc_master.api.app import create_app
from hpc_master.masterconf import parse_master_config
from hpc_master.services.master_config import mask_url
from hpc_master.services.redact import MASK

DB_PASSWORD = "pg-s3cret-word"
LDAP_PASSWORD = "ldap-search-secret"
ADMIN_PASSWORD = "admin-s3cret-word"


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql+psycopg://det:pw@db:5432/det", f"postgresql+psycopg://det:{MASK}@db:5432/det"),
        ("postgresql+psycopg://det:p@ss@db/det", f"postgresql+psycopg://det:{MASK}@db/det"),
        ("postgresql+psycopg://det@db/det?sslmode=require", "postgresql+psycopg://det@db/det?sslmode=require"),
        ("postgresql+psycopg://det@db/det?password=pw&sslmode=require",
         f"postgresql+psycopg://det@db/det?password={MASK}&sslmode=require"),
        ("sqlite:////var/lib/hpc-det/master/master.db", "sqlite:////var/lib/hpc-det/master/master.db"),
    ],
)  # fmt: skip
def test_database_urls_lose_their_passwords(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_admins_see_the_effective_configuration_with_secrets_masked(tmp_path: Path) -> None:
    config = parse_master_config(
        {
            "db": {"url": f"postgresql+psycopg://det:{DB_PASSWORD}@db.example.org:5432/det"},
            "listen": {"port": 8443},
            "resource_pools": {"gpu": {"partition": "gpu", "slots_per_node": 4}},
            "default_resource_pool": "gpu",
        },
        env={"DET_ADMIN_PASSWORD": ADMIN_PASSWORD, "DET_REQUIRE_PASSWORDS": "1",
             "DET_LDAP_BIND_PASSWORD": LDAP_PASSWORD},
    )  # fmt: skip
    engine = create_engine(f"sqlite:///{tmp_path / 'master.db'}")  # the app's own database, not db.url's
    with TestClient(create_app(config, engine=engine)) as client:
        assert client.get("/api/v1/master/config").status_code == 401
        token = client.post("/api/v1/auth/login", json={"username": "admin", "password": ADMIN_PASSWORD})
        admin = {"Authorization": f"Bearer {token.json()['token']}"}
        client.post("/api/v1/users", headers=admin, json={"user": {"username": "bob"}, "password": "bob-pw"})
        r = client.get("/api/v1/master/config", headers=admin)
        assert r.status_code == 200, r.text
        assert DB_PASSWORD not in r.text and ADMIN_PASSWORD not in r.text and LDAP_PASSWORD not in r.text
        got = r.json()["config"]
        assert got["db"]["url"] == f"postgresql+psycopg://det:{MASK}@db.example.org:5432/det"
        assert got["security"] == {
            "require_passwords": True,
            "token_ttl_hours": 168.0,
            "admin_password": MASK,
            "max_streams_per_user": 64,
            "max_long_polls_per_trial": 256,
            "munge": {
                "enabled": False, "create_users": "nobody", "user_groups": [], "admin_group": None, "names": [],
                "unmunge": "unmunge",
            },
            "ldap": {
                "enabled": False, "create_users": "nobody", "user_groups": [], "admin_group": None, "url": "",
                "start_tls": False, "ca_file": None, "bind_dn": None, "bind_password": MASK, "base_dn": "",
                "user_filter": "(&(objectClass=posixAccount)(uid={username}))", "unix_attribute": "uid",
                "timeout_s": 10.0,
            },
        }  # fmt: skip
        assert got["listen"] == {"host": "127.0.0.1", "port": 8443, "forwarded_allow_ips": []}
        assert got["resource_pools"]["gpu"]["slots_per_node"] == 4
        assert got["job_storage_root"] == str(tmp_path / "home" / "hpc-det" / "jobs")  # resolved defaults
        assert got["checkpoint_storage"]["host_path"] == str(tmp_path / "home" / "hpc-det" / "checkpoints")
        assert got["external_url"] == "http://127.0.0.1:8443"
        bob = client.post("/api/v1/auth/login", json={"username": "bob", "password": "bob-pw"}).json()[
            "token"
        ]
        r = client.get("/api/v1/master/config", headers={"Authorization": f"Bearer {bob}"})
        assert r.status_code == 403 and "admin" in r.json()["message"]
    engine.dispose()
