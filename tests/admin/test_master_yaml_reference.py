"""``docs/master-yaml.md`` is generated from the typed model (``python -m hpc_master.masterconf_doc``): the
committed file must be what the generator prints, every key must say what it means, and the example whole
file must be valid and use every key."""

from __future__ import annotations

import subprocess
import sys

from hpc_master.expconf import load_yaml
from hpc_master.masterconf import ENV_OVERRIDES, parse_master_config
from hpc_master.masterconf_doc import EXAMPLE, POOL_NAME, render, walk

from ._master_process import REPO

REFERENCE = REPO / "docs" / "master-yaml.md"


def test_the_committed_reference_is_what_the_generator_prints() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "hpc_master.masterconf_doc"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert printed == render()
    assert REFERENCE.read_text() == printed, (
        "docs/master-yaml.md is out of date: python -m hpc_master.masterconf_doc > docs/master-yaml.md"
    )


def test_every_key_says_what_it_means() -> None:
    undocumented = [k.path for k in walk() if not k.description]
    assert not undocumented, f"add a docstring under these fields in hpc_master/masterconf.py: {undocumented}"


def test_every_environment_override_names_a_key() -> None:
    keys = {k.path for k in walk() if not k.children}
    assert set(ENV_OVERRIDES.values()) <= keys


def _leaf_paths(node: object, prefix: str = "") -> set[str]:
    if not isinstance(node, dict):
        return {prefix.rstrip(".")}
    paths: set[str] = set()
    for key, value in node.items():
        name = POOL_NAME if prefix == "resource_pools." else key
        paths |= _leaf_paths(value, f"{prefix}{name}.")
    return paths


def test_the_example_is_valid_and_uses_every_key() -> None:
    parse_master_config(load_yaml(EXAMPLE), env={"DET_LDAP_BIND_PASSWORD": "from-the-unit"})
    keys = {k.path for k in walk() if not k.children}
    secrets = {"security.admin_password", "security.ldap.bind_password"}  # from the environment
    missing = keys - _leaf_paths(load_yaml(EXAMPLE)) - secrets
    assert not missing, f"EXAMPLE in hpc_master/masterconf_doc.py lacks {sorted(missing)}"
