"""The run directory's JSON documents as typed records, shared by the master and the job: ``plan.json``
(:class:`JobPlan`), the ClusterInfo the master writes as ``cluster_info.template.json`` (:class:`ClusterInfoDoc`,
with its :class:`TrialInfoDoc`) and the job entry's ``exit.json`` (:class:`ExitRecord`). Standard library only.

The master builds these records and writes ``to_json()``; the job entry reads its inputs back with ``from_json``,
which checks every field and raises :class:`ContractError` (a ValueError) naming the field, so a plan the job
cannot run fails its setup with a message that says why. ``exit.json`` is the other way round: the job writes it
and the master reads it, and since the job's owner can write anything there, :meth:`ExitRecord.from_json` never
raises: a field of the wrong type reads as None, unknown keys are ignored, and texts are cut to
``MAX_TEXT_CHARS``.

The JSON written is the same, key for key, as the dicts these records replace (the ClusterInfo keeps
Determined's shape; the job entry fills ``container_addrs``), and every file is dumped with sorted keys.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field, replace

from harness.exec.job_plan import CLUSTER_INFO_TEMPLATE_FILE, PLAN_FILE, PLAN_KEYS, PLAN_VERSION

# Type-only (the job entry imports this module on every launch; `typing` costs 3 ms): see job_entry.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_TEXT_CHARS = 4000  # exit.json's texts (reason, stage, ...) as the master reads them


class ContractError(ValueError):
    """A document that does not keep its contract; `field` names the offending key (dotted below the top)."""

    def __init__(self, document: str, field: str, problem: str) -> None:
        self.detail = f"{field} {problem}" if field else problem  # without the document's name
        super().__init__(f"{document}: {self.detail}")
        self.document = document
        self.field = field


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


class _Reader:
    """Typed reads of one JSON object's keys; each raises ContractError naming the key."""

    def __init__(self, document: str, obj: object, prefix: str = "") -> None:
        if not isinstance(obj, dict):
            raise ContractError(document, prefix, f"is not a JSON object (got {_type_name(obj)})")
        self.document = document
        self.obj: dict[str, Any] = obj
        self.prefix = prefix

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def error(self, key: str, problem: str) -> ContractError:
        return ContractError(self.document, self.name(key), problem)

    def require(self, keys: tuple[str, ...]) -> None:
        missing = [k for k in keys if k not in self.obj]
        if missing:
            names = ", ".join(self.name(k) for k in missing)
            raise ContractError(self.document, "", f"lacks {names}")

    def _bad(self, key: str, expected: str) -> ContractError:
        return self.error(key, f"must be {expected}, not {_type_name(self.obj.get(key))}")

    def text(self, key: str) -> str:
        value = self.obj.get(key)
        if not isinstance(value, str):
            raise self._bad(key, "a string")
        return value

    def opt_text(self, key: str) -> str | None:
        value = self.obj.get(key)
        if value is not None and not isinstance(value, str):
            raise self._bad(key, "a string or null")
        return value

    def integer(self, key: str) -> int:
        value = self.obj.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._bad(key, "an integer")
        return value

    def mapping(self, key: str) -> dict[str, Any]:
        value = self.obj.get(key)
        if not isinstance(value, dict):
            raise self._bad(key, "an object")
        return value

    def str_map(self, key: str) -> dict[str, str]:
        value = self.mapping(key)
        for k, v in value.items():
            if not isinstance(v, str):
                raise self.error(f"{key}.{k}", f"must be a string, not {_type_name(v)}")
        return dict(value)

    def list_of(self, key: str, item: type) -> list[Any]:
        value = self.obj.get(key)
        if not isinstance(value, list):
            raise self._bad(key, "a list")
        for i, v in enumerate(value):
            if not isinstance(v, item) or isinstance(v, bool):
                raise self.error(f"{key}[{i}]", f"must be {item.__name__}, not {_type_name(v)}")
        return list(value)


# -- plan.json ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobPlan:
    """``plan.json``: what the job entry runs, where, and with which environment (see ``harness.exec.job_plan``
    for the run directory it lies in and ``containers.job.container_section`` for ``container``)."""

    entrypoint: str | list[str]  # as the config wrote it; resolve_entrypoint turns it into an argv
    slots_per_trial: int
    python: str  # the platform's interpreter on the nodes
    context_archive: str | None  # the model definition's archive, unpacked into `workdir` once
    max_context_bytes: int
    workdir: str  # the entrypoint's working directory
    env: dict[str, str]  # DET_* and PYTHONPATH; applied last
    user_env: dict[str, str]  # the config's environment_variables for the job's device type
    preempt_signal: str  # e.g. "SIGUSR1"
    container: dict[str, Any] | None = None  # the image to run in (omitted from the JSON without one)
    version: int = PLAN_VERSION

    KEYS = PLAN_KEYS  # required in plan.json; "container" is optional

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": self.version,
            "entrypoint": self.entrypoint if isinstance(self.entrypoint, str) else list(self.entrypoint),
            "slots_per_trial": self.slots_per_trial,
            "python": self.python,
            "context_archive": self.context_archive,
            "max_context_bytes": self.max_context_bytes,
            "workdir": self.workdir,
            "env": dict(self.env),
            "user_env": dict(self.user_env),
            "preempt_signal": self.preempt_signal,
        }
        if self.container is not None:
            out["container"] = dict(self.container)
        return out

    @classmethod
    def from_json(cls, obj: object) -> JobPlan:
        """The plan in `obj` (plan.json's parsed JSON); ContractError naming the field when it is not one."""
        r = _Reader(PLAN_FILE, obj)
        version = r.obj.get("version")
        if version != PLAN_VERSION or isinstance(version, bool):
            raise r.error("version", f"is {version!r}, expected {PLAN_VERSION}")
        r.require(cls.KEYS)
        entrypoint = r.obj["entrypoint"]
        if not isinstance(entrypoint, str):
            entrypoint = r.list_of("entrypoint", str)
        container = r.obj.get("container")
        return cls(
            entrypoint=entrypoint,
            slots_per_trial=r.integer("slots_per_trial"),
            python=r.text("python"),
            context_archive=r.opt_text("context_archive"),
            max_context_bytes=r.integer("max_context_bytes"),
            workdir=r.text("workdir"),
            env=r.str_map("env"),
            user_env=r.str_map("user_env"),
            preempt_signal=r.text("preempt_signal"),
            container=None if container is None else r.mapping("container"),
            version=PLAN_VERSION,
        )


# -- cluster_info.template.json ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialInfoDoc:
    """The ClusterInfo's ``trial`` part (Determined's ``TrialInfo``), as ``harness.cluster_info`` reads it."""

    trial_id: int
    experiment_id: int
    trial_seed: int
    hparams: dict[str, Any]
    config: dict[str, Any]  # the experiment's config, as the master completed it
    steps_completed: int
    trial_run_id: int
    user_data: dict[str, Any]

    KEYS = (
        "trial_id",
        "experiment_id",
        "trial_seed",
        "hparams",
        "config",
        "steps_completed",
        "trial_run_id",
        "user_data",
    )

    def to_json(self) -> dict[str, Any]:
        return {
            "trial_id": self.trial_id,
            "experiment_id": self.experiment_id,
            "trial_seed": self.trial_seed,
            "hparams": dict(self.hparams),
            "config": dict(self.config),
            "steps_completed": self.steps_completed,
            "trial_run_id": self.trial_run_id,
            "user_data": dict(self.user_data),
        }

    @classmethod
    def from_json(cls, obj: object, document: str = CLUSTER_INFO_TEMPLATE_FILE) -> TrialInfoDoc:
        r = _Reader(document, obj, "trial")
        r.require(cls.KEYS)
        return cls(
            trial_id=r.integer("trial_id"),
            experiment_id=r.integer("experiment_id"),
            trial_seed=r.integer("trial_seed"),
            hparams=r.mapping("hparams"),
            config=r.mapping("config"),
            steps_completed=r.integer("steps_completed"),
            trial_run_id=r.integer("trial_run_id"),
            user_data=r.mapping("user_data"),
        )


@dataclass(frozen=True)
class ClusterInfoDoc:
    """Determined's ClusterInfo as the master writes it (``cluster_info.template.json``) and the job entry
    completes it (``cluster_info.json``, :meth:`on_nodes`). ``harness.cluster_info.ClusterInfo`` is what the
    job's code reads; this is the document's shape. The session token is never in it (``session_token`` is
    empty: the token is in the run directory's 0600 file)."""

    master_url: str
    cluster_id: str
    task_id: str
    allocation_id: str
    task_type: str  # "TRIAL", "COMMAND", "NOTEBOOK", ...
    slot_ids: list[int] = field(default_factory=list)
    agent_id: str = ""
    session_token: str = ""
    latest_checkpoint: str | None = None  # uuid
    container_addrs: list[str] = field(default_factory=list)  # the job entry fills them in
    container_rank: int = 0  # each node's harness takes its own from SLURM_NODEID
    trial: TrialInfoDoc | None = None  # None for a task

    KEYS = (
        "master_url",
        "cluster_id",
        "agent_id",
        "slot_ids",
        "task_id",
        "allocation_id",
        "session_token",
        "task_type",
        "latest_checkpoint",
        "container_addrs",
        "container_rank",
        "trial",
    )

    def to_json(self) -> dict[str, Any]:
        return {
            "master_url": self.master_url,
            "cluster_id": self.cluster_id,
            "agent_id": self.agent_id,
            "slot_ids": list(self.slot_ids),
            "task_id": self.task_id,
            "allocation_id": self.allocation_id,
            "session_token": self.session_token,
            "task_type": self.task_type,
            "latest_checkpoint": self.latest_checkpoint,
            "container_addrs": list(self.container_addrs),
            "container_rank": self.container_rank,
            "trial": self.trial.to_json() if self.trial is not None else None,
        }

    @classmethod
    def from_json(cls, obj: object, document: str = CLUSTER_INFO_TEMPLATE_FILE) -> ClusterInfoDoc:
        r = _Reader(document, obj)
        r.require(cls.KEYS)
        trial = r.obj["trial"]
        return cls(
            master_url=r.text("master_url"),
            cluster_id=r.text("cluster_id"),
            agent_id=r.text("agent_id"),
            slot_ids=r.list_of("slot_ids", int),
            task_id=r.text("task_id"),
            allocation_id=r.text("allocation_id"),
            session_token=r.text("session_token"),
            task_type=r.text("task_type"),
            latest_checkpoint=r.opt_text("latest_checkpoint"),
            container_addrs=r.list_of("container_addrs", str),
            container_rank=r.integer("container_rank"),
            trial=None if trial is None else TrialInfoDoc.from_json(trial, document),
        )

    def on_nodes(self, addrs: list[str]) -> ClusterInfoDoc:
        """This document as the job entry writes it for the job's nodes: their addresses, one file for all
        (each node's harness takes its rank from ``SLURM_NODEID``)."""
        return replace(self, container_addrs=list(addrs), container_rank=0)


# -- exit.json --------------------------------------------------------------------------------------------------


def _text(value: object) -> str | None:
    return value[:MAX_TEXT_CHARS] if isinstance(value, str) else None


def _signal_text(value: object) -> str | None:
    """A signal's name; a number (as a hand-written record may have it) becomes its name when it has one."""
    if isinstance(value, str):
        return value[:MAX_TEXT_CHARS]
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 16:
        try:
            return signal.Signals(value).name
        except ValueError:
            return None
    return None


@dataclass(frozen=True)
class ExitRecord:
    """``exit.json``: why the job ended, written by the job entry (see its docstring) and read by the master.

    JSON keys (Determined-style camelCase): ``exitCode``, ``signal``, ``preempted``, ``reason``, ``stage``,
    ``slurmJobId``, ``finishedAt``. Read back, every field may be None: the file is the job owner's."""

    exit_code: int | None
    signal: str | None  # the first signal the job entry received (or the one that killed the entrypoint)
    preempted: bool | None  # the entrypoint exited 0 after a preemption signal or acknowledgement
    reason: str | None  # in words, for people
    stage: str | None  # plan, cluster_info, context, image, startup_hook or entrypoint
    slurm_job_id: str | None
    finished_at: str | None  # ISO 8601, UTC ("2024-05-01T12:00:00Z")

    def to_json(self) -> dict[str, Any]:
        return {
            "exitCode": self.exit_code,
            "signal": self.signal,
            "preempted": self.preempted,
            "reason": self.reason,
            "stage": self.stage,
            "slurmJobId": self.slurm_job_id,
            "finishedAt": self.finished_at,
        }

    @classmethod
    def from_json(cls, obj: object) -> ExitRecord:
        """The record in `obj`, whatever it is: never raises (anything but an object reads as all None)."""
        data: dict[Any, Any] = obj if isinstance(obj, dict) else {}
        code = data.get("exitCode")
        preempted = data.get("preempted")
        return cls(
            exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
            signal=_signal_text(data.get("signal")),
            preempted=preempted if isinstance(preempted, bool) else None,
            reason=_text(data.get("reason")),
            stage=_text(data.get("stage")),
            slurm_job_id=_text(data.get("slurmJobId")),
            finished_at=_text(data.get("finishedAt")),
        )
