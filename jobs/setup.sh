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
# shellcheck source=jobs/setup_lib.sh
source jobs/setup_lib.sh  # policy-rc.d, a site's Slurm, the wheel cache

# 1. System packages (skipped when present): Open MPI, parallel HDF5, and Slurm + munge for the
#    tests' throw-away cluster (tests/support/slurm_cluster.py starts its own daemons), unless the site has
#    a Slurm of its own: never installed over (the Slurm tests use it or say why they skip). apt
#    must not start any daemon: a policy-rc.d that says no is in place while it runs, and gone on
#    every way out (with_policy_rc_d), unless the site has its own.
have() { PATH="$PATH:/usr/sbin:/sbin" command -v "$1" >/dev/null; }
packages=(libhdf5-openmpi-dev openmpi-bin libopenmpi-dev pkg-config)
if site_slurm; then
  log "a site Slurm is installed ($(PATH="$PATH:/usr/sbin:/sbin" command -v sbatch), no Debian package's): used as it is, no slurmctld/slurmd/slurm-client/munge installed over it (the Slurm tests use what is there or are skipped, saying why)"
elif ! have slurmctld || ! have slurmd || ! have sbatch || ! have munged; then
  packages+=(slurmctld slurmd slurm-client munge)
fi
if ! have mpicc || ! have mpirun || [ ! -d "$HDF5_DIR/include" ] || ((${#packages[@]} > 4)); then
  log "installing ${packages[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  with_policy_rc_d apt-get update -qq
  with_policy_rc_d apt-get install -y -qq "${packages[@]}" >/dev/null
fi

# 2. Stamp: what this environment was built from. Unchanged -> nothing to do.
HDF5_VER=$(dpkg-query -W -f='${Version}' libhdf5-openmpi-dev 2>/dev/null || echo unknown)
MPI_VER=$(dpkg-query -W -f='${Version}' libopenmpi-dev 2>/dev/null || echo unknown)
STAMP_TEXT="$(cat "$0" jobs/setup_lib.sh setup.cfg 2>/dev/null | sha256sum | cut -c1-16) hdf5=$HDF5_VER mpi=$MPI_VER"
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
#    The cache is a folder of this user's, mode 0700; a wheel is built in a temporary folder and
#    moved in whole, and a cached one is tested (a truncated zip is rebuilt, never installed).
BASE="${MPICD_WHEEL_CACHE:-$HOME/.cache/mpicd-wheels}"
private_folder "$BASE"
CACHE="$BASE/$(echo "hdf5=$HDF5_VER mpi=$MPI_VER $("$PY" -c 'import sys;print(sys.version_info[:2])')" | sha256sum | cut -c1-12)"
private_folder "$CACHE"
build_mpi4py() {
  log "compiling mpi4py against $(mpicc --showme:version 2>&1 | head -1)"
  MPICC=mpicc "$PY" -m pip wheel -q --no-deps --no-binary=mpi4py -w "$1" mpi4py
}
build_h5py() {
  log "compiling h5py against parallel HDF5 in $HDF5_DIR (several minutes)"
  CC=mpicc HDF5_MPI=ON HDF5_DIR="$HDF5_DIR" "$PY" -m pip wheel -q --no-deps \
    --no-binary=h5py --no-build-isolation -w "$1" h5py
}
cached_wheel "$CACHE" mpi4py build_mpi4py
"$PY" -m pip install -q --no-index --find-links "$CACHE" mpi4py  # h5py's MPI build imports it
cached_wheel "$CACHE" h5py build_h5py
"$PY" -m pip install -q --no-index --find-links "$CACHE" h5py
"$PY" -c 'import h5py, sys; sys.exit(0 if h5py.get_config().mpi else "h5py was built without MPI")'

# 5. PyTorch (pinned) and mpicd itself with its test, privacy (opacus, dp-accounting: the private
#    path's tests run in CI) and docs (Sphinx with MyST: jobs/docs.sh) extras. The torch pins are
#    repeated in the same install so that resolving the extras can never up- or downgrade torch.
"$PY" -m pip install -q $TORCH_PIN
"$PY" -m pip install -q -e ".[test,privacy,docs]" $TORCH_PIN

echo "$STAMP_TEXT" > "$STAMP"
log "done: $("$PY" -c 'import mpi4py, h5py, torch; print("mpi4py", mpi4py.__version__, "h5py", h5py.__version__, "torch", torch.__version__)')"
