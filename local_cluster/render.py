"""Pure renderers of the local cluster's Slurm configuration files (golden-tested)."""

from __future__ import annotations

from local_cluster.spec import (
    PARTITION_DEFAULT,
    PARTITION_SHORT,
    PARTITION_URGENT,
    LocalClusterSpec,
)

# Fake GPUs are character devices with distinct device numbers: Slurm only stat()s them, and refuses
# regular files ("not a valid character or block device"). 195 is the NVIDIA driver's real major.
GPU_DEVICE_MAJOR = 195
# Where PMIx clients put their files; each node bind-mounts its own directory here (`cluster._start_slurmd`).
PMIX_CLI_TMP_DIR = "/var/tmp/pmix"
HEADER = "# Written by `det deploy local up`; removed by `det deploy local down`. Do not edit.\n"


def render_slurm_conf(spec: LocalClusterSpec) -> str:
    root = spec.root
    lines = [
        f"ClusterName={spec.cluster_name}",
        f"SlurmctldHost={spec.controller_host}({spec.controller_ip})",
        "SlurmUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # Requeued jobs wait for credential expiry before they may start again (default 120 s).
        "AuthInfo=cred_expire=30",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        # Memory is a tracked resource, as on most real clusters; a job that asks for none gets its CPUs' share.
        "SelectTypeParameters=CR_Core_Memory",
        f"DefMemPerCPU={spec.mem_per_node_mb // spec.cpus_per_node}",
        "GresTypes=gpu",
        "ReturnToService=2",
        # The declared CPUs/memory are what Slurm schedules, not what this machine has.
        "SlurmdParameters=config_overrides",
        f"StateSaveLocation={root}/ctld",
        f"SlurmdSpoolDir={root}/nodes/%n/spool",
        f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/nodes/%n/slurmd.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        *_accounting_lines(spec),
        # Short timers so tests of failures and preemption do not wait minutes.
        "SlurmdTimeout=30",
        "KillWait=5",
        "MinJobAge=300",
        "InactiveLimit=0",
        "SchedulerType=sched/backfill",
        # Slurm delays scheduling a submitted batch job by up to batch_sched_delay (default 3 s) after its
        # last scheduling pass; on a small cluster that delay is most of a job's start latency (a bare
        # sbatch → RUNNING took 0.14-2.66 s with it, 0.35-0.81 s without).
        "SchedulerParameters=bf_interval=5,sched_interval=5,batch_sched_delay=0",
        # An epilog, as real clusters have: slurmd then reports each job's end with MESSAGE_EPILOG_COMPLETE, which
        # runs the scheduler at once. With none, a node with no steps left answers the job's termination with
        # "already complete", and slurmctld only queues a scheduling pass for its next one-second tick: the
        # freed slot stayed idle 0-1 s (mean 0.43-0.47 s) before the next pending job was allocated.
        "Epilog=/bin/true",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        "JobRequeue=1",
    ]
    gres = f" Gres=gpu:{spec.gpu_type}:{spec.gpus_per_node}" if spec.gpus_per_node else ""
    for i, name in enumerate(spec.node_names):
        lines.append(
            f"NodeName={name} NodeAddr={spec.node_ip(i)} CPUs={spec.cpus_per_node} "
            f"RealMemory={spec.mem_per_node_mb}{gres} State=UNKNOWN"
        )
    grace = f"GraceTime={spec.grace_time_s}"
    lines += [
        f"PartitionName={PARTITION_DEFAULT} Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
        f"PriorityTier=1 PreemptMode=REQUEUE {grace}",
        f"PartitionName={PARTITION_SHORT} Nodes=ALL MaxTime={spec.short_max_time_min} State=UP "
        f"PriorityTier=1 PreemptMode=REQUEUE {grace}",
        f"PartitionName={PARTITION_URGENT} Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10",
    ]
    return HEADER + "\n".join(lines) + "\n"


def _accounting_lines(spec: LocalClusterSpec) -> list[str]:
    if not spec.accounting:
        return [
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={spec.root}/log/jobcomp.log",
        ]
    return [
        "AccountingStorageType=accounting_storage/slurmdbd",
        f"AccountingStorageHost={spec.controller_ip}",
        "AccountingStorageTRES=gres/gpu",
        # As production sites do: a job needs a user association (`accounting.add_users`), and the association
        # and QOS limits (MaxSubmitJobs, MaxJobs, GrpTRES, ...) hold. `limits` implies `associations`.
        "AccountingStorageEnforce=associations,limits,qos",
        "JobAcctGatherType=jobacct_gather/linux",
        "JobAcctGatherFrequency=5",
        # Jobs that use more memory than they asked for are killed and end OUT_OF_MEMORY, as with cgroups.
        # UsePss: a shared library mapped by every rank of a job (libtorch: hundreds of MB) counts once, as a
        # cgroup would count it, not once per process (RSS); 2 torch ranks + torchrun were at the 1 GiB limit.
        "JobAcctGatherParams=UsePss,OverMemoryKill",
    ]


def render_slurmdbd_conf(spec: LocalClusterSpec, db_password: str) -> str:
    """slurmdbd.conf holds the database password: the caller writes it with mode 0600."""
    root = spec.root
    lines = [
        "AuthType=auth/munge",
        f"DbdHost={spec.controller_host}",
        f"DbdAddr={spec.controller_ip}",
        "SlurmUser=root",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={spec.accounting_db_port}",
        "StorageUser=slurm",
        f"StoragePass={db_password}",
        "StorageLoc=slurm_acct_db",
        f"PidFile={root}/run/slurmdbd.pid",
        f"LogFile={root}/log/slurmdbd.log",
        "DebugLevel=info",
    ]
    return HEADER + "\n".join(lines) + "\n"


def render_gres_conf(spec: LocalClusterSpec) -> str:
    if not spec.gpus_per_node:
        return HEADER
    last = spec.gpus_per_node - 1
    files = f"{spec.dev_dir}/nvidia0" if last == 0 else f"{spec.dev_dir}/nvidia[0-{last}]"
    return HEADER + f"NodeName={spec.node_list} Name=gpu Type={spec.gpu_type} File={files}\n"


def render_mpi_conf(spec: LocalClusterSpec) -> str:
    # All nodes share /tmp, so PMIx client directories would collide; each node's mount namespace
    # bind-mounts its own directory onto this path (Slurm does not expand %n here).
    return HEADER + f"PMIxCliTmpDirBase={PMIX_CLI_TMP_DIR}\n"


def render_hosts_block(spec: LocalClusterSpec) -> list[str]:
    return [f"{spec.node_ip(i)} {name}" for i, name in enumerate(spec.node_names)]
