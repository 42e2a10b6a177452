"""One measurement in a fresh process: a case spec (JSON file) and a runtime name -> one JSON line on stdout with
the first loss, median ms per step (or the epoch times), import and load seconds, and the process's peak RSS.

`python worker.py SPEC.json edgetrain|edgetrain_sgd|ort|torch`. It imports numpy and the one runtime it
measures, nothing else, so the peak RSS and the import time are that runtime's. It runs in the main environment
(edgetrain, PyTorch) or in onnxruntime-training's own (ort), which holds numpy and onnxruntime-training alone."""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # before numpy loads its BLAS
    os.environ[_var] = "1"

import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from configs import BUDGET_S, MIN_STEPS  # noqa: E402  (standard library only, like this file)


def main() -> None:
    spec_path, runtime = sys.argv[1], sys.argv[2]
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    t0 = time.perf_counter()
    import numpy as np

    numpy_s = time.perf_counter() - t0
    x, y = np.load(spec["x"]), np.load(spec["y"])
    if spec["kind"] == "epoch":
        result = EPOCHS[runtime](spec, x, y)
    else:
        t0 = time.perf_counter()
        step, info = RUNNERS[runtime](spec, x, y)
        info["load_s"] = time.perf_counter() - t0 - info["import_s"]
        info.update(time_steps(step, warmup=spec["warmup"], steps=spec["steps"]))
        result = info
    result["numpy_import_s"] = numpy_s
    result["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(result))


def peak_rss_mb() -> float:
    """This process's peak resident set. Linux keeps ru_maxrss across exec, so a worker started by a parent of
    300 MB (torch, onnx) would report the parent's footprint: read the high-water mark of this process's own
    memory map (VmHWM) instead, and fall back to ru_maxrss elsewhere."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    scale = 1024 * 1024 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale


def time_steps(step, *, warmup: int, steps: int) -> dict:
    """The first loss (from the initial weights), then warm-up, then up to `steps` timed steps (fewer when they
    take longer than BUDGET_S, but at least MIN_STEPS): the median and quartiles in ms."""
    import numpy as np

    first = step()
    for _ in range(max(warmup - 1, 0)):
        step()
    times: list[float] = []
    stop = time.perf_counter() + BUDGET_S
    while len(times) < steps and (len(times) < MIN_STEPS or time.perf_counter() < stop):
        t0 = time.perf_counter()
        last = step()
        times.append(time.perf_counter() - t0)
    ms = 1000 * np.asarray(times)
    return {
        "first_loss": float(first),
        "last_loss": float(last) if times else float(first),
        "steps": len(times),
        "step_ms": float(np.median(ms)),
        "step_ms_q1": float(np.percentile(ms, 25)),
        "step_ms_q3": float(np.percentile(ms, 75)),
    }


# ---- one training step per runtime: (step() -> loss, info with import_s and version) ----------------------------
def edgetrain_step(spec: dict, x, y, artifact: str = "edgetrain"):
    """artifact: the spec's key of the .etrain to train, "edgetrain" (SGD with momentum and weight decay, as PyTorch
    runs) or "edgetrain_sgd" (plain SGD, as onnxruntime-training runs)."""
    t0 = time.perf_counter()
    import edgetrain as et

    et.TrainingSession  # noqa: B018  (the package imports its names on first use: count the runtime's import)
    info = {"import_s": time.perf_counter() - t0, "version": et.__version__}
    sess = et.TrainingSession(spec[artifact])
    sess.lr = spec["lr"]
    return (lambda: sess.train_step(x, y)), info


def ort_step(spec: dict, x, y):
    """onnxruntime-training through its C++ objects: `import onnxruntime.training` would import torch."""
    t0 = time.perf_counter()
    import onnxruntime
    from onnxruntime.capi import _pybind_state as C

    info = {"import_s": time.perf_counter() - t0, "version": onnxruntime.__version__}
    C.set_default_logger_severity(3)
    d = spec["ort"]
    so = C.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    device = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
    state = C.load_checkpoint(f"{d}/checkpoint")
    module = C.Module(f"{d}/training_model.onnx", state, f"{d}/eval_model.onnx", device, so)
    optimizer = C.Optimizer(f"{d}/optimizer_model.onnx", state, device, so)
    optimizer.set_learning_rate(spec["lr"])  # plain SGD: no momentum or weight decay in 1.19.2
    feeds = [x, y.astype(spec.get("ort_label_dtype", "int64"))]

    def step():
        fetches = C.OrtValueVector()
        module.train_step(feeds, fetches)
        optimizer.optimizer_step()
        module.lazy_reset_grad()
        return float(fetches[0].numpy())

    return step, info


def torch_step(spec: dict, x, y):
    torch, info = _import_torch(spec)
    net = torch.load(spec["torch"], weights_only=False).eval()  # eval: BatchNorm statistics and no dropout
    opt = _torch_sgd(torch, net, spec)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(net(xt), yt)
        loss.backward()
        opt.step()
        return loss.item()

    return step, info


def _import_torch(spec: dict):
    t0 = time.perf_counter()
    import torch

    info = {"import_s": time.perf_counter() - t0, "version": torch.__version__}
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    if spec["torchvision"]:
        _import_torchvision(torch)  # the pickled module calls torchvision functions (stochastic depth)
    return torch, info


def _import_torchvision(torch) -> None:
    """torchvision 0.28 against the CPU torch wheel: declare the op schemas its compiled ops need first (as
    tests/harness/exports.py does; that module imports onnx, which would count in this process's memory)."""
    try:
        import torchvision  # noqa: F401
    except RuntimeError:
        for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        lib = torch.library.Library("torchvision", "DEF")
        for op in ("nms", "qnms"):
            lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _KEEP.append(lib)
        import torchvision  # noqa: F401


_KEEP: list = []  # the torchvision op schemas live as long as their Library object


def _torch_sgd(torch, net, spec: dict):
    trainable = spec.get("torch_trainable")
    for name, p in net.named_parameters():
        p.requires_grad_(trainable is None or name in trainable)
    params = [p for p in net.parameters() if p.requires_grad]
    return torch.optim.SGD(
        params, lr=spec["lr"], momentum=spec["momentum"], weight_decay=spec["weight_decay"]
    )


def edgetrain_sgd_step(spec: dict, x, y):
    return edgetrain_step(spec, x, y, artifact="edgetrain_sgd")


RUNNERS = {
    "edgetrain": edgetrain_step,
    "edgetrain_sgd": edgetrain_sgd_step,
    "ort": ort_step,
    "torch": torch_step,
}


# ---- the head-only personalization epoch --------------------------------------------------------------------
def edgetrain_epochs(spec: dict, x, y) -> dict:
    """Two epochs through edgetrain.Trainer, which caches the frozen prefix's features when it can: the second
    epoch is the one a phone pays again and again."""
    t0 = time.perf_counter()
    import edgetrain as et
    from loaders import ArrayDataView, DataLoader

    et.TrainingSession  # noqa: B018  (the package imports its names on first use: count the runtime's import)
    info = {"import_s": time.perf_counter() - t0, "version": et.__version__}
    sess = et.TrainingSession(spec["edgetrain"])
    sess.lr = spec["lr"]
    loader = DataLoader(ArrayDataView(x, y), batch_size=spec["batch"], drop_last=True)
    marks, losses = [], []

    def progress(event: dict) -> None:
        if event.get("event") == "epoch":
            marks.append(time.perf_counter())
        elif event.get("event") == "step" and not losses:
            losses.append(event["loss"])

    trainer = et.Trainer(sess, loader, epochs=2, progress=progress)
    start = time.perf_counter()
    result = trainer.fit()
    said = sess.feature_cache_info()
    cache = {k: said.get(k) for k in ("enabled", "reason", "prefix_nodes", "total_nodes", "samples", "bytes")}
    cache["hits_per_epoch"] = [r.get("feature_cache_hits", 0) for r in result.history]
    info.update(_epoch_result(start, marks, losses[0], len(loader)))
    info["cache"] = cache  # the session's feature cache after the run: on (and how much it served) or why not
    return info


def torch_epochs(spec: dict, x, y) -> dict:
    """PyTorch's head-only epoch as a PyTorch user writes it: the frozen body under no_grad, the head trained."""
    torch, info = _import_torch(spec)
    body, head = torch.load(spec["torch"], weights_only=False)
    body.eval().requires_grad_(False)
    head.eval()
    opt = torch.optim.SGD(
        head.parameters(), lr=spec["lr"], momentum=spec["momentum"], weight_decay=spec["weight_decay"]
    )
    b = spec["batch"]
    batches = [(torch.from_numpy(x[i : i + b]), torch.from_numpy(y[i : i + b])) for i in range(0, len(x), b)]
    marks, losses = [], []
    start = time.perf_counter()
    for _ in range(2):
        for xb, yb in batches:
            with torch.no_grad():
                features = body(xb)
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(head(features), yb)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        marks.append(time.perf_counter())
    info.update(_epoch_result(start, marks, losses[0], len(batches)))
    return info


def _epoch_result(start: float, marks: list[float], first_loss: float, steps: int) -> dict:
    return {
        "first_loss": float(first_loss),
        "epoch1_s": marks[0] - start,
        "epoch2_s": marks[1] - marks[0],
        "steps_per_epoch": steps,
        "step_ms": 1000 * (marks[1] - marks[0]) / steps,
    }


EPOCHS = {"edgetrain": edgetrain_epochs, "torch": torch_epochs}

if __name__ == "__main__":
    main()
