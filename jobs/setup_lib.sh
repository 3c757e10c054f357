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
