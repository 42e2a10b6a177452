"""int8 against float, side by side in one run: the artifact's bytes, the peak RSS of a training process and the
median step time of the same model, personalized from its float export and from its int8 form (onnxruntime's
quantize_static, QDQ, per-channel int8 weights and int8 activations, calibrated on a few batches), head-only and
full fine-tuning. Models: the demo's digits LeNet (b32) and torchvision's MobileNetV2 (3x64x64, b8; needs torch).
Each measurement runs in its own process (1 thread), so one's memory does not count in another's.

    .venv/bin/python tools/qat_bench.py [--steps 30] [--out docs/quantized.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(
    0, str(ROOT / "tests" / "harness")
)  # the suite's torchvision exports are the benchmark's models

import edgetrain as et  # noqa: E402

WORKER = r"""
import json, os, sys, time
os.environ["OMP_NUM_THREADS"] = "1"
import numpy as np
import edgetrain as et
def kib(key):  # this process's (ru_maxrss would keep the parent's high-water mark across exec)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))
etrain, x, y, steps = sys.argv[1], np.load(sys.argv[2]), np.load(sys.argv[3]), int(sys.argv[4])
before, before_file = kib("VmRSS"), kib("RssFile")
sess = et.TrainingSession(etrain, threads=1)
times = []
for k in range(steps + 3):
    t0 = time.perf_counter()
    sess.train_step(x, y)
    if k >= 3:
        times.append(time.perf_counter() - t0)
peak = kib("VmHWM")
print(json.dumps({"ms": 1e3 * float(np.median(times)), "peak_kib": peak, "start_kib": before,
                  "file_kib": kib("RssFile") - before_file}))
"""


class _Reader:
    def __init__(self, name: str, shape, lo: float, hi: float):
        rng = np.random.default_rng(0)
        self._it = iter([{name: rng.uniform(lo, hi, shape).astype(np.float32)} for _ in range(8)])

    def get_next(self):
        return next(self._it, None)


def _quantize(src: Path, shape, lo: float, hi: float, folder: Path) -> Path:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre, out = folder / f"{src.stem}_pre.onnx", folder / f"{src.stem}_int8.onnx"
    quant_pre_process(str(src), str(pre))
    name = onnx.load(str(pre)).graph.input[0].name
    quantize_static(
        str(pre),
        str(out),
        _Reader(name, shape, lo, hi),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
    )
    return out


def _models(folder: Path):
    """[(label, float ONNX, its int8 form, batch of inputs, labels, head pattern)]."""
    digits = ROOT / "edgetrain" / "data" / "digits_lenet.onnx"
    rng = np.random.default_rng(0)
    out = [
        (
            "digits LeNet b32",
            digits,
            _quantize(digits, (4, 1, 28, 28), 0.0, 1.0, folder),
            rng.integers(0, 256, (32, 1, 28, 28)).astype(np.uint8),
            rng.integers(0, 10, 32),
            "fc3*",
        )
    ]
    try:
        import exports  # needs torch and torchvision
    except ImportError as e:
        print(f"MobileNetV2 left out: {e}", file=sys.stderr)
        return out
    (folder / "exports").mkdir(exist_ok=True)
    e = exports.export("mobilenet_v2", folder / "exports", exporter="torchscript", mode="eval", batch=8)
    shape = tuple(int(d.dim_value) for d in onnx.load(str(e.path)).graph.input[0].type.tensor_type.shape.dim)
    x = rng.standard_normal(shape).astype(np.float32)
    classes = int(onnx.load(str(e.path)).graph.output[0].type.tensor_type.shape.dim[1].dim_value)
    head = sorted(e.onnx_names(e.head()))
    out.append(
        (
            "MobileNetV2 3x64x64 b8",
            e.path,
            _quantize(e.path, shape, -2.0, 2.0, folder),
            x,
            rng.integers(0, classes, 8),
            head,
        )
    )
    return out


def _measure(model: Path, x, y, trainable, folder: Path, steps: int) -> dict:
    art = et.convert(
        str(model),
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.01, momentum=0.9, weight_decay=1e-4),
        trainable=trainable,
        batch_size=len(x),
    )
    path = folder / "m.etrain"
    size = art.save(path)
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    run = subprocess.run(
        [sys.executable, "-c", WORKER, str(path), str(folder / "x.npy"), str(folder / "y.npy"), str(steps)],
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(run.stdout.strip().splitlines()[-1])
    return {"bytes": size, "trained": len(art.parameters), **got}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default=str(ROOT / "docs" / "quantized.md"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for label, flt, int8, x, y, head in _models(folder):
            for mode, trainable in (("head-only", head), ("full", None)):
                pair = {}
                for kind, model in (("float", flt), ("int8", int8)):
                    print(f"{label} {mode} {kind} ...", file=sys.stderr, flush=True)
                    pair[kind] = _measure(model, x, y, trainable, folder, args.steps)
                rows.append({"model": label, "mode": mode, **pair})
    _write(Path(args.out), rows, args.steps)


def _growth(m: dict) -> int:
    return max(1, m["peak_kib"] - m["start_kib"])


def _write(out: Path, rows: list[dict], steps: int) -> None:
    lines = [
        "# int8 against float: artifact, memory and step time",
        "",
        "Measured by `tools/qat_bench.py` in one run: the same model personalized from its float export and from its",
        "int8 form (onnxruntime's `quantize_static`, QDQ, per-channel int8 weights, int8 activations), SGD with",
        f"momentum, one thread, each in its own process; the step time is the median of {steps} steps after 3, the",
        "peak RSS the training process's (Python, numpy and edgetrain included), and beside it its growth from",
        "before the session was opened. The int8 model trains float master",
        "weights through fake quantization; its frozen weights stay int8 in the artifact and in memory.",
        "",
        "| model | training | artifact float | artifact int8 | int8/float | peak RSS float | peak RSS int8 "
        "| growth float | growth int8 | int8/float | mapped float | mapped int8 "
        "| step float | step int8 | int8/float |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f, q = r["float"], r["int8"]
        lines.append(
            f"| {r['model']} | {r['mode']} | {f['bytes'] / 1024:,.0f} KiB | {q['bytes'] / 1024:,.0f} KiB | "
            f"{q['bytes'] / f['bytes']:.2f} | {f['peak_kib'] / 1024:,.1f} MiB | {q['peak_kib'] / 1024:,.1f} MiB | "
            f"{_growth(f) / 1024:,.1f} MiB | {_growth(q) / 1024:,.1f} MiB | {_growth(q) / _growth(f):.2f} | "
            f"{f['file_kib'] / 1024:,.1f} MiB | {q['file_kib'] / 1024:,.1f} MiB | "
            f"{f['ms']:.2f} ms | {q['ms']:.2f} ms | {q['ms'] / f['ms']:.2f} |"
        )
    lines += [
        "",
        "The peak RSS includes the interpreter and libraries (about the same in both); the artifact is the file the",
        'phone keeps. "mapped" is the artifact\'s pages resident after training (its tensors are memory-mapped:',
        "the frozen int8 weights are a quarter of the float ones). The int8 step also holds what the float one does",
        "not: the frozen weights dequantized one at a time, the fake quantizations' inputs for the backward. The raw",
        "numbers:",
        "",
        "```json",
        json.dumps(rows, indent=1),
        "```",
        "",
    ]
    out.write_text("\n".join(lines))
    print("\n".join(lines[8 : 10 + len(rows)]))


if __name__ == "__main__":
    main()
