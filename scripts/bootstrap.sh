#!/usr/bin/env bash
# Install everything the project needs on a fresh Debian 12 machine (idempotent; fast when already done):
# Debian packages, then a virtual environment at .venv built from Debian's /usr/bin/python3 so that
# non-root researcher accounts can run its interpreter inside Slurm jobs.
# Usage: scripts/bootstrap.sh [VENV_DIR]     # as root (another user: through sudo)
set -euo pipefail
source "$(dirname "$0")/_as_root.sh"
cd "$(dirname "$0")/.."
VENV=${1:-.venv}

APT_PACKAGES=(
  slurm-wlm slurmdbd mariadb-server munge libpmix2 openmpi-bin libopenmpi-dev iproute2 util-linux passwd sudo
  python3 python3-venv python3-dev build-essential
  openssl  # the web UI's generated certificate (hpc_master/browser_tls.py)
  libldap2-dev libsasl2-dev  # python-ldap's build (the `ldap` extra: LDAP logins)
  slapd ldap-utils  # the real OpenLDAP server of the LDAP login tests (tests/ldap_server.py)
  postgresql
  chromium fonts-liberation
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian's postinst may start the services it just installed; the project starts private ones of its own.
  for svc in postgresql mariadb munge slapd; do
    [[ " ${missing[*]} " == *" ${svc}"* ]] && service "$svc" stop >/dev/null 2>&1 || true
  done
fi

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.base_prefix != "/usr")' 2>/dev/null; then
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV"
fi
PIP=("$VENV/bin/pip" --disable-pip-version-check -q)
PINS=(-c constraints.txt)
stamp="$VENV/.hpc-det-deps"
# Every install takes its versions from constraints.txt (scripts/pin.sh): a fresh clone installs what CI tested.
want="$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing Python packages into $VENV (log: $VENV/bootstrap.log)"
  {
    "${PIP[@]}" install "${PINS[@]}" --upgrade pip &&
    # The CPU build of torch lies on this machine's disk; ask for it by exact version first so that the
    # `torch>=` range of the extra is already satisfied and no CUDA build is downloaded.
    "${PIP[@]}" install "${PINS[@]}" "$(/usr/bin/python3 scripts/pins_inputs.py torch)" &&
    "${PIP[@]}" install "${PINS[@]}" -e '.[dev,bench,mpi,torch,examples,interactive,ldap]' &&
    # DeepSpeed (the `deepspeed` extra) builds against the torch above (no build isolation: an isolated build
    # would fetch the newest CUDA torch), with its CPU shared-memory collective op compiled now (~50 s) rather
    # than by each user's first job: a job killed during that JIT build leaves a lock in
    # ~/.cache/torch_extensions that makes every later DeepSpeed job of that user wait forever.
    # No wheel cache: a cached wheel may have been built without the op.
    deepspeed_req=$("$VENV/bin/python" -c 'import tomllib
print(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["deepspeed"][0])') &&
    DS_ACCELERATOR=cpu DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 \
      "${PIP[@]}" install "${PINS[@]}" --no-build-isolation --no-cache-dir "$deepspeed_req" &&
    "$VENV/bin/python" -c 'from deepspeed.git_version_info import installed_ops as o; assert o["deepspeed_shm_comm"]'
  } >"$VENV/bootstrap.log" 2>&1 || { tail -40 "$VENV/bootstrap.log"; echo "bootstrap: pip failed" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
# Bytecode for the packages that jobs import, as `pip install` writes it for an installed copy: jobs run as the
# users' own accounts, which cannot write __pycache__ here, and would otherwise compile these modules at each
# start. Measured: importing the job entry took 8-10 ms instead of 13-18 ms and 11.3 MB instead of 12.6 MB; in
# a rank that also imports torch the difference is lost in the noise (222.4-222.6 MB either way).
"$VENV/bin/python" -m compileall -q harness launchers containers slurm_backend >/dev/null
# Determined's official client (determined==0.38.1) in a virtual environment of its own, for the tests that run
# it against our master (tests/determined_client/); never on the jobs' path. Fast when already installed.
scripts/determined_client.sh >/dev/null
scripts/install_apptainer.sh  # Apptainer in a private prefix (Debian 12 has none); fast when already installed
# The web UI's formatter and linter (Biome, package-lock.json), run offline by the test scripts.
if ! command -v npm >/dev/null 2>&1; then
  echo "bootstrap: installing Debian's nodejs and npm (for the web UI's linter)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
js_want="$(sha256sum package-lock.json | cut -c1-16)"
if [ "$(cat node_modules/.hpc-det-lock 2>/dev/null)" != "$js_want" ]; then
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
  echo "$js_want" > node_modules/.hpc-det-lock
fi
echo "bootstrap: ready ($("$VENV/bin/python" --version), $VENV)"
