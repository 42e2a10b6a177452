#!/usr/bin/env bash
# run-aarch64.sh SYSROOT [--] COMMAND [ARGS...]
#
# Runs an aarch64 program from SYSROOT (built by setup-aarch64.sh) under QEMU
# user-mode emulation (qemu-aarch64-static; no binfmt_misc, no chroot).
# The whole host file system, current directory included, stays visible:
# relative paths and cwd work as usual.
#
#   COMMAND  python3 / python / python3.X -> SYSROOT's python (sys.prefix is in
#            SYSROOT, so only SYSROOT's packages are seen, plus PYTHONPATH);
#            another bare name is looked up in SYSROOT's bin folders;
#            a path is used as given (it must be an aarch64 executable).
#
# Environment: QEMU_CPU (default cortex-a72, an ARMv8.0 board/phone core like a
# Raspberry Pi 4; 'max' enables SVE/SME, where OpenBLAS in numpy 2.x wheels
# raises spurious 'divide by zero encountered in matmul' warnings under QEMU).
# Examples:
#   run-aarch64.sh .arm64-sysroot -- python3 -c 'import platform; print(platform.machine())'
#   run-aarch64.sh .arm64-sysroot -- python3 -m pytest -q tests/
#
# edgetrain's own copy of ../shared/arm/run-aarch64.sh. Adapted: SYSROOT's python
# gets SYSROOT/usr/bin/python3-qemu (written by setup-aarch64.sh) as argv[0], so
# its sys.executable is a launcher the host can run and child pythons
# (subprocess.run([sys.executable, ...])) are emulated too.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 SYSROOT [--] COMMAND [ARGS...]   e.g. $0 .arm64-sysroot -- python3 -m pytest -q" >&2
  exit 2
fi
[ -x "${1}/usr/bin/python3" ] || { echo "run-aarch64: '$1' is not a sysroot made by setup-aarch64.sh" >&2; exit 2; }
ROOT=$(cd "$1" && pwd)
shift
[ "${1:-}" = "--" ] && shift
[ $# -ge 1 ] || { echo "run-aarch64: no command given" >&2; exit 2; }

QEMU=$(command -v qemu-aarch64-static || command -v qemu-aarch64 || true)
[ -n "$QEMU" ] || { echo "run-aarch64: qemu-aarch64-static not found (run setup-aarch64.sh)" >&2; exit 2; }

CMD=$1
shift
case "$CMD" in
  */*) ;;                                   # a path: use as given
  python|python3) CMD=$ROOT/usr/bin/python3 ;;
  *)
    for d in usr/local/bin usr/bin bin usr/sbin sbin; do
      if [ -e "$ROOT/$d/$CMD" ]; then CMD=$ROOT/$d/$CMD; break; fi
    done
    case "$CMD" in
      */*) ;;
      *) echo "run-aarch64: '$CMD' not found in $ROOT" >&2; exit 127 ;;
    esac ;;
esac

export QEMU_LD_PREFIX=$ROOT                 # guest's /lib, /usr/lib ... come from ROOT first
export QEMU_CPU=${QEMU_CPU:-cortex-a72}
unset PYTHONHOME
ARGV0=()
if [ "$CMD" = "$ROOT/usr/bin/python3" ] && [ -x "$ROOT/usr/bin/python3-qemu" ]; then
  ARGV0=(-0 "$ROOT/usr/bin/python3-qemu")
fi
exec "$QEMU" "${ARGV0[@]}" "$CMD" "$@"
