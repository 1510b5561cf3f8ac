"""The ``master.yaml`` reference, generated from the typed model in ``masterconf``:

    python -m hpc_master.masterconf_doc > docs/master-yaml.md

Every key comes from the pydantic models (its type and constraints, its default), its meaning from the
docstring under the field, its environment variable from ``ENV_OVERRIDES``, and each section's example from
``EXAMPLE``, a whole shared master's file that the tests validate. ``tests/admin/test_master_yaml_reference.py``
fails when the committed ``docs/master-yaml.md`` differs from what this prints, or when a key has no docstring,
so the code and its reference cannot drift apart.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import re
import sys
import textwrap
import types
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, TypeGuard, Union, get_args, get_origin

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from hpc_master.masterconf import ENV_OVERRIDES, MasterConfig

EXAMPLE = """\
# /etc/hpc-det/master.yaml: a shared master for a whole cluster (docs/admin.md)
cluster_name: hpc-prod
db:
  # The password may instead come from DET_DB_URL in the unit's EnvironmentFile.
  url: postgresql+psycopg://det:CHANGE-ME@db.example.org:5432/det
listen:
  host: 0.0.0.0
  port: 8443
  # No reverse proxy in front (the master serves TLS itself): X-Forwarded-For is believed from nobody.
  forwarded_allow_ips: []
tls:
  cert: /etc/hpc-det/tls/cert.pem
  key: /etc/hpc-det/tls/key.pem
  # Used only without cert: browsers then get HTTPS on a port of their own with a generated certificate.
  generate: true
  browser_port: 9443
external_url: https://det.example.org:8443
job_storage_root: /shared/hpc-det/jobs
service_account: hpc-det
checkpoint_storage:
  type: shared_fs
  host_path: /shared/hpc-det/checkpoints
  storage_path: prod
  save_experiment_best: 0
  save_trial_best: 1
  save_trial_latest: 1
default_resource_pool: a100
resource_pools:
  a100:
    partition: gpu
    account: ml
    qos: normal
    slots_per_node: 4
    gpu_type: a100
    gpu_request_style: gres
    default_time_limit: "4:00:00"
    max_time_limit: 2-00:00:00
    mem_per_node: 480G
    priority_nice_step: 100
  cpu:
    partition: cpu
    slots_per_node: 0
    gpu_request_style: none
    default_time_limit: 60
    container:
      runtime: singularity
      command: /opt/singularity/bin/singularity
      image: /shared/images/sklearn.sif
      image_cache_dir: /shared/hpc-det/images-cpu
preemption:
  signal: SIGUSR1
  lead_time_s: 300
container:
  runtime: apptainer
  command: /usr/bin/apptainer
  image: docker://pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime
  image_cache_dir: /shared/hpc-det/images
poll_interval_s: 5
tensorboard_timeout: 300
security:
  require_passwords: true
  token_ttl_hours: 168
  max_streams_per_user: 64
  max_long_polls_per_trial: 256
  # admin_password: only for the first start; prefer DET_ADMIN_PASSWORD in the unit's EnvironmentFile.
  munge:  # `det user login` with no user name: the site's munge proves the Unix account
    enabled: true
    create_users: groups
    user_groups: [ml-users]
    admin_group: hpc-det-admins
    names: [login1.example.org, login2.example.org]
    unmunge: /usr/bin/unmunge
  ldap:  # the web UI (and `det user login NAME`): the password of the site's directory
    enabled: true
    url: ldaps://ldap.example.org
    start_tls: false
    ca_file: /etc/ssl/certs/site-ca.pem
    bind_dn: cn=hpc-det,ou=services,dc=example,dc=org
    # bind_password: prefer DET_LDAP_BIND_PASSWORD in the unit's EnvironmentFile.
    base_dn: ou=people,dc=example,dc=org
    user_filter: (&(objectClass=posixAccount)(uid={username}))
    unix_attribute: uid
    timeout_s: 10
    create_users: groups
    user_groups: [ml-users]
    admin_group: hpc-det-admins
task_proxy:
  # Notebooks' and TensorBoards' pages: a host name of their own (DNS and the certificate name it).
  origin: https://tasks.det.example.org:8443
  port: null
"""
"""A shared master's whole ``master.yaml``, with every key but ``security.admin_password`` and
``security.ldap.bind_password``."""

POOL_NAME = "<name>"
"""How a mapping key (a pool's name) appears in a key's path."""


@dataclass(frozen=True)
class KeyDoc:
    path: str  # dotted, with POOL_NAME for a mapping's keys: resource_pools.<name>.partition
    type: str
    default: str
    env: str | None
    description: str
    children: str | None  # a section's (a mapping of keys) path of its keys: "db", "resource_pools.<name>"


@cache
def field_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """The string literal under each field of `model`'s class body (PEP 257's attribute docstrings), or of
    the nearest base class that has one (a field inherited, or redefined without one)."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if isinstance(cls, type) and issubclass(cls, BaseModel) and cls.__module__.startswith("hpc_master"):
            docs |= _own_docstrings(cls)
    return docs


def _own_docstrings(model: type[BaseModel]) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(model)))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for stmt, after in itertools.pairwise(body):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _markdown(text: str) -> str:
    """A docstring as one line of Markdown (RST's double backticks become single ones)."""
    return re.sub(r"\s+", " ", text.replace("``", "`")).strip()


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(the model a field holds, whether through a mapping of names to it)."""
    if _is_model(annotation):
        return annotation, False
    origin = get_origin(annotation)
    if origin is dict:
        inner, _ = _model_of(get_args(annotation)[1])
        return inner, True
    if origin in (Union, types.UnionType):
        for arg in get_args(annotation):
            inner, keyed = _model_of(arg)
            if inner is not None:
                return inner, keyed
    return None, False


def _is_model(annotation: Any) -> TypeGuard[type[BaseModel]]:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}


def describe_type(annotation: Any, info: FieldInfo) -> str:
    args = [a for a in get_args(annotation) if a is not type(None)]
    origin = get_origin(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in get_args(annotation))
    if origin in (Union, types.UnionType) and len(args) == 1:
        return describe_type(args[0], info)
    if origin is dict:
        return "mapping of names to the keys below"
    if origin is list:
        return f"list of {_NAMES.get(args[0], getattr(args[0], '__name__', str(args[0])))}s"
    if _is_model(annotation):
        return "mapping (the keys below)"
    name = _NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))
    return f"{name} {', '.join(_bounds(info))}".strip()


def _bounds(info: FieldInfo) -> list[str]:
    """The field's numeric bounds (``≥ 1``, ``< 10``), in the order of its metadata."""
    bounds = []
    for meta in info.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(meta, attr, None)
            if isinstance(meta, annotated_types.BaseMetadata) and value is not None:
                bounds.append(f"{sign} {value}")
    return bounds


def describe_default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
    else:
        value = info.default
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "unset"
    return _describe_value(value)


def _describe_value(value: Any) -> str:
    """A default that is set, as the reference shows it."""
    if isinstance(value, BaseModel):
        return "—"
    if isinstance(value, dict):
        return ", ".join(f"pool `{k}` with every default" for k in value) or "none"
    if isinstance(value, list):
        return ", ".join(f"`{v}`" for v in value) or "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def walk(model: type[BaseModel] = MasterConfig, prefix: str = "") -> Iterator[KeyDoc]:
    """Every key under `model`, depth first, in the models' order."""
    env_of = {dotted: var for var, dotted in ENV_OVERRIDES.items()}
    docs = field_docstrings(model)
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        inner, keyed = _model_of(info.annotation)
        children = None if inner is None else f"{path}.{POOL_NAME}" if keyed else path
        yield KeyDoc(
            path=path,
            type=describe_type(info.annotation, info),
            default=describe_default(info),
            env=env_of.get(path),
            description=_markdown(docs.get(name, "")),
            children=children,
        )
        if inner is not None and children is not None:
            yield from walk(inner, f"{children}.")


def _example_under(node: Any, parts: list[str]) -> tuple[list[str], Any] | None:
    """(the concrete keys, the value) of EXAMPLE's part under `parts`; POOL_NAME matches the first entry of a
    mapping that has the rest."""
    if not parts:
        return [], node
    if not isinstance(node, dict):
        return None
    keys = list(node) if parts[0] == POOL_NAME else [parts[0]]
    for key in keys:
        found = _example_under(node[key], parts[1:]) if key in node else None
        if found is not None:
            return [key, *found[0]], found[1]
    return None


def _example_snippet(path: str) -> str | None:
    """The part of EXAMPLE under a section's dotted path, as YAML."""
    found = _example_under(yaml.safe_load(EXAMPLE), path.split("."))
    if found is None:
        return None
    keys, node = found
    for key in reversed(keys):
        node = {key: node}
    return yaml.safe_dump(node, sort_keys=False, default_flow_style=False).rstrip()


def _row(key: KeyDoc, section: str) -> str:
    name = key.path.removeprefix(f"{section}.") if section else key.path
    env = f"`{key.env}`" if key.env else ""
    return f"| `{name}` | {key.type} | {key.default} | {env} | {key.description} |"


def render() -> str:
    keys = list(walk())
    out = [
        "# `master.yaml` reference",
        "",
        "<!-- Generated by `python -m hpc_master.masterconf_doc > docs/master-yaml.md` from the typed model in",
        "     hpc_master/masterconf.py; do not edit: tests/admin/test_master_yaml_reference.py checks it. -->",
        "",
        "The master reads one YAML file (`det-master --config master.yaml`); every key is optional. Unknown keys",
        "are errors that name the key's path and the closest valid key. Check a file without starting anything:",
        "`det-master --check-config master.yaml` (exit 0 and `ok`, or 2 and the field). The running master's",
        "effective configuration, secrets masked: `det master config` (admins). An environment variable in the",
        "table overrides the file's value. How to set up a shared master: [admin.md](admin.md).",
        "",
        "## A shared master's whole file",
        "",
        "```yaml",
        EXAMPLE.rstrip(),
        "```",
    ]
    sections = [("", "", "")] + [(k.children, k.path, k.description) for k in keys if k.children]
    for section, example, description in sections:
        out += _section_lines(keys, section, example, description)
    out += [
        "",
        "## Environment overrides",
        "",
        "A variable that is set and not empty replaces the file's value (for quick tries and for secrets kept",
        "out of the file, such as `DET_DB_URL` and `DET_ADMIN_PASSWORD` in a systemd `EnvironmentFile`).",
        "",
        "| variable | key |",
        "|---|---|",
        *[f"| `{var}` | `{dotted}` |" for var, dotted in sorted(ENV_OVERRIDES.items())],
        "",
    ]
    return "\n".join(out)


def _section_lines(keys: list[KeyDoc], section: str, example: str, description: str) -> list[str]:
    """One section of the reference: its heading, description, table of keys and example."""
    prefix = f"{section}." if section else ""
    rows = [k for k in keys if k.path.startswith(prefix) and "." not in k.path.removeprefix(prefix)]
    out = ["", f"## `{section}`" if section else "## Top-level keys", ""]
    if section:
        out += [description, ""]
    out += ["| key | type | default | environment | meaning |", "|---|---|---|---|---|"]
    out += [_row(k, section) for k in rows]
    snippet = _example_snippet(example) if example else None
    if snippet:
        out += ["", "```yaml", snippet, "```"]
    return out


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
