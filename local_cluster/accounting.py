"""Job accounting for the local cluster: a private MariaDB on loopback and slurmdbd, so `sacct` works.

Both run from the cluster's state directory and are stopped and removed by `down`; the machine's own MariaDB
(if any) is never touched.
"""

from __future__ import annotations

import os
import secrets
import subprocess

from local_cluster import render, system
from local_cluster.spec import LocalClusterSpec


def start(spec: LocalClusterSpec, slurm_env: dict[str, str]) -> None:
    _start_mariadb(spec)
    password = secrets.token_urlsafe(24)
    _create_db_user(spec, password)
    conf = spec.etc_dir / "slurmdbd.conf"
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(render.render_slurmdbd_conf(spec, password))
    subprocess.run(["slurmdbd"], check=True, env=slurm_env, timeout=60)
    _wait_dbd(spec, slurm_env)


def _start_mariadb(spec: LocalClusterSpec) -> None:
    data = spec.db_dir / "data"
    data.mkdir(parents=True, exist_ok=True)
    system.run(["chown", "-R", "mysql:mysql", str(spec.db_dir)])
    system.run(
        [
            "mariadb-install-db", "--no-defaults", "--user=mysql", f"--datadir={data}",
            "--auth-root-authentication-method=socket", "--skip-test-db",
        ],
        timeout_s=120,
    )  # fmt: skip
    cmd = [
        "runuser", "-u", "mysql", "--", "mariadbd", "--no-defaults", f"--datadir={data}",
        f"--socket={spec.db_socket}", f"--pid-file={spec.db_dir / 'mariadb.pid'}",
        "--bind-address=127.0.0.1", f"--port={spec.accounting_db_port}", "--skip-name-resolve",
        f"--log-error={spec.log_dir / 'mariadb.log'}", "--innodb-buffer-pool-size=64M",
    ]  # fmt: skip
    system.run(["chown", "mysql:mysql", str(spec.log_dir)])
    subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)  # fmt: skip
    system.wait_until(lambda: _sql(spec, "SELECT 1").returncode == 0, 60, "MariaDB did not start")
    system.run(["chown", "root:root", str(spec.log_dir)])
    spec.log_dir.chmod(0o755)


def _sql(spec: LocalClusterSpec, statement: str) -> subprocess.CompletedProcess[str]:
    return system.run(
        ["mariadb", "--no-defaults", f"--socket={spec.db_socket}", "-e", statement], check=False
    )


def _create_db_user(spec: LocalClusterSpec, password: str) -> None:
    # The password is generated here (URL-safe characters only), never taken from input.
    for statement in (
        f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'",
        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'",
    ):
        proc = _sql(spec, statement)
        if proc.returncode != 0:
            raise system.CommandError(f"MariaDB refused to set up the slurm user: {proc.stderr.strip()}")


def _wait_dbd(spec: LocalClusterSpec, env: dict[str, str]) -> None:
    def ready() -> bool:
        proc = subprocess.run(
            ["sacctmgr", "-n", "-P", "list", "cluster"], capture_output=True, text=True, env=env, check=False
        )
        return proc.returncode == 0

    system.wait_until(ready, 60, f"slurmdbd did not answer; see {spec.log_dir / 'slurmdbd.log'}")
    proc = subprocess.run(
        ["sacctmgr", "-i", "add", "cluster", spec.cluster_name],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if proc.returncode != 0 and "already exists" not in proc.stdout + proc.stderr:
        raise system.CommandError(
            f"sacctmgr add cluster failed: {proc.stderr.strip() or proc.stdout.strip()}"
        )


# The Slurm account every `--create-user` account is associated with. The cluster enforces associations
# (`AccountingStorageEnforce=associations,limits,qos`), so a user without one cannot submit at all; root's
# association comes with `sacctmgr add cluster`.
LOCAL_ACCOUNT = "research"


def add_users(spec: LocalClusterSpec, users: tuple[str, ...], env: dict[str, str]) -> None:
    """Give each user an association (account `LOCAL_ACCOUNT`, default QOS `normal`, no limits); idempotent."""
    if not users:
        return
    _sacctmgr(
        env, "add", "account", LOCAL_ACCOUNT, f"Cluster={spec.cluster_name}",
        "Description=researchers", "Organization=local",
    )  # fmt: skip
    for user in users:
        _sacctmgr(env, "add", "user", user, f"Account={LOCAL_ACCOUNT}", f"Cluster={spec.cluster_name}")


def _sacctmgr(env: dict[str, str], *args: str) -> None:
    proc = subprocess.run(
        ["sacctmgr", "-i", *args], capture_output=True, text=True, env=env, check=False, timeout=60
    )
    text = proc.stdout + proc.stderr
    if proc.returncode != 0 and "Nothing new added" not in text and "already exists" not in text:
        raise system.CommandError(f"sacctmgr {' '.join(args[:3])} failed: {text.strip()}")


def stop(spec: LocalClusterSpec) -> None:
    system.terminate(system.pids_named("slurmdbd"))
    pid = system.read_pid(spec.db_dir / "mariadb.pid")
    if pid:
        system.terminate([pid], timeout_s=30)
