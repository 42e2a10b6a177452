"""Graph -> Graph passes that make an imported graph static and lean (numpy only, no onnx):
fixing input shapes, shape inference by execution, constant folding, no-op elimination, dead-code pruning."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np

from edgetrain.core.errors import (
    ConfigError,
    EdgeTrainError,
    ExecutionError,
    LimitError,
    ModelError,
    ModelLimitError,
    ShapeError,
)
from edgetrain.core.interpreter import Interpreter, compile_step
from edgetrain.core.ir import Graph, Node, TensorInfo
from edgetrain.core.ops import record

from .bounds import Bound, check_node, size_text

# Bounds on what a model may declare (module constants: raise them here, or by keyword where one is offered).
# One value (a graph input, an initializer, any value shape inference finds): 1 TiB.
MAX_TENSOR_BYTES = 1 << 40
# All initializers, and the constants folded from them, together: 4 GiB.
MAX_PARAMETER_BYTES = 4 << 30
# Shape inference runs a node on stand-in inputs only up to this size (each input and output); a larger value's
# shape comes from a shape rule (onnx's shape inference, on the build side) and is never allocated.
STANDIN_BYTES = 64 << 20

# (node, its inputs: arrays, TensorInfo for values known by shape alone, None for omitted ones, opset) -> the
# TensorInfo of each output (None where the rule cannot tell); raises ShapeError for a node it finds invalid.
ShapeRule = Callable[[Node, Sequence[Any], int], "list[TensorInfo | None]"]

# A recurrent node over more steps than this gets its shapes from the rule: running it loops in Python, step by step.
MAX_STANDIN_STEPS = 1024


def tensor_bound() -> Bound:
    """The bound on one value when a caller sets none: MAX_TENSOR_BYTES, as it is now."""
    return Bound(
        MAX_TENSOR_BYTES, "edgetrain allows for one tensor (edgetrain.graph.passes.MAX_TENSOR_BYTES)"
    )


def check_size(info: TensorInfo, what: str, bound: Bound | None = None) -> int:
    """The bytes of a static TensorInfo; ModelError for a negative dimension, ModelLimitError beyond the bound
    (MAX_TENSOR_BYTES by default: a dimension of 2**62, dimensions whose product overflows int64)."""
    bound = bound or tensor_bound()
    if info.shape is None:
        return 0
    for k, d in enumerate(info.shape):
        if isinstance(d, int) and d < 0:
            raise ModelError(f"{what} has dimension {k} of {d}; a dimension is 0 or more (or symbolic)")
    n = info.nbytes
    if n is None:
        return 0
    # the bound holds for the dimensions apart from a zero one too: numpy checks them all
    span = np.dtype(info.dtype).itemsize
    for d in info.shape:
        span *= max(int(d), 1)
    if span > bound.limit:
        n = max(n, span)
    if n > bound.limit:
        raise ModelLimitError(
            f"{what} ({info}) would hold {size_text(n)}, more than the {size_text(bound.limit)} {bound.whose}; "
            "check the model's shapes",
            limit=bound.limit,
            needed=n,
        )
    return n


def _info(a: Any) -> TensorInfo:
    return a if isinstance(a, TensorInfo) else TensorInfo(a.dtype, tuple(int(d) for d in a.shape))


def _view(info: TensorInfo) -> np.ndarray:
    """A read-only array of info's shape that costs one element: for ops that read only shapes."""
    return np.broadcast_to(np.zeros((), info.dtype), info.shape)


def shape_step(
    node: Node,
    fn: Callable[..., Any],
    kwargs: dict[str, Any],
    args: Sequence[Any],
    *,
    fill: Callable[..., np.ndarray] = np.zeros,
    rule: ShapeRule | None = None,
    opset: int = 18,
    bound: Bound | None = None,
) -> list[Any]:
    """One node's outputs for shape inference: arrays where it ran, TensorInfo where only the shape is known.

    args are the node's inputs: arrays (constants, or stand-ins), TensorInfo (a value known by its shape, too
    large to stand in), None (omitted). The node runs on the arrays and on fill(shape) for small shape-only
    inputs, which is exact for every op the interpreter runs; Shape and Size run on zero-strided views (their
    values stay exact, so Reshape targets computed from them do too). With a rule, a node whose inputs or
    outputs are larger than STANDIN_BYTES does not run: the rule gives its output shapes. Raises what the kernel
    raises when it fails on the stand-ins, ModelLimitError when a value is too large to run and the rule cannot
    tell its shape, and, before a node runs, when an input, an output or its kernel's working copy would be larger
    than bound (MAX_TENSOR_BYTES by default; edgetrain.graph.bounds predicts them)."""
    bound = bound or tensor_bound()
    label = node.label
    if record(node.op_type).reads_shape and not node.domain:  # exact on a zero-strided view
        return _outputs(node, fn(*[_view(a) if isinstance(a, TensorInfo) else a for a in args], **kwargs))
    predicted: list[TensorInfo | None] | None = None
    refused: ShapeError | None = None
    if rule is not None:
        try:
            predicted = rule(node, args, opset)
        except ShapeError as e:
            refused = e
    sizes = [
        check_size(_info(a), f"{label}: input '{i}'", bound)
        for a, i in zip(args, node.inputs)
        if a is not None
    ]
    big = [size for size in sizes if size > STANDIN_BYTES]
    if record(node.op_type).sequential and args and args[0] is not None:  # a Python loop over the sequence
        x = _info(args[0]).shape
        axis = 1 if int(node.attrs.get("layout", 0) or 0) else 0
        if len(x) > axis and x[axis] > MAX_STANDIN_STEPS:
            big.append(sizes[0])
    for o, p in zip(node.outputs, predicted or ()):
        if o and p is not None:
            size = check_size(p, f"{label}: output '{o}'", bound)
            if size > STANDIN_BYTES:
                big.append(size)
    if big and rule is not None:
        if refused is not None:
            raise refused
        unknown = [o for k, o in enumerate(node.outputs) if o and (predicted is None or predicted[k] is None)]
        if unknown:
            raise ModelLimitError(
                f"{label}: the shape of its output '{unknown[0]}' cannot be inferred from its input shapes, "
                f"and running it to find out would take {size_text(max(big))} of stand-in data, more than "
                f"the {size_text(STANDIN_BYTES)} edgetrain allows (edgetrain.graph.passes.STANDIN_BYTES)",
                limit=STANDIN_BYTES,
                needed=max(big),
            )
        return [p if o else None for o, p in zip(node.outputs, predicted)]  # type: ignore[arg-type]
    if predicted is not None and _rule_suffices(node, args, predicted):
        return [p if o else None for o, p in zip(node.outputs, predicted)]  # type: ignore[arg-type]
    check_node(node, args, bound)  # what it would allocate, before it runs
    real = [
        _standin(a, fill, f"{label}: input '{i}'") if isinstance(a, TensorInfo) else a
        for a, i in zip(args, node.inputs)
    ]
    outs = _outputs(node, fn(*real, **kwargs))
    for o, r in zip(node.outputs, outs):
        if o and r is not None:
            check_size(_info(r), f"{label}: output '{o}'", bound)
    return outs


def _rule_suffices(node: Node, args: Sequence[Any], predicted: Sequence[TensorInfo | None]) -> bool:
    """Whether a heavy node's shapes may come from the rule alone, without running it on stand-ins (a convolution
    or a matrix product, forward or backward: most of a conversion's time otherwise): its output is not a constant
    (an input is known by its shape only), no input decides its shape by value, and the rule gave every output a
    static shape."""
    rec = record(node.op_type)
    if not (rec.heavy or node.domain) or rec.shape_inputs or rec.reads_shape:
        return False
    if not any(isinstance(a, TensorInfo) for a in args):
        return False
    return all(p is not None and p.is_static for o, p in zip(node.outputs, predicted) if o)


def _standin(info: TensorInfo, fill, what: str) -> np.ndarray:
    try:
        return fill(info.shape, info.dtype)
    except MemoryError:
        n = info.nbytes or 0
        raise ModelLimitError(
            f"{what} ({info}): {size_text(n)} of stand-in data to infer shapes cannot be allocated",
            needed=n,
        ) from None


def _outputs(node: Node, res: Any) -> list[Any]:
    res = res if isinstance(res, tuple) else (res,)
    out = [None if r is None else np.asarray(r) for r in res]
    return out + [None] * (len(node.outputs) - len(out))


def contiguous(a: np.ndarray) -> np.ndarray:
    """C-contiguous, keeping 0-d arrays 0-d (np.ascontiguousarray makes them 1-d)."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else a.copy(order="C")


def fix_input_shapes(
    graph: Graph,
    *,
    batch_size: int | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    bound: Bound | None = None,
) -> Graph:
    """Makes every graph input static: shapes[name] when given, else a symbolic or unknown leading
    dimension becomes batch_size. Any dimension left unknown is a ShapeError that says what to pass."""
    shapes = dict(shapes or {})
    batch = None
    if batch_size is not None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ConfigError(f"batch_size must be a whole number of 1 or more, not {batch_size!r}")
        batch = int(batch_size)
    for name, given in shapes.items():
        try:
            ok = all(not isinstance(d, bool) and int(d) == d and d >= 0 for d in given)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ConfigError(f"shapes['{name}'] must be a list of whole numbers of 0 or more, not {given!r}")
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
                dims[0] = batch
                continue
            what = f"'{d}'" if isinstance(d, str) else "unknown"
            hint = (
                "pass batch_size=N to fix it"
                if k == 0
                else "edgetrain needs static shapes: re-export the model with this dimension fixed"
            )
            raise ShapeError(f"input '{name}' ({info}): dimension {k} is {what}; {hint}")
        values[name] = TensorInfo(info.dtype, tuple(dims))
        check_size(values[name], f"input '{name}'", bound)
    return graph.copy(values=values)


def infer_shapes(graph: Graph, *, rule: ShapeRule | None = None, bound: Bound | None = None) -> Graph:
    """Static shape inference by execution: runs the graph node by node on zeros of the (static) input shapes
    and records every value's dtype and shape (again on ones if zeros fail, e.g. in an integer division). Exact
    for every op the interpreter runs, as long as no shape depends on the data (check_static_shapes reports
    those). With a shape rule (the build side), a value larger than STANDIN_BYTES is never allocated: the
    nodes around it get their shapes from the rule (see shape_step). Every input, and every node's outputs and
    working copy, are held to bound (MAX_TENSOR_BYTES by default) before anything of their size is allocated."""

    graph.verify()
    for name in graph.inputs:
        if not graph.values[name].is_static:
            raise ShapeError(
                f"input '{name}' ({graph.values[name]}) has no static shape; fix it first (batch_size=...)"
            )
        check_size(graph.values[name], f"input '{name}'", bound)
    steps = [(node, *compile_step(node)) for node in graph.nodes]
    last_use = {i: k for k, node in enumerate(graph.nodes) for i in node.inputs if i}
    first_error: EdgeTrainError | None = None
    for fill in (np.zeros, np.ones):
        try:
            record = _walk(graph, steps, last_use, fill, rule, bound)
            break
        except LimitError:
            raise
        except EdgeTrainError as e:
            first_error = first_error or e
    else:
        assert first_error is not None
        raise _prefixed(first_error, "while inferring static shapes: ")
    values = dict(graph.values)
    values.update(record)
    return graph.copy(values=values)


def _prefixed(e: EdgeTrainError, text: str) -> EdgeTrainError:
    """e with text before its message (same class and attributes)."""
    if e.args and isinstance(e.args[0], str):
        e.args = (text + e.args[0], *e.args[1:])
    return e


def _walk(
    graph: Graph, steps, last_use: dict[str, int], fill, rule: ShapeRule | None, bound: Bound | None = None
) -> dict[str, TensorInfo]:
    """The TensorInfo of every value the nodes compute, from one pass over stand-ins (see shape_step)."""
    env: dict[str, Any] = dict(graph.initializers)
    for name in graph.inputs:
        info = graph.values[name]
        big = rule is not None and (info.nbytes or 0) > STANDIN_BYTES
        env[name] = info if big else _standin(info, fill, f"input '{name}'")
    record: dict[str, TensorInfo] = {}
    for k, (node, fn, kwargs) in enumerate(steps):
        args = [env[i] if i else None for i in node.inputs]
        try:
            with np.errstate(all="ignore"):  # made-up inputs: overflow or log(0) here mean nothing
                outs = shape_step(
                    node, fn, kwargs, args, fill=fill, rule=rule, opset=graph.opset, bound=bound
                )
        except LimitError:
            raise
        except EdgeTrainError as e:
            if not str(e).startswith(node.label):
                _prefixed(e, f"{node.label}: ")
            raise
        except Exception as e:  # a kernel failure on inputs it cannot handle: say where, with the shapes
            shapes = ", ".join(
                "None" if a is None else f"{_info(a).dtype}{list(_info(a).shape)}" for a in args
            )
            raise ExecutionError(f"{node.label} failed on inputs ({shapes}): {type(e).__name__}: {e}") from e
        for o, v in zip(node.outputs, outs):
            if o and v is None:
                raise ModelError(f"{node.label} computes no value for its output '{o}'; check its inputs")
            if o:
                env[o] = v
                record[o] = _info(v)
        for i in node.inputs:
            if i and last_use.get(i) == k and i not in graph.initializers:
                env.pop(i, None)
    return record


def _is_const_producer(node: Node, consts: Mapping[str, np.ndarray], graph: Graph, fold_shapes: bool) -> bool:
    if record(node.op_type).random or not record(node.op_type).folds or node.domain not in ("", "ai.onnx"):
        return False
    if (
        fold_shapes
        and record(node.op_type).reads_shape
        and node.inputs
        and graph.values.get(node.inputs[0], _UNKNOWN).is_static
    ):
        return True
    return all(not i or i in consts for i in node.inputs)


_UNKNOWN = TensorInfo(np.dtype("float32"), None)


def fold_constants(
    graph: Graph,
    *,
    fold_shapes: bool = True,
    keep: Collection[str] = (),
    rule: ShapeRule | None = None,
    max_bytes: int | None = None,
    bound: Bound | None = None,
) -> Graph:
    """Evaluates every node whose inputs are all constants (and Shape/Size of static values) and turns its
    outputs into initializers. Weights built by ConstantOfShape become ordinary initializers this way.

    keep names parameters: values that depend on them are never folded (they change as training goes), though a
    kept value that is itself computed from constants is (it becomes the parameter's initializer).
    The initializers and the folded constants together may hold max_bytes (MAX_PARAMETER_BYTES by default): a
    node that would fold beyond it is a ModelLimitError, found before it runs from the shapes already inferred, the
    shape rule, or (neither known) edgetrain.graph.bounds, which also holds its kernel's working copy to bound
    (MAX_TENSOR_BYTES by default)."""

    limit = MAX_PARAMETER_BYTES if max_bytes is None else int(max_bytes)
    keep = set(keep)
    consts = {k: v for k, v in graph.initializers.items() if k not in keep}
    inits = dict(graph.initializers)
    values = dict(graph.values)
    total = sum(int(v.nbytes) for v in inits.values())
    kept: list[Node] = []
    for node in graph.nodes:
        if not _is_const_producer(node, consts, graph, fold_shapes):
            kept.append(node)
            continue
        inputs = [i for i in node.inputs if i]
        size = _fold_size(node, graph, values, consts, rule, total, limit, keep, bound or tensor_bound())
        if size is None:  # a large constant spread from small ones (a broadcast gradient seed): stays a node
            kept.append(node)
            continue
        total += size
        sub = Graph(
            nodes=[node],
            inputs=[],
            outputs=[o for o in node.outputs if o],
            initializers={i: consts[i] for i in inputs if i in consts},
            values=values,
            opset=graph.opset,
            name=node.name,
        )
        if record(node.op_type).reads_shape and node.inputs[0] not in consts:
            sub.initializers[node.inputs[0]] = _view(values[node.inputs[0]])  # a view of the data's shape
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


def _fold_size(
    node: Node, graph: Graph, values, consts, rule, total: int, limit: int, keep, bound: Bound
) -> int | None:
    """The bytes folding node would add (as far as known before running it); ModelLimitError beyond limit. None
    when the node is better not folded: an output larger than STANDIN_BYTES and than all its inputs together,
    that is no parameter (an Expand of a scalar to the batch is cheap to compute at every step, and folded it
    would cost its size in the artifact and in memory)."""
    if record(node.op_type).reads_shape:
        return 0
    infos = [values.get(o) if o else None for o in node.outputs]
    args = [consts.get(i) if i else None for i in node.inputs]
    found = check_node(node, args, bound)  # what its constants ask for, whatever the model declares
    if any(o and (i is None or not i.is_static) for o, i in zip(node.outputs, infos)) and rule is not None:
        try:
            infos = rule(node, args, graph.opset)
        except ShapeError:
            pass  # the node runs, and its kernel says what is wrong in its own words
    elif rule is None and found is not None:  # the device side: the outputs as far as known before it runs
        infos = [i if i is not None and i.is_static else f for i, f in zip(infos, found.outputs)]
    size = sum(check_size(i, f"{node.label}: output '{o}'") for o, i in zip(node.outputs, infos) if o and i)
    read = sum(int(consts[i].nbytes) for i in node.inputs if i in consts)
    if size > max(STANDIN_BYTES, read) and not any(o in keep for o in node.outputs):
        return None
    if total + size > limit:
        raise ModelLimitError(
            f"{node.label} computes a constant of {size_text(size)} from constants; with the model's other "
            f"constants ({size_text(total)}) that is more than the {size_text(limit)} edgetrain allows for a "
            "model's parameters and constants (edgetrain.graph.passes.MAX_PARAMETER_BYTES)",
            limit=limit,
            needed=total + size,
        )
    return size


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
        if node is not None and not record(node.op_type).reads_shape:  # those read shapes, not values
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
    rule: ShapeRule | None = None,
    max_bytes: int | None = None,
    bound: Bound | None = None,
) -> Graph:
    """The whole static pipeline: bind constant inputs, fix input shapes, infer shapes, fold constants (never
    through the parameters named in keep), drop no-ops and dead code. rule (the build side gives onnx's shape
    inference) lets shape inference skip values too large to stand in; max_bytes bounds the constants folded;
    bound every value (MAX_TENSOR_BYTES by default), before anything of its size is allocated."""
    g = bind_inputs(graph, constants or {})
    g = fix_input_shapes(
        g,
        batch_size=batch_size,
        shapes={k: v for k, v in (shapes or {}).items() if k in g.inputs},
        bound=bound,
    )
    g = infer_shapes(g, rule=rule, bound=bound)
    g = fold_constants(g, keep=keep, rule=rule, max_bytes=max_bytes, bound=bound)
    g = eliminate_noops(g)
    g = prune(g)
    check_static_shapes(g)
    return g
