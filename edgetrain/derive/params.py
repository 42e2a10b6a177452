"""Parameters by role (numpy only): an imported graph, before any folding -> which initializers are parameters
(weights, biases, scales, embedding tables), which are statistics or shape values, which are other constants that
train only when named, each with the nodes that read it; and the trainable set that `trainable=` selects.

Roles come from the op records (edgetrain.core.ops), read through ops that only rearrange a tensor (Transpose,
Reshape, Identity, Cast, ...), so an exporter's pre-transposed or tied weight is still the initializer under it.
Two roles depend on the neighbourhood: a constant added to the output of a linear op that has no bias of its own
is that op's bias (torch's Linear exported as MatMul + Add), and a constant multiplying a normalized value is a
scale (a LayerNorm or RMSNorm written out in elementwise ops), whose following Add is then a bias.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from edgetrain.core.errors import UnsupportedError
from edgetrain.core.ir import Graph, Node
from edgetrain.core.ops import record

PARAMETER, CONSTANT, FIXED = "parameter", "constant", "fixed"


@dataclass
class Role:
    """What one initializer (or constant-computed value) is to the model."""

    name: str
    kind: str  # PARAMETER (trains by default), CONSTANT (trains only when named), FIXED (never trains)
    role: str  # e.g. "weight of Conv", "bias of MatMul", "running mean of BatchNormalization", "constant"
    nodes: list[str] = field(default_factory=list)  # the nodes that read it (through rearranging ops)
    shape: tuple[int, ...] | None = None
    dtype: str = ""
    # names of Identity copies: one tensor under several names
    aliases: list[str] = field(default_factory=list)
    # module paths of the reading nodes, where the exporter recorded them (else "")
    scopes: list[str] = field(default_factory=list)
    author: str = ""  # the name its author gave it (a parameter manifest's), when the model came with one


@dataclass
class Roles:
    """Every initializer's role, in the graph's initializer order (values computed from constants alone that fill
    a weight role, like ConstantOfShape weight fills, come after)."""

    entries: dict[str, Role]

    def of_kind(self, kind: str) -> list[str]:
        return [n for n, r in self.entries.items() if r.kind == kind]

    @property
    def parameters(self) -> list[str]:
        return self.of_kind(PARAMETER)

    @property
    def constants(self) -> list[str]:
        return self.of_kind(CONSTANT)

    def finalize(self, graph: Graph) -> Roles:
        """The roles of the values that are float initializers of `graph` (the graph after folding), with shapes:
        a parameter that folded into an integer tensor, or that was folded away, drops out."""
        out = {}
        for name, r in self.entries.items():
            arr = graph.initializers.get(name)
            if arr is None:
                continue
            kind = r.kind if arr.dtype.kind == "f" or r.kind == FIXED else FIXED
            shape = tuple(int(d) for d in arr.shape)
            out[name] = Role(
                name,
                kind,
                r.role,
                list(r.nodes),
                shape,
                arr.dtype.name,
                list(r.aliases),
                list(r.scopes),
                r.author,
            )
        return Roles(out)


class _Walker:
    """Producers and readers of a graph, looked at through the ops that only rearrange a tensor."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.producer = graph.producers()
        self.readers = graph.consumers()
        self.computable = set(graph.initializers)  # values computed from initializers alone
        for n in graph.nodes:
            if not record(n.op_type).random and all(not i or i in self.computable for i in n.inputs):
                self.computable.update(o for o in n.outputs if o)

    def source(self, value: str) -> str:
        """The value under `value` through rearranging ops: the initializer a weight is read from."""
        seen = set()
        while value not in self.graph.initializers and value not in seen:
            seen.add(value)
            p = self.producer.get(value)
            if p is None or not record(p.op_type).rearranges or not p.inputs or not p.inputs[0]:
                break
            value = p.inputs[0]
        return value

    def broadcast_source(self, value: str) -> str:
        """The value under `value` through rearranging ops and broadcasts (Expand, Tile): a class token expanded to
        the batch is still the initializer under it."""
        seen = set()
        while value not in self.graph.initializers and value not in seen:
            seen.add(value)
            p = self.producer.get(value)
            if p is None or not p.inputs or not p.inputs[0]:
                break
            if not (record(p.op_type).rearranges or p.op_type in ("Expand", "Tile")):
                break
            value = p.inputs[0]
        return value

    def made_by(self, value: str) -> Node | None:
        """The node that computes `value`, looking through rearranging ops (None for inputs and initializers)."""
        p = self.producer.get(value)
        while p is not None and record(p.op_type).rearranges and p.inputs and p.inputs[0]:
            p = self.producer.get(p.inputs[0])
        return p

    def users(self, value: str) -> list[Node]:
        """The nodes that read `value`, looking through rearranging ops (Identity, Transpose, ...)."""
        out, todo, seen = [], [value], set()
        while todo:
            v = todo.pop(0)
            for n in self.readers.get(v, []):
                if n.name in seen:
                    continue
                seen.add(n.name)
                if record(n.op_type).rearranges and n.inputs[0] == v:
                    todo.extend(o for o in n.outputs if o)
                else:
                    out.append(n)
        return out

    def aliases(self, value: str) -> list[str]:
        """Other names an exporter gave the same tensor: Identity copies of it (the TorchScript exporter merges
        initializers whose values are identical and reads the merged one through Identity nodes)."""
        return [o for n in self.readers.get(value, []) if n.op_type == "Identity" for o in n.outputs if o]

    def is_float_constant(self, value: str) -> bool:
        if value not in self.computable:
            return False
        arr = self.graph.initializers.get(value)
        info = self.graph.values.get(value)
        dtype = arr.dtype if arr is not None else (info.dtype if info is not None else None)
        return dtype is None or np.dtype(dtype).kind == "f"  # unknown yet: decided after folding (finalize)

    def normalized(self, value: str) -> bool:
        """Whether `value` is the output of a normalization: a normalization op, x / sqrt(...) (a LayerNorm
        written out) or x * 1/sqrt(...) (an RMSNorm written out)."""
        p = self.made_by(value)
        if p is None:
            return False
        if record(p.op_type).normalizes:
            return True
        if p.op_type == "Div" and len(p.inputs) > 1:
            return self._root(p.inputs[1])
        if p.op_type == "Mul":
            for i in p.inputs:
                q = self.made_by(i)
                if q is not None and q.op_type == "Reciprocal" and self._root(q.inputs[0]):
                    return True
                if q is not None and q.op_type == "Div" and len(q.inputs) > 1 and self._root(q.inputs[1]):
                    return q.inputs[0] in self.computable
        return False

    def _root(self, value: str) -> bool:
        q = self.made_by(value)
        if q is not None and q.op_type == "Add":  # sqrt(var) + eps
            q = next((self.made_by(i) for i in q.inputs if self.made_by(i) is not None), None)
        return q is not None and q.op_type == "Sqrt"


def find_roles(graph: Graph) -> Roles:
    """The role of every initializer of an imported graph (canonical form, nothing folded yet)."""
    w = _Walker(graph)
    entries: dict[str, Role] = {
        name: Role(
            name, CONSTANT if arr.dtype.kind == "f" else FIXED, "constant" if arr.dtype.kind == "f" else ""
        )
        for name, arr in graph.initializers.items()
    }

    def claim(value: str, kind: str, role: str, node: Node) -> None:
        # FIXED is claimed first and wins; a value computed from constants alone (a ConstantOfShape weight fill)
        # becomes a parameter under its own name, and an initializer when folded
        src = w.source(value)
        r = entries.get(src)
        if r is None:
            if kind != PARAMETER or src not in w.computable:
                return
            r = entries[src] = Role(src, kind, role)
        elif r.kind == CONSTANT or (r.kind == FIXED and kind == FIXED and not r.role):
            r.kind, r.role = kind, role
        if node.name not in r.nodes:
            r.nodes.append(node.name)

    for n in graph.nodes:  # statistics and shape values first: they never train, whatever else reads them
        rec = record(n.op_type)
        fixed = {**{k: "shape input" for k in rec.shape_inputs}, **rec.statistics}
        for pos, what in fixed.items():
            if pos < len(n.inputs) and n.inputs[pos]:
                claim(n.inputs[pos], FIXED, f"{what} of {n.op_type}", n)
    for n in graph.nodes:
        for pos, what in record(n.op_type).weights.items():
            if pos < len(n.inputs) and n.inputs[pos] and w.is_float_constant(w.source(n.inputs[pos])):
                claim(n.inputs[pos], PARAMETER, f"{what} of {n.op_type}", n)
    for n in graph.nodes:  # roles by neighbourhood: scales after normalizations, biases after linear maps
        if n.op_type not in ("Mul", "Add") or len(n.inputs) != 2:
            continue
        for mine, other in (n.inputs, n.inputs[::-1]):
            src = w.source(mine)
            if not w.is_float_constant(src) or other in w.computable:
                continue
            if n.op_type == "Mul" and w.normalized(other):
                claim(mine, PARAMETER, "scale after a normalization", n)
            elif n.op_type == "Add" and _unbiased_linear(w, other, entries):
                claim(mine, PARAMETER, f"bias of {w.made_by(other).op_type}", n)
    _exporter_fills(graph, w, entries)
    _learned_constants(graph, w, entries, claim)
    for name, r in entries.items():  # every reader, for `check` and for selecting by node name
        for reader in w.users(name):
            if reader.name not in r.nodes:
                r.nodes.append(reader.name)
        r.aliases = w.aliases(name)
        r.scopes = [graph.scopes.get(n, "") for n in r.nodes]
    return Roles(entries)


# ---- learned constants: tensors outside a weight role that the model's author trains ----------------------------
_COMBINE = ("Add", "Sub", "Mul", "Div")  # a constant combined with an activation by these is a learned one
_PREPROCESS = (
    "Sub",
    "Div",
    "Mul",
    "Add",
    "Cast",
    "Transpose",
    "Reshape",
    "Unsqueeze",
    "Squeeze",
    "Identity",
    "Flatten",
)
MASK_MAGNITUDE = 1e4  # a value this large (or not finite) in a constant makes it a mask, not a learned tensor


def _learned_constants(graph: Graph, w: _Walker, entries: dict[str, Role], claim) -> None:
    """A float constant combined with an internal activation (Add, Sub, Mul, Div), joined to one (Concat, also
    after an Expand: a class token), is a tensor the model's author trains: a position table, a class token, a layer
    scale, a written-out norm's weight and bias. Not a literal number (one value), a mask (values beyond
    MASK_MAGNITUDE or not finite, or a 0/1 pattern), a table of sines and cosines (positions, as buffers hold them),
    nor what preprocesses a graph input (mean and std): those stay constants, and their role says which."""
    data = _data_values(graph, w)
    raw = _preprocessed(graph, w, entries)
    found: dict[str, tuple[str, Node]] = {}  # candidate -> (how it meets an activation, the node)
    for n in graph.nodes:
        if n.op_type in _COMBINE and len(n.inputs) == 2:
            operands = [(n.inputs[0], [n.inputs[1]]), (n.inputs[1], [n.inputs[0]])]
        elif n.op_type == "Concat":
            operands = [(i, [o for o in n.inputs if o != i]) for i in n.inputs if i]
        else:
            continue
        for mine, others in operands:
            src = w.broadcast_source(mine)
            r = entries.get(src)
            acts = [o for o in others if o in data]
            if r is None or r.kind != CONSTANT or src not in graph.initializers or not acts:
                continue
            if all(o in raw for o in acts):  # (x - mean) / std on the input: preprocessing, not the model
                r.role = r.role if r.role != "constant" else "preprocessing of a graph input"
                continue
            found.setdefault(src, (f"learned constant ({n.op_type} with an activation)", n))
    tables = _position_tables({k: graph.initializers[k] for k in found})
    for src, (role, node) in found.items():
        why = tables.get(src) or _not_learned(graph.initializers[src])
        if why:
            entries[src].role = why
        else:
            claim(src, PARAMETER, role, node)


def _not_learned(arr: np.ndarray) -> str:
    """Why a constant that meets an activation is not a learned tensor ("" when nothing says so)."""
    if arr.size <= 1:
        return "a literal number"
    if arr.dtype.kind != "f":
        return ""
    if not np.all(np.isfinite(arr)) or float(np.abs(arr).max()) >= MASK_MAGNITUDE:
        return "a mask (values not finite or beyond ±1e4)"
    values = np.unique(arr)
    if values.size == 2 and values[0] == 0 and values[1] == 1:
        return "a mask (a pattern of 0 and 1)"
    return ""


def _position_tables(arrays: dict[str, np.ndarray]) -> dict[str, str]:
    """Constants that are tables of sines and cosines (a buffer, in PyTorch): one whose even and odd columns pair
    up as sin and cos (sinusoidal positions), or two of one shape that do (rotary embeddings)."""
    why = "a table of sines and cosines (position encodings, a buffer)"
    out = {}
    unit = {
        k: a
        for k, a in arrays.items()
        if a.dtype.kind == "f" and a.ndim >= 1 and float(np.abs(a).max()) <= 1.0
    }
    for k, a in unit.items():
        if a.shape[-1] >= 2 and a.shape[-1] % 2 == 0 and _pythagorean(a[..., 0::2], a[..., 1::2]):
            out[k] = why
    names = sorted(unit)
    for i, k in enumerate(names):
        for j in names[i + 1 :]:
            if unit[k].shape == unit[j].shape and _pythagorean(unit[k], unit[j]):
                out[k] = out[j] = why
    return out


def _pythagorean(s: np.ndarray, c: np.ndarray) -> bool:
    return s.size >= 2 and bool(
        np.allclose(s.astype(np.float64) ** 2 + c.astype(np.float64) ** 2, 1.0, atol=1e-4)
    )


def _data_values(graph: Graph, w: _Walker) -> set[str]:
    """The values that depend on a graph input's values (not only on its shape), and are not integers."""
    data = {i for i in graph.inputs if i not in graph.initializers}
    for n in graph.nodes:
        if not record(n.op_type).reads_shape and any(i in data for i in n.inputs if i):
            data.update(o for o in n.outputs if o)
    ints = {v for v in data if (info := graph.values.get(v)) is not None and np.dtype(info.dtype).kind != "f"}
    return data - ints


def _preprocessed(graph: Graph, w: _Walker, entries: dict[str, Role]) -> set[str]:
    """The graph inputs and what elementwise ops with constants (no parameter) make of them before the model
    proper: an image scaled, its mean subtracted, divided by its std, transposed."""
    raw = {i for i in graph.inputs if i not in graph.initializers}
    for n in graph.nodes:
        if n.op_type not in _PREPROCESS:
            continue
        shape_pos = record(n.op_type).shape_inputs
        ins = [i for k, i in enumerate(n.inputs) if i and k not in shape_pos]
        computed = [i for i in ins if i not in w.computable]
        params = [i for i in ins if (r := entries.get(w.source(i))) is not None and r.kind == PARAMETER]
        if computed and all(i in raw for i in computed) and not params:
            raw.update(o for o in n.outputs if o)
    return raw


def _exporter_fills(graph: Graph, w: _Walker, entries: dict[str, Role]) -> None:
    """A GroupNorm exported below opset 18 is Reshape -> InstanceNormalization(ones, zeros) -> Reshape -> Mul -> Add:
    the ones and zeros are the exporter's, the Mul and Add after them hold the real scale and bias. Those ones and
    zeros never train."""
    for n in graph.nodes:
        if n.op_type != "InstanceNormalization" or len(n.inputs) < 3 or not n.outputs:
            continue
        scale, bias = w.source(n.inputs[1]), w.source(n.inputs[2])
        s, b = graph.initializers.get(scale), graph.initializers.get(bias)
        if s is None or b is None or not (np.all(s == 1) and np.all(b == 0)):
            continue
        affine = [
            u
            for u in w.users(n.outputs[0])
            if u.op_type == "Mul" and any(w.is_float_constant(w.source(i)) for i in u.inputs if i)
        ]
        if affine:
            why = (
                f"the exporter's fill for a GroupNorm: its scale and bias are the Mul after it "
                f"('{affine[0].name}') and the Add after that"
            )
            for name in (scale, bias):
                entries[name].kind, entries[name].role = CONSTANT, why


def _unbiased_linear(w: _Walker, value: str, entries: dict[str, Role]) -> bool:
    """Whether `value` is the output of a linear op with a parameter and no bias of its own (MatMul, Conv
    without B, ...), or of a scale after a normalization: a constant added to it is its bias."""
    p = w.made_by(value)
    if p is None:
        return False
    rec = record(p.op_type)
    reads_param = any(
        entries.get(w.source(i)) is not None and entries[w.source(i)].kind == PARAMETER for i in p.inputs if i
    )
    if not reads_param:
        return False
    if rec.linear:
        return rec.bias is None or rec.bias >= len(p.inputs) or not p.inputs[rec.bias]
    return p.op_type == "Mul" and any(
        (r := entries.get(w.source(i))) is not None and r.role == "scale after a normalization"
        for i in p.inputs
    )


# ---- selecting what trains --------------------------------------------------------------------------------------
def select_trainable(roles: Roles, trainable: str | Sequence[str] | None) -> list[str]:
    """The trainable set: every parameter (None), or those matching names or glob patterns. A pattern matches a
    parameter's name or the name of a node that reads it ('/layer4/*'); an exact name may also select a constant
    (input normalization, say), never a statistic or shape value. Each pattern must match something."""
    params = roles.parameters
    if trainable is None:
        if not params:
            raise UnsupportedError(
                "the model has no initializers in a parameter role (weights, biases, scales, embedding tables); "
                "nothing to train. Name constants to train with trainable=[...] (`edgetrain check` lists them)"
            )
        return params
    patterns = [trainable] if isinstance(trainable, str) else list(trainable)
    chosen: list[str] = []
    for pat in patterns:
        r = roles.entries.get(pat)
        if r is not None:
            if r.kind == FIXED:
                raise UnsupportedError(
                    f"'{pat}' cannot be trained: it is the {r.role or (r.dtype + ' tensor')}"
                    f"{' read by ' + r.nodes[0] if r.nodes else ''}"
                )
            hits = [pat]
        else:
            hits = [p for p in params if _matches(roles.entries[p], pat)]
        if not hits:
            raise UnsupportedError(_no_match(roles, pat))
        chosen.extend(h for h in hits if h not in chosen)
    order = {p: k for k, p in enumerate(roles.entries)}
    return sorted(chosen, key=order.__getitem__)


def _matches(r: Role, pat: str) -> bool:
    """A pattern selects a tensor by its own name, or by the name or module path of a node that reads it."""
    return any(fnmatch.fnmatchcase(n, pat) for n in [r.name, r.author, *r.nodes, *r.scopes] if n)


def _no_match(roles: Roles, pat: str) -> str:
    params = roles.parameters
    msg = f"trainable pattern '{pat}' matches no parameter name and no node name"
    words = [w for w in re.split(r"[*?\[\]]+", pat) if w.strip("./_-")]
    readers = {n: p for p in reversed(params) for n in roles.entries[p].nodes + roles.entries[p].scopes if n}
    nodes = sorted(readers)
    near = [n for n in nodes if words and all(w.strip(".") in n for w in words)]
    if near:
        prefix = _prefix_through(near[0], words[0].strip("."))
        msg += (
            f". Nodes named like it read parameters, e.g. '{near[0]}' (reading '{readers[near[0]]}'): select "
            f"them by node name, e.g. '{prefix}*'"
        )
    else:
        shown = ", ".join(f"'{p}'" for p in params[:8])
        msg += f". Parameters: {shown}{' ...' if len(params) > 8 else ''}"
        if nodes:
            msg += f"; node names look like '{nodes[0]}'"
    return msg + ". `edgetrain check MODEL` lists every parameter with the nodes that read it"


def _prefix_through(name: str, word: str) -> str:
    """The part of a node name up to the end of the path segment that holds `word`: '/layer4/' for
    '/layer4/layer4.0/conv1/Conv' and 'layer4'."""
    at = name.find(word)
    end = name.find("/", at + len(word))
    return name[: end + 1] if end >= 0 else name[: at + len(word)]


def apply_manifest(roles: Roles, manifest) -> Roles:
    """The roles with the manifest's word on what trains: its parameters train, whatever their role; every other
    tensor does not, and says why. Each keeps the role read from the graph, and the author's name."""
    out = {}
    for name, r in roles.entries.items():
        r = Role(name, r.kind, r.role, r.nodes, r.shape, r.dtype, r.aliases, r.scopes, manifest.author(name))
        if name in manifest.parameters:
            r.kind, r.role = PARAMETER, f"{r.role or 'a tensor'} (in the manifest)"
        elif name in manifest.frozen:
            r.kind, r.role = CONSTANT, f"{r.role or 'a tensor'} (frozen by its author: the manifest)"
        elif r.kind == PARAMETER:
            r.kind, r.role = CONSTANT, f"{r.role} (not in the manifest)"
        out[name] = r
    return Roles(out)
