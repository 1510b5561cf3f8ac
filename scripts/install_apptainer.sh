#!/usr/bin/env bash
# Install Apptainer into a private prefix on Debian 12, which has no apptainer package (run as root).
#
# Debian unstable's apptainer runs here with unstable's libc6, libseccomp2 and libsqlite3-0 beside it: the debs
# are downloaded through a temporary apt configuration for unstable (its own sources, lists and cache in a
# temporary directory, removed on exit even on failure; the system's apt setup is never touched), unpacked with
# `dpkg -x`, and the two ELF binaries (`apptainer` and its `starter`) are pointed at the private libraries with
# patchelf. Apptainer relocates itself from where its binary lies, so its configuration and session directory
# live under the prefix too. Non-root users run images in user-namespace mode (no setuid starter).
#
#   sudo scripts/install_apptainer.sh            # idempotent: fast when already installed
#   HPC_DET_APPTAINER_PREFIX=/opt/x sudo scripts/install_apptainer.sh
#
# Result: $PREFIX/usr/bin/apptainer, linked as /usr/local/bin/apptainer unless that name is already taken.
set -euo pipefail
PREFIX=${HPC_DET_APPTAINER_PREFIX:-/opt/hpc-det/apptainer}
BIN="$PREFIX/usr/bin/apptainer"
LINK=/usr/local/bin/apptainer
PACKAGES=(apptainer libc6 libseccomp2 libsqlite3-0)

link() {
  if [ ! -e "$LINK" ] || [ "$(readlink -f "$LINK")" = "$(readlink -f "$BIN")" ]; then
    ln -sfn "$BIN" "$LINK"
  fi
}

if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1 && [ -d "$PREFIX/usr/lib/var/lib/apptainer/mnt/session" ]; then
  link
  echo "install_apptainer: $("$BIN" --version) already in $PREFIX"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "install_apptainer: run as root (it installs Debian packages and writes $PREFIX)" >&2
  exit 2
fi
started=$(date +%s)

need=()
for p in patchelf squashfs-tools uidmap; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if ((${#need[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

WORK=$(mktemp -d /var/tmp/hpc-det-apptainer.XXXXXX)
NEW="$PREFIX.new"
trap 'rm -rf "$WORK" "$NEW"' EXIT  # the temporary unstable sources go with it, whatever happens

# The Debian mirror this machine already uses, so that no host name is written here.
mirror=$(
  { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}'; } |
    grep -v -- '-security' | grep -m1 '/debian/\?$' || true
)
if [ -z "$mirror" ]; then
  echo "install_apptainer: no Debian mirror found in /etc/apt/sources.list*" >&2
  exit 1
fi
mkdir -p "$WORK/sources" "$WORK/lists/partial" "$WORK/cache/archives/partial" "$WORK/debs" "$WORK/root"
cat >"$WORK/sources/unstable.sources" <<EOF
Types: deb
URIs: $mirror
Suites: unstable
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
APT_OPTS=(
  -o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$WORK/sources"
  -o "Dir::State::Lists=$WORK/lists" -o "Dir::Cache=$WORK/cache" -o "APT::Sandbox::User=root"
)
apt-get "${APT_OPTS[@]}" update -qq
(cd "$WORK/debs" && apt-get "${APT_OPTS[@]}" download -qq "${PACKAGES[@]}")
for deb in "$WORK"/debs/*.deb; do
  dpkg -x "$deb" "$WORK/root"
done

# Build the new tree beside the old one and swap it in, so that a failed run leaves any earlier install intact.
rm -rf "$NEW"
mkdir -p "$NEW/lib" "$NEW/usr/etc" "$NEW/usr/var/lib/apptainer/mnt/session"
cp -a "$WORK/root/usr/bin" "$WORK/root/usr/lib" "$NEW/usr/"
cp -a "$WORK/root/etc/apptainer" "$NEW/usr/etc/"
cp -a "$WORK"/root/usr/lib/x86_64-linux-gnu/*.so* "$NEW/lib/"
# The starter, run from usr/lib/x86_64-linux-gnu/apptainer/bin, takes usr/lib for its prefix when it extracts a
# SIF (no squashfuse): its configuration and session directory must be found from there too.
ln -s ../etc "$NEW/usr/lib/etc"
ln -s ../var "$NEW/usr/lib/var"
for exe in "$NEW/usr/bin/apptainer" "$NEW/usr/lib/x86_64-linux-gnu/apptainer/bin/starter"; do
  patchelf --set-interpreter "$PREFIX/lib/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$PREFIX/lib" "$exe"
done
chmod -R a+rX "$NEW"
rm -rf "$PREFIX.old"
if [ -e "$PREFIX" ]; then mv "$PREFIX" "$PREFIX.old"; fi
mkdir -p "$(dirname "$PREFIX")"
mv "$NEW" "$PREFIX"
rm -rf "$PREFIX.old"
link
echo "install_apptainer: $("$BIN" --version) installed in $PREFIX in $(($(date +%s) - started)) s"
