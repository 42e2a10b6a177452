"""A memory plan and its check (numpy only): MemoryPlan, where every value a program computes lives in one arena,
and check_plan, which proves a plan (made by edgetrain.graph.memory, or read from a file) safe for its program
before anything is allocated: alignment, bounds, sizes, and that no two values whose lifetimes overlap share a byte
but for an in-place output written over the input that dies at its node. What a value may share with its input
comes from the kernel table (registry: view=, view_if=, inplace=)."""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .declared import declared_nbytes
from .errors import LimitError, ModelError, ModelLimitError
from .ir import Graph, Node
from .kernels import KERNELS
from .kernels.registry import DYNAMIC

# The largest arena a plan may ask for (and the largest value a stored program may declare): a phone has a few GB;
# a caller with more raises it (load_artifact(max_arena_bytes=), or this constant).
MAX_ARENA_BYTES = 4 << 30


MAX_ALIGNMENT = 4096  # a page; plans are made with 64


@dataclass
class MemoryPlan:
    """Where every planned value lives, and what the plan saves. JSON-ready through to_dict / from_dict."""

    arena_size: int  # bytes; also the peak, since nothing planned lives outside the arena
    alignment: int
    offsets: dict[str, int]  # planned value -> byte offset in the arena
    aliases: dict[str, str]  # value -> the input it is a view of (no buffer of its own)
    in_place: list[tuple[str, str]]  # (output, input): the output is written over the input, which dies there
    outside: list[str]  # values nodes produce outside the arena: graph outputs, constants, unplannable values
    # most bytes live at once in this schedule (an in-place output and its input counted once): no arrangement of
    # offsets does better
    lower_bound: int
    no_plan: int  # one buffer per planned value
    unreordered_peak: int  # the arena the given node order would need
    order_digest: str = ""  # which schedule the offsets are for (runtime.interpreter.schedule_digest)
    # planned values whose kernel has no out=: the interpreter copies them into the arena
    copies: list[str] = field(default_factory=list)

    @property
    def peak(self) -> int:
        return self.arena_size

    def to_dict(self) -> dict[str, Any]:
        return {
            "arena_size": self.arena_size,
            "alignment": self.alignment,
            "offsets": dict(self.offsets),
            "aliases": dict(self.aliases),
            "in_place": [list(p) for p in self.in_place],
            "outside": list(self.outside),
            "lower_bound": self.lower_bound,
            "no_plan": self.no_plan,
            "unreordered_peak": self.unreordered_peak,
            "order_digest": self.order_digest,
            "copies": list(self.copies),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryPlan:
        """The plan to_dict wrote; ValueError naming the first field that is missing or of another type."""
        if not isinstance(d, dict):
            raise ValueError(f"the plan is a {type(d).__name__}, not an object")

        def get(key: str, kind: str, default: Any = ...) -> Any:
            if key not in d:
                if default is ...:
                    raise ValueError(f"the plan lacks '{key}'")
                return default
            v = d[key]
            ok = {
                "int": type(v) is int,
                "str": isinstance(v, str),
                "names": isinstance(v, list) and all(isinstance(x, str) for x in v),
                "offsets": isinstance(v, dict) and all(type(x) is int for x in v.values()),
                "aliases": isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
                "pairs": isinstance(v, list)
                and all(
                    isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in v
                ),
            }[kind]
            if not ok:
                text = repr(v)
                raise ValueError(
                    f"the plan's '{key}' is {text[:60]}{'...' if len(text) > 60 else ''}, not {kind}"
                )
            return v

        return cls(
            arena_size=get("arena_size", "int"),
            alignment=get("alignment", "int"),
            offsets=dict(get("offsets", "offsets")),
            aliases=dict(get("aliases", "aliases")),
            in_place=[(o, i) for o, i in get("in_place", "pairs")],
            outside=list(get("outside", "names")),
            lower_bound=get("lower_bound", "int"),
            no_plan=get("no_plan", "int"),
            unreordered_peak=get("unreordered_peak", "int"),
            order_digest=get("order_digest", "str", ""),
            copies=list(get("copies", "names", [])),
        )

    def summary(self) -> str:
        mb = 1 / 2**20
        return (
            f"memory plan: arena {self.arena_size * mb:.3f} MB (lower bound {self.lower_bound * mb:.3f} MB, "
            f"given order {self.unreordered_peak * mb:.3f} MB, one buffer per value {self.no_plan * mb:.3f} MB); "
            f"{len(self.offsets)} values in the arena, {len(self.in_place)} in place, {len(self.aliases)} views"
        )


def nbytes(graph: Graph, name: str) -> int:
    info = graph.values[name]
    return int(np.prod(info.shape, dtype=np.int64)) * np.dtype(info.dtype).itemsize


class PlanFacts:
    """Order-independent facts: which values are planned, views (and of what), their sizes and readers."""

    def __init__(self, graph: Graph):
        self.graph = graph
        nodes = graph.nodes
        self.nodes = nodes
        outputs = set(graph.outputs)
        self.producer: dict[str, int] = {}
        self.base: dict[str, str] = {}  # alias -> the input it views
        self.outside: list[str] = []
        self.planned: dict[str, int] = {}  # value -> nbytes
        self.flat: set[str] = set()  # aliases that keep their base's layout (reshape-like)
        for k, n in enumerate(nodes):
            kern = KERNELS.get(n.op_type)
            view = (
                kern is not None
                and kern.aliases_input
                and (kern.view_if is None or kern.view_if(n.attrs, self._consts(n)))
            )
            for o in n.outputs:
                if not o:
                    continue
                self.producer[o] = k
                if view and n.inputs and n.inputs[0]:
                    self.base[o] = n.inputs[0]
                    if kern.keeps_layout:
                        self.flat.add(o)
                elif view or o in outputs or not self._plannable(o):
                    self.outside.append(o)
                else:
                    self.planned[o] = nbytes(graph, o)
        # Liveness is tracked on roots: the planned value whose buffer a value is, or views of it.
        self.root = {v: self._root(v) for v in self.producer}
        self.readers: dict[str, list[int]] = {r: [] for r in self.planned}
        for k, n in enumerate(nodes):
            for r in dict.fromkeys(self.root.get(i) for i in n.inputs if i):
                if r in self.readers:
                    self.readers[r].append(k)
        # A root that a graph output views lives to the end (the interpreter copies that output out).
        self.pinned = {self.root[o] for o in graph.outputs if self.root.get(o) in self.planned}

    def _consts(self, n: Node) -> list[Any]:
        g = self.graph
        return [None if not i else g.initializers[i] if i in g.initializers else DYNAMIC for i in n.inputs]

    def _plannable(self, v: str) -> bool:
        info = self.graph.values.get(v)
        return info is not None and info.is_static and np.dtype(info.dtype).kind not in "OUS"

    def _root(self, v: str) -> str:
        while v in self.base:
            v = self.base[v]
        return v

    def is_flat(self, v: str) -> bool:
        """v is its root's buffer in the root's layout (the root itself, or reshapes of it)."""
        while v in self.base:
            if v not in self.flat:
                return False
            v = self.base[v]
        return True


def check_plan(
    graph: Graph,
    plan: MemoryPlan,
    *,
    where: str = "the memory plan",
    error: type[Exception] = ModelError,
    limit_error: type[LimitError] = ModelLimitError,
    max_arena_bytes: int | None = None,
) -> None:
    """Raises error(where + the first fault) unless the plan is safe to run graph (in its node order) with:
    alignment a power of two up to MAX_ALIGNMENT; an arena of at most max_arena_bytes (MAX_ARENA_BYTES; a
    limit_error past it), and no larger than all its values together; every placed value one that a node computes
    into the arena (not a graph input, initializer, graph output or view), with a static shape, at an aligned
    offset >= 0 with all its bytes inside the arena; and no two values live at once sharing a byte. A value lives
    from the node that makes it to the last node that reads it or a view of it (to the end when a graph output
    views it), views being what the kernels say, not what the plan says. The one sharing allowed is the planner's
    in place: an output at the very offset and size of an input that dies at its node, of the same dtype, when
    the kernel may write over that input (Kernel.inplace) and reads it there only in its own layout."""
    limit = MAX_ARENA_BYTES if max_arena_bytes is None else max_arena_bytes
    _check_arena(plan, limit, where, error, limit_error)
    if plan.order_digest and plan.order_digest != schedule_digest(graph):
        raise error(f"{where} was made for another node order than its program's")
    try:
        f = PlanFacts(graph)
    except Exception as e:  # a kernel's view condition that cannot read a node's attributes
        raise error(f"{where}: its program cannot be planned ({type(e).__name__}: {e})") from None
    size = _placed(graph, plan, f, where, error)
    need = sum(-(-b // plan.alignment) * plan.alignment for b in size.values())
    if plan.arena_size > need:
        raise error(
            f"{where} declares an arena of {plan.arena_size} bytes, more than all its values need ({need})"
        )
    _check_lifetimes(graph, plan, f, size, where, error)


def _check_arena(plan: MemoryPlan, limit: int, where: str, error, limit_error) -> None:
    align, arena = plan.alignment, plan.arena_size
    if type(align) is not int or not 1 <= align <= MAX_ALIGNMENT or align & (align - 1):
        raise error(f"{where}: its alignment {align!r} is not a power of two from 1 to {MAX_ALIGNMENT}")
    if type(arena) is not int or arena < 0:
        raise error(f"{where}: its arena size {arena!r} is not an int >= 0")
    if arena > limit:
        raise limit_error(
            f"{where} asks for an arena of {arena} bytes, more than the {limit} edgetrain allows "
            "(max_arena_bytes=)",
            limit=limit,
            needed=arena,
        )


def _placed(graph: Graph, plan: MemoryPlan, f: PlanFacts, where: str, error) -> dict[str, int]:
    """The bytes of every value the plan places, each a value a node computes into the arena, at an aligned
    offset with all its bytes inside the arena."""
    align, arena = plan.alignment, plan.arena_size
    size: dict[str, int] = {}
    for name, off in plan.offsets.items():
        quoted = repr(name)[:80]
        if name not in f.planned:
            raise error(
                f"{where} places {quoted}, which is not a value a node computes into the arena (a graph input, "
                "initializer, graph output, view, or unknown value)"
            )
        info = graph.values[name]
        try:
            size[name] = declared_nbytes(list(info.shape), np.dtype(info.dtype).itemsize)
        except ValueError as e:
            raise error(f"{where} places {quoted}, whose declared shape is impossible: {e}") from None
        if type(off) is not int or off < 0 or off % align or off + size[name] > arena:
            raise error(
                f"{where} places {quoted} ({size[name]} bytes) at {off!r}: not an aligned offset >= 0 with all "
                f"its bytes inside the {arena}-byte arena"
            )
    return size


def _check_lifetimes(
    graph: Graph, plan: MemoryPlan, f: PlanFacts, size: dict[str, int], where: str, error
) -> None:
    """No two values live at once share a byte, but for the planner's in place (see check_plan): a sweep over the
    nodes, keeping the byte ranges of the values live, sorted."""
    n = len(graph.nodes)
    start = {v: f.producer[v] for v in size}
    end = {v: n if v in f.pinned else max(f.readers[v], default=start[v]) for v in size}
    births: dict[int, list[str]] = {}
    deaths: dict[int, list[str]] = {}
    for v in sorted(size, key=lambda v: (start[v], plan.offsets[v])):
        if size[v]:  # an empty value has no bytes to share
            births.setdefault(start[v], []).append(v)
            deaths.setdefault(end[v], []).append(v)
    live: list[tuple[int, int, str]] = []  # (first byte, end byte, value) of the values live now: disjoint

    def forget(v: str) -> None:
        k = bisect.bisect_left(live, (plan.offsets[v], plan.offsets[v] + size[v], v))
        if k < len(live) and live[k][2] == v:
            del live[k]

    for t in range(n + 1):
        for b in births.get(t, ()):
            lo, hi = plan.offsets[b], plan.offsets[b] + size[b]
            k = bisect.bisect_left(live, (lo, hi, b))
            if k > 0 and live[k - 1][1] > lo:  # the one before may reach into b
                k -= 1
            shared = []
            while k < len(live) and live[k][0] < hi:
                if live[k][1] > lo:
                    shared.append(live[k][2])
                k += 1
            for a in shared:
                if not (end[a] == t and _may_write_over(f, graph, graph.nodes[t], a, b, plan.offsets, size)):
                    node = graph.nodes[t]
                    raise error(
                        f"{where} puts {b!r} (made by node {t} '{node.name or b}', {node.op_type}) on bytes of "
                        f"{a!r}, which is still live then (made at node {start[a]}, read until node {end[a]}): "
                        "the two would overwrite each other"
                    )
                forget(a)
            bisect.insort(live, (lo, hi, b))
        for a in deaths.get(t, ()):
            forget(a)


def _may_write_over(
    f: PlanFacts, g: Graph, node: Node, a: str, b: str, offsets: dict[str, int], size: dict[str, int]
) -> bool:
    """Whether node may write its output b in place over a, which dies there (memory._layout's in place)."""
    kern = KERNELS.get(node.op_type)
    outs = [o for o in node.outputs if o]
    if kern is None or outs != [b] or offsets[a] != offsets[b] or size[a] != size[b]:
        return False
    for j in kern.inplace:
        x = node.inputs[j] if j < len(node.inputs) else ""
        xi = g.values.get(x)
        if x and f.root.get(x) == a and xi is not None and xi.dtype == g.values[b].dtype:
            return all(f.is_flat(i) for i in node.inputs if i and f.root.get(i) == a)
    return False


def schedule_digest(graph: Graph) -> str:
    """A fingerprint of the node order: a memory plan's offsets are valid for the schedule they were made for."""
    text = "\n".join(f"{n.op_type}:{','.join(n.inputs)}>{','.join(n.outputs)}" for n in graph.nodes)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
