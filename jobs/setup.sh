#!/usr/bin/env bash
# Idempotent set-up of everything mpicd needs on a fresh Debian machine (as root):
# Open MPI + parallel HDF5 from apt, a venv in .venv/, mpi4py and h5py compiled against that MPI,
# torch/torchvision, and mpicd itself (editable). A second call checks a stamp and returns quickly.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
MULTIARCH=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
HDF5_DIR="/usr/lib/$MULTIARCH/hdf5/openmpi"
TORCH_PIN="torch==2.14.1 torchvision==0.29.1"

log() { printf '[setup] %s\n' "$*"; }

# 1. System packages (skipped when present): Open MPI, parallel HDF5, and Slurm + munge for the
#    tests' throw-away cluster (tests/slurm_cluster.py starts its own daemons). apt must not start
#    any daemon: a policy-rc.d that says no is in place while it runs (unless the site has one).
have() { PATH="$PATH:/usr/sbin:/sbin" command -v "$1" >/dev/null; }
if ! have mpicc || ! have mpirun || [ ! -d "$HDF5_DIR/include" ] \
   || ! have slurmctld || ! have slurmd || ! have sbatch || ! have munged; then
  log "installing Open MPI, parallel HDF5, Slurm and munge (apt)"
  export DEBIAN_FRONTEND=noninteractive
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
  fi
  apt-get update -qq
  apt-get install -y -qq libhdf5-openmpi-dev openmpi-bin libopenmpi-dev pkg-config \
    slurmctld slurmd slurm-client munge >/dev/null
fi

# 2. Stamp: what this environment was built from. Unchanged -> nothing to do.
HDF5_VER=$(dpkg-query -W -f='${Version}' libhdf5-openmpi-dev 2>/dev/null || echo unknown)
MPI_VER=$(dpkg-query -W -f='${Version}' libopenmpi-dev 2>/dev/null || echo unknown)
STAMP_TEXT="$(cat "$0" setup.cfg 2>/dev/null | sha256sum | cut -c1-16) hdf5=$HDF5_VER mpi=$MPI_VER"
STAMP="$VENV/.mpicd-setup"
if [ -x "$PY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ]; then
  log "environment up to date ($VENV)"
  exit 0
fi

# 3. The venv and the build tools mpi4py/h5py need.
[ -x "$PY" ] || python3 -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip "setuptools>=77" wheel
"$PY" -m pip install -q cython pkgconfig numpy

# 4. mpi4py and h5py, compiled against the system Open MPI / parallel HDF5.
#    Built wheels are cached outside the clone (keyed by the library versions) so later
#    CI runs skip the ~5 min compile; a fresh machine builds them once.
CACHE="${MPICD_WHEEL_CACHE:-$HOME/.cache/mpicd-wheels}/$(echo "hdf5=$HDF5_VER mpi=$MPI_VER $("$PY" -c 'import sys;print(sys.version_info[:2])')" | sha256sum | cut -c1-12)"
mkdir -p "$CACHE"
if ! ls "$CACHE"/mpi4py-*.whl >/dev/null 2>&1; then
  log "compiling mpi4py against $(mpicc --showme:version 2>&1 | head -1)"
  MPICC=mpicc "$PY" -m pip wheel -q --no-deps --no-binary=mpi4py -w "$CACHE" mpi4py
fi
"$PY" -m pip install -q --no-index --find-links "$CACHE" mpi4py  # h5py's MPI build imports it
if ! ls "$CACHE"/h5py-*.whl >/dev/null 2>&1; then
  log "compiling h5py against parallel HDF5 in $HDF5_DIR (several minutes)"
  CC=mpicc HDF5_MPI=ON HDF5_DIR="$HDF5_DIR" "$PY" -m pip wheel -q --no-deps \
    --no-binary=h5py --no-build-isolation -w "$CACHE" h5py
fi
"$PY" -m pip install -q --no-index --find-links "$CACHE" h5py
"$PY" -c 'import h5py, sys; sys.exit(0 if h5py.get_config().mpi else "h5py was built without MPI")'

# 5. PyTorch (pinned) and mpicd itself with its test and privacy extras (opacus, dp-accounting:
#    the private path's tests run in CI). The torch pins are repeated in the same install so that
#    resolving the extras can never up- or downgrade torch (pip fails instead).
"$PY" -m pip install -q $TORCH_PIN
"$PY" -m pip install -q -e ".[test,privacy]" $TORCH_PIN

echo "$STAMP_TEXT" > "$STAMP"
log "done: $("$PY" -c 'import mpi4py, h5py, torch; print("mpi4py", mpi4py.__version__, "h5py", h5py.__version__, "torch", torch.__version__)')"
