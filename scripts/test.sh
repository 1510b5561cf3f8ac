#!/usr/bin/env bash
# The whole test suite on real parts, from a fresh Debian 12 machine (run as root):
# installs what is missing, brings up the local Slurm cluster (unless one is already up) and a private
# PostgreSQL, runs the linters and every test as required (no silent skips), and takes down what it started.
#   scripts/test.sh [PYTEST ARGS...]     # as root (another user: through sudo)
set -euo pipefail
HERE="$(cd "$(dirname "$0")/.." && pwd)"
cd "$HERE"

source "$HERE/scripts/_as_root.sh"

# Jobs run as a non-root researcher, who must be able to read this checkout and run its venv. If the checkout
# sits somewhere private (e.g. under /root), test a copy in a world-readable place instead.
if ! runuser -u nobody -- test -r "$HERE/pyproject.toml" 2>/dev/null; then
  COPY=/var/tmp/hpc-det-checkout
  echo "test: $HERE is not readable by other users; testing a copy in $COPY"
  rm -rf "$COPY" && mkdir -p "$COPY"
  git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$COPY"
  [ -d .git ] && cp -r .git "$COPY/.git"
  chmod -R a+rX "$COPY"
  cd "$COPY" && exec scripts/test.sh "$@"
fi

started=$(date +%s)
scripts/bootstrap.sh
export PATH="$HERE/.venv/bin:$PATH"
# Horovod for its e2e test (built once with the C++17 fix, about 2 minutes on 2 cores; cached by version).
if ! tests/e2e/distributed_context/horovod/build_wheel.sh >/var/tmp/hpc-det-horovod-build.log 2>&1; then
  echo "test: building Horovod failed (see /var/tmp/hpc-det-horovod-build.log); the Horovod test will skip"
fi

cleanup() {
  local rc=$?
  set +e
  if [ "${STARTED_CLUSTER:-0}" = 1 ]; then det deploy local down; fi
  if [ "${STARTED_PG:-0}" = 1 ]; then scripts/postgres.sh stop; fi
  echo "test: finished in $(( $(date +%s) - started )) s with exit status $rc"
  exit $rc
}
trap cleanup EXIT

# status exits 0 only when the cluster is up and its daemons run; a stale one (a state file left from before a
# restart, or a machine restored from a disk image) is removed and started afresh by `up`.
if det deploy local status >/dev/null 2>&1; then
  echo "test: using the local Slurm cluster that is already up"
else
  t0=$(date +%s)
  det deploy local up --nodes 2 --gpus-per-node 2 --cpus-per-node 4 --create-user "${DET_TEST_USER:-researcher}"
  STARTED_CLUSTER=1
  echo "test: cluster up in $(( $(date +%s) - t0 )) s"
fi
id "${DET_TEST_USER:-researcher}" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "${DET_TEST_USER:-researcher}"

if [ -z "${DET_TEST_PG_URL:-}" ]; then
  DET_TEST_PG_URL="$(scripts/postgres.sh start)"
  STARTED_PG=1
fi
export DET_TEST_PG_URL

echo "test: ruff and mypy"
ruff check .
ruff format --check .
mypy

export DET_TEST_REQUIRE_ALL=1
echo "test: pytest"
pytest -q -p no:cacheprovider "$@"
