"""Gradient rules of LSTM, GRU and RNN, and the standard-op bodies of their fused ops.

The rule emits one fused node (LSTMGrad, GRUGrad, RNNGrad: back-propagation through time in numpy, see
edgetrain.core.kernels.recurrent). Its body, for any other ONNX runtime, is the recurrence unrolled over the
static sequence length into standard ops (one MatMul of all steps' inputs, then per step a MatMul against R, the
gates, the masks of sequence_lens) followed by the gradient rules of those ops: the same derivative, built from
rules that are each checked on their own, so the body is an independent second implementation of the kernel.

With the fast path "recurrent-trace" on (edgetrain.core.fastpaths), the rule also swaps the forward node for its
training-mode forward (LSTMTrain, GRUTrain, RNNTrain): the same outputs plus the trace of every step (gates,
states), which the fused backward reads instead of running the forward again. Its body is the standard op for the
outputs and the unrolled recurrence for the trace; the backward's body recomputes (it ignores the trace).
"""

from __future__ import annotations

import numpy as np

from edgetrain.core import fastpaths
from edgetrain.core.ir import Node
from edgetrain.core.kernels.recurrent import (
    DEFAULT_ACTS,
    DIRECTIONS,
    GATES,
    Act,
    needs_pre,
    resolve_activations,
    trace_blocks,
)
from edgetrain.core.ops import PRIVATE_DOMAIN, record
from edgetrain.derive.autodiff.context import GradContext
from edgetrain.derive.autodiff.driver import backprop
from edgetrain.derive.autodiff.registry import body, grad

Grads = list[str | None]

# gradient outputs of the fused op, by the forward input they belong to
GRAD_INPUTS = {
    "LSTM": (0, 1, 2, 3, 5, 6, 7),  # X, W, R, B, initial_h, initial_c, P
    "GRU": (0, 1, 2, 3, 5),  # X, W, R, B, initial_h
    "RNN": (0, 1, 2, 3, 5),
}
N_INPUTS = {"LSTM": 8, "GRU": 6, "RNN": 6}
N_OUTPUTS = {"LSTM": 3, "GRU": 2, "RNN": 2}
TRACE = "recurrent-trace"  # the fast path: the backward reads the training-mode forward's trace


# (Y, Y_h[, Y_c]) = recurrence(X, W, R, B, sequence_lens, initial_h[, initial_c, P]): every gradient from one
# fused op that recomputes the forward and runs back through time
@grad("LSTM", "GRU", "RNN")
def recurrent_grad(g: GradContext, node: Node, dys: Grads, needs: list[bool]) -> Grads:
    op = node.op_type
    n_in = N_INPUTS[op]
    ins = list(node.inputs) + [""] * (n_in - len(node.inputs))
    seeds = [d or "" for d in dys] + [""] * (N_OUTPUTS[op] - len(dys))
    wanted = [k < len(needs) and needs[k] for k in GRAD_INPUTS[op]]
    last = max(j for j, w in enumerate(wanted) if w)
    names = [g.b.fresh(f"{node.name}_grad_{j}") if w else "" for j, w in enumerate(wanted[: last + 1])]
    trace = _train_forward(g, node) if fastpaths.enabled(TRACE) else ""
    if trace:  # in initial_h's place: the trace begins with the initial states (see the kernels)
        ins[5] = trace
    inputs = ins + seeds
    while inputs and not inputs[-1]:
        inputs.pop()
    g.b.add(
        f"{op}Grad",
        inputs,
        attrs=dict(node.attrs),
        outputs=names,
        name=f"{node.name}_grad",
        domain=PRIVATE_DOMAIN,
    )
    out: Grads = [None] * len(node.inputs)
    for j, name in enumerate(names):
        k = GRAD_INPUTS[op][j]
        if name and k < len(out):
            out[k] = name
    return out


def _train_forward(g: GradContext, node: Node) -> str:
    """Swaps node (in g's graph) for its training-mode forward, which writes the same outputs and the trace;
    returns the trace's name ("" when node is not in g's graph: the backward then recomputes)."""
    nodes = g.graph.nodes
    at = next((k for k, n in enumerate(nodes) if n is node), None)
    if at is None:
        return ""
    op = node.op_type
    trace = g.b.fresh(f"{node.name or op}_trace")
    outputs = [trace] + list(node.outputs) + [""] * (N_OUTPUTS[op] - len(node.outputs))
    train = Node(
        f"{op}Train", node.inputs, tuple(outputs), dict(node.attrs), name=node.name, domain=PRIVATE_DOMAIN
    )
    infos = [g.info(i) if i else None for i in node.inputs]
    g.graph.values[trace] = record(train.op_type).shape(train, infos)[0]
    nodes[at] = train
    return trace


# ---------------------------------------------------------------------------------------------------- the body
def _act(g: GradContext, act: Act, x: str) -> str:
    """act(x) in standard ops."""
    n, a, b = act.name, act.alpha, act.beta
    simple = {
        "sigmoid": "Sigmoid",
        "tanh": "Tanh",
        "relu": "Relu",
        "softsign": "Softsign",
        "softplus": "Softplus",
    }
    if n in simple:
        return g.op(simple[n], x)
    if n == "affine":
        return g.op("Add", g.op("Mul", x, g.scalar_like(a, x)), g.scalar_like(b, x))
    if n == "scaledtanh":
        return g.op("Mul", g.op("Tanh", g.op("Mul", x, g.scalar_like(b, x))), g.scalar_like(a, x))
    if n == "leakyrelu":
        return g.op("LeakyRelu", x, alpha=a)
    if n == "thresholdedrelu":
        return g.op("ThresholdedRelu", x, alpha=a)
    if n == "hardsigmoid":
        return g.op("HardSigmoid", x, alpha=a, beta=b)
    assert n == "elu", n
    return g.op("Elu", x, alpha=a)


class _Unrolled:
    """The forward of one recurrent node unrolled into standard ops over its static sequence length."""

    def __init__(self, g: GradContext, node: Node, *, traced: bool = False):
        op = node.op_type.removesuffix("Grad").removesuffix("Train")
        self.g, self.op, self.attrs = g, op, node.attrs
        ins = list(node.inputs) + [""] * (N_INPUTS[op] + N_OUTPUTS[op] - len(node.inputs))
        self.x, self.w, self.r, self.b, self.lens, self.h0 = ins[:6]
        self.c0, self.p = (ins[6], ins[7]) if op == "LSTM" else ("", "")
        self.seeds = ins[N_INPUTS[op] : N_INPUTS[op] + N_OUTPUTS[op]]
        # per direction, per step: the parts of the trace (a training forward's body builds it)
        self.steps: list[list[dict]] | None = [] if traced else None
        self.direction = self.attrs.get("direction", "forward")
        self.direction = self.direction.decode() if isinstance(self.direction, bytes) else self.direction
        self.nd = DIRECTIONS[self.direction]
        self.layout = int(self.attrs.get("layout", 0))
        self.hidden = g.shape(self.r)[-1]
        self.clip = self.attrs.get("clip")
        self.acts = resolve_activations(
            op,
            DEFAULT_ACTS[op],
            self.nd,
            self.attrs.get("activations"),
            self.attrs.get("activation_alpha"),
            self.attrs.get("activation_beta"),
        )
        if self.h0 and len(g.shape(self.h0)) == 2:  # a training forward's trace stands in for initial_h
            self.h0 = self._initial_from_trace(self.h0)

    def _initial_from_trace(self, trace: str) -> str:
        """initial_h (in the node's layout) as the trace's first states: each direction's h block, row 0."""
        g = self.g
        x = g.shape(self.x)
        t_len, n = (x[1], x[0]) if self.layout else (x[0], x[1])
        blocks = trace_blocks(
            self.op, t_len, n, self.hidden, pre=needs_pre(self.acts), clip=self.clip is not None
        )
        at = 0
        for name, shape in blocks:
            if name == "h":
                break
            at += int(np.prod(shape))
        h0 = g.op(
            "Slice",
            trace,
            g.ints([at], hint="starts"),
            g.ints([at + n * self.hidden], hint="ends"),
            g.ints([1]),
        )
        h0 = g.reshape(h0, [self.nd, n, self.hidden])
        return g.op("Transpose", h0, perm=[1, 0, 2]) if self.layout else h0

    def build(self) -> tuple[str, str, str | None]:
        """Appends the forward; returns (Y, Y_h, Y_c or None) in the node's layout."""
        g = self.g
        x, h0, c0 = self.x, self.h0, self.c0
        if self.layout == 1:
            x = g.op("Transpose", x, perm=[1, 0, 2])
            h0 = h0 and g.op("Transpose", h0, perm=[1, 0, 2])
            c0 = c0 and g.op("Transpose", c0, perm=[1, 0, 2])
        self.t_len, self.n = g.shape(x)[:2]
        lens = g.op("Cast", self.lens, to=7) if self.lens else ""  # int64
        self.lens64 = lens
        ys, hs, cs = [], [], []
        for d in range(self.nd):
            y, h, c = self._direction(x, h0, c0, d)
            ys.append(g.op("Unsqueeze", y, g.ints([1])))
            hs.append(g.op("Unsqueeze", h, g.ints([0])))
            if c:
                cs.append(g.op("Unsqueeze", c, g.ints([0])))
        y = ys[0] if self.nd == 1 else g.op("Concat", *ys, axis=1)  # [T, D, N, H]
        yh = hs[0] if self.nd == 1 else g.op("Concat", *hs, axis=0)
        yc = (cs[0] if self.nd == 1 else g.op("Concat", *cs, axis=0)) if cs else None
        if self.layout == 1:
            y = g.op("Transpose", y, perm=[2, 0, 1, 3])
            yh = g.op("Transpose", yh, perm=[1, 0, 2])
            yc = yc and g.op("Transpose", yc, perm=[1, 0, 2])
        return y, yh, yc

    def _pick(self, v: str, d: int) -> str:
        """v[d] of a per-direction input."""
        return self.g.op("Gather", v, self.g.const(d, "int64", hint="dir"), axis=0)

    def _direction(self, x: str, h0: str, c0: str, d: int) -> tuple[str, str, str]:
        g, op, hs = self.g, self.op, self.hidden
        gates = GATES[op]
        reverse = self.direction == "reverse" or d == 1
        by_length = reverse and bool(self.lens64)
        if by_length:
            x = g.op("ReverseSequence", x, self.lens64, batch_axis=1, time_axis=0)
        w, r = self._pick(self.w, d), self._pick(self.r, d)
        xw = g.op("MatMul", x, g.op("Transpose", w, perm=[1, 0]))  # [T, N, G*H]
        rb_h = None
        if self.b:
            bd = self._pick(self.b, d)
            wb, rb = g.ops("Split", bd, g.ints([gates * hs] * 2, hint="split"), n=2, axis=0)
            if op == "GRU":
                rb_zr, rb_h = g.ops("Split", rb, g.ints([2 * hs, hs], hint="split"), n=2, axis=0)
                zero_h = g.const([0.0] * hs, g.dtype(x), hint="zeros")
                xw = g.op("Add", xw, g.op("Add", wb, g.op("Concat", rb_zr, zero_h, axis=0)))
            else:
                xw = g.op("Add", xw, g.op("Add", wb, rb))
        dt = g.dtype(x)
        zeros = g.const(0.0, dt, hint="zero")
        h = self._pick(h0, d) if h0 else g.op("Expand", zeros, g.ints([self.n, hs], hint="shape"))
        c = None
        if op == "LSTM":
            c = self._pick(c0, d) if c0 else g.op("Expand", zeros, g.ints([self.n, hs], hint="shape"))
        p = self._pick(self.p, d) if self.p else None
        r_t = g.op("Transpose", r, perm=[1, 0])
        steps = range(self.t_len - 1, -1, -1) if reverse and not by_length else range(self.t_len)
        ys: dict[int, str] = {}
        if self.steps is not None:
            self.steps.append([])
        for k, t in enumerate(steps):
            a = g.op("Gather", xw, g.const(t, "int64", hint="t"), axis=0)  # [N, G*H]
            self.step = {"h": h, "c": c, "gates": [], "a": [], "kept": []}
            if op == "LSTM":
                h_new, c_new = self._lstm(a, h, c, r_t, p, d)
            elif op == "GRU":
                h_new, c_new = self._gru(a, h, r, rb_h, d), None
            else:
                h_new, c_new = self._gate(d, 0, g.op("Add", a, g.op("MatMul", h, r_t))), None
            if self.steps is not None:
                self.steps[-1].append(self.step)
            if self.lens64:
                # processing step k of a sample is within its length when k < length (its steps are in order)
                m = g.op("Unsqueeze", g.op("Less", g.const(k, "int64", hint="t"), self.lens64), g.ints([1]))
                ys[t] = g.op("Where", m, h_new, zeros)
                h = g.op("Where", m, h_new, h)
                c = g.op("Where", m, c_new, c) if c_new else c
            else:
                ys[t] = h = h_new
                c = c_new
        if self.steps is not None:
            self.steps[-1].append({"h": h, "c": c})  # the states after the last step
        y = g.op("Concat", *[g.op("Unsqueeze", ys[t], g.ints([0])) for t in range(self.t_len)], axis=0)
        if by_length:
            y = g.op("ReverseSequence", y, self.lens64, batch_axis=1, time_axis=0)
        return y, h, c

    def _clip(self, a: str) -> str:
        if self.clip is None:
            return a
        lim = float(np.float32(self.clip))  # a FLOAT attribute is 32-bit, as the kernel reads it
        return self.g.op("Clip", a, self.g.scalar_like(-lim, a), self.g.scalar_like(lim, a))

    def _act(self, d: int, k: int, x: str) -> str:
        return _act(self.g, self.acts[d][k], x)

    def _gate(self, d: int, k: int, a: str) -> str:
        """act(clip(a)) of one gate, its parts kept for the trace (gate value, clipped pre-activation, clip mask)."""
        clipped = self._clip(a)
        value = self._act(d, k, clipped)
        self._keep(a, clipped, value)
        return value

    def _keep(self, a: str, clipped: str, value: str) -> None:
        if self.steps is None:
            return
        step = self.step
        step["gates"].append(value)
        step["a"].append(clipped)
        if self.clip is not None:
            g, lim = self.g, float(np.float32(self.clip))
            kept = g.op("LessOrEqual", g.op("Abs", a), g.scalar_like(lim, a))
            step["kept"].append(g.op("Cast", kept, to=_ONNX_FLOAT[g.dtype(a).name]))

    def _lstm(self, a: str, h: str, c: str, r_t: str, p: str | None, d: int) -> tuple[str, str]:
        g, hs = self.g, self.hidden
        a = g.op("Add", a, g.op("MatMul", h, r_t))
        ai, ao, af, ac = g.ops("Split", a, g.ints([hs] * 4, hint="split"), n=4, axis=1)
        if p:
            pi, po, pf = g.ops("Split", p, g.ints([hs] * 3, hint="split"), n=3, axis=0)
            ai = g.op("Add", ai, g.op("Mul", pi, c))
            af = g.op("Add", af, g.op("Mul", pf, c))
        gi = self._act(d, 0, ai_c := self._clip(ai))
        af_c = self._clip(af) if self.steps is not None or not self.attrs.get("input_forget", 0) else af
        if self.attrs.get("input_forget", 0):
            gf = g.op("Sub", g.scalar_like(1.0, gi), gi)
        else:
            gf = self._act(d, 0, af_c)
        gc = self._act(d, 1, ac_c := self._clip(ac))
        c_new = g.op("Add", g.op("Mul", gf, c), g.op("Mul", gi, gc))
        if p:
            ao = g.op("Add", ao, g.op("Mul", po, c_new))
        go = self._act(d, 0, ao_c := self._clip(ao))
        hc = self._act(d, 2, c_new)
        if self.steps is not None:  # the kernel's gate order: i, o, f, c
            for a, clipped, value in ((ai, ai_c, gi), (ao, ao_c, go), (af, af_c, gf), (ac, ac_c, gc)):
                self._keep(a, clipped, value)
            self.step["extra"] = hc
        return g.op("Mul", go, hc), c_new

    def _gru(self, a: str, h: str, r: str, rb_h: str | None, d: int) -> str:
        g, hs = self.g, self.hidden
        r_zr, r_h = g.ops("Split", r, g.ints([2 * hs, hs], hint="split"), n=2, axis=0)
        ax, ah = g.ops("Split", a, g.ints([2 * hs, hs], hint="split"), n=2, axis=1)
        azr = g.op("Add", ax, g.op("MatMul", h, g.op("Transpose", r_zr, perm=[1, 0])))
        az, ar = g.ops("Split", azr, g.ints([hs, hs], hint="split"), n=2, axis=1)
        z = self._gate(d, 0, az)
        rr = self._gate(d, 0, ar)
        r_h_t = g.op("Transpose", r_h, perm=[1, 0])
        if self.attrs.get("linear_before_reset", 0):
            q = g.op("MatMul", h, r_h_t)
            q = g.op("Add", q, rb_h) if rb_h else q
            self.step["extra"] = q
            ah = g.op("Add", ah, g.op("Mul", rr, q))
        else:
            self.step["extra"] = rh = g.op("Mul", rr, h)
            q = g.op("MatMul", rh, r_h_t)
            q = g.op("Add", q, rb_h) if rb_h else q
            ah = g.op("Add", ah, q)
        hh = self._gate(d, 1, ah)
        # (1 - z) * hh + z * h
        return g.op("Add", g.op("Mul", g.op("Sub", g.scalar_like(1.0, z), z), hh), g.op("Mul", z, h))


_ONNX_FLOAT = {"float16": 10, "float32": 1, "float64": 11}


@body("LSTMTrain", "GRUTrain", "RNNTrain")
def _recurrent_train_body(g: GradContext, node: Node) -> list[str]:
    """The trace built by the recurrence unrolled (blocks as the kernel's), and the standard op's outputs."""
    op = node.op_type.removesuffix("Train")
    inputs = list(node.inputs)
    while inputs and not inputs[-1]:
        inputs.pop()
    outs = g.ops(op, *inputs, n=N_OUTPUTS[op], **node.attrs)
    u = _Unrolled(g, node, traced=True)
    u.build()
    return [_trace(u)] + outs


def _trace(u: _Unrolled) -> str:
    """The trace [D, size] from the unrolled recurrence's steps: per direction, each block of
    edgetrain.core.kernels.recurrent.trace_blocks flattened, the blocks end to end."""
    g, rows = u.g, []
    blocks = trace_blocks(u.op, u.t_len, u.n, u.hidden, pre=needs_pre(u.acts), clip=u.clip is not None)
    for steps in u.steps:
        flat = []
        for name, _ in blocks:
            if name in ("h", "c"):
                parts = [s[name] for s in steps]
            elif name == "extra":
                parts = [s["extra"] for s in steps[:-1]]
            else:
                parts = [
                    g.op("Concat", *s[name], axis=1) if len(s[name]) > 1 else s[name][0] for s in steps[:-1]
                ]
            if not parts:
                flat.append(g.const(np.zeros(0, g.dtype(u.x)), hint="empty"))
                continue
            stacked = g.op("Concat", *[g.op("Unsqueeze", v, g.ints([0])) for v in parts], axis=0)
            flat.append(g.op("Reshape", stacked, g.ints([-1], hint="shape")))
        row = g.op("Concat", *flat, axis=0) if len(flat) > 1 else flat[0]
        rows.append(g.op("Unsqueeze", row, g.ints([0])))
    return rows[0] if len(rows) == 1 else g.op("Concat", *rows, axis=0)


@body("LSTMGrad", "GRUGrad", "RNNGrad")
def _recurrent_grad_body(g: GradContext, node: Node) -> list[str]:
    u = _Unrolled(g, node)
    start = len(g.graph.nodes)
    outs = u.build()
    forward = g.graph.nodes[start:]
    seeds = {o: s for o, s in zip(outs, u.seeds) if o and s}
    wrt_inputs = [u.x, u.w, u.r, u.b, u.h0] + ([u.c0, u.p] if u.op == "LSTM" else [])
    wrt = [v for v in wrt_inputs if v]
    grads = backprop(g, forward, seeds, wrt)
    results = []
    for k, v in enumerate(wrt_inputs[: len(node.outputs)]):
        if not node.outputs[k]:
            results.append("")
        elif v and grads.get(v):
            results.append(grads[v])
        else:  # no seed depends on it (or the input is omitted): zeros of its shape
            shape = g.shape(v) if v else _omitted_shape(u, k)
            results.append(
                g.op("Expand", g.const(0.0, g.dtype(u.x), hint="zero"), g.ints(shape, hint="shape"))
            )
    return results


def _omitted_shape(u: _Unrolled, k: int) -> list[int]:
    """The shape of the gradient of an omitted input (the fused kernel returns zeros of it)."""
    g, nd, hs, gates = u.g, u.nd, u.hidden, GATES[u.op]
    n = g.shape(u.x)[1 - u.layout]
    state = [nd, n, hs] if u.layout == 0 else [n, nd, hs]
    return {3: [nd, 2 * gates * hs], 4: state, 5: state, 6: [nd, 3 * hs]}[k]
