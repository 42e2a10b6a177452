#!/usr/bin/env bash
# Sets up and runs the whole test suite on a fresh machine (the README's test command; CI calls it).
#   .venv        edgetrain[dev]: numpy 2.x, onnx, onnxruntime, pytest
#   .venv-np124  numpy 1.24 (Debian 12's) and nothing else: the device side must run there too
# Extra arguments go to pytest, e.g. `bash tools/test.sh -k conv -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q -e ".[dev]"
if [ -x .venv-np124/bin/python ] || "$PY" -m venv .venv-np124; then
  .venv-np124/bin/python -m pip install -q "numpy==1.24.4" && .venv-np124/bin/python -m pip install -q --no-deps -e . \
    && export EDGETRAIN_NUMPY124_PYTHON="$PWD/.venv-np124/bin/python"
fi
exec .venv/bin/python -m pytest "$@"
