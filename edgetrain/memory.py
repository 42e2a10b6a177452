"""The memory plan (build side, numpy only): a static Graph -> (the Graph in a low-memory schedule, MemoryPlan).

The plan covers the values nodes produce: activations, gradients, temporaries. Graph inputs and initializers
(data, parameters, optimizer state) belong to the session, and graph outputs (loss, model outputs, new parameters
and state) are allocated by their kernels on each run and handed to the caller, who owns them: neither lives in
the arena. What the kernel table says about views (registry: view=, view_if=) makes a value an alias of its
input's buffer; what it says about in-place safety (inplace=) lets an elementwise op write over an input that
dies there. Everything else gets an aligned offset in one byte arena, placed greedily by size over the liveness
intervals (TFLite's arena planner), after a schedule that runs each optimizer update as soon as its gradient is
ready so that gradients die early ("On-Device Training Under 256KB Memory", NeurIPS 2022). The greedy schedule has
a few variants, each best on some graphs; the plan keeps whichever needs the smallest arena, the given order
included. Kernels' own temporaries (im2col columns, say) are not planned.

A plan read from a file is checked against its program before anything is allocated (check_plan): alignment,
bounds, sizes, and the one property that makes it safe, that no two values whose lifetimes overlap share a byte
but for an in-place output written over the input that dies at its node.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import LimitError, ModelError, ModelLimitError
from .ir import Graph, Node, toposort
from .runtime.interpreter import schedule_digest
from .runtime.kernels import KERNELS
from .runtime.kernels.registry import DYNAMIC

# A node's producers are pulled into its cluster only this far; values up to TINY bytes (scalars, shapes) may be
# pulled even when others read them too.
_MAX_CLUSTER = 8
_TINY = 64
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


# ---------------------------------------------------------------------------------------------------------------
# what the graph says, whatever the order


class _Facts:
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


# ---------------------------------------------------------------------------------------------------------------
# the schedule


def _schedule(f: _Facts, *, strict: bool, smallest: bool) -> list[int]:
    """A topological order (node indices) that keeps the bytes live low. Greedy over clusters: a node, with the
    few producers that only it needs pulled in just before it. A cluster that frees at least what it allocates runs
    at once, the most freeing first: an optimizer update frees its gradient, so it runs as soon as the gradient is
    ready, and the products only it needs (weight decay times the parameter, momentum times the state) are computed
    just then. strict asks more of such a cluster: that it never holds more extra bytes than it finally frees; the
    smallest transient then goes first (so each comes on as much freed memory as possible). When no cluster
    qualifies, the ready node that comes first in the given order runs, or (smallest) the one that adds fewest
    bytes, nodes that read nothing in the arena (the first layer, products of parameters) last. Ties go to the
    given order."""
    nodes = f.nodes
    n = len(nodes)
    producers = [sorted({f.producer[i] for i in nd.inputs if i in f.producer}) for nd in nodes]
    consumers: list[list[int]] = [[] for _ in range(n)]
    for k, ps in enumerate(producers):
        for p in ps:
            consumers[p].append(k)
    reads = [
        [r for r in dict.fromkeys(f.root.get(i) for i in nd.inputs if i) if r in f.planned] for nd in nodes
    ]
    made = [[o for o in nd.outputs if o in f.planned] for nd in nodes]
    alloc = [sum(f.planned[o] for o in made[k]) for k in range(n)]
    pullable = [len(consumers[k]) == 1 or alloc[k] <= _TINY for k in range(n)]
    # bytes of outputs nobody reads (freed at once), and the inputs an in-place kernel may write over
    unread = [sum(f.planned[o] for o in made[k] if not f.readers[o] and o not in f.pinned) for k in range(n)]
    overwritable: list[set[str]] = []
    for k, nd in enumerate(nodes):
        kern = KERNELS.get(nd.op_type)
        ins = kern.inplace if kern is not None and len(made[k]) == 1 else ()
        overwritable.append(
            {
                f.root[nd.inputs[j]]
                for j in ins
                if j < len(nd.inputs) and f.root.get(nd.inputs[j]) in f.planned
            }
        )

    missing = [len(ps) for ps in producers]
    remaining = {r: len(ks) for r, ks in f.readers.items()}
    done = [False] * n
    order: list[int] = []
    # Candidates are evaluated again only when something they depend on changes: a node of their cluster (or the
    # one blocking it) runs, or a value their cluster reads loses a reader.
    clusters: dict[int, list[int]] = {}
    version = [0] * n
    by_node: dict[int, set[int]] = {}
    by_root: dict[str, set[int]] = {}
    good: list[tuple[int, int, int, int]] = []  # heap of (transient bytes, final bytes, head, version)
    rest: list[tuple[bool, int, int, int]] = []  # heap of (reads no arena value, final bytes, node, version)
    dirty: set[int] = set()
    is_head = [False] * n

    def became_ready(k: int) -> None:
        dirty.add(k)
        c = k  # walk from a producer that only one node needs to that node: it may pull k in
        for _ in range(_MAX_CLUSTER):
            if not is_head[c]:
                is_head[c] = True
                dirty.add(c)
            if not pullable[c] or len(consumers[c]) != 1:
                break
            c = consumers[c][0]

    def evaluate(head: int) -> None:
        version[head] += 1
        members, stack = {head}, [head]
        ok = True
        while stack and ok:
            for p in producers[stack.pop()]:
                if done[p] or p in members:
                    continue
                by_node.setdefault(p, set()).add(head)
                if not pullable[p] or len(members) >= _MAX_CLUSTER:
                    ok = False
                    break
                members.add(p)
                stack.append(p)
        by_node.setdefault(head, set()).add(head)
        if not ok:
            return
        # Run the cluster on paper: bytes allocated above the current state, at the worst moment and at the end.
        cur = peak = 0
        seen: dict[str, int] = {}
        for m in sorted(members):
            dying = []
            for r in reads[m]:
                by_root.setdefault(r, set()).add(head)
                seen[r] = seen.get(r, 0) + 1
                if seen[r] == remaining[r] and r not in f.pinned:
                    dying.append(r)
            add = alloc[m]
            reuse = next((r for r in dying if r in overwritable[m]), None)
            if reuse is not None:  # likely written in place over an input that dies here
                add -= f.planned[reuse]
                dying.remove(reuse)
            cur += add
            peak = max(peak, cur)
            cur -= sum(f.planned[r] for r in dying) + unread[m]
        if (peak <= -cur) if strict else (cur <= 0):
            clusters[head] = sorted(members)
            heapq.heappush(good, (peak if strict else 0, cur, head, version[head]))
        elif missing[head] == 0:
            source = smallest and not reads[head]
            heapq.heappush(rest, (source, cur if smallest and not source else 0, head, version[head]))

    for k in range(n):
        if missing[k] == 0:
            became_ready(k)
    while len(order) < n:
        for h in sorted(dirty):
            if not done[h]:
                evaluate(h)
        dirty.clear()
        while good and (done[good[0][2]] or good[0][3] != version[good[0][2]]):
            heapq.heappop(good)
        while rest and (done[rest[0][2]] or rest[0][3] != version[rest[0][2]]):
            heapq.heappop(rest)
        if good:
            chosen = clusters[heapq.heappop(good)[2]]
        else:
            chosen = [heapq.heappop(rest)[2]]
        for m in chosen:
            done[m] = True
            order.append(m)
            dirty |= by_node.pop(m, set())
            for r in reads[m]:
                remaining[r] -= 1
                dirty |= by_root.pop(r, set())
            for c in consumers[m]:
                missing[c] -= 1
                if missing[c] == 0:
                    became_ready(c)
    assert len(order) == n, "the schedule lost nodes: the graph has a cycle"
    return order


# ---------------------------------------------------------------------------------------------------------------
# liveness, in place, arena


@dataclass
class _Layout:
    offsets: dict[str, int]
    in_place: list[tuple[str, str]]
    arena: int
    lower_bound: int


def _layout(f: _Facts, order: Sequence[int], alignment: int) -> _Layout:
    nodes = f.nodes
    pos = {k: t for t, k in enumerate(order)}
    end_of_graph = len(order)
    start = {r: pos[f.producer[r]] for r in f.planned}
    end = {
        r: end_of_graph if r in f.pinned else max((pos[k] for k in f.readers[r]), default=start[r])
        for r in f.planned
    }
    # In place: an output joins the buffer group of an input that dies at its node.
    group = {r: r for r in f.planned}
    in_place: list[tuple[str, str]] = []
    g = f.graph
    for t, k in enumerate(order):
        nd = nodes[k]
        kern = KERNELS.get(nd.op_type)
        outs = [o for o in nd.outputs if o]
        if kern is None or not kern.inplace or len(outs) != 1 or outs[0] not in f.planned:
            continue
        o = outs[0]
        for j in kern.inplace:
            x = nd.inputs[j] if j < len(nd.inputs) else ""
            r, xi = f.root.get(x), g.values.get(x)
            if (
                r not in f.planned
                or r in f.pinned
                or end[r] != t
                or f.planned[r] != f.planned[o]
                or xi is None
                or xi.dtype != g.values[o].dtype
                or not all(f.is_flat(i) for i in nd.inputs if i and f.root.get(i) == r)
            ):
                continue
            group[o] = group[r]
            in_place.append((o, x))
            break
    members: dict[str, list[str]] = {}
    for v, gr in group.items():
        members.setdefault(gr, []).append(v)
    spans = []  # (first step, last step, bytes, group)
    for gr, vs in members.items():
        spans.append((min(start[v] for v in vs), max(end[v] for v in vs), f.planned[gr], gr))
    # Lower bound: the most bytes live at once.
    live = np.zeros(end_of_graph + 2, np.int64)
    for s, e, b, _ in spans:
        live[s] += b
        live[e + 1] -= b
    lower = int(np.cumsum(live).max(initial=0))
    # Greedy by size, best fit among the gaps left by groups already placed whose lifetimes overlap.
    spans.sort(key=lambda s: (-s[2], s[0], s[3]))
    m = len(spans)
    p_start, p_end = np.empty(m, np.int64), np.empty(m, np.int64)
    p_off, p_size = np.empty(m, np.int64), np.empty(m, np.int64)
    where: dict[str, int] = {}
    arena = 0
    for k, (s, e, b, gr) in enumerate(spans):
        size = -(-b // alignment) * alignment
        hit = np.nonzero((p_start[:k] <= e) & (p_end[:k] >= s))[0]
        by_off = np.argsort(p_off[hit], kind="stable")
        o = p_off[hit][by_off]
        cursor = np.maximum.accumulate(np.concatenate(([0], o + p_size[hit][by_off])))  # end of all below
        gaps = o - cursor[:-1]
        fit = np.nonzero(gaps >= size)[0]
        best = int(cursor[fit[np.argmin(gaps[fit])]] if fit.size else cursor[-1])
        p_start[k], p_end[k], p_off[k], p_size[k] = s, e, best, size
        where[gr] = best
        arena = max(arena, best + size)
    offsets = {v: where[group[v]] for v in f.planned}
    return _Layout(offsets, in_place, arena, lower)


# ---------------------------------------------------------------------------------------------------------------
# the entry point


def plan_memory(graph: Graph, *, alignment: int = 64, reorder: bool = True) -> tuple[Graph, MemoryPlan]:
    """A static graph -> (the same graph in its planned schedule, the plan for that schedule). The schedule is
    the best of the greedy variants, or the given (topological) order when none needs a smaller arena;
    reorder=False keeps the given order. Run the returned graph with Interpreter(graph, plan=plan)."""
    if alignment < 1 or alignment & (alignment - 1):
        raise ModelError(f"alignment must be a power of two, got {alignment}")
    graph = graph.copy(nodes=toposort(graph.nodes, available=set(graph.inputs) | set(graph.initializers)))
    f = _Facts(graph)
    given = _layout(f, range(len(graph.nodes)), alignment)
    order: list[int] = list(range(len(graph.nodes)))
    lay = given
    if reorder:  # the greedy's variants each win on some graphs: keep the best
        for strict in (False, True):
            for smallest in (False, True):
                greedy = _schedule(f, strict=strict, smallest=smallest)
                lay_greedy = _layout(f, greedy, alignment)
                if lay_greedy.arena < lay.arena:
                    order, lay = greedy, lay_greedy
    program = graph.copy(nodes=[graph.nodes[k] for k in order])
    no_copy = set()
    for nd in program.nodes:
        kern = KERNELS.get(nd.op_type)
        if kern is not None and kern.writes_out and nd.outputs and nd.outputs[0]:
            no_copy.add(nd.outputs[0])
    plan = MemoryPlan(
        arena_size=lay.arena,
        alignment=alignment,
        offsets=lay.offsets,
        aliases=dict(f.base),
        in_place=lay.in_place,
        outside=list(f.outside),
        lower_bound=lay.lower_bound,
        no_plan=sum(f.planned.values()),
        unreordered_peak=given.arena,
        order_digest=schedule_digest(program),
        copies=[v for v in f.planned if v not in no_copy],
    )
    return program, plan


# ---------------------------------------------------------------------------------------------------------------
# checking a plan read from a file


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
    from .container import declared_nbytes

    limit = MAX_ARENA_BYTES if max_arena_bytes is None else max_arena_bytes
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
    if plan.order_digest and plan.order_digest != schedule_digest(graph):
        raise error(f"{where} was made for another node order than its program's")
    try:
        f = _Facts(graph)
    except Exception as e:  # a kernel's view condition that cannot read a node's attributes
        raise error(f"{where}: its program cannot be planned ({type(e).__name__}: {e})") from None
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
    need = sum(-(-b // align) * align for b in size.values())
    if arena > need:
        raise error(f"{where} declares an arena of {arena} bytes, more than all its values need ({need})")
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
    f: _Facts, g: Graph, node: Node, a: str, b: str, offsets: dict[str, int], size: dict[str, int]
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
