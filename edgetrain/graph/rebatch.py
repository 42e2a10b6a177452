"""A model exported with a fixed batch -> the same model at another batch (numpy only).

`torch.onnx.export` without dynamic axes fixes the leading dimension of every input, and bakes it into the shape
constants of Reshape, Expand, ConstantOfShape, Tile and Slice nodes (`x.view(1, -1)` becomes Reshape(x, [1, -1])).
find_batch_plan walks the graph once at the new batch and finds, from how each value's size changed, which
element of which shape constant is the batch (times a per-sample factor); apply_batch_plan rewrites those
constants for any batch. verify_batch_plan runs both models on the same samples and compares them sample by
sample, so a rewrite that changed what the model computes is refused, naming the nodes, instead of trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from edgetrain.core.errors import EdgeTrainError, LimitError, ModelLimitError, RebatchError, ShapeError
from edgetrain.core.interpreter import Interpreter, compile_step
from edgetrain.core.ir import Graph, GraphBuilder, Node, TensorInfo
from edgetrain.core.ops import record

from .passes import STANDIN_BYTES, check_size, make_static, shape_step, size_text

BIG = np.iinfo(np.int64).max


@dataclass(frozen=True)
class BatchEdit:
    """Element `index` of the shape constant at input `position` of node `node` is factor * batch."""

    node: str
    position: int
    index: int
    factor: int

    def to_list(self) -> list[Any]:
        return [self.node, self.position, self.index, self.factor]

    @classmethod
    def from_list(cls, v: list[Any]) -> BatchEdit:
        return cls(str(v[0]), int(v[1]), int(v[2]), int(v[3]))


@dataclass
class BatchPlan:
    """How to move a fixed-batch graph to another batch: its batch inputs, their fixed batch, the edits."""

    inputs: list[str]
    batch: int  # the batch the model was exported with
    edits: list[BatchEdit]

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": self.inputs, "batch": self.batch, "edits": [e.to_list() for e in self.edits]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BatchPlan:
        return cls(
            [str(i) for i in d["inputs"]], int(d["batch"]), [BatchEdit.from_list(e) for e in d["edits"]]
        )

    def describe(self, graph: Graph, batch: int) -> list[str]:
        """One line per rewritten constant, as the user will read it."""
        by_name = {n.name: n for n in graph.nodes}
        lines = []
        for e in self.edits:
            node = by_name[e.node]
            old = graph.initializers[node.inputs[e.position]]
            new = old.copy()
            new[e.index] = BIG if e.factor == 0 else e.factor * batch
            lines.append(f"{node.label}: {_shape_text(old)} -> {_shape_text(new)}")
        return lines


def fixed_batch(graph: Graph) -> tuple[list[str], int] | None:
    """(inputs with a fixed leading dimension, that dimension) when the graph's first input has a static leading
    dimension; None when the batch is symbolic (nothing to re-batch)."""
    if not graph.inputs:
        return None
    first = graph.values.get(graph.inputs[0])
    if first is None or not first.shape or not isinstance(first.shape[0], int):
        return None
    b0 = int(first.shape[0])
    names = [
        n
        for n in graph.inputs
        if (info := graph.values.get(n)) is not None and info.shape and info.shape[0] == b0
    ]
    return names, b0


def _shape_text(a: np.ndarray) -> str:
    return "[" + ", ".join("end" if int(v) == BIG else str(int(v)) for v in np.asarray(a).ravel()) + "]"


def _with_batch(graph: Graph, names: list[str], batch: int) -> Graph:
    values = dict(graph.values)
    for n in names:
        info = values[n]
        values[n] = TensorInfo(info.dtype, (batch, *info.shape[1:]))
    return graph.copy(values=values)


def _run_shapes(graph: Graph, edit=None, rule=None) -> dict[str, tuple[int, ...]]:
    """Runs the graph node by node on zeros of its input shapes and returns every value's shape; edit(node, env)
    may return a replacement node (with new constant inputs) before the node runs. With a shape rule, a value
    larger than edgetrain.graph.passes.STANDIN_BYTES is never allocated (see edgetrain.graph.passes.shape_step)."""

    env: dict[str, Any] = dict(graph.initializers)
    for n in graph.inputs:
        info = graph.values[n]
        if not info.is_static:
            raise RebatchError(
                f"input '{n}' ({info}) has dimensions that are not fixed besides its leading one, which is taken "
                "for a fixed batch; re-batching needs them fixed: export the model with a dynamic batch"
            )
        size = check_size(info, f"input '{n}'")
        env[n] = info if rule is not None and size > STANDIN_BYTES else np.zeros(info.shape, info.dtype)
    shapes = {k: tuple(v.shape) for k, v in env.items()}
    for node in list(graph.nodes):
        if edit is not None:
            node = edit(node, env, shapes)
        fn, kwargs = compile_step(node)
        args = [env[i] if i else None for i in node.inputs]
        try:
            with np.errstate(all="ignore"):
                out = shape_step(node, fn, kwargs, args, rule=rule, opset=graph.opset)
        except LimitError:
            raise
        except EdgeTrainError as e:
            raise RebatchError(f"{node.label}: {e}") from e
        except Exception as e:  # a kernel's numpy error on shapes that do not fit
            raise RebatchError(f"{node.label}: {type(e).__name__}: {e}") from e
        for o, v in zip(node.outputs, out):
            if o and v is not None:
                env[o] = v
                shapes[o] = tuple(int(d) for d in v.shape)
    return shapes


def find_batch_plan(graph: Graph, batch: int, *, rule=None) -> BatchPlan:
    """The edits that move `graph` (its inputs' leading dimension fixed) to `batch`; ShapeError naming the node
    when a baked-in batch cannot be found or rewritten."""
    found = fixed_batch(graph)
    if found is None:
        raise ShapeError("the model's batch dimension is not fixed: nothing to re-batch")
    names, b0 = found
    old = _run_shapes(graph, rule=rule)
    edits: list[BatchEdit] = []
    b = GraphBuilder(graph)

    def edit(node: Node, env: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]]) -> Node:
        changes = _batch_edits(node, env, old, b0, batch)
        # only a constant holds a baked-in batch: a shape computed at run time (Shape, Gather, Concat) follows it
        changes = [c for c in changes if node.inputs[c[0]] in b.graph.initializers]
        if not changes:
            return node
        consts: dict[int, np.ndarray] = {}
        for pos, idx, value in changes:
            const = consts.setdefault(pos, np.array(env[node.inputs[pos]], copy=True))
            const[idx] = value
            edits.append(BatchEdit(node.name, pos, idx, 0 if value == BIG else value // batch))
        inputs = list(node.inputs)
        for pos, const in consts.items():  # a fresh constant: exporters share one constant among many nodes
            inputs[pos] = b.initializer(f"{node.name}_batch_{pos}", const)
            env[inputs[pos]] = const
        return node.replace(inputs=tuple(inputs))

    _run_shapes(_with_batch(graph, names, batch), edit, rule)
    return BatchPlan(names, b0, edits)


def _batch_axis(old: tuple[int, ...] | None, new: tuple[int, ...] | None) -> int | None:
    """The axis of a value that grew or shrank with the batch (None when its shape did not change)."""
    if old is None or new is None or len(old) != len(new):
        return None
    changed = [k for k, (a, b) in enumerate(zip(old, new)) if a != b]
    return changed[0] if changed else None


def _batch_edits(node: Node, env, old, b0: int, batch: int) -> list[tuple[int, int, int]]:
    """(input position, element, new value) for each batch baked into a constant shape input of `node`."""
    op = node.op_type
    if op not in ("Reshape", "Expand", "ConstantOfShape", "Tile", "Slice"):
        return []
    pos = {"ConstantOfShape": 0, "Slice": 2}.get(op, 1)
    if pos >= len(node.inputs) or not node.inputs[pos]:
        return []
    const = env.get(node.inputs[pos])
    if (
        not isinstance(const, np.ndarray)
        or const.ndim != 1
        or const.size == 0
        or const.dtype.kind not in "iu"
    ):
        return []
    c = [int(v) for v in const]
    x = node.inputs[0] if op != "ConstantOfShape" else ""
    old_in, new_in = old.get(x), (tuple(env[x].shape) if x in env else None)
    axis = _batch_axis(old_in, new_in)
    if op == "Reshape":
        return _reshape_edit(node, c, old_in, new_in, old.get(node.outputs[0]), axis, b0, batch)
    if op == "Slice":  # a full slice along the batch axis, x[0:B0], would cut a larger batch to B0
        axes = env.get(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else None
        starts = env.get(node.inputs[1])
        if (
            axis is None
            or not old_in
            or not isinstance(starts, np.ndarray)
            or (axes is not None and not isinstance(axes, np.ndarray))
        ):
            return []
        axes = list(range(len(c))) if axes is None else [int(a) % len(old_in) for a in axes.ravel()]
        starts = [int(v) for v in starts.ravel()]
        if len(axes) != len(c) or len(starts) != len(c):
            return []  # a malformed Slice: its kernel says so when it runs
        if axis in axes and starts[axes.index(axis)] == 0 and c[axes.index(axis)] >= old_in[axis]:
            return [(pos, axes.index(axis), BIG)]
        return []
    if axis is not None and op in (
        "Expand",
        "Tile",
    ):  # a batch-carrying input: its axis, aligned to the right
        j = axis + len(c) - len(old_in) if op == "Expand" else axis
        return [(pos, j, batch)] if 0 <= j < len(c) and c[j] == b0 and b0 != 1 else []
    # a constant made as large as the batch (a mask, a zero state); with batch 1, broadcasting needs no help
    if c[0] == b0 and b0 != 1 and (op != "Tile" or old_in[0] == 1):
        return [(pos, 0, batch)]
    # ... or a constant broadcast over a batch that is not its first axis ([1, B, H]: an unrolled RNN's first
    # step, folded): the one element equal to the batch (verify_batch_plan checks the guess sample by sample)
    at = [j for j, v in enumerate(c) if v == b0]
    return [(pos, at[0], batch)] if op == "Expand" and len(at) == 1 and b0 != 1 else []


def _reshape_edit(
    node: Node, c, old_in, new_in, old_out, axis, b0: int, batch: int
) -> list[tuple[int, int, int]]:
    if axis is None or old_out is None:
        return []
    # Reshape keeps the order of elements: the batch, at input axis `axis`, lands on the output axis j at which
    # the elements before it in the input (pre) begin a new index.
    pre = int(np.prod(old_in[:axis]))
    j = next((k for k in range(len(old_out)) if int(np.prod(old_out[:k])) == pre), None)
    ratio = Fraction(int(np.prod(new_in)), int(np.prod(old_in)))
    if j is not None and (c[j] == -1 or (c[j] == 0 and not node.attrs.get("allowzero", 0) and j == axis)):
        return []  # -1 (or a copied dimension) takes the new size by itself
    scaled = None if j is None else c[j] * ratio
    if scaled is None or scaled.denominator != 1 or scaled <= 0 or int(scaled) % batch:
        raise RebatchError(
            f"{node.label} reshapes to {c}, a shape that holds the exported batch {b0} in a way edgetrain cannot "
            f"rewrite for batch {batch} (its input grows from {list(old_in)} to {list(new_in)}); export the model "
            "with a dynamic batch (torch.onnx.export(..., dynamic_axes={'input': {0: 'batch'}}))"
        )
    return [(1, j, int(scaled))]


def apply_batch_plan(graph: Graph, plan: BatchPlan, batch: int) -> Graph:
    """The graph at `batch`: its batch inputs' leading dimension and the planned shape constants rewritten."""
    if batch == plan.batch:
        return graph
    g = _with_batch(graph, plan.inputs, batch)
    b = GraphBuilder(g)
    by_node: dict[str, list[BatchEdit]] = {}
    for e in plan.edits:
        by_node.setdefault(e.node, []).append(e)
    nodes = []
    for node in g.nodes:
        inputs = list(node.inputs)
        for e in by_node.get(node.name, []):
            const = np.array(b.graph.initializers[inputs[e.position]], copy=True)
            const[e.index] = BIG if e.factor == 0 else e.factor * batch
            inputs[e.position] = b.initializer(f"{node.name}_batch_{e.position}", const)
        nodes.append(node.replace(inputs=tuple(inputs)) if by_node.get(node.name) else node)
    out = b.finish()
    out.nodes = nodes
    return out


# verify_batch_plan runs the model at both batches: it refuses when that would take more than this
MAX_VERIFY_BYTES = 2 << 30


def verify_batch_plan(
    graph: Graph, rebatched: Graph, plan: BatchPlan, batch: int, *, samples: int = 4, rule=None
) -> None:
    """Runs the original model (at its batch) and the re-batched one on the same samples and compares each
    sample's outputs; ShapeError naming the rewritten nodes when they differ. ModelLimitError when running them
    would take more than MAX_VERIFY_BYTES (the values of both graphs, all together)."""

    static_new, static_old = make_static(rebatched, rule=rule), make_static(graph, rule=rule)
    need = sum(info.nbytes or 0 for g in (static_new, static_old) for info in g.values.values())
    if need > MAX_VERIFY_BYTES:
        raise ModelLimitError(
            f"re-batching the model from its exported batch {plan.batch} to {batch} is checked by running it at "
            f"both batches, which would take up to {size_text(need)}, more than the {size_text(MAX_VERIFY_BYTES)} "
            f"edgetrain allows (edgetrain.graph.rebatch.MAX_VERIFY_BYTES); convert with --batch-size {plan.batch}",
            limit=MAX_VERIFY_BYTES,
            needed=need,
        )

    k = min(samples, batch)
    rng = np.random.default_rng(0)
    feeds_new = {}
    for n in rebatched.inputs:
        info = rebatched.values[n]
        shape = (batch, *info.shape[1:]) if n in plan.inputs else info.shape
        kind = np.dtype(info.dtype).kind
        x = rng.standard_normal(shape).astype(info.dtype) if kind == "f" else np.zeros(shape, info.dtype)
        feeds_new[n] = x
    new = Interpreter(static_new).run(feeds_new)
    orig_prog = Interpreter(static_old)
    b0 = plan.batch
    rows: list[list[np.ndarray]] = [[] for _ in graph.outputs]
    for start in range(0, k, b0):
        feeds = {}
        for n, x in feeds_new.items():
            if n in plan.inputs:
                chunk = x[start : start + b0]
                pad = b0 - len(chunk)
                feeds[n] = np.concatenate([chunk, np.repeat(chunk[:1], pad, axis=0)]) if pad else chunk
            else:
                feeds[n] = x
        for r, out in zip(rows, orig_prog.run(feeds)):
            r.append(out)
    for name, got, parts in zip(graph.outputs, new, rows):
        ref = np.concatenate(parts)[:k] if parts[0].ndim and parts[0].shape[0] == b0 else parts[0]
        mine = got[:k] if got.ndim and got.shape[0] == batch else got
        if mine.shape != ref.shape or not _close(mine, ref):
            nodes = ", ".join(sorted({e.node for e in plan.edits})) or "none"
            why = (
                f"at batch {batch} it has shape {list(got.shape)}, at batch {b0} {list(parts[0].shape)}"
                if mine.shape != ref.shape
                else f"values differ by up to {float(np.max(np.abs(mine - ref))):.3g}"
            )
            raise RebatchError(
                f"re-batching the model from its exported batch {b0} to {batch} changes its output '{name}' "
                f"({why}; shape constants rewritten in: {nodes}). edgetrain will not train a model it cannot "
                f"re-batch faithfully: export it with a dynamic batch (torch.onnx.export(..., dynamic_axes="
                f"{{'input': {{0: 'batch'}}}})) or convert with --batch-size {b0}"
            )


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal up to float rounding; NaN and inf where both have them count as equal (a model may well make them
    from random inputs, at any batch)."""
    if a.dtype.kind not in "fc" or b.dtype.kind not in "fc":
        return bool(np.array_equal(a, b))
    finite = np.abs(b[np.isfinite(b)])
    scale = float(finite.max()) if finite.size else 0.0
    with np.errstate(all="ignore"):
        return bool(np.allclose(a, b, rtol=1e-4, atol=1e-5 * (scale + 1), equal_nan=True))


def batch_free_states(graph: Graph) -> tuple[Graph, list[str]]:
    """A recurrent node's initial state given as a constant of one value ([D, B, H] zeros: the dynamo exporter
    folds nn.LSTM's zero state for the example's batch B) becomes that value expanded to the batch X has at run
    time, so the model runs at any batch, as its PyTorch module does."""
    b = GraphBuilder(graph)
    notes: list[str] = []
    made: dict[tuple[str, str], str] = {}
    seen: set[str] = set()
    nodes: list[Node] = []
    for node in graph.nodes:
        positions = record(node.op_type).batch_states if not node.domain else ()
        inputs = list(node.inputs)
        for pos in positions:
            name = inputs[pos] if pos < len(inputs) else ""
            v = graph.initializers.get(name)
            if v is None or v.ndim != 3 or v.size == 0 or v.dtype.kind != "f" or not (v == v.flat[0]).all():
                continue
            layout = int(node.attrs.get("layout", 0))
            key = (name, node.inputs[0])
            if key not in made:  # its nodes go right before this first reader (X is made by then)
                made[key] = _state_like(b, nodes, node, v, layout)
            if name not in seen:
                seen.add(name)
                notes.append(
                    f"initial state '{name}' {list(v.shape)} of {node.label} holds {float(v.flat[0])!r} for the "
                    "batch the model was exported with; edgetrain makes it for the batch the input has"
                )
            inputs[pos] = made[key]
        nodes.append(node.replace(inputs=tuple(inputs)) if inputs != list(node.inputs) else node)
    if not notes:
        return graph, []
    return b.finish().copy(nodes=nodes), notes


def _state_like(b: GraphBuilder, nodes: list[Node], node: Node, v: np.ndarray, layout: int) -> str:
    """Nodes (appended to nodes) making a [D, N, H] (layout 0) or [N, D, H] (layout 1) state of v's one value, N
    read from the recurrent node's X at run time."""
    x = node.inputs[0]
    base = f"{node.name}_state"
    n_axis, d_pos = (1, 0) if layout == 0 else (0, 1)
    d, h = v.shape[d_pos], v.shape[2]

    def add(op: str, inputs: list[str], **attrs) -> str:
        out = b.fresh(f"{base}_{op.lower()}")
        nodes.append(Node(op, tuple(inputs), (out,), attrs, name=b.fresh_node_name(f"{base}_{op}")))
        return out

    shape = add("Shape", [x], start=n_axis, end=n_axis + 1)
    dims = [
        b.initializer(f"{base}_d", np.array([d], np.int64)),
        shape,
        b.initializer(f"{base}_h", np.array([h], np.int64)),
    ]
    if layout == 1:
        dims[0], dims[1] = dims[1], dims[0]
    full = add("Concat", dims, axis=0)
    value = b.initializer(f"{base}_value", np.asarray(v.flat[0], v.dtype).reshape(1, 1, 1))
    return add("Expand", [value, full])
