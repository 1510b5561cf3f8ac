#!/usr/bin/env bash
# Build the small Apptainer image the container tests run trials in, without any container registry (as root):
# a Debian 12 minbase root filesystem made by debootstrap from the Debian mirror this machine already uses, with
# python3 and libstdc++6 (enough for the harness, and for torch from a bind mount), a marker file
# /etc/hpc-det-test-image and a VARIANT_ID in /etc/os-release so that tests can prove code ran inside it.
#
#   sudo scripts/build_test_image.sh     # prints the .sif path (last line); cached, fast when already built
#
# The image is cached under $HPC_DET_IMAGE_DIR (default /var/cache/hpc-det/images), keyed by this script's hash:
#   det-test-<key>.sif        the image (built to a temporary name, then renamed into place)
#   det-test-<key>.sandbox/   the same root filesystem as a sandbox directory
#   det-test.sif              a link to the current .sif
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DIR=${HPC_DET_IMAGE_DIR:-/var/cache/hpc-det/images}
KEY=$(sha256sum "$HERE/build_test_image.sh" | cut -c1-12)
SIF="$DIR/det-test-$KEY.sif"
SANDBOX="$DIR/det-test-$KEY.sandbox"
APPTAINER=${APPTAINER:-$(command -v apptainer || echo /opt/hpc-det/apptainer/usr/bin/apptainer)}

if [ -f "$SIF" ] && [ -f "$SANDBOX/etc/hpc-det-test-image" ]; then
  ln -sfn "$(basename "$SIF")" "$DIR/det-test.sif"
  echo "$SIF"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "build_test_image: run as root (debootstrap needs it)" >&2
  exit 2
fi
# One build at a time (the container tests' workers all ask at once on a fresh machine): the others wait here
# and then find the image built.
mkdir -p "$DIR"
exec 9>"$DIR/.build.lock"
flock 9
if [ -f "$SIF" ] && [ -f "$SANDBOX/etc/hpc-det-test-image" ]; then
  ln -sfn "$(basename "$SIF")" "$DIR/det-test.sif"
  echo "$SIF"
  exit 0
fi
started=$(date +%s)
if ! command -v debootstrap >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi
mirror=$(
  { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}'; } |
    grep -v -- '-security' | grep -m1 '/debian/\?$' || true
)
if [ -z "$mirror" ]; then
  echo "build_test_image: no Debian mirror found in /etc/apt/sources.list*" >&2
  exit 1
fi

mkdir -p "$DIR"
chmod 755 "$DIR"
WORK=$(mktemp -d "$DIR/.build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
ROOTFS="$WORK/rootfs"
debootstrap --variant=minbase --include=python3,libstdc++6 bookworm "$ROOTFS" "$mirror" >"$WORK/debootstrap.log" 2>&1 ||
  { tail -30 "$WORK/debootstrap.log" >&2; echo "build_test_image: debootstrap failed" >&2; exit 1; }

# Make the image recognisable from inside, and small.
echo "hpc-det-test-image $KEY" >"$ROOTFS/etc/hpc-det-test-image"
cp --remove-destination "$(readlink -f "$ROOTFS/etc/os-release")" "$ROOTFS/etc/os-release" 2>/dev/null ||
  cp --remove-destination "$ROOTFS/usr/lib/os-release" "$ROOTFS/etc/os-release"
printf 'VARIANT="hpc-det test image"\nVARIANT_ID=hpc-det-test\n' >>"$ROOTFS/etc/os-release"
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/usr/share/doc/* \
  "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/locale/* "$ROOTFS"/var/log/*

"$APPTAINER" -q build "$WORK/image.sif" "$ROOTFS/" >"$WORK/build.log" 2>&1 ||
  { tail -30 "$WORK/build.log" >&2; echo "build_test_image: apptainer build failed" >&2; exit 1; }
chmod 644 "$WORK/image.sif"
chmod -R a+rX "$ROOTFS"
rm -rf "$SANDBOX" "$SIF"
mv "$ROOTFS" "$SANDBOX"
mv "$WORK/image.sif" "$SIF"
# Images of older versions of this script are of no use any more.
find "$DIR" -maxdepth 1 -name 'det-test-*' ! -name "det-test-$KEY.*" -exec rm -rf {} +
ln -sfn "$(basename "$SIF")" "$DIR/det-test.sif"
echo "build_test_image: built $SIF ($(du -h "$SIF" | cut -f1)) in $(($(date +%s) - started)) s" >&2
echo "$SIF"
