"""Independent checks of gradient rules: float64 central finite differences of the forward, and onnxruntime
running the emitted backward graph (edgetrain's fused ops as ONNX functions in standard ops)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from edgetrain.core.interpreter import Interpreter
from edgetrain.core.ir import Graph, Node, TensorInfo
from edgetrain.derive.autodiff import GradContext, ShapedBuilder, differentiate
from edgetrain.graph.passes import infer_shapes

# op -> the largest relative finite-difference error any check_grad saw (conftest prints it after the run)
WORST: dict[str, float] = {}


def record(op: str, err: float) -> None:
    WORST[op] = max(WORST.get(op, 0.0), err)


def build(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any] | None,
    wrt: Sequence[int],
    n_outputs: int,
    seed: int,
    dtype: Any,
    opset: int = 18,
    seeded: Collection[int] | None = None,
) -> tuple[Graph, list[str], dict[str, np.ndarray]]:
    """y = op(inputs); loss = sum_k sum(y_k * R_k) with fixed random R_k (so every output element matters
    differently); the graph outputs [loss, d loss / d x_i for i in wrt]. Inputs in wrt are graph inputs, the
    others constants. seeded: the outputs the node names (and the loss reads); the others are "" (default: all).
    Returns (graph, wrt names, feeds)."""
    rng = np.random.default_rng(seed + 1000)
    names, inits, feeds, values = [], {}, {}, {}
    for k, x in enumerate(inputs):
        if x is None:
            names.append("")
            continue
        x = np.asarray(x)
        if x.dtype.kind == "f":
            x = x.astype(dtype)
        name = f"x{k}"
        names.append(name)
        values[name] = TensorInfo(x.dtype, x.shape)
        (feeds if k in wrt else inits)[name] = x
    outs = [f"y{k}" if seeded is None or k in seeded else "" for k in range(n_outputs)]
    node = Node(op_type, tuple(names), tuple(outs), dict(attrs or {}), name="under_test")
    outs = [o for o in outs if o]
    g = Graph(
        nodes=[node],
        inputs=[n for n in names if n in feeds],
        outputs=outs,
        initializers=inits,
        values=values,
        opset=opset,
    )
    g = infer_shapes(g)
    b = ShapedBuilder(g)
    ctx = GradContext(b)
    terms = []
    for y in outs:
        info = g.values[y]
        if np.dtype(info.dtype).kind != "f":
            continue
        r = ctx.const(rng.standard_normal(info.shape).astype(info.dtype), hint="R")
        terms.append(ctx.op("ReduceSum", ctx.op("Mul", y, r), keepdims=0))
    loss = terms[0] if len(terms) == 1 else ctx.op("Sum", *terms)
    wrt_names = [names[k] for k in wrt]
    grads = differentiate(ctx, loss, wrt_names)
    graph = b.finish(outputs=[loss] + [grads[w] for w in wrt_names])
    graph.verify(static=True)
    return graph, wrt_names, feeds


def _loss(graph: Graph, feeds: dict[str, np.ndarray]) -> float:
    fwd = graph.copy(outputs=graph.outputs[:1])
    return float(Interpreter(fwd, preallocate=False).run(feeds)[0])


def check_grad(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any] | None = None,
    *,
    wrt: Sequence[int] | None = None,
    n_outputs: int = 1,
    rtol: float = 1e-5,
    atol: float = 1e-7,
    eps: float = 1e-6,
    seed: int = 0,
    ort: bool = True,
    max_coords: int = 48,
    opset: int = 18,
    seeded: Collection[int] | None = None,
) -> float:
    """Checks the rule of op_type at these inputs (float ones are used in float64) against central finite
    differences, and (ort=True) the float32 backward graph run by onnxruntime against edgetrain's interpreter.
    wrt: indices of the inputs to differentiate (default: every float input); opset: of the emitted graph (newer
    ops need newer ones). Returns the largest relative finite-difference error seen."""
    if wrt is None:
        wrt = [k for k, x in enumerate(inputs) if x is not None and np.asarray(x).dtype.kind == "f"]
    graph, names, feeds = build(op_type, inputs, attrs, wrt, n_outputs, seed, np.float64, opset, seeded)
    got = Interpreter(graph, preallocate=False).run(feeds)[1:]
    rng = np.random.default_rng(seed)
    worst = 0.0
    for name, g in zip(names, got):
        x = feeds[name]
        assert g.shape == x.shape and g.dtype == x.dtype, (name, g.shape, x.shape, g.dtype)
        coords = list(np.ndindex(x.shape))
        if len(coords) > max_coords:
            coords = [coords[i] for i in rng.choice(len(coords), max_coords, replace=False)]
        fd = np.empty(len(coords))
        for j, c in enumerate(coords):
            xp, xm = x.copy(), x.copy()
            xp[c] += eps
            xm[c] -= eps
            fd[j] = (_loss(graph, {**feeds, name: xp}) - _loss(graph, {**feeds, name: xm})) / (2 * eps)
        an = np.array([g[c] for c in coords])
        np.testing.assert_allclose(an, fd, rtol=rtol, atol=atol, err_msg=f"{op_type}: d loss / d {name}")
        scale = np.maximum(np.abs(fd), 1e-3)
        worst = max(worst, float(np.max(np.abs(an - fd) / scale)))
        # A random direction over all elements too, so unsampled coordinates cannot hide an error.
        v = rng.standard_normal(x.shape)
        d = (_loss(graph, {**feeds, name: x + eps * v}) - _loss(graph, {**feeds, name: x - eps * v})) / (
            2 * eps
        )
        np.testing.assert_allclose(
            float(np.sum(g * v)),
            d,
            rtol=rtol,
            atol=atol * max(1, v.size),
            err_msg=f"{op_type}: directional derivative along {name}",
        )
    record(op_type, worst)
    if ort:
        check_against_onnxruntime(
            op_type, inputs, attrs, wrt=wrt, n_outputs=n_outputs, seed=seed, opset=opset, seeded=seeded
        )
    return worst


def check_against_onnxruntime(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any] | None = None,
    *,
    wrt: Sequence[int],
    n_outputs: int = 1,
    seed: int = 0,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    opset: int = 18,
    seeded: Collection[int] | None = None,
) -> None:
    """The float32 backward graph, emitted as standard ONNX, run by onnxruntime equals edgetrain's run."""
    import onnx
    import onnxruntime as ort

    from edgetrain.derive.autodiff import expand_body
    from edgetrain.onnx_io.writer import to_onnx

    graph, names, feeds = build(op_type, inputs, attrs, wrt, n_outputs, seed, np.float32, opset, seeded)
    ours = Interpreter(graph, preallocate=False).run(feeds)
    model = to_onnx(graph, body=expand_body)
    onnx.checker.check_model(model, full_check=True)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    theirs = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    for o, t, name in zip(ours, theirs, graph.outputs):
        scale = max(1.0, float(np.abs(t).max()))
        np.testing.assert_allclose(
            o, t, rtol=rtol, atol=atol * scale, err_msg=f"{op_type}: {name} vs onnxruntime"
        )


def rnd(*shape, seed=0, lo=None, hi=None, away=(), margin=0.05):
    """Seeded float64 data; uniform in [lo, hi) if given, else standard normal; pushed at least `margin` away
    from each kink in `away` (finite differences are meaningless across a kink)."""
    rng = np.random.default_rng(seed + 17 * len(shape) + sum(shape))
    x = rng.uniform(lo, hi, shape) if lo is not None else rng.standard_normal(shape)
    for k in away:
        near = np.abs(x - k) < margin
        x[near] = k + np.where(x[near] >= k, margin, -margin) * 2
    return x


def grads_of(nodes, feeds, loss, wrt):
    """Runs differentiate on a small hand-built graph: ({param: gradient name or None}, gradient values)."""
    from edgetrain.derive.autodiff import GradContext

    values = {k: TensorInfo(v.dtype, v.shape) for k, v in feeds.items()}
    g = infer_shapes(Graph(nodes, list(feeds), [loss], {}, values, opset=18))
    b = ShapedBuilder(g)
    grads = differentiate(GradContext(b), loss, wrt)
    outs = [grads[w] for w in wrt if grads[w]]
    return grads, Interpreter(b.finish(outputs=outs), preallocate=False).run(feeds)
