"""Cluster info of the running job: read from ``DET_CLUSTER_INFO`` (a JSON file path, or inline JSON).

The shape is Determined's ``ClusterInfo`` so ``det.get_cluster_info()`` works unchanged. Every path or value that
comes from the environment is read through a ``get_*()`` function so tests can redirect it.

A public contract: ``launchers`` (chief address, port offset) and the ``determined`` facade read the job's cluster
info through this module, so renaming or removing a name here breaks them.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"


class TrialInfo:
    """The ``trial`` part of the cluster info (Determined's ``TrialInfo``)."""

    def __init__(
        self,
        *,
        trial_id: int,
        experiment_id: int,
        trial_seed: int,
        hparams: dict[str, Any],
        config: dict[str, Any],
        steps_completed: int,
        trial_run_id: int,
        user_data: dict[str, Any] | None = None,
    ) -> None:
        self.trial_id = trial_id
        self.experiment_id = experiment_id
        self.trial_seed = trial_seed
        self.hparams = hparams
        self._config = config
        self.steps_completed = steps_completed
        self._trial_run_id = trial_run_id
        self.user_data = user_data if user_data is not None else dict(config.get("data") or {})

    @property
    def trial_run_id(self) -> int:
        return self._trial_run_id

    @property
    def config(self) -> dict[str, Any]:
        return self._config

    @classmethod
    def _from_json(cls, obj: dict[str, Any]) -> TrialInfo:
        config = obj.get("config") or {}
        return cls(
            trial_id=int(obj["trial_id"]),
            experiment_id=int(obj.get("experiment_id", 0)),
            trial_seed=int(obj.get("trial_seed", 0)),
            hparams=dict(obj.get("hparams") or {}),
            config=dict(config),
            steps_completed=int(obj.get("steps_completed") or 0),
            trial_run_id=int(obj.get("trial_run_id") or 0),
            user_data=obj.get("user_data"),
        )


class ClusterInfo:
    """What the job knows about itself (Determined's ``ClusterInfo``)."""

    def __init__(
        self,
        *,
        master_url: str,
        cluster_id: str,
        agent_id: str,
        slot_ids: list[int],
        task_id: str,
        allocation_id: str,
        session_token: str,
        task_type: str,
        latest_checkpoint: str | None = None,
        container_addrs: list[str] | None = None,
        container_rank: int = 0,
        trial: TrialInfo | None = None,
    ) -> None:
        self.master_url = master_url
        self.cluster_id = cluster_id
        self.agent_id = agent_id
        self.slot_ids = slot_ids
        self.task_id = task_id
        self.allocation_id = allocation_id
        self.session_token = session_token
        self.task_type = task_type
        self.latest_checkpoint = latest_checkpoint or None
        self.container_addrs = container_addrs or ["127.0.0.1"]
        self.container_rank = container_rank
        self._trial_info = trial
        self.master_cert_file: str | None = None
        self.master_cert_name: str | None = None

    @property
    def trial(self) -> TrialInfo:
        if self._trial_info is None:
            raise RuntimeError("this task is not a trial")
        return self._trial_info

    @property
    def user_data(self) -> dict[str, Any]:
        return self._trial_info.user_data if self._trial_info is not None else {}

    @property
    def gpu_uuids(self) -> list[str]:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        return [x for x in visible.split(",") if x]

    @classmethod
    def _from_json(cls, obj: dict[str, Any]) -> ClusterInfo:
        trial = TrialInfo._from_json(obj["trial"]) if obj.get("trial") else None
        rank = _node_rank(obj.get("container_rank"))
        latest = os.environ.get("DET_LATEST_CHECKPOINT") or obj.get("latest_checkpoint")
        return cls(
            master_url=_env_or_field("DET_MASTER", obj, "master_url"),
            cluster_id=_field(obj, "cluster_id"),
            agent_id=_field(obj, "agent_id"),
            slot_ids=[int(s) for s in obj.get("slot_ids") or [0]],
            task_id=_field(obj, "task_id"),
            allocation_id=_env_or_field("DET_ALLOCATION_ID", obj, "allocation_id"),
            session_token=_env_or_field("DET_SESSION_TOKEN", obj, "session_token"),
            task_type=_field(obj, "task_type", "TRIAL"),
            latest_checkpoint=latest,
            container_addrs=[str(a) for a in obj.get("container_addrs") or []],
            container_rank=int(rank or 0),
            trial=trial,
        )

    @classmethod
    def _from_file(cls, path: str | os.PathLike[str]) -> ClusterInfo:
        with open(path, encoding="utf-8") as f:
            return cls._from_json(json.load(f))

    def _to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "master_url": self.master_url,
            "cluster_id": self.cluster_id,
            "agent_id": self.agent_id,
            "slot_ids": self.slot_ids,
            "task_id": self.task_id,
            "allocation_id": self.allocation_id,
            "session_token": self.session_token,
            "task_type": self.task_type,
            "latest_checkpoint": self.latest_checkpoint,
            "container_addrs": self.container_addrs,
            "container_rank": self.container_rank,
        }
        if self._trial_info is not None:
            t = self._trial_info
            out["trial"] = {
                "trial_id": t.trial_id,
                "experiment_id": t.experiment_id,
                "trial_seed": t.trial_seed,
                "hparams": t.hparams,
                "config": t.config,
                "steps_completed": t.steps_completed,
                "trial_run_id": t.trial_run_id,
                "user_data": t.user_data,
            }
        return out


def _field(obj: dict[str, Any], key: str, default: str = "") -> str:
    """``obj[key]`` as text; `default` when it is missing or empty."""
    return str(obj.get(key) or default)


def _env_or_field(name: str, obj: dict[str, Any], key: str) -> str:
    """The environment variable `name` when set and not empty, else ``obj[key]`` as text ("" when missing)."""
    return os.environ.get(name) or _field(obj, key)


def _node_rank(container_rank: Any) -> Any:
    """This node's rank: ``SLURM_NODEID`` when it is a number, else the file's `container_rank`."""
    node_id = os.environ.get("SLURM_NODEID")
    if node_id is not None and node_id.isdigit():
        # The node we run on is Slurm's business: one shared file may serve every node.
        return int(node_id)
    return container_rank


def get_cluster_info() -> ClusterInfo | None:
    """The job's ``ClusterInfo``, or ``None`` off-cluster (``DET_CLUSTER_INFO`` unset or empty)."""
    raw = os.environ.get("DET_CLUSTER_INFO", "").strip()
    if not raw:
        return None
    if raw.startswith("{"):
        return ClusterInfo._from_json(json.loads(raw))
    return ClusterInfo._from_file(raw)


def get_storage_root() -> pathlib.Path | None:
    """Checkpoint storage directory on the shared filesystem (``DET_STORAGE_ROOT``)."""
    raw = os.environ.get("DET_STORAGE_ROOT")
    return pathlib.Path(raw) if raw else None


def get_job_storage() -> pathlib.Path | None:
    """This trial's working directory (``DET_JOB_STORAGE``)."""
    raw = os.environ.get("DET_JOB_STORAGE")
    return pathlib.Path(raw) if raw else None


def get_local_storage_root() -> pathlib.Path:
    """Where checkpoints go off-cluster when no ``checkpoint_storage`` is given."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return pathlib.Path(base) / "determined"


def get_port_offset() -> int:
    """Per-job offset added to fixed ports, so two jobs on one node do not collide."""
    raw = os.environ.get("DET_UNIQUE_PORT_OFFSET")
    if raw:
        return int(raw)
    job_id = os.environ.get("SLURM_JOB_ID", "")
    return int(job_id) % 2000 if job_id.isdigit() else 0


def get_chief_ip() -> str | None:
    """Address of the node running rank 0: ``DET_CHIEF_IP``, else the first container address."""
    ip = os.environ.get("DET_CHIEF_IP")
    if ip:
        return ip
    info = get_cluster_info()
    if info is not None and info.container_addrs:
        return info.container_addrs[0]
    return None
