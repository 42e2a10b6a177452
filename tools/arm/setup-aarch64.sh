#!/usr/bin/env bash
# setup-aarch64.sh [SYSROOT]
#
# Builds an arm64 (aarch64) Debian sysroot with python3 + numpy + pytest that
# runs on this x86_64 machine under QEMU user-mode emulation, without
# binfmt_misc, chroot or debootstrap. Must run as root on Debian (uses apt-get).
#
#   SYSROOT            folder to build (default: .arm64-sysroot)
#
# Knobs (environment):
#   ARM_NUMPY=pypi     (default) Debian's arm64 python3 + numpy/pytest wheels
#                      from PyPI (manylinux aarch64), installed by the host's pip.
#   ARM_NUMPY=debian   everything from Debian's arm64 packages
#                      (python3-numpy, python3-pytest; no pip involved).
#   ARM_PIP_PACKAGES   pip requirements for pypi mode (default: "numpy pytest"),
#                      e.g. "numpy==2.4.6 pytest" or "-r requirements.txt".
#   ARM_DEB_PACKAGES   extra Debian arm64 packages to add (default: none).
#
# Idempotent: a finished sysroot is recorded in SYSROOT/.setup/stamp; a second
# run with the same settings only checks that numpy imports (a few seconds).
# Changed settings or an unfinished build -> the sysroot is rebuilt.
# Run things in it with run-aarch64.sh (next to this file).
#
# edgetrain's own copy of ../shared/arm/setup-aarch64.sh (a fresh checkout has no
# ../shared). Adapted: it also writes SYSROOT/usr/bin/python3-qemu, a host-side
# launcher of the emulated python that run-aarch64.sh makes its sys.executable
# (see write_launcher below). tools/arm/job.py builds .arm64-sysroot-debian and
# .arm64-sysroot-pypi with it (both git-ignored).
set -euo pipefail

SYSROOT=${1:-.arm64-sysroot}
MODE=${ARM_NUMPY:-pypi}
PIP_PKGS=${ARM_PIP_PACKAGES:-numpy pytest}
EXTRA_DEBS=${ARM_DEB_PACKAGES:-}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TRIPLET=aarch64-linux-gnu

log() { echo "[setup-aarch64] $*" >&2; }
die() { echo "[setup-aarch64] ERROR: $*" >&2; exit 1; }

case "$MODE" in
  pypi)   DEBS="python3 libstdc++6 $EXTRA_DEBS" ;;   # numpy 2.x wheels need libstdc++
  debian) DEBS="python3 python3-numpy python3-pytest $EXTRA_DEBS" ;;
  *) die "ARM_NUMPY must be 'pypi' or 'debian', not '$MODE'" ;;
esac
[ "$MODE" = pypi ] || PIP_PKGS=""
KEY="mode=$MODE debs=[$DEBS] pip=[$PIP_PKGS] v=1"

usage_hint() {
  echo "aarch64 sysroot ready: $SYSROOT  (try: $(printf %q "$HERE/run-aarch64.sh") $(printf %q "$SYSROOT") -- python3 -c 'import platform, numpy; print(platform.machine(), numpy.__version__)')"
}

[ "$(id -u)" = 0 ] || die "run as root (needs apt-get)"
case "$(readlink -m -- "$SYSROOT")" in
  /|/usr|/etc|/var|/root|/home|/tmp|"$(readlink -m -- "$HOME")") die "refusing to use '$SYSROOT' as sysroot" ;;
esac

# ---- 1. qemu (static user-mode emulator; no binfmt_misc registration needed)
if ! command -v qemu-aarch64-static >/dev/null 2>&1; then
  log "installing qemu-user-static"
  export DEBIAN_FRONTEND=noninteractive
  QLOG=$(mktemp)
  { apt-get update -q && apt-get install -y -q --no-install-recommends qemu-user-static; } >"$QLOG" 2>&1 \
    || { cat "$QLOG" >&2; die "could not install qemu-user-static"; }
  rm -f "$QLOG"
fi
QEMU=$(command -v qemu-aarch64-static)

# Without binfmt_misc the kernel cannot start an aarch64 binary, so a program under
# emulation that runs `sys.executable` (subprocess, multiprocessing) would fail with
# 'Exec format error'. This x86-64 shell script starts the emulated python instead;
# run-aarch64.sh passes it to QEMU as argv[0] (-0), which python takes for
# sys.executable (and finds its prefix from the same usr/bin folder). It finds
# SYSROOT from its own path, so a moved sysroot keeps working.
write_launcher() {
  cat > "$1/usr/bin/python3-qemu" <<'LAUNCHER'
#!/bin/sh
# Host-side launcher of this sysroot's aarch64 python3 under QEMU user-mode emulation
# (written by setup-aarch64.sh: the emulated python's sys.executable, see there).
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
QEMU=$(command -v qemu-aarch64-static || command -v qemu-aarch64) \
  || { echo "python3-qemu: qemu-aarch64-static not found" >&2; exit 127; }
export QEMU_LD_PREFIX="$ROOT"
export QEMU_CPU="${QEMU_CPU:-cortex-a72}"
unset PYTHONHOME
exec "$QEMU" -0 "$ROOT/usr/bin/python3-qemu" "$ROOT/usr/bin/python3" "$@"
LAUNCHER
  chmod 755 "$1/usr/bin/python3-qemu"
}

# ---- 2. already done?
run_py() { env -u PYTHONHOME QEMU_LD_PREFIX="$ROOT" QEMU_CPU="${QEMU_CPU:-cortex-a72}" \
             "$QEMU" "$ROOT/usr/bin/python3" "$@"; }
if [ -f "$SYSROOT/.setup/stamp" ] && [ "$(cat "$SYSROOT/.setup/stamp")" = "$KEY" ]; then
  ROOT=$(cd "$SYSROOT" && pwd)
  if run_py -c 'import numpy' >/dev/null 2>&1; then
    write_launcher "$ROOT"
    log "already set up ($KEY)"
    usage_hint
    exit 0
  fi
  log "existing sysroot is broken; rebuilding"
fi
if [ -e "$SYSROOT" ]; then
  if [ -d "$SYSROOT/.setup" ] || [ -z "$(ls -A "$SYSROOT")" ]; then
    rm -rf -- "$SYSROOT"
  else
    die "'$SYSROOT' exists and was not made by this script; remove it or pick another folder"
  fi
fi
mkdir -p "$SYSROOT/.setup"
ROOT=$(cd "$SYSROOT" && pwd)
A=$ROOT/.setup/apt

# ---- 3. private apt config for arm64 (host's apt state is not touched)
# The Debian mirrors/suites are taken from the host's own apt configuration.
debian_sources() {
  apt-cache policy 2>/dev/null | awk '
    $1 ~ /^[0-9]+$/ && $2 ~ /^(https?|file):/ && $NF == "Packages" { uri=$2; sc=$3; next }
    $1 == "release" && uri != "" { if ($0 ~ /o=Debian/) { split(sc, p, "/"); print uri, p[1], p[2] } uri=""; next }
    { uri="" }' | sort -u
}
SRC=$(debian_sources)
if [ -z "$SRC" ]; then
  log "no apt lists on the host yet: apt-get update"
  apt-get update -q >/dev/null
  SRC=$(debian_sources)
fi
[ -n "$SRC" ] || die "found no Debian archive in the host's apt configuration"
mkdir -p "$A/etc/apt/apt.conf.d" "$A/etc/apt/preferences.d" "$A/etc/apt/sources.list.d" \
         "$A/lists/partial" "$A/archives/partial" "$A/cache"
: > "$A/status"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$KEYRING" ] || die "missing $KEYRING (apt-get install debian-archive-keyring)"
# merge components per (uri, suite)
echo "$SRC" | awk -v k="$KEYRING" '
  { key=$1" "$2; if (!(key in c)) order[++n]=key; c[key]=c[key]" "$3 }
  END { for (i=1;i<=n;i++) { split(order[i], a, " "); print "deb [arch=arm64 signed-by=" k "] " a[1] " " a[2] c[order[i]] } }' \
  > "$A/etc/apt/sources.list"
cat > "$A/apt.conf" <<EOF
Dir::Etc "$A/etc/apt";
Dir::State "$A";
Dir::State::lists "$A/lists";
Dir::State::status "$A/status";
Dir::Cache "$A/cache";
Dir::Cache::archives "$A/archives";
APT::Architecture "arm64";
APT::Architectures { "arm64"; };
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
APT::Sandbox::User "root";
EOF
export APT_CONFIG=$A/apt.conf
log "apt-get update (arm64 lists: $(awk '{print $5}' "$A/etc/apt/sources.list" | tr '\n' ' '))"
apt-get update -q >"$A/update.log" 2>&1 || { cat "$A/update.log" >&2; die "arm64 apt-get update failed"; }
log "downloading arm64 packages: $DEBS (+ dependencies)"
# shellcheck disable=SC2086
apt-get install -y -q --download-only $DEBS >"$A/install.log" 2>&1 \
  || { cat "$A/install.log" >&2; die "arm64 package download failed"; }
unset APT_CONFIG

# ---- 4. unpack (no maintainer scripts are run: nothing needs them for python)
n=0
for deb in "$A"/archives/*.deb; do dpkg-deb -x "$deb" "$ROOT"; n=$((n+1)); done
log "unpacked $n packages"
# what update-alternatives would have done for BLAS/LAPACK (python3-numpy links libblas.so.3)
L=$ROOT/usr/lib/$TRIPLET
for d in blas lapack; do
  for f in "$L/$d"/lib*.so.3; do
    [ -e "$f" ] && [ ! -e "$L/$(basename "$f")" ] && ln -s "$d/$(basename "$f")" "$L/$(basename "$f")"
  done
done
PYVER=$(cd "$ROOT/usr/bin" && ls python3.* | grep -E '^python3\.[0-9]+$' | sort -V | tail -1 | sed 's/^python//')
[ -n "$PYVER" ] || die "no python3.X in the sysroot"
# keep the package list (with versions) for reference, drop the downloaded debs and lists
( cd "$A/archives" && ls *.deb ) > "$ROOT/.setup/debs.txt"
rm -rf "$A/archives" "$A/lists" "$A/cache"

# ---- 5. pip wheels for aarch64 (pypi mode), installed by the host's pip
if [ -n "$PIP_PKGS" ]; then
  HOSTPY=""
  for c in python3 /usr/bin/python3 "python$PYVER"; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -m pip --version >/dev/null 2>&1; then HOSTPY=$c; break; fi
  done
  [ -n "$HOSTPY" ] || die "pypi mode needs pip on the host (or use ARM_NUMPY=debian)"
  # newest manylinux tag the sysroot's glibc satisfies (libc6_2.36-... -> 36)
  GLIBC_MINOR=$(sed -n 's/^libc6_2\.\([0-9]*\).*/\1/p' "$ROOT/.setup/debs.txt" | head -1)
  GLIBC_MINOR=${GLIBC_MINOR:-28}
  PLAT=(--platform manylinux2014_aarch64)
  for ((m = 17; m <= GLIBC_MINOR; m++)); do PLAT+=(--platform "manylinux_2_${m}_aarch64"); done
  TARGET=$ROOT/usr/local/lib/python$PYVER/dist-packages
  log "pip (host: $HOSTPY) -> $TARGET: $PIP_PKGS"
  # shellcheck disable=SC2086
  if ! PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 "$HOSTPY" -m pip install -q \
      --target "$TARGET" "${PLAT[@]}" --python-version "$PYVER" --implementation cp \
      --abi "cp${PYVER/./}" --only-binary=:all: $PIP_PKGS >"$ROOT/.setup/pip.log" 2>&1; then
    cat "$ROOT/.setup/pip.log" >&2
    die "pip install of aarch64 wheels failed"
  fi
  rm -rf "$TARGET/bin"   # console scripts with host shebangs: use 'python3 -m pytest'
fi

# ---- 6. byte-compile (much faster imports under emulation). A host python of
# the same X.Y writes identical .pyc files quickly; otherwise compile emulated.
DIRS=()
for d in "$ROOT/usr/lib/python$PYVER" "$ROOT/usr/lib/python3/dist-packages" \
         "$ROOT/usr/local/lib/python$PYVER/dist-packages"; do [ -d "$d" ] && DIRS+=("$d"); done
COMPILER=""
for c in "/usr/bin/python$PYVER" "python$PYVER"; do
  if command -v "$c" >/dev/null 2>&1 && \
     [ "$("$c" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$PYVER" ]; then COMPILER=$c; break; fi
done
log "byte-compiling with ${COMPILER:-emulated python$PYVER}"
if [ -n "$COMPILER" ]; then
  env -u PYTHONDONTWRITEBYTECODE "$COMPILER" -m compileall -q -j0 "${DIRS[@]}" >/dev/null 2>&1 || true
else
  env -u PYTHONDONTWRITEBYTECODE QEMU_LD_PREFIX="$ROOT" "$QEMU" "$ROOT/usr/bin/python3" \
    -m compileall -q -j0 "${DIRS[@]}" >/dev/null 2>&1 || true
fi

# ---- 7. check and record
OUT=$(run_py -c 'import platform, sys, numpy; print(platform.machine(), platform.python_version(), numpy.__version__)') \
  || die "numpy does not import in the new sysroot"
set -- $OUT
[ "$1" = aarch64 ] || die "expected aarch64, got '$1'"
log "ok: machine=$1 python=$2 numpy=$3 ($(du -sh "$ROOT" | cut -f1))"
write_launcher "$ROOT"
echo "$KEY" > "$ROOT/.setup/stamp"
usage_hint
