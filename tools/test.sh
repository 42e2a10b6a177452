#!/usr/bin/env bash
# Sets up, checks and runs the tests on a fresh machine (the README's test commands; CI calls it without --quick).
#   .venv        edgetrain[dev]: numpy 2.x, onnx, onnxruntime, pytest
#   .venv-np124  numpy 1.24 (Debian 12's) and nothing else: the device side must run there too
# `bash tools/test.sh` runs the whole suite; `bash tools/test.sh --quick` the quick tier: the same set-up and static
# checks, then the tests of the files tests/quick.txt names, less those marked slow (CONTRIBUTING.md, "Checks").
# Extra arguments go to pytest, e.g. `bash tools/test.sh -k conv -x` or `bash tools/test.sh --quick -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=0
if [ "${1:-}" = "--quick" ]; then
  QUICK=1
  shift
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q -e ".[dev]"
# PyTorch is an optional reference (tests/derive/test_vs_torch.py). Pinned to the CPU build this kind of machine holds
# locally; elsewhere an unpinned or unavailable torch would pull gigabytes of CUDA packages, so it is only
# installed when the local wheel is there (or EDGETRAIN_TORCH=1 asks for it), and its tests skip otherwise.
# torchvision, transformers and onnxscript (the dynamo exporter) make the real exports of
# tests/onnx_io/test_real_exports.py, peft the LoRA reference of tests/derive/test_lora_peft.py; torch is pinned in the same
# command so that resolving them cannot upgrade it.
# (importlib.util.find_spec: importing transformers would import torchvision, which needs the workaround in
# tests/harness/exports.py.)
if ! .venv/bin/python -c "import importlib.util as u, sys; \
    sys.exit(any(u.find_spec(m) is None for m in ('torch', 'torchvision', 'transformers', 'onnxscript', 'peft')))" \
    2>/dev/null; then
  if ls /opt/wheels/torch-2.13.0*.whl >/dev/null 2>&1 || [ "${EDGETRAIN_TORCH:-0}" = 1 ]; then
    .venv/bin/python -m pip install -q "torch==2.13.0" "torchvision==0.28.0" "transformers==4.57.6" \
      "onnxscript==0.7.2" "peft==0.17.1"
  else
    echo "tools/test.sh: no local torch 2.13.0 wheel: the PyTorch comparison tests will be skipped" >&2
  fi
fi
if [ -x .venv-np124/bin/python ] || "$PY" -m venv .venv-np124; then
  .venv-np124/bin/python -m pip install -q "numpy==1.24.4" && .venv-np124/bin/python -m pip install -q --no-deps -e . \
    && export EDGETRAIN_NUMPY124_PYTHON="$PWD/.venv-np124/bin/python"
fi
# The static checks: lint and format (ruff), and the import contracts of pyproject.toml (import-linter: the layers,
# the device side without onnx, loaders without the rest of edgetrain). A second or two; tests/project/test_layers.py also
# proves the contracts break when an import crosses a layer.
.venv/bin/ruff check --quiet .
.venv/bin/ruff format --check --quiet .
.venv/bin/lint-imports --no-cache >/dev/null || .venv/bin/lint-imports --no-cache
if [ "$QUICK" = 1 ]; then
  # Opt-in by file: a test file is quick only once tests/quick.txt names it, so a new file (and its slow tests)
  # lands in the whole suite alone until someone lists it; a listed file that is gone fails here, loudly.
  mapfile -t QUICK_FILES < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' tests/quick.txt)
  # no file named would make pytest run every test not marked slow, which is no quick tier
  [ "${#QUICK_FILES[@]}" -gt 0 ] || { echo "tools/test.sh: tests/quick.txt names no test file" >&2; exit 2; }
  exec .venv/bin/python -m pytest -m "not slow" "${QUICK_FILES[@]}" "$@"
fi
exec .venv/bin/python -m pytest "$@"
