#!/usr/bin/env bash
# Regenerate the pinned constraints from pyproject.toml (run it after changing any requirement there):
#   constraints.txt             every package of the project's venv (.venv), all extras, resolved together
#   constraints-determined.txt  Determined's official client venv (.venv-determined)
# scripts/bootstrap.sh and scripts/determined_client.sh install with these, so a release upstream never changes
# what a fresh clone installs; tests/unit/test_pins.py fails when pyproject.toml's requirements changed and this
# was not run. Needs the package registry (PyPI); no root. pip-tools runs from a venv of its own.
#   scripts/pin.sh [--upgrade]     # --upgrade: take the newest releases that fit, not the pinned ones
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=${DET_PIPTOOLS_VENV:-/var/tmp/hpc-det-piptools}
PIPTOOLS_VERSION=7.6.2
PYTHON=/usr/bin/python3  # the interpreter both venvs are built from (Debian 12's)

if ! "$TOOLS/bin/pip-compile" --version 2>/dev/null | grep -q "$PIPTOOLS_VERSION"; then
  rm -rf "$TOOLS"
  "$PYTHON" -m venv "$TOOLS"
  "$TOOLS/bin/pip" --disable-pip-version-check -q install "pip-tools==$PIPTOOLS_VERSION"
fi

digest=$("$PYTHON" scripts/pins_inputs.py digest)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" scripts/pins_inputs.py torch >"$tmp/torch.txt"
"$PYTHON" scripts/pins_inputs.py tools >"$tmp/tools.in"
compile=("$TOOLS/bin/pip-compile" --quiet --no-emit-index-url --no-emit-find-links --strip-extras --allow-unsafe
  --no-header --resolver=backtracking)
[ "${1:-}" = --upgrade ] && compile+=(--upgrade)

header() {
  printf '# Pinned by scripts/pin.sh from %s; do not edit by hand.\n# inputs: %s\n' "$1" "$digest"
}

# Every extra at once: the venv holds them all, so they must agree with each other. torch is the CPU build
# that lies on the machines' disk (its exact version; a range would take a CUDA build of several GB).
[ -f constraints.txt ] && cp constraints.txt "$tmp/project.txt"
"${compile[@]}" --extra "$("$PYTHON" scripts/pins_inputs.py extras)" -c "$tmp/torch.txt" \
  -o "$tmp/project.txt" pyproject.toml "$tmp/tools.in"
# The inputs' temporary paths out of pip-compile's "via" comments, so that pinning twice writes the same file.
strip_tmp() { sed "s|$tmp/||g" "$1"; }
{ header "pyproject.toml (every extra)"; strip_tmp "$tmp/project.txt"; } >constraints.txt

"$PYTHON" scripts/pins_inputs.py determined >"$tmp/determined.in"
[ -f constraints-determined.txt ] && cp constraints-determined.txt "$tmp/determined.txt"
"${compile[@]}" -o "$tmp/determined.txt" "$tmp/determined.in" "$tmp/tools.in"
{ header "$("$PYTHON" scripts/pins_inputs.py determined)"; strip_tmp "$tmp/determined.txt"; } >constraints-determined.txt

echo "pin: constraints.txt ($(grep -c '==' constraints.txt) pins), constraints-determined.txt ($(grep -c '==' constraints-determined.txt) pins); inputs $digest"
