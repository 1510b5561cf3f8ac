#!/bin/bash
# Build (once) and cache the Horovod wheel the Horovod e2e test uses, then unpack it into a site directory that
# experiments put on PYTHONPATH (the shared venv is left alone). Run as root; about 2 min on 2 cores.
#   tests/e2e/distributed_context/horovod/build_wheel.sh
# horovod 0.28.1 (the last release) asks for C++14 and torch 2.x's headers need C++17: patched below.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../../.." && pwd)
py="$repo/.venv/bin/python"
torch_v=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')
cp_v=$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
mpi_v=$(mpirun --version 2>/dev/null | head -n 1 | awk '{print "openmpi-" $NF}')
key="horovod-0.28.1_torch-${torch_v}_${cp_v}_${mpi_v}"
wheels=/var/cache/hpc-det/wheels/$key
site=/var/cache/hpc-det/site/$key
if ! ls "$wheels"/horovod-*.whl >/dev/null 2>&1; then
  build=$(mktemp -d /var/tmp/hpc-det-horovod-build.XXXXXX)
  (cd "$build" && "$py" -m pip download --no-deps --no-binary :all: horovod==0.28.1 -d . \
    && tar xzf horovod-0.28.1.tar.gz)
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
    "$build/horovod-0.28.1/CMakeLists.txt" "$build/horovod-0.28.1/horovod/torch/CMakeLists.txt"
  mkdir -p "$wheels"
  (cd "$build/horovod-0.28.1" && HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 MAKEFLAGS=-j"$(nproc)" \
    "$py" -m pip wheel --no-build-isolation --no-deps -w "$wheels" .)
  rm -rf "$build"
fi
if [ ! -d "$site/horovod" ]; then
  "$py" -m pip install --no-deps --target "$site" "$wheels"/horovod-*.whl
  # Only the dependencies the venv lacks: what lies in $site shadows the venv's packages on PYTHONPATH.
  missing=$("$py" - <<'PY'
import importlib.util
need = {"cloudpickle": "cloudpickle", "psutil": "psutil", "cffi": "cffi", "yaml": "pyyaml", "packaging": "packaging"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
PY
)
  if [ -n "$missing" ]; then "$py" -m pip install --target "$site" $missing; fi
  chmod -R a+rX "$site"
fi
echo "$site"
