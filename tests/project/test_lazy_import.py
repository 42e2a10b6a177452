"""`import edgetrain` and `import edgetrain.runtime` load no build-side module and no kernel module (the names are
imported on first use, PEP 562), and every public name still resolves to the object its module defines. Structure
only: what is in sys.modules, never how long an import took."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# modules that `import edgetrain` / `import edgetrain.runtime` must not load (the converter side, onnx, the
# trainer and its data loaders, and the kernel modules, which load when a graph is first compiled)
BUILD_SIDE = [
    "onnx",
    "onnxruntime",
    "edgetrain.derive",
    "edgetrain.graph.memory",
    "edgetrain.onnx_io",
    "edgetrain.runtime.trainer",
    "loaders",
]
KERNEL_MODULES = [
    f"edgetrain.core.kernels.{m}"
    for m in ("math", "conv", "pool", "window", "nn_grad", "tensor", "activations")
]


def run(code: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_edgetrain_loads_nothing_of_the_build_side():
    got = run("""
        import json, sys
        import edgetrain
        after_package = sorted(m for m in sys.modules if m.startswith(("edgetrain", "onnx", "loaders")))
        import edgetrain.runtime
        after_runtime = sorted(m for m in sys.modules if m.startswith(("edgetrain", "onnx", "loaders")))
        print(json.dumps({"package": after_package, "runtime": after_runtime}))
    """)
    assert got["package"] == ["edgetrain", "edgetrain.core", "edgetrain.core.errors"], got["package"]
    for unwanted in BUILD_SIDE + KERNEL_MODULES:
        assert not any(m == unwanted or m.startswith(unwanted + ".") for m in got["runtime"]), (unwanted, got)
    assert "edgetrain.runtime.training" in got["runtime"]  # the sessions themselves are not deferred


def test_public_names_resolve_to_their_modules_objects():
    got = run("""
        import json, sys
        import edgetrain as et
        before = set(sys.modules)
        fn = et.convert
        loaded = sorted(m for m in set(sys.modules) - before if m.startswith(("edgetrain.", "onnx")))
        from edgetrain import TrainingSession, CrossEntropyLoss, SGD, Trainer, CosineLR
        import edgetrain.derive.pipeline, edgetrain.derive.artifact, edgetrain.runtime, edgetrain.derive.losses
        import edgetrain.derive.optimizers, edgetrain.runtime.trainer
        conv = sys.modules["edgetrain.derive.pipeline"]
        checks = {
            "convert is the function": fn is conv.convert and et.convert is conv.convert,
            "TrainingArtifact": et.TrainingArtifact is edgetrain.derive.artifact.TrainingArtifact,
            "sessions": TrainingSession is edgetrain.runtime.TrainingSession
            and et.InferenceSession is edgetrain.runtime.InferenceSession,
            "losses": CrossEntropyLoss is edgetrain.derive.losses.CrossEntropyLoss,
            "optimizers": SGD is edgetrain.derive.optimizers.SGD and et.AdamW is edgetrain.derive.optimizers.AdamW,
            "trainer": Trainer is edgetrain.runtime.trainer.Trainer and CosineLR is edgetrain.runtime.trainer.CosineLR,
            "submodule attribute": et.derive is edgetrain.derive and et.runtime is edgetrain.runtime,
            "every name in __all__": all(getattr(et, n) is not None for n in et.__all__),
            "dir": set(et.__all__) <= set(dir(et)),
        }
        print(json.dumps({"loaded": loaded, "checks": checks}))
    """)
    assert all(got["checks"].values()), got["checks"]
    assert "edgetrain.derive.pipeline" in got["loaded"] and "edgetrain.derive.autodiff" in got["loaded"]


def test_convert_stays_the_function_when_the_submodule_is_imported_first():
    # importlib sets the package's attribute `convert` to the submodule when it loads it; the name must keep
    # meaning the function, as it did when the package imported everything eagerly
    got = run("""
        import json, sys
        from edgetrain.derive.pipeline import TrainingArtifact  # loads the pipeline before anyone asks for et.convert
        import edgetrain as et
        from edgetrain import convert
        same = convert is sys.modules["edgetrain.derive.pipeline"].convert
        print(json.dumps({"callable": callable(et.convert), "same": same,
                          "missing": not hasattr(et, "no_such_name")}))
    """)
    assert got == {"callable": True, "same": True, "missing": True}


def test_kernels_load_on_first_read_of_the_table():
    got = run("""
        import json, sys
        from edgetrain.core.kernels import KERNELS
        before = any(m.startswith("edgetrain.core.kernels.conv") for m in sys.modules)
        conv = KERNELS["Conv"]
        from edgetrain.core.kernels import conv as conv_kernels
        print(json.dumps({"before": before, "same": conv.fn is conv_kernels.conv,
                          "after": "edgetrain.core.kernels.conv" in sys.modules, "n": len(KERNELS),
                          "has_relu": "Relu" in KERNELS}))
    """)
    assert got["before"] is False and got["after"] is True and got["same"] and got["has_relu"]
    assert got["n"] > 100
