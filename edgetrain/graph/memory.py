"""The memory planner (numpy only): a static Graph -> (the Graph in a low-memory schedule, its MemoryPlan).

The plan covers the values nodes produce: activations, gradients, temporaries. Graph inputs and initializers
(data, parameters, optimizer state) belong to the session, and graph outputs (loss, model outputs, new parameters
and state) are allocated by their kernels on each run and handed to the caller, who owns them: neither lives in
the arena. What the kernel table says about views (registry: view=, view_if=) makes a value an alias of its
input's buffer; what it says about in-place safety (inplace=) lets an elementwise op write over an input that
dies there. Everything else gets an aligned offset in one byte arena, placed greedily by size over the liveness
intervals (TFLite's arena planner), after a schedule that runs each optimizer update as soon as its gradient is
ready so that gradients die early ("On-Device Training Under 256KB Memory", NeurIPS 2022). The greedy schedule has
a few variants, each best on some graphs; the plan keeps whichever needs the smallest arena, the given order
included. Kernels' own temporaries (im2col columns, say) are not planned. The plan's format and its check are in
edgetrain.core.plan: a plan read from a file is checked against its program before anything is allocated.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgetrain.core.errors import ModelError
from edgetrain.core.interpreter import Interpreter
from edgetrain.core.ir import Graph, Node, toposort
from edgetrain.core.kernels import KERNELS
from edgetrain.core.plan import MemoryPlan, PlanFacts, schedule_digest

# A node's producers are pulled into its cluster only this far; values up to TINY bytes (scalars, shapes) may be
# pulled even when others read them too.
_MAX_CLUSTER = 8
_TINY = 64


# ---------------------------------------------------------------------------------------------------------------
# the schedule


def _schedule(f: PlanFacts, *, strict: bool, smallest: bool) -> list[int]:
    """A topological order (node indices) that keeps the bytes live low. Greedy over clusters: a node, with the
    few producers that only it needs pulled in just before it. A cluster that frees at least what it allocates runs
    at once, the most freeing first: an optimizer update frees its gradient, so it runs as soon as the gradient is
    ready, and the products only it needs (weight decay times the parameter, momentum times the state) are computed
    just then. strict asks more of such a cluster: that it never holds more extra bytes than it finally frees; the
    smallest transient then goes first (so each comes on as much freed memory as possible). When no cluster
    qualifies, the ready node that comes first in the given order runs, or (smallest) the one that adds fewest
    bytes, nodes that read nothing in the arena (the first layer, products of parameters) last. Ties go to the
    given order."""
    return _Greedy(f, strict=strict, smallest=smallest).run()


class _Greedy:
    """One greedy schedule under way (see _schedule): what each node reads, makes and frees in the arena, the
    nodes done, and two heaps of candidates: clusters that free what they allocate (`good`), and single ready
    nodes (`rest`). A candidate is evaluated again only when something it depends on changes: a node of its
    cluster (or the one blocking it) runs, or a value its cluster reads loses a reader."""

    def __init__(self, f: PlanFacts, *, strict: bool, smallest: bool):
        self.f, self.strict, self.smallest = f, strict, smallest
        nodes = f.nodes
        n = self.n = len(nodes)
        self.producers = [sorted({f.producer[i] for i in nd.inputs if i in f.producer}) for nd in nodes]
        self.consumers: list[list[int]] = [[] for _ in range(n)]
        for k, ps in enumerate(self.producers):
            for p in ps:
                self.consumers[p].append(k)
        self.reads = [
            [r for r in dict.fromkeys(f.root.get(i) for i in nd.inputs if i) if r in f.planned]
            for nd in nodes
        ]
        made = [[o for o in nd.outputs if o in f.planned] for nd in nodes]
        self.alloc = [sum(f.planned[o] for o in made[k]) for k in range(n)]
        self.pullable = [len(self.consumers[k]) == 1 or self.alloc[k] <= _TINY for k in range(n)]
        # bytes of outputs nobody reads (freed at once), and the inputs an in-place kernel may write over
        self.unread = [
            sum(f.planned[o] for o in made[k] if not f.readers[o] and o not in f.pinned) for k in range(n)
        ]
        self.overwritable = [self._overwritable(nd, len(made[k])) for k, nd in enumerate(nodes)]
        self.missing = [len(ps) for ps in self.producers]
        self.remaining = {r: len(ks) for r, ks in f.readers.items()}
        self.done = [False] * n
        self.order: list[int] = []
        self.clusters: dict[int, list[int]] = {}
        self.version = [0] * n
        self.by_node: dict[int, set[int]] = {}  # node -> the heads whose cluster it joins or blocks
        self.by_root: dict[str, set[int]] = {}  # value -> the heads whose cluster reads it
        self.good: list[
            tuple[int, int, int, int]
        ] = []  # heap of (transient bytes, final bytes, head, version)
        self.rest: list[
            tuple[bool, int, int, int]
        ] = []  # heap of (reads no arena value, final bytes, node, version)
        self.dirty: set[int] = set()
        self.is_head = [False] * n

    def _overwritable(self, nd: Node, n_made: int) -> set[str]:
        f = self.f
        kern = KERNELS.get(nd.op_type)
        ins = kern.inplace if kern is not None and n_made == 1 else ()
        return {
            f.root[nd.inputs[j]] for j in ins if j < len(nd.inputs) and f.root.get(nd.inputs[j]) in f.planned
        }

    def run(self) -> list[int]:
        for k in range(self.n):
            if self.missing[k] == 0:
                self.became_ready(k)
        good, rest, done, version = self.good, self.rest, self.done, self.version
        while len(self.order) < self.n:
            for h in sorted(self.dirty):
                if not done[h]:
                    self.evaluate(h)
            self.dirty.clear()
            while good and (done[good[0][2]] or good[0][3] != version[good[0][2]]):
                heapq.heappop(good)
            while rest and (done[rest[0][2]] or rest[0][3] != version[rest[0][2]]):
                heapq.heappop(rest)
            if good:
                chosen = self.clusters[heapq.heappop(good)[2]]
            else:
                chosen = [heapq.heappop(rest)[2]]
            for m in chosen:
                self.runs(m)
        assert len(self.order) == self.n, "the schedule lost nodes: the graph has a cycle"
        return self.order

    def runs(self, m: int) -> None:
        """Node m runs: its readers' candidates change, and so do the nodes it makes ready."""
        self.done[m] = True
        self.order.append(m)
        self.dirty |= self.by_node.pop(m, set())
        for r in self.reads[m]:
            self.remaining[r] -= 1
            self.dirty |= self.by_root.pop(r, set())
        for c in self.consumers[m]:
            self.missing[c] -= 1
            if self.missing[c] == 0:
                self.became_ready(c)

    def became_ready(self, k: int) -> None:
        self.dirty.add(k)
        c = k  # walk from a producer that only one node needs to that node: it may pull k in
        for _ in range(_MAX_CLUSTER):
            if not self.is_head[c]:
                self.is_head[c] = True
                self.dirty.add(c)
            if not self.pullable[c] or len(self.consumers[c]) != 1:
                break
            c = self.consumers[c][0]

    def evaluate(self, head: int) -> None:
        """head's cluster onto the heap it qualifies for, if any (its old entries become stale)."""
        self.version[head] += 1
        members = self._cluster(head)
        if members is None:
            return
        peak, cur = self._on_paper(head, members)
        if (peak <= -cur) if self.strict else (cur <= 0):
            self.clusters[head] = sorted(members)
            heapq.heappush(self.good, (peak if self.strict else 0, cur, head, self.version[head]))
        elif self.missing[head] == 0:
            source = self.smallest and not self.reads[head]
            entry = (source, cur if self.smallest and not source else 0, head, self.version[head])
            heapq.heappush(self.rest, entry)

    def _cluster(self, head: int) -> set[int] | None:
        """head and the producers not done yet that only it needs (at most _MAX_CLUSTER), or None when one of its
        producers cannot be pulled in."""
        members, stack = {head}, [head]
        ok = True
        while stack and ok:
            for p in self.producers[stack.pop()]:
                if self.done[p] or p in members:
                    continue
                self.by_node.setdefault(p, set()).add(head)
                if not self.pullable[p] or len(members) >= _MAX_CLUSTER:
                    ok = False
                    break
                members.add(p)
                stack.append(p)
        self.by_node.setdefault(head, set()).add(head)
        return members if ok else None

    def _on_paper(self, head: int, members: set[int]) -> tuple[int, int]:
        """The cluster run on paper: bytes allocated above the current state, at the worst moment and at the end."""
        f = self.f
        cur = peak = 0
        seen: dict[str, int] = {}
        for m in sorted(members):
            dying = []
            for r in self.reads[m]:
                self.by_root.setdefault(r, set()).add(head)
                seen[r] = seen.get(r, 0) + 1
                if seen[r] == self.remaining[r] and r not in f.pinned:
                    dying.append(r)
            add = self.alloc[m]
            reuse = next((r for r in dying if r in self.overwritable[m]), None)
            if reuse is not None:  # likely written in place over an input that dies here
                add -= f.planned[reuse]
                dying.remove(reuse)
            cur += add
            peak = max(peak, cur)
            cur -= sum(f.planned[r] for r in dying) + self.unread[m]
        return peak, cur


# ---------------------------------------------------------------------------------------------------------------
# liveness, in place, arena


@dataclass
class _Layout:
    offsets: dict[str, int]
    in_place: list[tuple[str, str]]
    arena: int
    lower_bound: int


def _layout(f: PlanFacts, order: Sequence[int], alignment: int) -> _Layout:
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
    f = PlanFacts(graph)
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


def planned_interpreter(graph: Graph, **kwargs) -> Interpreter:
    """An interpreter for a static graph whose values share one arena by their lifetimes (the graph's own order,
    planned; cheap enough to do on the device), instead of one buffer per value: what an evaluation, an inference
    or the feature cache's two halves hold is then what their plan says, not every activation of the graph at
    once. kwargs go to Interpreter (bind=, lean=)."""
    program, plan = plan_memory(graph, reorder=False)
    return Interpreter(program, plan=plan, **kwargs)
