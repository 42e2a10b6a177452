"""The interpreter (numpy only): a Graph compiled once into a list of steps, then run over feeds.

Compiling resolves each node's kernel, checks its attributes against the kernel's signature, numbers the values
into slots, and computes when each value dies, so that the loop in `run` is a few lines: fetch inputs by slot,
call the kernel, store outputs, drop dead values. Under a memory plan (edgetrain.core.plan), compiling also gives
each planned value its view of one arena, so that the loop allocates nothing but the graph's outputs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import EdgeTrainError, ExecutionError, FeedError, LimitError, UnsupportedError
from .ir import Graph, Node, TensorInfo
from .kernels import KERNELS
from .plan import MemoryPlan, check_plan


@dataclass(frozen=True)
class Step:
    fn: Callable[..., Any]
    ins: tuple[int, ...]  # slots; an omitted optional input reads the slot that always holds None
    outs: tuple[int, ...]  # slots; -1 for an omitted optional output
    kwargs: dict[str, Any]  # attributes (and noutputs, and out= when the kernel writes into a buffer of ours)
    dests: tuple[np.ndarray | None, ...]  # per output: the buffer its value must end up in, or None
    free: tuple[int, ...]  # slots whose last reader is this step
    node: Node


def supported_ops() -> list[str]:
    """The standard ONNX ops the interpreter runs."""
    return sorted(op for op, k in KERNELS.items() if not k.domain)


def compile_step(node: Node) -> tuple[Callable[..., Any], dict[str, Any]]:
    """Resolves the kernel of one node and its keyword arguments; user errors name the node."""
    kern = KERNELS.get(node.op_type)
    domain = "" if node.domain == "ai.onnx" else node.domain
    if kern is not None and kern.domain != domain:
        kern = None
    if kern is None:
        from .alternatives import no_kernel_message

        raise UnsupportedError(no_kernel_message(node.label, node.op_type, domain, supported_ops()))
    unknown = sorted(set(node.attrs) - set(kern.attrs))
    if unknown:
        raise UnsupportedError(
            f"{node.label}: attribute '{unknown[0]}' is not supported by {node.op_type}; "
            f"supported attributes: {', '.join(sorted(kern.attrs)) or 'none'}"
        )
    missing = [a for a, d in kern.attrs.items() if d is inspect.Parameter.empty and a not in node.attrs]
    if missing:
        raise UnsupportedError(f"{node.label}: required attribute '{missing[0]}' is missing")
    n_in = len(node.inputs)
    lo, hi = kern.n_inputs
    if n_in < max(lo, 1 if hi is None else 0) or (hi is not None and n_in > hi):
        takes = str(lo) if hi == lo else f"{lo} to {'any number' if hi is None else hi}"
        raise UnsupportedError(f"{node.label} has {n_in} inputs; {node.op_type} takes {takes}")
    kwargs = dict(node.attrs)
    if kern.wants_noutputs:
        kwargs["noutputs"] = max((k + 1 for k, o in enumerate(node.outputs) if o), default=1)
    return kern.fn, kwargs


class Interpreter:
    """Runs one graph.

    With a memory plan (edgetrain.graph.memory.plan_memory, whose graph this must be), every planned value is a view
    into one arena allocated here: kernels that take out= write there, the others' results are copied there.
    Graph outputs are outside the arena: their kernels allocate them on each run, and the caller owns them.
    Without a plan, values with static shapes whose kernel writes in place get a buffer of their own, allocated
    once and reused on every run (no allocation in steady state). Either way, the caller never receives an array
    that a later run overwrites."""

    def __init__(
        self,
        graph: Graph,
        *,
        preallocate: bool = True,
        plan: MemoryPlan | None = None,
        bind: Mapping[str, np.ndarray] | None = None,
        max_arena_bytes: int | None = None,
    ):
        self.graph = graph
        self.max_arena_bytes = max_arena_bytes  # the plan's ceiling (memory.MAX_ARENA_BYTES when None)
        self.plan = plan
        self.arena: np.ndarray | None = None  # under a plan: the bytes every planned value lives in
        names = list(graph.inputs) + list(graph.initializers)
        for n in graph.nodes:
            names.extend(o for o in n.outputs if o)
        self.slot = {name: k for k, name in enumerate(dict.fromkeys(names))}
        self._names = list(self.slot)
        self.n_slots = len(self.slot)
        none_slot = self.n_slots  # env has one more slot, never written: omitted inputs read None from it
        keep = set(graph.outputs) | set(graph.initializers) | set(graph.inputs)
        last_use: dict[int, int] = {}
        for idx, n in enumerate(graph.nodes):
            for i in n.inputs:
                if i:
                    last_use[self.slot[i]] = idx
        # ids of the arrays a caller must never receive uncopied: constants, the arena, our buffers
        self._protected: set[int] = {id(_root(v)) for v in graph.initializers.values()}
        buffers = self._arena_views(plan) if plan is not None else {}
        # graph outputs the caller gives a buffer for (a session's flat gradient views): written there, returned
        for name, buf in (bind or {}).items():
            assert name in graph.outputs and name not in buffers, (
                f"'{name}' cannot be bound: not a free output"
            )
            buffers[name] = buf
        steps = []
        for idx, n in enumerate(graph.nodes):
            fn, kwargs = compile_step(n)
            writes_out = KERNELS[n.op_type].writes_out
            ins = tuple(self.slot[i] if i else none_slot for i in n.inputs)
            outs = tuple(self.slot[o] if o else -1 for o in n.outputs)
            # A value nobody reads dies at once; one that is read dies after its last reader.
            free = {s for s in ins if s != none_slot and last_use.get(s) == idx}
            free |= {s for s in outs if s >= 0 and s not in last_use}
            free = tuple(sorted(s for s in free if self._name(s) not in keep))
            first = n.outputs[0] if n.outputs else ""
            if plan is None and preallocate and writes_out and first and first not in keep:
                info = graph.values.get(first, _NO)
                if info.is_static:
                    try:
                        buffers[first] = b = np.empty(info.shape, info.dtype)
                    except (MemoryError, ValueError):  # too large to keep: the kernel allocates it each run
                        pass
                    else:
                        self._protected.add(id(b))
            dests = tuple(buffers.get(o) if o else None for o in n.outputs)
            if writes_out and dests and dests[0] is not None:
                kwargs["out"] = dests[0]
            steps.append(Step(fn, ins, outs, kwargs, dests, free, n))
        self.steps = steps
        self._consts = [(self.slot[k], v) for k, v in graph.initializers.items()]
        self._in_slots = [(name, self.slot[name]) for name in graph.inputs]
        self._compiled = _compile(steps, self.n_slots + 1)

    def _arena_views(self, plan: MemoryPlan) -> dict[str, np.ndarray]:
        """One aligned byte arena, and a view into it for every planned value. The plan is checked first
        (plan.check_plan: alignment, bounds, no two live values on the same bytes), before the arena is
        allocated: a plan from a file or a caller may be anything."""
        g = self.graph
        check_plan(g, plan, max_arena_bytes=self.max_arena_bytes)
        try:
            raw = np.empty(plan.arena_size + plan.alignment, np.uint8)
        except MemoryError:
            raise LimitError(
                f"the memory plan's arena of {plan.arena_size} bytes cannot be allocated here (out of memory); "
                "train with a smaller batch (convert with --batch-size)",
                needed=plan.arena_size,
            ) from None
        self._protected.add(id(raw))
        shift = -raw.ctypes.data % plan.alignment
        arena = raw[shift : shift + plan.arena_size]
        views = {}
        for name, off in plan.offsets.items():
            info = g.values[name]
            size = int(np.prod(info.shape, dtype=np.int64)) * np.dtype(info.dtype).itemsize
            views[name] = arena[off : off + size].view(info.dtype).reshape(info.shape)
        self.arena = arena
        return views

    def _name(self, s: int) -> str:
        return self._names[s]

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        outputs: Sequence[str] | None = None,
        record: dict[str, TensorInfo] | None = None,
    ) -> list[np.ndarray]:
        """Runs the graph on feeds (already checked) and returns the requested outputs (all by default).
        record, when given, receives the dtype and shape of every value computed (used by shape inference)."""
        env: list[Any] = [None] * (self.n_slots + 1)
        for s, v in self._consts:
            env[s] = v
        for name, s in self._in_slots:
            env[s] = feeds[name]
        if record is None:  # the straight-line code; on a failure, the loop below says where, with the shapes
            try:
                self._compiled(env)
                wanted = self.graph.outputs if outputs is None else outputs
                return [self._detached(env[self.slot[name]]) for name in wanted]
            except Exception:
                pass
            env = [None] * (self.n_slots + 1)
            for s, v in self._consts:
                env[s] = v
            for name, s in self._in_slots:
                env[s] = feeds[name]
        for st in self.steps:
            args = [env[s] for s in st.ins]
            try:
                res = st.fn(*args, **st.kwargs)
                if len(st.outs) == 1:
                    d = st.dests[0]
                    if d is not None and res is not d:  # a kernel without out=: into the planned buffer
                        np.copyto(d, res)
                        res = d
                    env[st.outs[0]] = res
                else:
                    if not isinstance(res, tuple):
                        res = (res,)
                    for s, d, r in zip(st.outs, st.dests, res):
                        if d is not None and r is not d:
                            np.copyto(d, r)
                            r = d
                        if s >= 0:
                            env[s] = r
            except EdgeTrainError as e:
                raise type(e)(f"{st.node.label}: {e}") from e
            except Exception as e:  # a kernel failure on inputs it cannot handle: say where, with the shapes
                shapes = ", ".join("None" if a is None else f"{a.dtype}{list(a.shape)}" for a in args)
                raise ExecutionError(
                    f"{st.node.label} failed on inputs ({shapes}): {type(e).__name__}: {e}"
                ) from e
            if record is not None:
                for o, s in zip(st.node.outputs, st.outs):
                    if s >= 0 and env[s] is not None:
                        record[o] = TensorInfo(env[s].dtype, tuple(int(d) for d in env[s].shape))
            for s in st.free:
                env[s] = None
        wanted = self.graph.outputs if outputs is None else outputs
        return [self._detached(env[self.slot[name]]) for name in wanted]

    def _detached(self, r: np.ndarray) -> np.ndarray:
        """A result that is (a view of) a reused buffer, the arena or a constant (a Reshape of a Conv output,
        say) is copied, so that the caller's arrays never change under it, nor ours under the caller."""
        return r.copy() if id(_root(r)) in self._protected else r


def _compile(steps: Sequence[Step], n_env: int) -> Callable[[list[Any]], None]:
    """The steps as one straight-line Python function over the env list: each kernel called with its attributes
    bound (functools.partial), its result put into its planned buffer when the kernel did not write there, dead
    values dropped; no loop, no per-step dispatch. A failure falls back to the loop, which says where."""
    import functools

    names: dict[str, Any] = {"np_copyto": np.copyto}
    lines = ["def run(e):"]
    for k, st in enumerate(steps):
        f = f"f{k}"
        names[f] = functools.partial(st.fn, **st.kwargs) if st.kwargs else st.fn
        args = ", ".join(f"e[{s}]" for s in st.ins)
        if len(st.outs) == 1:
            lines.append(f"    r = {f}({args})")
            d = st.dests[0]
            if d is not None:
                names[f"d{k}"] = d
                lines.append(f"    if r is not d{k}:")
                lines.append(f"        np_copyto(d{k}, r)")
                lines.append(f"        r = d{k}")
            lines.append(f"    e[{st.outs[0]}] = r")
        else:
            lines.append(f"    r = {f}({args})")
            lines.append("    r = r if isinstance(r, tuple) else (r,)")
            for j, (s, d) in enumerate(zip(st.outs, st.dests)):
                if d is not None:
                    names[f"d{k}_{j}"] = d
                    lines.append(f"    if r[{j}] is not d{k}_{j}:")
                    lines.append(f"        np_copyto(d{k}_{j}, r[{j}])")
                    val = f"d{k}_{j}"
                else:
                    val = f"r[{j}]"
                if s >= 0:
                    lines.append(f"    e[{s}] = {val}")
        for s in st.free:
            lines.append(f"    e[{s}] = None")
    if not steps:
        lines.append("    pass")
    code = compile("\n".join(lines), "<edgetrain step>", "exec")
    exec(code, names)
    return names["run"]


def _root(a: np.ndarray) -> np.ndarray:
    while a.base is not None and isinstance(a.base, np.ndarray):
        a = a.base
    return a


_NO = TensorInfo(np.dtype("float32"), None)


def check_feeds(graph: Graph, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Validates feeds against the graph's inputs (names, dtypes, static shapes) and returns them as arrays."""
    if not isinstance(feeds, Mapping):
        raise FeedError(
            f"feeds must be a dict of input name -> array, not {type(feeds).__name__}; "
            f"inputs: {_describe_inputs(graph)}"
        )
    unknown = [k for k in feeds if k not in graph.inputs]
    if unknown:
        raise FeedError(
            f"'{unknown[0]}' is not an input of the model; its inputs are: {_describe_inputs(graph)}"
        )
    missing = [k for k in graph.inputs if k not in feeds]
    if missing:
        raise FeedError(
            f"input '{missing[0]}' is missing from the feeds; the model's inputs are: "
            f"{_describe_inputs(graph)}"
        )
    out = {}
    for name in graph.inputs:
        try:
            x = np.asarray(feeds[name])
        except (TypeError, ValueError) as e:  # ragged lists, objects numpy cannot make an array of
            raise FeedError(f"input '{name}' is not an array: {e}") from None
        info = graph.values[name]
        if x.dtype != info.dtype:
            want = np.dtype(info.dtype)
            # np.object is gone from numpy 2 (and np.str_ arrays are not strings to ONNX): a text input is an
            # object array of str
            fix = "np.array(texts, dtype=object)" if want.kind == "O" else f".astype(np.{want.name})"
            raise FeedError(f"input '{name}' must be {want.name}, got {x.dtype.name}; convert it with {fix}")
        if info.shape is not None:
            ok = len(x.shape) == len(info.shape) and all(
                not isinstance(d, int) or d == s for d, s in zip(info.shape, x.shape)
            )
            if not ok:
                raise FeedError(
                    f"input '{name}' must have shape {_fmt_shape(info.shape)}, got {list(x.shape)}"
                )
        out[name] = x
    return out


def _fmt_shape(shape: Sequence[Any]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _describe_inputs(graph: Graph) -> str:
    return (
        ", ".join(f"'{n}' {graph.values[n]}" if n in graph.values else f"'{n}'" for n in graph.inputs)
        or "(none)"
    )
