"""Developer benchmark: the conv and pool kernels of the working tree beside those of a git revision (HEAD by
default), on LeNet's layers (batch 32 and 64) and MobileNetV2-like depthwise layers; median ms per call, 1 thread.
Usage: python tools/bench_kernels.py [--rev HEAD] [--repeat 200] [--only SUBSTRING]"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # before numpy loads BLAS
    os.environ[_var] = "1"

import argparse  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgetrain.core.kernels import conv, nn_grad, pool, registry  # noqa: E402

PKG = "edgetrain.core.kernels"


def load_rev(rev: str) -> tuple[types.SimpleNamespace, types.ModuleType]:
    """The conv and pool kernels and nn_grad (and the window and depthwise modules they use) as of git revision rev,
    loaded as modules of their own beside today's."""
    mods = {}
    real = registry.kernel
    registry.kernel = lambda *a, **k: (
        lambda fn: fn
    )  # the old kernels register nowhere: today's keep the op records
    try:
        for name in ("depthwise", "window", "conv", "pool", "nn_grad"):
            path = f"{PKG.replace('.', '/')}/{name}.py"
            src = subprocess.run(
                ["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
            ).stdout
            for dep in ("window", "conv", "pool", "depthwise"):
                src = src.replace(f"from .{dep} import", f"from ._rev_{dep} import")
            src = src.replace("from . import depthwise", "from . import _rev_depthwise as depthwise")
            mod = types.ModuleType(f"{PKG}._rev_{name}")
            mod.__package__ = PKG
            sys.modules[mod.__name__] = mod
            exec(compile(src, f"{rev}:{path}", "exec"), mod.__dict__)
            mods[name] = mod
    finally:
        registry.kernel = real
    return kernels_of(mods["conv"], mods["pool"]), mods["nn_grad"]


def kernels_of(conv_module: types.ModuleType, pool_module: types.ModuleType) -> types.SimpleNamespace:
    """The forward kernels the cases call (a.conv, a.max_pool), from their two modules."""
    return types.SimpleNamespace(conv=conv_module.conv, max_pool=pool_module.max_pool)


def median_ms(fns, repeat: int) -> list[float]:
    """Median ms per call of each fn, the calls interleaved (old, new, old, ...) so that the shared machine's
    slow phases hit both alike."""
    for _ in range(max(3, repeat // 10)):
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [1000 * float(np.median(ts)) for ts in times]


P2 = {"pads": [2, 2, 2, 2]}  # LeNet's first convolution
MP = {"kernel_shape": [2, 2], "strides": [2, 2]}  # its pooling


def cases(rng):
    """(name, fn(forward kernels, nn_grad) -> call) pairs."""
    f32 = np.float32

    def r(*shape):
        return rng.standard_normal(shape).astype(f32)

    out = []
    for n in (32, 64):
        # LeNet: Conv(1->6, 5x5, pad 2) 28x28, MaxPool 2; Conv(6->16, 5x5) 14x14, MaxPool 2
        x1, w1, b1 = r(n, 1, 28, 28), r(6, 1, 5, 5), r(6)
        x2, w2, b2 = r(n, 6, 14, 14), r(16, 6, 5, 5), r(16)
        dy1, dy2 = r(n, 6, 28, 28), r(n, 16, 10, 10)
        y1 = np.empty((n, 6, 28, 28), f32)
        y2 = np.empty((n, 16, 10, 10), f32)
        pm1, pm2 = r(n, 6, 28, 28), r(n, 16, 10, 10)
        q1, q2 = np.empty((n, 6, 14, 14), f32), np.empty((n, 16, 5, 5), f32)
        dq1, dq2 = r(n, 6, 14, 14), r(n, 16, 5, 5)
        out += [
            (f"lenet{n} Conv1", lambda a, g, x=x1, w=w1, b=b1, y=y1: lambda: a.conv(x, w, b, **P2, out=y)),
            (f"lenet{n} Conv2", lambda a, g, x=x2, w=w2, b=b2, y=y2: lambda: a.conv(x, w, b, out=y)),
            (
                f"lenet{n} ConvGradWeight1",
                lambda a, g, x=x1, dy=dy1: (
                    lambda: g.conv_grad_weight(dy, x, kernel_shape=[5, 5], noutputs=2, **P2)
                ),
            ),
            (
                f"lenet{n} ConvGradWeight2",
                lambda a, g, x=x2, dy=dy2: lambda: g.conv_grad_weight(dy, x, kernel_shape=[5, 5], noutputs=2),
            ),
            (
                f"lenet{n} ConvGradInput2",
                lambda a, g, w=w2, dy=dy2: lambda: g.conv_grad_input(dy, w, output_shape=[14, 14]),
            ),
            (f"lenet{n} MaxPool1", lambda a, g, x=pm1, y=q1: lambda: a.max_pool(x, **MP, out=y)),
            (f"lenet{n} MaxPool2", lambda a, g, x=pm2, y=q2: lambda: a.max_pool(x, **MP, out=y)),
            (
                f"lenet{n} MaxPoolGrad1",
                lambda a, g, x=pm1, dy=dq1: (lambda y: lambda: g.max_pool_grad(dy, x, y, **MP))(
                    a.max_pool(x, **MP)
                ),
            ),
            (
                f"lenet{n} MaxPoolGrad2",
                lambda a, g, x=pm2, dy=dq2: (lambda y: lambda: g.max_pool_grad(dy, x, y, **MP))(
                    a.max_pool(x, **MP)
                ),
            ),
        ]
    # MobileNetV2-like depthwise 3x3 layers: (batch, channels, size, stride, multiplier)
    # and the late layers of MobileNetV2/V3 at 64x64 inputs (hundreds of channels over 2x2 and 4x4, 3x3 and 5x5)
    for n, c, h, s, mult, k in (
        (8, 32, 32, 1, 1, 3),
        (8, 32, 32, 2, 1, 3),
        (4, 96, 32, 2, 1, 3),
        (4, 144, 16, 1, 1, 3),
        (8, 16, 32, 1, 2, 3),
        (8, 960, 2, 1, 1, 3),
        (8, 384, 4, 1, 1, 3),
        (8, 576, 2, 1, 1, 5),
        (8, 240, 4, 1, 1, 5),
    ):
        x, w, b = r(n, c, h, h), r(c * mult, 1, k, k), r(c * mult)
        o = (h + 2 * (k // 2) - k) // s + 1
        dy = r(n, c * mult, o, o)
        at = {"group": c, "pads": [k // 2] * 4, "strides": [s, s]}
        tag = f"dw b{n} c{c}x{mult} {h}x{h} k{k} s{s}"
        y = np.empty((n, c * mult, o, o), f32)
        out += [
            (f"{tag} Conv", lambda a, g, x=x, w=w, b=b, at=at, y=y: lambda: a.conv(x, w, b, **at, out=y)),
            (
                f"{tag} ConvGradInput",
                lambda a, g, w=w, dy=dy, at=at, h=h: (
                    lambda: g.conv_grad_input(dy, w, output_shape=[h, h], **at)
                ),
            ),
            (
                f"{tag} ConvGradWeight",
                lambda a, g, x=x, dy=dy, at=at, k=k: (
                    lambda: g.conv_grad_weight(dy, x, kernel_shape=[k, k], noutputs=2, **at)
                ),
            ),
        ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    old = load_rev(args.rev)
    print(f"{'case':44s} {args.rev:>9s} {'now':>9s} {'speedup':>8s}")
    for name, make in cases(np.random.default_rng(0)):
        if args.only and args.only not in name:
            continue
        t_old, t_new = median_ms([make(*old), make(kernels_of(conv, pool), nn_grad)], args.repeat)
        print(f"{name:44s} {t_old:9.3f} {t_new:9.3f} {t_old / t_new:7.2f}x", flush=True)


if __name__ == "__main__":
    main()
