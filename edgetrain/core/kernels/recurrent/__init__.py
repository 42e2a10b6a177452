"""Recurrent kernels: ONNX LSTM, GRU and RNN, their training-mode forwards (LSTMTrain, GRUTrain, RNNTrain) and
their fused backward ops (LSTMGrad, GRUGrad, RNNGrad).

One driver runs every cell: directions (forward, reverse, bidirectional), layouts 0 and 1, initial states,
sequence_lens (a reverse direction reverses each sequence within its own length; steps past a length leave the
state as it was and write zeros to Y), clip, every activation the spec lists, LSTM peepholes and input_forget, GRU
linear_before_reset. Per direction the input projection of all steps is one GEMM; each step is one GEMM against R
and a few elementwise passes, written where their results stay (Y's rows, or the trace's).

The training-mode forward also writes the trace (trace_blocks: every step's gate values, the states before each
step, what the backward needs besides): the backward reads it and runs back through time. Without a trace (the
fast path "recurrent-trace" off), the backward runs the forward again to make one. The gradient of each step's
pre-activations goes into one [T, N, G*H] array, so dX, dW and the recurrence weights' gradient are each one GEMM
over all steps; only dH (through R) is per step.

This package: the kernels are here (a node's inputs and attributes -> its outputs); activations.py holds the
activations the attributes name, spec.py a node's inputs checked into a Spec and the order each direction takes
its steps in, trace.py what the training-mode forward keeps for the backward, forward.py and backward.py the two
drivers, which run a step of each cell: LSTM's in lstm.py, GRU's in gru.py (RNN's, one activation, is written in
the drivers).
"""

from __future__ import annotations

import numpy as np

from edgetrain.core.ir import Node, TensorInfo
from edgetrain.core.ops import PRIVATE_DOMAIN

from ..registry import kernel
from .activations import ACTIVATIONS, SPELLING, Act, resolve_activations
from .backward import backward
from .forward import forward, run_direction
from .spec import DEFAULT_ACTS, DIRECTIONS, GATES, N_STATES, Spec, make_spec
from .trace import Trace, carve, needs_pre, new_trace, new_trace_shape, trace_blocks, trace_size

__all__ = [
    "ACTIVATIONS",
    "DEFAULT_ACTS",
    "DIRECTIONS",
    "GATES",
    "N_STATES",
    "SPELLING",
    "Act",
    "Spec",
    "Trace",
    "backward",
    "carve",
    "forward",
    "gru",
    "gru_grad",
    "gru_train",
    "lstm",
    "lstm_grad",
    "lstm_train",
    "make_spec",
    "needs_pre",
    "new_trace",
    "new_trace_shape",
    "resolve_activations",
    "rnn",
    "rnn_grad",
    "rnn_train",
    "run_direction",
    "trace_blocks",
    "trace_size",
]


# ---------------------------------------------------------------------------------------------------- the kernels
def _run_forward(
    op: str,
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    initial_c=None,
    P=None,
    *,
    noutputs: int = 1,
    out: np.ndarray | None = None,
    **attrs,
):
    """The kernels' shared body: their parameters (a kernel passes its locals()) -> the outputs asked for; the
    training-mode forwards (op "LSTMTrain", ...) write the trace first, into out when given (its planned buffer)."""
    train = op.endswith("Train")
    op = op[: -len("Train")] if train else op
    spec = make_spec(op, X, W, R, B, sequence_lens, initial_h, initial_c, P, **attrs)
    if not train:
        outs = forward(spec, noutputs)
        return outs if len(outs) > 1 else outs[0]
    trace = new_trace(spec) if out is None else out
    assert trace.shape == new_trace_shape(spec) and trace.dtype == spec.x.dtype, (trace.shape, trace.dtype)
    return (trace, *forward(spec, N_STATES[op] + 1, trace))


def _run_backward(
    op: str,
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    initial_c=None,
    P=None,
    *,
    dY=None,
    dY_h=None,
    dY_c=None,
    noutputs: int = 1,
    **attrs,
):
    """The fused backward ops' shared body: their parameters (a kernel passes its locals()) -> the gradients.
    initial_h may be the training forward's trace (2-D, where a state is 3-D): it holds the initial states."""
    trace = None
    if initial_h is not None and np.ndim(initial_h) == 2:
        trace, initial_h = initial_h, None  # the backward reads the states from the trace
    spec = make_spec(op, X, W, R, B, sequence_lens, initial_h, initial_c, P, **attrs)
    return backward(spec, dY, dY_h, dY_c, noutputs, trace)


@kernel("LSTM")
def lstm(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    initial_c=None,
    P=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    input_forget=0,
    layout=0,
    noutputs: int = 1,
):
    return _run_forward("LSTM", **locals())


@kernel("GRU")
def gru(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    layout=0,
    linear_before_reset=0,
    noutputs: int = 1,
):
    return _run_forward("GRU", **locals())


@kernel("RNN")
def rnn(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    layout=0,
    noutputs: int = 1,
):
    return _run_forward("RNN", **locals())


# LSTMGrad(X, W, R, B, sequence_lens, initial_h, initial_c, P, dY, dY_h, dY_c) -> dX, dW, dR, dB, d initial_h,
# d initial_c, dP (the LSTM's attributes); an omitted seed is a zero gradient. In place of initial_h, the fused
# backward may read LSTMTrain's trace [D, size], whose states begin with the initial ones: then it runs no forward
# (the trace is 2-D, a state 3-D: the kernel, the shapes and the body tell them apart so).
def _backward_shapes(node: Node, infos: list[TensorInfo | None]) -> list[TensorInfo | None]:
    """LSTMGrad, GRUGrad, RNNGrad: the gradients of X, W, R, B, initial_h (and initial_c, P), each of its input's
    shape; B, initial_h (initial_c, P) of their default shape when the node has no such input."""
    x, w, r = infos[0], infos[1], infos[2]
    gates = {"LSTMGrad": 4, "GRUGrad": 3, "RNNGrad": 1}[node.op_type]
    d, hidden = w.shape[0], r.shape[2]
    batch_first = bool(int(node.attrs.get("layout", 0)))
    batch = x.shape[0] if batch_first else x.shape[1]
    state = (batch, d, hidden) if batch_first else (d, batch, hidden)

    def given(k: int, shape: tuple[int, ...]) -> TensorInfo:
        return infos[k] if k < len(infos) and infos[k] is not None else TensorInfo(x.dtype, shape)

    h0 = given(5, state)
    if len(h0.shape) == 2:  # the training forward's trace stands in for initial_h (it holds the states)
        h0 = TensorInfo(x.dtype, state)
    made = [x, w, r, given(3, (d, 2 * gates * hidden)), h0]
    if node.op_type == "LSTMGrad":
        made += [given(6, state), given(7, (d, 3 * hidden))]
    return [TensorInfo(x.dtype, tuple(m.shape)) for m in made[: len(node.outputs)]]


@kernel("LSTMGrad", domain=PRIVATE_DOMAIN, shape=_backward_shapes)
def lstm_grad(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    initial_c=None,
    P=None,
    dY=None,
    dY_h=None,
    dY_c=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    input_forget=0,
    layout=0,
    noutputs: int = 1,
):
    return _run_backward("LSTM", **locals())


# GRUGrad(X, W, R, B, sequence_lens, initial_h or the trace, dY, dY_h) -> dX, dW, dR, dB, d initial_h
@kernel("GRUGrad", domain=PRIVATE_DOMAIN, shape=_backward_shapes)
def gru_grad(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    dY=None,
    dY_h=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    layout=0,
    linear_before_reset=0,
    noutputs: int = 1,
):
    return _run_backward("GRU", **locals())


# RNNGrad(X, W, R, B, sequence_lens, initial_h or the trace, dY, dY_h) -> dX, dW, dR, dB, d initial_h
@kernel("RNNGrad", domain=PRIVATE_DOMAIN, shape=_backward_shapes)
def rnn_grad(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    dY=None,
    dY_h=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    layout=0,
    noutputs: int = 1,
):
    return _run_backward("RNN", **locals())


# ---------------------------------------------------------------------------------------------------- training mode
# LSTMTrain (LSTM's inputs and attributes) -> trace, Y, Y_h, Y_c; GRUTrain / RNNTrain -> trace, Y, Y_h. The forward
# of the training step where a backward reads it: each direction's trace [D, size] (trace_blocks: gates, states,
# ...), which the fused backward reads instead of running the forward again, written first (into its planned
# buffer: it is the largest output), and the op's outputs (all of them, whichever the graph reads).
def _train_shapes(node: Node, infos: list[TensorInfo | None]) -> list[TensorInfo | None]:
    op = node.op_type[: -len("Train")]
    x, r = infos[0], infos[2]
    d, hidden = r.shape[0], r.shape[2]
    batch_first = bool(int(node.attrs.get("layout", 0)))
    t_len, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    y = (batch, t_len, d, hidden) if batch_first else (t_len, d, batch, hidden)
    state = (batch, d, hidden) if batch_first else (d, batch, hidden)
    acts = resolve_activations(
        op,
        DEFAULT_ACTS[op],
        d,
        node.attrs.get("activations"),
        node.attrs.get("activation_alpha"),
        node.attrs.get("activation_beta"),
    )
    size = trace_size(op, t_len, batch, hidden, pre=needs_pre(acts), clip=node.attrs.get("clip") is not None)
    shapes = [(d, size), y] + [state] * N_STATES[op]
    return [TensorInfo(x.dtype, s) for s in shapes]


@kernel("LSTMTrain", domain=PRIVATE_DOMAIN, shape=_train_shapes)
def lstm_train(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    initial_c=None,
    P=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    input_forget=0,
    layout=0,
    noutputs: int = 1,
    out=None,
):
    return _run_forward("LSTMTrain", **locals())


@kernel("GRUTrain", domain=PRIVATE_DOMAIN, shape=_train_shapes)
def gru_train(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    layout=0,
    linear_before_reset=0,
    noutputs: int = 1,
    out=None,
):
    return _run_forward("GRUTrain", **locals())


@kernel("RNNTrain", domain=PRIVATE_DOMAIN, shape=_train_shapes)
def rnn_train(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    *,
    activation_alpha=None,
    activation_beta=None,
    activations=None,
    clip=None,
    direction="forward",
    hidden_size=None,
    layout=0,
    noutputs: int = 1,
    out=None,
):
    return _run_forward("RNNTrain", **locals())
