#!/usr/bin/env bash
# The fast lane: the linters (ruff, mypy, Biome for the web UI), then every test that needs no root, no Slurm, no
# PostgreSQL, no browser, no Determined client, no Apptainer and no GPU, on every core (pytest-xdist). No root:
# any user who can read the checkout runs it, after scripts/bootstrap.sh has run once (as root). CI (scripts/test.sh)
# runs it as an unprivileged account in two parts: the linters first (the cluster starts only if they pass), the
# tests beside the exclusive lane, whose tests mostly wait.
#   scripts/test-fast.sh [PYTEST ARGS...]      # e.g. -x, -k name, or a path (then only the tests there)
#   scripts/test-fast.sh --lint                # only the linters
#   scripts/test-fast.sh --no-lint [ARGS...]   # only the tests
#   DET_TEST_WORKERS=1 scripts/test-fast.sh    # one process (default 3: on 2 cores, 3 workers keep both busy)
set -euo pipefail
HERE="$(cd "$(dirname "$0")/.." && pwd)"
cd "$HERE"

if [ ! -x .venv/bin/pytest ] || [ ! -x node_modules/.bin/biome ]; then
  echo "test-fast: the project is not installed here: run scripts/bootstrap.sh once (as root)" >&2
  exit 2
fi
export PATH="$HERE/.venv/bin:$PATH"
# The tests of the fast lane, by marker (pyproject.toml lists the markers): the rest need a service or root.
FAST_LANE="not slurm and not postgres and not browser and not determined_client and not apptainer and not gpu and not root and not exclusive"

# Caches where this user may write: the checkout may belong to someone else (CI runs this as another account).
if [ -w "$HERE" ]; then cache="$HERE/.cache"; else cache="${TMPDIR:-/tmp}/hpc-det-cache-$(id -u)"; fi
mkdir -p "$cache"
export RUFF_CACHE_DIR="$cache/ruff" MYPY_CACHE_DIR="$cache/mypy" HYPOTHESIS_STORAGE_DIRECTORY="$cache/hypothesis"
export PYTHONDONTWRITEBYTECODE=1
# A test in this lane that asks for a service is missing its marker: fail it rather than skip it.
export DET_TEST_REQUIRE_ALL=1

started=$(date +%s)
parts=all
case "${1:-}" in
  --lint) parts=lint; shift ;;
  --no-lint) parts=tests; shift ;;
esac
if [ "$parts" != tests ]; then
  echo "test-fast: ruff, mypy and biome"
  ruff check --quiet .
  ruff format --check --quiet .
  mypy
  node_modules/.bin/biome ci --error-on-warnings --colors=off webui/js >"$cache/biome.log" 2>&1 ||
    { cat "$cache/biome.log"; echo "test-fast: biome found problems in webui/js" >&2; exit 1; }
  if [ "$parts" = lint ]; then
    echo "test-fast: the linters passed in $(($(date +%s) - started)) s"
    exit 0
  fi
fi

echo "test-fast: pytest -m \"$FAST_LANE\""
rc=0
pytest -q -p no:cacheprovider -n "${DET_TEST_WORKERS:-3}" --dist worksteal -m "$FAST_LANE" "$@" || rc=$?
echo "test-fast: finished in $(($(date +%s) - started)) s with exit status $rc"
exit $rc
