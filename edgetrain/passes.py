"""Graph -> Graph passes that make an imported graph static and lean (numpy only, no onnx):
fixing input shapes, shape inference by execution, constant folding, no-op elimination, dead-code pruning."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

from .errors import EdgeTrainError, ShapeError
from .ir import Graph, Node, TensorInfo
from .ops import record


def contiguous(a: np.ndarray) -> np.ndarray:
    """C-contiguous, keeping 0-d arrays 0-d (np.ascontiguousarray makes them 1-d)."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else a.copy(order="C")


def fix_input_shapes(
    graph: Graph, *, batch_size: int | None = None, shapes: Mapping[str, Sequence[int]] | None = None
) -> Graph:
    """Makes every graph input static: shapes[name] when given, else a symbolic or unknown leading
    dimension becomes batch_size. Any dimension left unknown is a ShapeError that says what to pass."""
    shapes = dict(shapes or {})
    values = dict(graph.values)
    for name in graph.inputs:
        info = graph.values.get(name)
        if info is None or info.shape is None:
            if name in shapes:
                values[name] = TensorInfo(info.dtype if info else np.dtype("float32"), tuple(shapes[name]))
                continue
            raise ShapeError(
                f"input '{name}' has no declared shape; re-export the model with a static input "
                "shape (e.g. torch.onnx.export with a fixed example input)"
            )
        dims = list(info.shape)
        if name in shapes:
            given = tuple(int(d) for d in shapes[name])
            if len(given) != len(dims) or any(isinstance(d, int) and d != g for d, g in zip(dims, given)):
                raise ShapeError(
                    f"input '{name}' is declared as {info}, which shape {list(given)} does not fit"
                )
            dims = list(given)
        for k, d in enumerate(dims):
            if isinstance(d, int) and d >= 0:
                continue
            if k == 0 and batch_size is not None:
                dims[0] = int(batch_size)
                continue
            what = f"'{d}'" if isinstance(d, str) else "unknown"
            hint = (
                "pass batch_size=N to fix it"
                if k == 0
                else "edgetrain needs static shapes: re-export the model with this dimension fixed"
            )
            raise ShapeError(f"input '{name}' ({info}): dimension {k} is {what}; {hint}")
        values[name] = TensorInfo(info.dtype, tuple(dims))
    return graph.copy(values=values)


def infer_shapes(graph: Graph) -> Graph:
    """Static shape inference by execution: runs the graph once on zeros of the (static) input shapes and
    records every value's dtype and shape (again on ones if zeros fail, e.g. in an integer division). Exact for
    every op the interpreter runs, as long as no shape depends on the data (check_static_shapes reports those)."""
    from .runtime.interpreter import Interpreter

    for name in graph.inputs:
        if not graph.values[name].is_static:
            raise ShapeError(
                f"input '{name}' ({graph.values[name]}) has no static shape; fix it first (batch_size=...)"
            )
    interp = Interpreter(graph, preallocate=False)
    first_error: EdgeTrainError | None = None
    for fill in (np.zeros, np.ones):
        feeds = {n: fill(graph.values[n].shape, graph.values[n].dtype) for n in graph.inputs}
        record: dict[str, TensorInfo] = {}
        try:
            with np.errstate(all="ignore"):  # made-up inputs: overflow or log(0) here mean nothing
                interp.run(feeds, record=record)
            break
        except EdgeTrainError as e:
            first_error = first_error or e
    else:
        raise type(first_error)(f"while inferring static shapes: {first_error}") from first_error
    values = dict(graph.values)
    values.update(record)
    return graph.copy(values=values)


def _is_const_producer(node: Node, consts: Mapping[str, np.ndarray], graph: Graph, fold_shapes: bool) -> bool:
    if record(node.op_type).random or node.domain not in ("", "ai.onnx"):
        return False
    if (
        fold_shapes
        and node.op_type in ("Shape", "Size")
        and graph.values.get(node.inputs[0], _UNKNOWN).is_static
    ):
        return True
    return all(not i or i in consts for i in node.inputs)


_UNKNOWN = TensorInfo(np.dtype("float32"), None)


def fold_constants(graph: Graph, *, fold_shapes: bool = True, keep: Collection[str] = ()) -> Graph:
    """Evaluates every node whose inputs are all constants (and Shape/Size of static values) and turns its
    outputs into initializers. Weights built by ConstantOfShape become ordinary initializers this way.

    keep names parameters: values that depend on them are never folded (they change as training goes), though a
    kept value that is itself computed from constants is (it becomes the parameter's initializer)."""
    from .runtime.interpreter import Interpreter

    keep = set(keep)
    consts = {k: v for k, v in graph.initializers.items() if k not in keep}
    inits = dict(graph.initializers)
    values = dict(graph.values)
    kept: list[Node] = []
    for node in graph.nodes:
        if not _is_const_producer(node, consts, graph, fold_shapes):
            kept.append(node)
            continue
        inputs = [i for i in node.inputs if i]
        sub = Graph(
            nodes=[node],
            inputs=[],
            outputs=[o for o in node.outputs if o],
            initializers={i: consts[i] for i in inputs if i in consts},
            values=values,
            opset=graph.opset,
            name=node.name,
        )
        if node.op_type in ("Shape", "Size"):  # the data itself is not constant: feed zeros of its shape
            info = graph.values[node.inputs[0]]
            sub.initializers[node.inputs[0]] = np.zeros(info.shape, info.dtype)
        with np.errstate(all="ignore"):
            results = Interpreter(sub, preallocate=False).run({})
        for o, r in zip(sub.outputs, results):
            r = contiguous(r)
            inits[o] = r
            if o not in keep:
                consts[o] = r
            values[o] = TensorInfo(r.dtype, tuple(int(d) for d in r.shape))
    # Initializers that were graph outputs or are still read stay; folded intermediates nobody reads go.
    read = {i for n in kept for i in n.inputs if i} | set(graph.outputs)
    initializers = {k: v for k, v in inits.items() if k in read}
    return graph.copy(nodes=kept, initializers=initializers, values=values)


def eliminate_noops(graph: Graph) -> Graph:
    """Removes Identity nodes, inference-mode Dropout, and Reshape/Flatten/Squeeze/Unsqueeze that do not
    change the shape, by renaming their readers to read the input (graph outputs keep their names)."""
    rename: dict[str, str] = {}
    kept: list[Node] = []
    kept_by_output: dict[str, int] = {}  # value -> index in kept of the node that writes it
    outputs = set(graph.outputs)
    n_readers: dict[str, int] = {}
    for node in graph.nodes:
        for i in node.inputs:
            if i:
                n_readers[i] = n_readers.get(i, 0) + 1
    for node in graph.nodes:
        node = node.replace(inputs=tuple(rename.get(i, i) for i in node.inputs))
        src = node.inputs[0] if node.inputs else ""
        out = node.outputs[0] if node.outputs else ""
        noop = False
        if node.op_type == "Identity":
            noop = True
        elif node.op_type == "Dropout":
            noop = (len(node.inputs) < 3 or not node.inputs[2]) and not any(node.outputs[1:])
        elif node.op_type in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
            a, b = graph.values.get(src), graph.values.get(out)
            noop = a is not None and b is not None and a.is_static and a.shape == b.shape
        if noop and src and out not in outputs:
            rename[out] = src
            n_readers[src] = n_readers.get(src, 0) - 1 + n_readers.get(out, 0)
            continue
        if noop and src and n_readers.get(src) == 1 and src not in outputs and src in kept_by_output:
            # The no-op feeds a graph output: let its producer write the output name directly.
            idx = kept_by_output[src]
            prod = kept[idx]
            kept[idx] = prod.replace(outputs=tuple(out if o == src else o for o in prod.outputs))
            kept_by_output[out] = idx
            continue
        for o in node.outputs:
            if o:
                kept_by_output[o] = len(kept)
        kept.append(node)
    return graph.copy(nodes=kept)


def prune(graph: Graph) -> Graph:
    """Drops nodes whose outputs nothing needs, and initializers nothing reads."""
    needed = set(graph.outputs)
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        if any(o in needed for o in node.outputs if o):
            kept.append(node)
            needed.update(i for i in node.inputs if i)
    kept.reverse()
    initializers = {k: v for k, v in graph.initializers.items() if k in needed}
    live = needed | {o for n in kept for o in n.outputs if o} | set(graph.inputs)
    values = {k: v for k, v in graph.values.items() if k in live}
    return graph.copy(nodes=kept, initializers=initializers, values=values)


def check_static_shapes(graph: Graph) -> None:
    """Raises a ShapeError naming the node whose output shape would depend on the data at run time."""
    consts = set(graph.initializers)
    for node in graph.nodes:
        if record(node.op_type).data_dependent:
            raise ShapeError(
                f"{node.label}: its output shape depends on the data, and edgetrain plans memory "
                "with static shapes; remove the op from the model or replace it by a fixed-size op"
            )
        for pos in record(node.op_type).shape_inputs:
            if pos < len(node.inputs) and node.inputs[pos] and node.inputs[pos] not in consts:
                raise ShapeError(
                    f"{node.label}: input '{node.inputs[pos]}' decides the output shape but is "
                    "computed from the data at run time; edgetrain needs static shapes "
                    "(export the model with a constant there)"
                )
    graph.verify(static=True)


def shape_deciding_inputs(graph: Graph) -> list[str]:
    """Graph inputs whose values (not just shapes) reach an input that decides an output shape, e.g. the
    `shape` of a Reshape fed by the caller. A session can only plan such a graph once it knows their values."""
    producer = graph.producers()
    found: set[str] = set()
    seen: set[str] = set()
    todo = [
        n.inputs[p]
        for n in graph.nodes
        for p in record(n.op_type).shape_inputs
        if p < len(n.inputs) and n.inputs[p]
    ]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in graph.inputs:
            found.add(name)
        node = producer.get(name)
        if node is not None and node.op_type not in ("Shape", "Size"):  # those read shapes, not values
            todo.extend(i for i in node.inputs if i)
    return [n for n in graph.inputs if n in found]


def bind_inputs(graph: Graph, constants: Mapping[str, np.ndarray]) -> Graph:
    """Turns the named graph inputs into initializers holding the given values."""
    if not constants:
        return graph
    inits = dict(graph.initializers)
    values = dict(graph.values)
    for name, v in constants.items():
        v = contiguous(v)
        inits[name] = v
        values[name] = TensorInfo(v.dtype, tuple(int(d) for d in v.shape))
    return graph.copy(
        inputs=[i for i in graph.inputs if i not in constants], initializers=inits, values=values
    )


def make_static(
    graph: Graph,
    *,
    batch_size: int | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    constants: Mapping[str, np.ndarray] | None = None,
    keep: Collection[str] = (),
) -> Graph:
    """The whole static pipeline: bind constant inputs, fix input shapes, infer shapes, fold constants (never
    through the parameters named in keep), drop no-ops and dead code."""
    g = bind_inputs(graph, constants or {})
    g = fix_input_shapes(
        g, batch_size=batch_size, shapes={k: v for k, v in (shapes or {}).items() if k in g.inputs}
    )
    g = infer_shapes(g)
    g = fold_constants(g, keep=keep)
    g = eliminate_noops(g)
    g = prune(g)
    check_static_shapes(g)
    return g
