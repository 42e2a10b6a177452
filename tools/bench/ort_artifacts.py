"""onnxruntime-training's training artifacts, generated inside its own virtual environment: a jobs JSON file (ONNX
model, parameters to train, parameters to freeze, output folder) -> in each folder its training, eval and
optimizer models and checkpoint (softmax cross-entropy, plain SGD), loaded once to check that its kernels accept
them, and one JSON line per job on stdout: the files' sizes and the labels' dtype, or the error (e.g. an op without
a gradient builder, or a kernel that refuses an attribute).

`python ort_artifacts.py JOBS.json`, run by tools/bench/ort_venv.py with the venv's python."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types


def import_artifacts():
    """onnxruntime.training.artifacts without onnxruntime/training/__init__.py, which imports its optimizers and,
    through them, torch (not installed here). The artifact generator itself needs onnx and the C++ gradient builder
    only: load the package as an empty shell whose submodules import normally."""
    spec = importlib.util.find_spec("onnxruntime.training")
    shell = types.ModuleType("onnxruntime.training")
    shell.__path__ = list(spec.submodule_search_locations)
    sys.modules["onnxruntime.training"] = shell
    from onnxruntime.training import artifacts

    return artifacts


def generate(artifacts, job: dict) -> dict:
    import onnx

    os.makedirs(job["out"], exist_ok=True)
    artifacts.generate_artifacts(
        onnx.load(job["onnx"]),
        requires_grad=job["requires_grad"],
        frozen_params=job["frozen"],
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.SGD,  # the only SGD it has: no momentum, no weight decay
        artifact_directory=job["out"],
    )
    # The generator stamps the optimizer model with the installed onnx's IR version, newer than 1.19.2 reads
    # (it reads IR <= 10); the optimizer graph uses nothing newer than IR 8.
    path = os.path.join(job["out"], "optimizer_model.onnx")
    model = onnx.load(path)
    model.ir_version = min(model.ir_version, 8)
    onnx.save(model, path)
    check_loads(job["out"])
    training = onnx.load(os.path.join(job["out"], "training_model.onnx"), load_external_data=False)
    labels = training.graph.input[1].type.tensor_type.elem_type
    return {
        "files": {f: os.path.getsize(os.path.join(job["out"], f)) for f in sorted(os.listdir(job["out"]))},
        "label_dtype": onnx.helper.tensor_dtype_to_np_dtype(labels).name,
    }


def check_loads(out: str) -> None:
    """Loads the artifacts as the worker will (training module and optimizer on the CPU): a generated model whose
    kernels refuse it (1.19.2's training LSTM runs the forward direction only) fails here, in plain words, instead
    of in every worker."""
    from onnxruntime.capi import _pybind_state as C

    so = C.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    device = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
    try:
        state = C.load_checkpoint(os.path.join(out, "checkpoint"))
        C.Module(
            os.path.join(out, "training_model.onnx"), state, os.path.join(out, "eval_model.onnx"), device, so
        )
        C.Optimizer(os.path.join(out, "optimizer_model.onnx"), state, device, so)
    except Exception as e:  # noqa: BLE001
        said = _short(e)
        raise RuntimeError(
            f"its generator made the artifacts, but loading them for training fails: {said}"
        ) from e


def main() -> None:
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    artifacts = import_artifacts()
    with open(sys.argv[1], encoding="utf-8") as f:
        jobs = json.load(f)
    for job in jobs:
        try:
            result = generate(artifacts, job)
        except Exception as e:  # noqa: BLE001  (a model it cannot train is a result to report, not a crash)
            result = {"error": _short(e)}
        print(json.dumps({"config": job["config"], **result}), flush=True)


def _short(e: Exception) -> str:
    """The useful end of a C++ error message (its start is a long source location and signature)."""
    text = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)
    return text.rsplit(" was false. ", 1)[-1][-300:]


if __name__ == "__main__":
    main()
