#!/usr/bin/env bash
# Determined's official client (CLI `det` and Python SDK), unmodified, in a virtual environment of its own, for
# the tests in tests/determined_client/ (docs/determined-client.md). It lives apart from .venv on purpose: the
# PyPI `determined` package must never shadow the job-side compatibility package (determined_compat/), nor our
# `det` on PATH. Idempotent, and quick when the wanted version is already there.
#   scripts/determined_client.sh [VENV_DIR]    # default .venv-determined; prints the venv's bin/det
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-determined}
VERSION=${DET_CLIENT_VERSION:-0.38.1}
PYTHON=${DET_CLIENT_PYTHON:-/usr/bin/python3}

PINS=constraints-determined.txt  # scripts/pin.sh; used when the version is the pinned one
[ "determined==$VERSION" = "$(/usr/bin/python3 scripts/pins_inputs.py determined)" ] || PINS=/dev/null
want="$VERSION $(sha256sum "$PINS" | cut -c1-16)"

installed() {
  [ -x "$VENV/bin/det" ] && [ "$(cat "$VENV/.hpc-det-pins" 2>/dev/null)" = "$want" ] &&
    [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("determined"))' 2>/dev/null)" = "$VERSION" ]
}

if ! installed; then
  echo "determined_client: installing determined==$VERSION into $VENV (log: $VENV/install.log)" >&2
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  { "$VENV/bin/pip" --disable-pip-version-check -q install -c "$PINS" --upgrade pip &&
    "$VENV/bin/pip" --disable-pip-version-check -q install -c "$PINS" "determined==$VERSION"; } >"$VENV/install.log" 2>&1 ||
    { tail -40 "$VENV/install.log" >&2; echo "determined_client: pip failed" >&2; exit 1; }
  echo "$want" >"$VENV/.hpc-det-pins"
  installed || { echo "determined_client: $VENV/bin/det is missing after the install" >&2; exit 1; }
fi
echo "$VENV/bin/det"
