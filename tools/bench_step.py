"""Benchmark: one training step of MLP and LeNet (batch 32, SGD momentum 0.9, weight decay 5e-4, softmax
cross-entropy), edgetrain's TrainingSession beside onnxruntime running the same training_onnx() graph (and
PyTorch eager when installed), in one process, 1 thread each; plus the artifact size and the memory plan.
Writes docs/benchmarks.md.  Usage: python tools/bench_step.py [--steps 300] [--warmup 30] [--quick]"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # before numpy loads BLAS
    os.environ[_var] = "1"

import argparse  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from models import MODELS, batch_for  # noqa: E402

import edgetrain as et  # noqa: E402

BATCH = 32


def median_ms(fn, steps: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


def bench(name: str, steps: int, warmup: int, tmp: Path) -> dict:
    import onnxruntime as ort

    art = et.convert(
        MODELS[name][0](),
        loss=et.CrossEntropyLoss(),
        batch_size=BATCH,
        optimizer=et.SGD(lr=0.01, momentum=0.9, weight_decay=5e-4),
    )
    path = tmp / f"{name}.etrain"
    size = art.save(path)
    params = sum(v.nbytes for v in art.inference.initializers.values() if v.dtype.kind == "f")
    state = sum(art.initial[s].nbytes for s in art.state)
    sess = et.TrainingSession(path)
    plan = sess.artifact.plan
    x, y = batch_for(name, BATCH)
    ours = median_ms(lambda: sess.train_step(x, y), steps, warmup)

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    osess = ort.InferenceSession(
        art.training_onnx().SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in osess.get_outputs()]
    values = {k: np.array(v) for k, v in art.initial.items()}
    lr = np.asarray(0.01, np.float32)

    def ort_step():
        out = dict(zip(names, osess.run(None, {"input": x, art.target: y, art.lr: lr, **values})))
        values.update({k: out[v] for k, v in art.updates.items()})

    theirs = median_ms(ort_step, steps, warmup)
    row = {
        "model": name,
        "artifact": size,
        "params": params,
        "state": state,
        "peak": plan.arena_size,
        "lower": plan.lower_bound,
        "no_plan": plan.no_plan,
        "edgetrain_ms": ours,
        "ort_ms": theirs,
    }
    try:
        row["torch_ms"] = bench_torch(name, x, y, steps, warmup)
    except ImportError:
        row["torch_ms"] = None
    return row


def bench_torch(name: str, x, y, steps: int, warmup: int) -> float:
    import torch
    from onnx import numpy_helper
    from torch_models import torch_model

    torch.set_num_threads(1)
    weights = {t.name: numpy_helper.to_array(t) for t in MODELS[name][0]().graph.initializer}
    net = torch_model(name, weights)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xt), yt).backward()
        opt.step()

    return median_ms(step, steps, warmup)


def kib(n: float) -> str:
    return f"{n / 1024:,.1f} KiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="30 steps, 5 warm-up: a smoke run")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    args = ap.parse_args()
    steps, warmup = (30, 5) if args.quick else (args.steps, args.warmup)
    import onnxruntime

    with tempfile.TemporaryDirectory() as tmp:
        rows = [bench(name, steps, warmup, Path(tmp)) for name in ("mlp", "lenet")]
    torch_v = "not installed"
    try:
        import torch

        torch_v = torch.__version__
    except ImportError:
        pass
    lines = [
        "# Training-step benchmark",
        "",
        f"`python tools/bench_step.py` ({steps} timed steps after {warmup} warm-up; median). Batch {BATCH}, SGD "
        "momentum 0.9, weight decay 5e-4, softmax cross-entropy; 1 thread for every runtime, one process.",
        f"Machine: {platform.machine()}, {platform.processor() or 'cpu'}; Python {platform.python_version()}, "
        f"numpy {np.__version__}, onnxruntime {onnxruntime.__version__} (running edgetrain's training_onnx() "
        f"graph), PyTorch {torch_v}. Shared machine: differences under ~25% are noise.",
        "",
        "| model | edgetrain TrainingSession | onnxruntime, same graph | ratio | PyTorch eager |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        t = f"{r['torch_ms']:.3f} ms" if r["torch_ms"] is not None else "n/a"
        lines.append(
            f"| {r['model']} | {r['edgetrain_ms']:.3f} ms | {r['ort_ms']:.3f} ms | "
            f"{r['edgetrain_ms'] / r['ort_ms']:.2f}x | {t} |"
        )
    lines += [
        "",
        "| model | artifact file | parameters | optimizer state | overhead | planned peak | "
        "lower bound | no planning |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        over = r["artifact"] - r["params"] - r["state"]
        lines.append(
            f"| {r['model']} | {kib(r['artifact'])} | {kib(r['params'])} | {kib(r['state'])} | "
            f"{kib(over)} | {kib(r['peak'])} | {kib(r['lower'])} | {kib(r['no_plan'])} |"
        )
    lines += [
        "",
        "Planned peak, lower bound and no planning cover activations, gradients and temporaries "
        "(parameters and optimizer state are owned by the session and counted in the artifact columns).",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
