#!/usr/bin/env bash
# The whole test suite on real parts, from a fresh Debian 12 machine (run as root): installs what is missing,
# runs the linters (scripts/test-fast.sh --lint, as an unprivileged account; if they fail, nothing else starts),
# then brings up the local Slurm cluster (unless one is already up) and a private PostgreSQL and runs every test
# as required (no silent skips): the cluster lane (tests on the cluster that can share it, several at a time),
# then the exclusive lane (tests that need the cluster to themselves, one at a time; they mostly wait) beside the
# services lane (PostgreSQL, the browser, Determined's client, root; no cluster) and after it the fast lane's
# tests (no service, no root; as the unprivileged account). It takes down what it started.
# docs/testing.md has the lanes and markers.
#   scripts/test.sh                      # as root (another user: through sudo); what CI runs
#   scripts/test.sh [PYTEST ARGS...]     # only these tests, in one pytest, with the cluster and PostgreSQL up
#   DET_TEST_WORKERS=N                   # workers of the cluster lane (default 6)
#   DET_TEST_NODES=N                     # nodes of the cluster lane's cluster (default 4; the exclusive lane gets 2)
set -euo pipefail
HERE="$(cd "$(dirname "$0")/.." && pwd)"
cd "$HERE"

source "$HERE/scripts/_as_root.sh"

# Jobs run as a non-root researcher, who must be able to read this checkout and run its venv; a master serving as
# its service account runs the per-user helper from it, which must be root's (hpc_master/helper_integrity.py). If
# the checkout sits somewhere private (e.g. under /root) or is another user's, test a root-owned copy in a
# world-readable place instead.
not_roots=$(find "$HERE" -path "$HERE/.git" -prune -o ! -user root -print -quit 2>/dev/null || true)
if ! runuser -u nobody -- test -r "$HERE/pyproject.toml" 2>/dev/null || [ -n "$not_roots" ]; then
  COPY=/var/tmp/hpc-det-checkout
  echo "test: $HERE is not readable by other users, or not all root's (${not_roots:-}); testing a copy in $COPY"
  rm -rf "$COPY" && mkdir -p "$COPY"
  git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$COPY"
  [ -d .git ] && cp -r .git "$COPY/.git"
  chmod -R a+rX "$COPY"
  cd "$COPY" && exec scripts/test.sh "$@"
fi

started=$(date +%s)
# Each phase line says how busy the CPUs were since the last one (from /proc/stat): where CI's time goes.
cpu_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat; }
read -r busy0 total0 < <(cpu_ticks)
phase() {
  local busy total
  read -r busy total < <(cpu_ticks)
  echo "test: $1 ($(($(date +%s) - started)) s in; CPUs $((100 * (busy - busy0) / (total - total0 + 1)))% busy since the last phase)"
  busy0=$busy total0=$total
}
scripts/bootstrap.sh
export PATH="$HERE/.venv/bin:$PATH"
export DET_TEST_REQUIRE_ALL=1
# Every test process carries this session's id (tests/leakgate.py); whatever is left of them at the end is killed.
export HPC_DET_TEST_SESSION="${HPC_DET_TEST_SESSION:-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')}"

# Core dumps: a process that crashes during the run leaves its core here, and the leak gate fails the test
# during which it appeared. The machine's own settings come back at the end.
CORE_DIR="/var/tmp/hpc-det-cores/$HPC_DET_TEST_SESSION"
mkdir -p "$CORE_DIR" && chmod 1777 "$CORE_DIR"
old_core_pattern="$(cat /proc/sys/kernel/core_pattern)"
if echo "$CORE_DIR/core.%e.%p" >/proc/sys/kernel/core_pattern 2>/dev/null; then
  export DET_TEST_CORE_DIR="$CORE_DIR"
else
  echo "test: cannot set the kernel's core pattern here; core files are not checked"
fi
ulimit -c unlimited

cleanup() {
  local rc=$?
  set +e
  [ -n "${old_core_pattern:-}" ] && echo "$old_core_pattern" >/proc/sys/kernel/core_pattern 2>/dev/null
  if [ "${STARTED_CLUSTER:-0}" = 1 ]; then det deploy local down; fi
  if [ "${STARTED_PG:-0}" = 1 ]; then scripts/postgres.sh stop; fi
  # Test processes that outlived pytest (this script killed, or pytest): whatever carries this session's id but
  # the cluster's and PostgreSQL's daemons (tests/leakgate.py's DAEMONS) and this script. (The loop's own short
  # pipelines carry it too; killing one of them only skips that process.)
  for env in /proc/[0-9]*/environ; do
    pid=${env#/proc/}; pid=${pid%/environ}
    [ "$pid" = $$ ] && continue
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
    case "$comm" in slurmctld|slurmd|slurmdbd|slurmstepd|munged|mariadbd|mysqld|postgres) continue ;; esac
    if { tr '\0' '\n' <"$env"; } 2>/dev/null | grep -qx "HPC_DET_TEST_SESSION=$HPC_DET_TEST_SESSION"; then
      kill -9 "$pid" 2>/dev/null && echo "test: killed leftover process $pid ($comm)"
    fi
  done
  phase "the end"
  echo "test: finished in $(($(date +%s) - started)) s with exit status $rc"
  exit $rc
}
trap cleanup EXIT

# The fast lane runs as an account that is not root, in two parts: its linters first (if they fail, nothing else
# runs), its tests at the end, beside the exclusive lane (they need the CPUs that lane's waiting leaves idle).
fast_lane() {
  local home rc=0
  home=$(mktemp -d /tmp/hpc-det-fast.XXXXXX) && chown nobody "$home"
  runuser -u nobody -- env HOME="$home" TMPDIR="$home" PATH="$PATH" scripts/test-fast.sh "$@" || rc=$?
  rm -rf "$home"
  return $rc
}
if [ $# -eq 0 ]; then
  phase "the fast lane's linters (scripts/test-fast.sh --lint, as nobody)"
  if ! fast_lane --lint; then
    echo "test: the linters failed (above); the cluster was not started and nothing else ran" >&2
    exit 1
  fi
fi

# Horovod for its e2e test (built once with the C++17 fix, about 2 minutes on 2 cores; cached by version). It
# builds while the shared lane runs; the Horovod test waits for it (tests/e2e/test_distributed.py).
export DET_TEST_HOROVOD_LOG=/var/tmp/hpc-det-horovod-build.log
rm -f "$DET_TEST_HOROVOD_LOG.done"
( tests/e2e/distributed_context/horovod/build_wheel.sh >"$DET_TEST_HOROVOD_LOG" 2>&1
  echo $? >"$DET_TEST_HOROVOD_LOG.done" ) &

# status exits 0 only when the cluster is up and its daemons run; a stale one (a state file left from before a
# restart, or a machine restored from a disk image) is removed and started afresh by `up`.
# The cluster lane gets four nodes (two 4-GPU trials at once: each takes two nodes' 2 GPUs); the exclusive
# lane's tests fill, preempt or restart the whole cluster and expect the 2-node one, which it gets after. Tests
# in the cluster lane work on either (they never name a node). Only a cluster this script started is resized.
cluster_up() {
  local t0 nodes=$1
  shift
  t0=$(date +%s)
  det deploy local up "$@" --nodes "$nodes" --gpus-per-node 2 --cpus-per-node 4 \
    --create-user "${DET_TEST_USER:-researcher}"
  STARTED_CLUSTER=1
  echo "test: cluster of $nodes nodes up in $(($(date +%s) - t0)) s"
}
if det deploy local status >/dev/null 2>&1; then
  echo "test: using the local Slurm cluster that is already up"
elif [ $# -eq 0 ]; then
  cluster_up "${DET_TEST_NODES:-4}"
else
  cluster_up 2
fi
id "${DET_TEST_USER:-researcher}" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "${DET_TEST_USER:-researcher}"

if [ -z "${DET_TEST_PG_URL:-}" ]; then
  DET_TEST_PG_URL="$(scripts/postgres.sh start)"
  STARTED_PG=1
fi
export DET_TEST_PG_URL

PYTEST=(pytest -q -p no:cacheprovider)
if [ $# -gt 0 ]; then
  phase "pytest $*"
  "${PYTEST[@]}" "$@"
  exit
fi
FAST_LANE="not slurm and not postgres and not browser and not determined_client and not apptainer and not gpu and not root and not exclusive"
LOGS=$(mktemp -d /var/tmp/hpc-det-test-logs.XXXXXX)
rc=0
phase "the cluster lane: the tests on the cluster that can share it, ${DET_TEST_WORKERS:-6} at a time"
"${PYTEST[@]}" -n "${DET_TEST_WORKERS:-6}" --dist load --durations=15 -m "slurm and not exclusive" || rc=$?
# The tests that need the cluster to themselves mostly wait on it (an outage, a preemption's grace time, a
# time limit, `down` and `up`), so the other services' tests (PostgreSQL, the browser, Determined's client,
# root) run beside them; each lane's output is printed whole when both have ended.
if [ "${STARTED_CLUSTER:-0}" = 1 ] && [ "${DET_TEST_NODES:-4}" != 2 ]; then
  phase "the 2-node cluster for the exclusive lane"
  det deploy local down >/dev/null
  cluster_up 2 --no-install
fi
phase "the exclusive lane (one at a time) beside the services lane (no cluster, 2 at a time), then the fast lane"
"${PYTEST[@]}" --durations=10 -m "exclusive" >"$LOGS/exclusive.log" 2>&1 &
exclusive=$!
"${PYTEST[@]}" -n 2 --dist load --durations=10 -m "not slurm and not exclusive and not ($FAST_LANE)" \
  >"$LOGS/services.log" 2>&1 || rc=$?
phase "the fast lane's tests (scripts/test-fast.sh --no-lint, as nobody) beside the exclusive lane"
fast_lane --no-lint --durations=10 >"$LOGS/fast.log" 2>&1 || rc=$?
phase "the services and fast lanes ended; waiting for the exclusive lane"
wait $exclusive || rc=$?
for lane in exclusive services fast; do
  echo "test: ---- the $lane lane ----"
  cat "$LOGS/$lane.log"
done
rm -rf "$LOGS"
exit $rc
