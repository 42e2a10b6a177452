"""The interpreter (numpy only): a Graph compiled once into one straight-line Python function, then run over feeds.

Compiling resolves each node's kernel, checks its attributes against the kernel's signature, numbers the values
into slots, computes when each value dies, and writes the steps out as code: call the kernel with its attributes
bound, put the result into its planned buffer, drop dead values. That function is the only executor; when a
kernel fails, the traceback's line says which node, and the error names it with the shapes of its inputs. Under a
memory plan (edgetrain.core.plan), compiling also gives each planned value its view of one arena, so that a run
allocates nothing but the graph's outputs.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import fastpaths
from .alternatives import no_kernel_message
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
        lean: bool | None = None,
        per_sample: Collection[str] = (),
    ):
        """lean: run kernels specialized for the graph's static shapes where they have a specialization (fast
        path "lean_kernels"); by default for a training step's program (a plan or bound outputs), whose feeds
        its session checks against those shapes. Never for a graph whose shapes are still being inferred.
        per_sample: names of nodes that compute each sample on its own, without the fast paths that put several
        samples in one product (fastpaths.BATCH_MIXING): a frozen prefix whose results are cached per sample."""
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
        if lean is None:
            lean = plan is not None or bool(bind)
        lean = lean and fastpaths.enabled("lean_kernels")
        shared: dict[Any, Any] = {}  # what specialized kernels of this program share (scratch, a loss's exp)
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
            alone = n.name in per_sample
            fn, kwargs = self._kernel(n, (fn, kwargs), (dests, buffers, shared), lean=lean, alone=alone)
            steps.append(Step(fn, ins, outs, kwargs, dests, free, n))
        self.steps = steps
        self._tables(bind or {})
        self._compiled = _compile(steps)
        self._kept: _Program | None = None  # compiled without dropping values, for run(record=)

    def _kernel(self, n: Node, plain: tuple, where: tuple, *, lean: bool, alone: bool):
        """(fn, kwargs) node n runs: its specialized kernel when lean and it has one, else plain; alone: without
        the fast paths that put several samples in one product (fastpaths.BATCH_MIXING)."""
        # only a kernel with such a path; and plain() with no name would turn every path off
        alone = alone and n.op_type in fastpaths.BATCH_MIXING_OPS and bool(fastpaths.BATCH_MIXING)
        if lean:
            dests, buffers, shared = where
            with fastpaths.plain(*fastpaths.BATCH_MIXING) if alone else contextlib.nullcontext():
                fast = self._lean(n, KERNELS[n.op_type], dests, buffers, shared)
            if fast is not None:  # its paths were read when it was built
                return fast, {}
        fn, kwargs = plain
        return (_per_sample(fn) if alone else fn), kwargs

    def _tables(self, bind: Mapping[str, np.ndarray]) -> None:
        """What run() reads: the constants' slots, an env with them in place, the inputs' and outputs' slots."""
        g = self.graph
        self._consts = [(self.slot[k], v) for k, v in g.initializers.items()]
        self._in_slots = [(name, self.slot[name]) for name in g.inputs]
        # a bound output a node computes is always the caller's own buffer (a bound constant is not)
        made = {o for n in g.nodes for o in n.outputs}
        self._out_slots = [(self.slot[o], o in bind and o in made) for o in g.outputs]
        self._env: list[Any] = [None] * (self.n_slots + 1)
        for s, v in self._consts:
            self._env[s] = v

    def _lean(
        self, n: Node, kern: Any, dests: tuple, buffers: dict, shared: dict
    ) -> Callable[..., Any] | None:
        """The kernel specialized for this node's static input shapes and output buffer (the kernel's `lean`
        builder: its checks done here, once), or None. A kernel that does not take out= writes into its planned
        buffer only when that buffer shares no bytes with an input's (the plan may reuse an input's bytes for it,
        since the plain step copies the result there after the kernel has read its inputs)."""
        build = getattr(kern.fn, "lean", None)
        if build is None or len(n.outputs) != 1 or not n.outputs[0]:
            return None
        g = self.graph
        infos = [g.values.get(i) if i else None for i in n.inputs]
        if any(i and (info is None or not info.is_static) for i, info in zip(n.inputs, infos)):
            return None
        out = dests[0] if dests else None
        if out is not None and not kern.writes_out:
            if any(i in buffers and np.shares_memory(out, buffers[i]) for i in n.inputs if i):
                out = None
        consts = [g.initializers.get(i) if i else None for i in n.inputs]
        return build(n, infos, consts, out, shared)

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
        env = self._env.copy()  # the constants in their slots; the slot past the end holds None
        for name, s in self._in_slots:
            env[s] = feeds[name]
        program = self._compiled if record is None else self._keeping()
        try:
            # IEEE arithmetic, as onnxruntime's: a mask's most negative float plus a score is -inf, not a warning
            with np.errstate(over="ignore", under="ignore"):
                program.run(env)
        except Exception as e:  # a kernel failed: say which node, with the shapes of its inputs
            raise self._failure(program, e, env) from e
        if record is not None:
            for st in self.steps:
                for o, s in zip(st.node.outputs, st.outs):
                    if s >= 0 and env[s] is not None:
                        record[o] = TensorInfo(env[s].dtype, tuple(int(d) for d in env[s].shape))
        if outputs is None:  # a bound output is the caller's own buffer: never ours to detach
            return [env[s] if bound else self._detached(env[s]) for s, bound in self._out_slots]
        return [self._detached(env[self.slot[name]]) for name in outputs]

    def _keeping(self) -> _Program:
        """The step compiled without dropping dead values, for record= (made on first use)."""
        if self._kept is None:
            self._kept = _compile(self.steps, free=False)
        return self._kept

    def _failure(self, program: _Program, e: Exception, env: list[Any]) -> Exception:
        """The error to raise for an exception out of the compiled step: the node it came from is the one whose
        lines the traceback ends in; its inputs are still in env (a step drops its dead inputs after its call)."""
        st = self.steps[program.step_of(e)]
        if isinstance(e, EdgeTrainError):
            return type(e)(f"{st.node.label}: {e}")
        args = [env[s] for s in st.ins]
        shapes = ", ".join("None" if a is None else f"{a.dtype}{list(a.shape)}" for a in args)
        return ExecutionError(f"{st.node.label} failed on inputs ({shapes}): {type(e).__name__}: {e}")

    def _detached(self, r: np.ndarray) -> np.ndarray:
        """A result that is (a view of) a reused buffer, the arena or a constant (a Reshape of a Conv output,
        say) is copied, so that the caller's arrays never change under it, nor ours under the caller."""
        return r.copy() if id(r if r.base is None else _root(r)) in self._protected else r


@dataclass(frozen=True)
class _Program:
    """The steps as one straight-line Python function over the env list, and the first line of each step in it."""

    run: Callable[[list[Any]], None]
    starts: tuple[int, ...]

    def step_of(self, e: BaseException) -> int:
        """The step whose lines an exception raised in run() came from."""
        line = 0
        tb = e.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == _FILENAME:
                line = tb.tb_lineno
            tb = tb.tb_next
        return max(0, bisect.bisect_right(self.starts, line) - 1)


_FILENAME = "<edgetrain step>"


def _compile(steps: Sequence[Step], *, free: bool = True) -> _Program:
    """The steps as one straight-line Python function over the env list: each kernel called with its attributes
    bound (functools.partial), its result put into its planned buffer when the kernel did not write there, dead
    values dropped (unless free=False); no loop, no per-step dispatch."""
    names: dict[str, Any] = {"np_copyto": np.copyto}
    lines = ["def run(e):"]
    starts = []
    for k, st in enumerate(steps):
        starts.append(len(lines) + 1)  # line numbers count from 1
        f = f"f{k}"
        names[f] = functools.partial(st.fn, **st.kwargs) if st.kwargs else st.fn
        args = ", ".join(f"e[{s}]" for s in st.ins)
        lines.append(f"    r = {f}({args})")
        if len(st.outs) == 1:
            d = st.dests[0]
            if d is not None:
                names[f"d{k}"] = d
                lines += [f"    if r is not d{k}:", f"        np_copyto(d{k}, r)", f"        r = d{k}"]
            lines.append(f"    e[{st.outs[0]}] = r")
        else:
            lines.append("    r = r if isinstance(r, tuple) else (r,)")
            for j, (s, d) in enumerate(zip(st.outs, st.dests)):
                val = f"r[{j}]"
                if d is not None:
                    names[f"d{k}_{j}"] = d
                    lines += [f"    if r[{j}] is not d{k}_{j}:", f"        np_copyto(d{k}_{j}, r[{j}])"]
                    val = f"d{k}_{j}"
                if s >= 0:
                    lines.append(f"    e[{s}] = {val}")
        if free:
            lines += [f"    e[{s}] = None" for s in st.free]
    if not steps:
        lines.append("    pass")
    exec(compile("\n".join(lines), _FILENAME, "exec"), names)
    return _Program(names["run"], tuple(starts))


def _per_sample(fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn run without the fast paths that put several samples in one product (a kernel that reads its switches
    when called)."""

    def alone(*args: Any, **kwargs: Any) -> Any:
        with fastpaths.plain(*fastpaths.BATCH_MIXING):
            return fn(*args, **kwargs)

    return alone


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
