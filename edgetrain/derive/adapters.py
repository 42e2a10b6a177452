"""Adapter modules (numpy only): what `convert(..., adapters=...)` inserts into the imported graph, beside ILoss and
IOptimizer. LoRA adds a low-rank update to chosen MatMul/Gemm layers:

    y = x W (+ b)   becomes   y = x W (+ b) + (alpha / rank) * (x A) B

with A [in, rank] initialized as PEFT does (Kaiming-uniform, a = sqrt(5): uniform in +-1/sqrt(in)) and B [rank, out]
zero, so the adapted model starts equal to the base model. The base weights are frozen; only the adapters (and what
`trainable=` adds, a head say) train, and the autodiff takes no gradient it does not need. A and B are stored in the
layout the graph multiplies them in (PEFT's lora_A.weight is A transposed, its lora_B.weight B transposed).

Each adapted layer is recorded (edgetrain.graph.adapters.LoraModule) so that the runtime can export the model
three ways: merged (W + (alpha / rank) A B folded into the weight: the original graph, a drop-in replacement),
for onnxruntime's multi-LoRA serving (A and B as graph inputs with default initializers), and the adapters alone.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgetrain.core.errors import ConfigError, LimitError, UnsupportedError
from edgetrain.core.ir import Graph, GraphBuilder, Node, TensorInfo
from edgetrain.graph.adapters import LoraModule
from edgetrain.graph.bounds import size_text
from edgetrain.graph.passes import MAX_PARAMETER_BYTES
from edgetrain.graph.sections import AdaptersSection
from loaders.values import count, number, shown

from .params import PARAMETER, Role, Roles, _matches, select_trainable
from .rewrite import Conversion, Rewrite
from .ties import _generated

F32 = np.float32
LINEAR = ("MatMul", "Gemm")
# A rank R adapts only layers of at least R inputs and R outputs (above that A B gains no rank), whose A and B then
# hold 8 R^2 bytes or more: the largest rank whose adapters of one layer fit the bound on a model's parameters.
MAX_RANK = math.isqrt(MAX_PARAMETER_BYTES // 8)
MAX_SEED = 2**64 - 1  # what a header's JSON holds as it is; numpy's generators take any whole number from 0
RANK_FIX = "ranks of 4 to 64 are usual; a rank above a layer's inputs or outputs adds nothing to it"


def lora_rank(value: Any) -> int:
    """A LoRA rank (LoRA(rank=), --lora-rank): a whole number from 1 to MAX_RANK; ConfigError naming it otherwise."""
    return count(value, "LoRA rank (--lora-rank)", lo=1, hi=MAX_RANK, fix=RANK_FIX)


class IAdapter(Rewrite, ABC):
    """An adapter insertion module: adds trainable adapter parameters to the imported graph, before the loss, the
    gradients and the optimizer are. It is a rewrite (edgetrain.derive.rewrite): it adapts its layers when what
    trains is chosen, and then the adapters train, with what `trainable` adds; its section records the adapted
    layers for the export (merged or served)."""

    KEY = "adapters"

    def choose(self, c: Conversion) -> None:
        c.graph, c.roles, modules, inserted = self.insert(c.graph, c.roles)
        c.notes.extend(inserted)
        chosen = [p for m in modules for p in (m.A, m.B)]
        if c.trainable is not None:
            chosen += [p for p in select_trainable(c.roles, c.trainable) if p not in chosen]
        c.chosen = chosen
        c.found[self.KEY] = modules

    def section(self, c: Conversion, art: Any) -> AdaptersSection:
        modules = [m for m in c.found[self.KEY] if m.A in art.parameters]
        return AdaptersSection(self.config(), modules)

    @abstractmethod
    def insert(self, graph: Graph, roles: Roles) -> tuple[Graph, Roles, list[LoraModule], list[str]]:
        """(the graph with adapters, the roles with theirs added as parameters, the adapted layers, notes)."""

    @abstractmethod
    def config(self) -> dict[str, Any]:
        """JSON-able settings, stored in the artifact."""


class LoRA(IAdapter):
    """Low-rank adapters (Hu et al. 2021, as PEFT inserts them). rank and alpha as in PEFT (scale alpha / rank);
    targets: glob patterns over parameter names, node names and recovered module paths ('*q_proj*', '*attn*'),
    None for every MatMul/Gemm with a constant 2-D weight; seed: A's initialization."""

    def __init__(
        self,
        rank: int = 8,
        alpha: float = 16.0,
        targets: str | Sequence[str] | None = None,
        dropout: float = 0.0,
        seed: int = 0,
    ):
        self.rank = lora_rank(rank)
        self.alpha = number(
            alpha,
            "LoRA alpha (--lora-alpha)",
            positive=True,
            fix="alpha / rank scales the update: 2 x rank is usual",
        )
        number(
            self.alpha / self.rank,
            f"LoRA's scale alpha / rank ({self.alpha:g} / {self.rank})",
            fix="it multiplies every adapter's output in float32: give an alpha nearer the rank",
        )
        if number(dropout, "LoRA dropout", lo=0.0, hi=1.0, float32=False) != 0.0:
            raise ConfigError(
                f"LoRA dropout={dropout} is not supported: edgetrain's steps are deterministic; use dropout=0.0"
            )
        self.seed = count(
            seed, "LoRA seed", hi=MAX_SEED, fix="it seeds A's initialization (numpy's generators)"
        )
        self.targets = _targets(targets)

    def config(self) -> dict[str, Any]:
        return {
            "type": "LoRA",
            "rank": self.rank,
            "alpha": self.alpha,
            "targets": self.targets,
            "seed": self.seed,
        }

    def insert(self, graph: Graph, roles: Roles) -> tuple[Graph, Roles, list[LoraModule], list[str]]:
        sites = _sites(graph, roles)
        chosen = [s for s in sites if self._wanted(roles.entries[s[0]])]
        if self.targets is not None:
            for pat in self.targets:
                if not any(_matches(roles.entries[site[0]], pat) for site in sites):
                    raise UnsupportedError(_no_target(pat, sites, roles))
        if not chosen:
            raise UnsupportedError("LoRA found no MatMul or Gemm with a constant 2-D weight to adapt")
        self._fits(chosen, graph)
        g = graph.copy()
        entries = dict(roles.entries)
        rng = np.random.default_rng(self.seed)
        modules = []  # inserted from the last node back, so that the indices of those before stay valid
        readers = _readers(graph)
        fresh = GraphBuilder(g).fresh  # names not taken yet, the ones it gave out included
        for weight, k, fan_in, fan_out, transposed in sorted(chosen, key=lambda site: -site[1]):
            shared = _shared(graph.nodes[k], weight, readers)
            stem = _layer_name(weight, roles.entries[weight], g.nodes[k].name, graph.scopes, shared)
            node = graph.nodes[k]
            m = _insert_one(g, node, (weight, stem), (fan_in, fan_out, transposed), (self, rng, fresh))
            if shared:  # the merged export gives this layer its own merged weight: the others read W as it is
                m.own = fresh(f"{stem}.weight")
            modules.append(m)
            for name, what in ((m.A, "A"), (m.B, "B")):
                arr = g.initializers[name]
                entries[name] = Role(
                    name,
                    PARAMETER,
                    f"LoRA {what} of {node.op_type}",
                    [node.name],
                    tuple(arr.shape),
                    "float32",
                    scopes=list(roles.entries[weight].scopes),
                )
        modules.reverse()
        n = sum(g.initializers[m.A].size + g.initializers[m.B].size for m in modules)
        notes = [
            f"LoRA (rank {self.rank}, alpha {self.alpha:g}) on {len(modules)} layer(s): {n:,} adapter values train, "
            f"the base stays frozen; e.g. {', '.join(repr(_stem(m.A, '.lora_A')) for m in modules[:3])}"
            + (" ..." if len(modules) > 3 else "")
        ]
        return g, Roles(entries), modules, notes

    def _wanted(self, role: Role) -> bool:
        return self.targets is None or any(_matches(role, p) for p in self.targets)

    def _fits(self, chosen: list[tuple[str, int, int, int, bool]], graph: Graph) -> None:
        """Refuses, before anything is allocated, a rank above a chosen layer's inputs or outputs (A B would have
        the rank of the smaller alone: the rest trains nothing), and adapters that together would hold more than
        MAX_PARAMETER_BYTES."""
        for weight, k, fan_in, fan_out, _ in chosen:
            if self.rank > min(fan_in, fan_out):
                raise ConfigError(
                    f"LoRA rank (--lora-rank) {self.rank} is larger than layer '{weight}' (node "
                    f"'{graph.nodes[k].name}', {fan_in} inputs, {fan_out} outputs) can use: its update A B has rank "
                    f"{min(fan_in, fan_out)} at most; give a rank of {min(fan_in, fan_out)} or less, or leave the "
                    "layer out of the targets (--lora-targets)"
                )
        needed = sum(self.rank * (fan_in + fan_out) * F32().itemsize for _, _, fan_in, fan_out, _ in chosen)
        if needed > MAX_PARAMETER_BYTES:
            raise LimitError(
                f"LoRA rank (--lora-rank) {self.rank} on {len(chosen)} layer(s) makes adapters of "
                f"{size_text(needed)}, more than the {size_text(MAX_PARAMETER_BYTES)} edgetrain allows for a "
                "model's parameters (edgetrain.graph.passes.MAX_PARAMETER_BYTES); give a smaller rank or fewer "
                "targets (--lora-targets)",
                limit=MAX_PARAMETER_BYTES,
                needed=needed,
            )


def _targets(targets: Any) -> list[str] | None:
    """LoRA's targets as a list of glob patterns (None: every layer it can adapt): a string, or a list or tuple of
    non-empty strings, kept in their order (they are stored in the artifact)."""
    fix = "give a pattern such as '*attn*', a list of them, or None for every MatMul/Gemm layer"
    if targets is None:
        return None
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, Sequence) or isinstance(targets, (bytes, bytearray)):
        raise ConfigError(
            f"LoRA targets (--lora-targets) {shown(targets)} are not a pattern or a list of them; {fix}"
        )
    out = list(targets)
    bad = [t for t in out if not isinstance(t, str) or not t]
    if bad or not out:
        what = f"hold {shown(bad[0])}" if bad else "are an empty list"
        raise ConfigError(f"LoRA targets (--lora-targets) {what}: each target is a non-empty pattern; {fix}")
    return out


def _sites(graph: Graph, roles: Roles) -> list[tuple[str, int, int, int, bool]]:
    """(weight, node index, in features, out features) of every MatMul/Gemm reading a constant 2-D weight as its
    right operand, directly or through a Transpose (a Gemm's transB too), with the data as its left operand; and
    whether the [in, out] operand is the weight transposed."""
    producers = graph.producers()
    out = []
    for k, n in enumerate(graph.nodes):
        if n.op_type not in LINEAR or len(n.inputs) < 2 or n.attrs.get("transA", 0):
            continue
        w, transposed = n.inputs[1], bool(n.attrs.get("transB", 0))
        p = producers.get(w)
        if p is not None and p.op_type == "Transpose" and list(p.attrs.get("perm", [1, 0])) == [1, 0]:
            w, transposed = p.inputs[0], not transposed
        arr = graph.initializers.get(w)
        r = roles.entries.get(w)
        if arr is None or arr.ndim != 2 or arr.dtype != F32 or r is None or r.kind != PARAMETER:
            continue
        if n.inputs[0] in graph.initializers:
            continue
        fan_in, fan_out = (arr.shape[1], arr.shape[0]) if transposed else arr.shape
        out.append((w, k, int(fan_in), int(fan_out), transposed))
    return out


def _stem(name: str, suffix: str = ".weight") -> str:
    return name[: -len(suffix)] if name.endswith(suffix) else name


def _readers(graph: Graph) -> dict[str, int]:
    """How many nodes read each value (graph outputs count as readers)."""
    count: dict[str, int] = {}
    for name in [i for n in graph.nodes for i in set(n.inputs)] + list(graph.outputs):
        count[name] = count.get(name, 0) + 1
    return count


def _shared(node: Node, weight: str, readers: dict[str, int]) -> bool:
    """Whether something else than this layer reads its weight (or the Transpose it reads the weight through): a tied
    weight, GPT-2's head that is its token table. Folding an adapter into it would change those readers too."""
    return readers.get(weight, 0) > 1 or (node.inputs[1] != weight and readers.get(node.inputs[1], 0) > 1)


def _layer_name(weight: str, role: Role, node: str, scopes: dict[str, str], shared: bool = False) -> str:
    """What a layer's adapters are named after ('<layer>.lora_A'): its weight's name minus '.weight' (its author's,
    from a parameter manifest, first); where the exporter made that name up (onnx::MatMul_336, val_58), or the
    weight is another layer's too (a tied head reads the token table), the module path recovered from the node's
    recorded scope (dynamo) or name (TorchScript); else the weight's name as it is."""
    names = [_stem(n) for n in (role.author, weight) if n and not _generated(n)]
    paths = [p for p in (_module_path(scopes.get(node, "")), _module_path(node)) if p]
    found = paths + names if shared else names + paths
    return found[0] if found else _stem(weight)


def _module_path(scope: str) -> str:
    """The module path of a node from its scope, '' when it has none. TorchScript names a node by the attribute names
    down to it, a Sequential's or ModuleList's child by its name in the parent ('/bert/encoder/layer.0/attention/self/
    query/MatMul', '/body/seq/seq.1/seq.1.0/Gemm'); dynamo records the full path of every module on the way
    ('/body/body.seq/body.seq.1/linear'). Either way the last part is the op, and a part that extends the one
    before it replaces it."""
    if not scope.startswith("/"):
        return ""
    parts: list[str] = []
    for part in scope.split("/")[1:-1]:
        if not part:
            continue
        if parts and part.startswith(parts[-1] + "."):
            parts[-1] = part
        else:
            parts.append(part)
    path = ".".join(parts)
    return path if path and all(p.replace("_", "").replace(".", "").isalnum() for p in parts) else ""


def _insert_one(
    g: Graph, node: Node, names: tuple[str, str], site: tuple[int, int, bool], how: tuple
) -> LoraModule:
    """y = op(x, W) -> y_base = op(x, W); y = y_base + s (x A) B, in place on g. names: (W, the layer's name);
    how: (the LoRA module, the generator that draws A, the fresh-name function of g's builder)."""
    lora, rng, fresh = how
    fan_in, fan_out, transposed = site
    weight, stem = names
    a, b = fresh(f"{stem}.lora_A"), fresh(f"{stem}.lora_B")
    bound = 1.0 / math.sqrt(fan_in)  # kaiming_uniform_(a=sqrt(5)) on PEFT's [rank, in] lora_A
    g.initializers[a] = np.ascontiguousarray(rng.uniform(-bound, bound, (lora.rank, fan_in)).astype(F32).T)
    g.initializers[b] = np.zeros((lora.rank, fan_out), F32)
    y = node.outputs[0]
    info = g.values.get(y)
    names = {k: fresh(f"{y}_lora_{k}") for k in ("base", "xa", "xab", "scaled")}
    s = fresh(f"{stem}.lora_scale")
    scale = lora.alpha / lora.rank
    g.initializers[s] = np.asarray(scale, F32)
    for v, shape in ((a, (fan_in, lora.rank)), (b, (lora.rank, fan_out)), (s, ())):
        g.values[v] = TensorInfo(np.dtype(F32), shape)
    x = node.inputs[0]
    xinfo = g.values.get(x)
    lead = tuple(xinfo.shape[:-1]) if xinfo is not None and xinfo.shape else None
    for key, last in (("xa", lora.rank), ("xab", fan_out), ("scaled", fan_out)):
        g.values[names[key]] = TensorInfo(np.dtype(F32), None if lead is None else lead + (last,))
    g.values[names["base"]] = info if info is not None else TensorInfo(np.dtype(F32), None)
    at = next(k for k, n in enumerate(g.nodes) if n is node)
    prefix = f"{node.name or y}/lora"
    new = [
        Node("MatMul", (x, a), (names["xa"],), {}, f"{prefix}_A"),
        Node("MatMul", (names["xa"], b), (names["xab"],), {}, f"{prefix}_B"),
        Node("Mul", (names["xab"], s), (names["scaled"],), {}, f"{prefix}_scale"),
        Node("Add", (names["base"], names["scaled"]), (y,), {}, f"{prefix}_add"),
    ]
    g.nodes[at : at + 1] = [node.replace(outputs=(names["base"], *node.outputs[1:]))] + new
    merge = "transposed" if transposed else "same"
    return LoraModule(weight, node.name, a, b, scale, y, names["base"], [n.name for n in new], merge)


def _no_target(pat: str, sites, roles: Roles) -> str:
    shown = ", ".join(repr(w) for w, *_ in sites[:6]) + (" ..." if len(sites) > 6 else "")
    return (
        f"LoRA target '{pat}' matches no MatMul/Gemm weight (by parameter name, node name or module path); the "
        f"layers LoRA can adapt: {shown}"
    )
