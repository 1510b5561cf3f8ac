# Sourced first by the scripts that need root (they install packages and start daemons and namespaces). On a
# fresh Debian 12 machine used as root there is no sudo, so the README's commands carry none: as root this
# does nothing; as another user it re-runs the script with sudo (keeping the environment, e.g. DET_TEST_PG_URL)
# where sudo exists, and otherwise says how to run it.
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    exec sudo -E "$0" "$@"
  fi
  echo "$(basename "$0") must run as root (it installs packages and starts Slurm daemons), and this machine has no sudo: run it as root" >&2
  exit 2
fi
