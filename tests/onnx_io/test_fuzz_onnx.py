"""Fuzzing the ONNX importer, `convert` and `check` with hostile models (tests/harness/fuzzing.py runs each target in a
child process under RLIMIT_AS, one input at a time under an alarm): only an EdgeTrainError may come out, and its
message must name the model file.

- PROTO_BYTES: real small models (an MLP, a LeNet, a residual net, an LSTM classifier, a model with a local
  function) serialized, then bit flips, truncations, splices and duplicated ranges of their bytes, through
  import_model and convert.
- PROTO_FIELDS: the same models parsed and changed field by field (dims, element types, names, raw data lengths,
  attribute types and values, duplicated initializers, inputs renamed to nothing, nodes reordered), through
  import_model and convert.
- GRAPHS: graphs generated from a small vocabulary of ops (Gemm, MatMul, Add, Relu, Conv, Reshape, Flatten, Concat,
  Softmax, ...) with random, often wrong, wiring, names, element types, shapes, attributes (of the wrong types too)
  and initializers (duplicated, of the wrong size), through import_model, convert and, when it converts, one
  training step of edgetrain.runtime.TrainingSession.
- CHECK: the same generated graphs through edgetrain.derive.check.check (the function `edgetrain check` prints).

EDGETRAIN_FUZZ_EXAMPLES sets the inputs per target (150 in CI); a developer runs thousands.
"""

from __future__ import annotations

import functools
import hashlib
import os
import traceback
from pathlib import Path

import fuzzing
import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import edgetrain as et

# ---- the real models mutated ---------------------------------------------------------------------------------


@functools.cache
def seeds() -> list[bytes]:
    """Small real models, serialized: the shapes of tests/harness/models.py at a size that converts in milliseconds."""
    from models import _Net

    out = []
    n = _Net(0)  # MLP 12 -> 8 (ReLU) -> 4
    n.node("Relu", [n.gemm("input", "fc1", 12, 8)])
    n.gemm(n.nodes[-1].output[0], "fc2", 8, 4)
    out.append(n.model(["N", 12], 4, "mlp").SerializeToString())
    n = _Net(1)  # LeNet-like: Conv, ReLU, MaxPool, Flatten, Gemm, Softmax
    h = n.node("Relu", [n.conv("input", "conv1", 1, 3, 3, pads=[1, 1, 1, 1])])
    h = n.node("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    h = n.node("Flatten", [h])
    n.node("Softmax", [n.gemm(h, "fc", 3 * 4 * 4, 5)], axis=1)
    out.append(n.model(["N", 1, 8, 8], 5, "lenet").SerializeToString())
    n = _Net(2)  # conv + BatchNorm + residual + global pool
    h = n.node("Relu", [n.bn(n.conv("input", "stem", 2, 4, 3, pads=[1, 1, 1, 1], bias=False), "bn", 4)])
    h = n.node("Relu", [n.node("Add", [n.conv(h, "c2", 4, 4, 3, pads=[1, 1, 1, 1]), h])])
    h = n.node("Flatten", [n.node("GlobalAveragePool", [h])])
    n.gemm(h, "fc", 4, 3)
    out.append(n.model([2, 2, 6, 6], 3, "resnet").SerializeToString())
    out.append(_lstm().SerializeToString())
    out.append(_with_function().SerializeToString())
    return out


def _with_function() -> onnx.ModelProto:
    """x [N, 6] -> local::Block (MatMul, Add, Relu: a model-local function, inlined on import) -> Gemm."""
    rng = np.random.default_rng(4)
    body = [
        helper.make_node("MatMul", ["a", "w"], ["m"]),
        helper.make_node("Add", ["m", "c"], ["s"]),
        helper.make_node("Relu", ["s"], ["r"]),
    ]
    block = helper.make_function(
        "local", "Block", ["a", "w", "c"], ["r"], body, [helper.make_opsetid("", 17)]
    )
    nodes = [
        helper.make_node("Block", ["input", "w1", "b1"], ["h"], domain="local", name="block"),
        helper.make_node("Gemm", ["h", "w2", "b2"], ["output"], name="fc"),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((6, 5)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((5, 2)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.standard_normal(2).astype(np.float32), "b2"),
    ]
    g = helper.make_graph(
        nodes,
        "function",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 2])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    return helper.make_model(g, opset_imports=opsets, functions=[block])


def _lstm() -> onnx.ModelProto:
    """Reshape [N, 4, 3] -> Transpose -> LSTM (hidden 5) -> last state -> Gemm -> 2 classes."""
    rng = np.random.default_rng(3)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    nodes = [
        helper.make_node("Transpose", ["input"], ["t"], perm=[1, 0, 2], name="to_time"),
        helper.make_node("LSTM", ["t", "W", "R", "B"], ["", "h"], hidden_size=5, name="lstm"),
        helper.make_node("Squeeze", ["h", "axis0"], ["last"], name="last"),
        helper.make_node("Gemm", ["last", "fc.weight", "fc.bias"], ["output"], transB=1, name="fc"),
    ]
    inits = [
        w("W", 1, 20, 3),
        w("R", 1, 20, 5),
        w("B", 1, 40),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
        w("fc.weight", 2, 5),
        w("fc.bias", 2),
    ]
    g = helper.make_graph(
        nodes,
        "lstm",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 4, 3])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 2])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@st.composite
def mutated_bytes(draw) -> bytes:
    """A real model's bytes, mutated a few times: bit flips, truncation, a splice of another model's or random
    bytes, a duplicated or deleted range."""
    base = seeds()
    data = bytearray(base[draw(st.integers(0, len(base) - 1))])
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "flip", "truncate", "splice", "dup", "delete", "byte"]))
        n = len(data)
        if n == 0:
            break
        at = draw(st.integers(0, n - 1))
        if kind == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte":
            data[at] = draw(
                st.sampled_from([0x00, 0xFF, 0x7F, 0x80, 0x08, 0x10, 0x12, 0x1A, 0x22, 0x3A, 0x42])
            )
        elif kind == "truncate":
            del data[at:]
        elif kind == "splice":
            other = base[draw(st.integers(0, len(base) - 1))]
            a = draw(st.integers(0, len(other) - 1))
            piece = other[a : a + draw(st.integers(1, 64))]
            if draw(st.booleans()):
                piece = draw(st.binary(min_size=1, max_size=32))
            data[at : at + draw(st.integers(0, 32))] = piece
        elif kind == "dup":
            data[at:at] = data[at : at + draw(st.integers(1, 64))]
        else:
            del data[at : at + draw(st.integers(1, 64))]
    return bytes(data)


# the values a mutated field takes: boundaries, huge, negative, wrong-typed
_DIMS = [0, 1, 2, 3, -1, -7, 2**31, 2**40, 2**62, 10**6]
_STRINGS = ["", "ghost", "input", "output", "W", "fc1.weight", "x" * 300, "\u00e9\u4e2d", "a/b:c"]
_ELEM_TYPES = [0, 1, 2, 3, 6, 7, 9, 10, 11, 8, 16, 17, 22, 99, -1]


@st.composite
def mutated_fields(draw) -> bytes:
    """A real model with a few of its fields changed through the protobuf API (so the bytes stay well formed and
    the change reaches the importer)."""
    return _fields_of(draw, seeds()[draw(st.integers(0, len(seeds()) - 1))])


def _fields_of(draw, data: bytes) -> bytes:
    """data (a model's bytes) with one to three of its fields changed."""
    m = onnx.load_model_from_string(data)
    g = m.graph
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(
            st.sampled_from(
                [
                    "init_dims",
                    "init_type",
                    "init_raw",
                    "init_name",
                    "init_dup",
                    "input_dims",
                    "input_type",
                    "node_input",
                    "node_output",
                    "node_op",
                    "attr_type",
                    "attr_value",
                    "attr_drop",
                    "node_swap",
                    "node_drop",
                    "output_name",
                    "opset",
                    "invalid_utf8",
                ]
            )
        )
        pick = functools.partial(_pick, draw)
        if kind.startswith("init") and g.initializer:
            t = pick(g.initializer)
            if kind == "init_dims":
                dims = list(t.dims) or [1]
                dims[draw(st.integers(0, len(dims) - 1))] = draw(st.sampled_from(_DIMS))
                del t.dims[:]
                t.dims.extend(dims[: draw(st.integers(0, len(dims)))] if draw(st.booleans()) else dims)
            elif kind == "init_type":
                t.data_type = draw(st.sampled_from([x for x in _ELEM_TYPES if x >= 0]))
            elif kind == "init_raw":
                raw = t.raw_data
                t.raw_data = raw[: draw(st.integers(0, len(raw)))] + draw(st.binary(max_size=8))
            elif kind == "init_name":
                t.name = draw(st.sampled_from(_STRINGS + [x.name for x in g.initializer]))
            else:
                g.initializer.append(t)
        elif kind == "input_dims" and g.input:
            dims = g.input[0].type.tensor_type.shape.dim
            if dims:
                d = dims[draw(st.integers(0, len(dims) - 1))]
                d.dim_value = draw(st.sampled_from(_DIMS))
        elif kind == "input_type" and g.input:
            g.input[0].type.tensor_type.elem_type = draw(st.sampled_from([x for x in _ELEM_TYPES if x >= 0]))
        elif kind.startswith("node") and g.node:
            n = pick(g.node)
            names = _STRINGS + [o for x in g.node for o in x.output] + [t.name for t in g.initializer]
            if kind == "node_input" and n.input:
                n.input[draw(st.integers(0, len(n.input) - 1))] = draw(st.sampled_from(names))
            elif kind == "node_output" and n.output:
                n.output[0] = draw(st.sampled_from(names))
            elif kind == "node_op":
                n.op_type = draw(st.sampled_from(_OPS + ["", "Loop", "relu", "FusedConv"]))
            elif kind == "node_swap" and len(g.node) > 1:
                i, j = draw(st.integers(0, len(g.node) - 1)), draw(st.integers(0, len(g.node) - 1))
                a, b = onnx.NodeProto(), onnx.NodeProto()
                a.CopyFrom(g.node[i])
                b.CopyFrom(g.node[j])
                g.node[i].CopyFrom(b)
                g.node[j].CopyFrom(a)
            elif kind == "node_drop":
                g.node.remove(n)
        elif kind.startswith("attr"):
            attrs = [a for n in g.node for a in n.attribute]
            if attrs:
                a = pick(attrs)
                if kind == "attr_type":
                    a.type = draw(st.integers(0, 14))
                elif kind == "attr_value":
                    a.i = draw(st.sampled_from([0, -1, 2**62, -(2**62), 7]))
                    a.f = draw(st.sampled_from([0.0, -1.0, float("nan"), float("inf"), 1e30]))
                    a.s = draw(st.sampled_from([b"", b"NOTSET", b"SAME_UPPER", b"\xff\xfe", b"constant"]))
                    del a.ints[:]
                    a.ints.extend(draw(st.lists(st.sampled_from(_DIMS), max_size=6)))
                else:
                    for n in g.node:
                        if a in n.attribute:
                            n.attribute.remove(a)
                            break
        elif kind == "output_name" and g.output:
            g.output[0].name = draw(st.sampled_from(_STRINGS))
        elif kind == "opset":
            if draw(st.booleans()):
                del m.opset_import[:]
            elif m.opset_import:
                m.opset_import[0].version = draw(st.sampled_from([0, 1, 6, 9, 11, 13, 99, -3]))
        elif kind == "invalid_utf8":
            return _invalid_utf8(draw, m.SerializeToString())
    return m.SerializeToString()


def _pick(draw, items):
    return items[draw(st.integers(0, len(items) - 1))]


def _invalid_utf8(draw, data: bytes) -> bytes:
    """A name in the model's bytes with one byte made invalid UTF-8 (same length: the protobuf stays framed)."""
    names = [b"input", b"output", b"fc1.weight", b"Relu_", b"lstm", b"conv1"]
    present = [n for n in names if n in data]
    if not present:
        return data
    name = draw(st.sampled_from(present))
    return data.replace(name, b"\xff" + name[1:], 1)


# ---- generated graphs ----------------------------------------------------------------------------------------

_OPS = [
    "Gemm",
    "MatMul",
    "Add",
    "Mul",
    "Relu",
    "Sigmoid",
    "Conv",
    "MaxPool",
    "Reshape",
    "Flatten",
    "Concat",
    "Softmax",
    "Transpose",
    "Identity",
    "ReduceMean",
    "BatchNormalization",
    "Cast",
    "Shape",
    "Gather",
    "Expand",
    "ConstantOfShape",
    "Unsqueeze",
    "Slice",
]
# attribute name -> the values it is drawn from (of its right type and of wrong ones)
_ATTRS = {
    "Gemm": {"transA": [0, 1, "1", 2.5], "transB": [0, 1, [1]], "alpha": [1.0, 0.5, 2, "x"]},
    "Conv": {
        "kernel_shape": [[1, 1], [3, 3], [2], [], [0, 0], [-1, 3], [2**40, 1]],
        "pads": [[0, 0, 0, 0], [1, 1, 1, 1], [-2, 0, 0, 0], [1]],
        "strides": [[1, 1], [2, 2], [0, 1], [-1, -1]],
        "group": [1, 2, 0, -1, 3],
        "dilations": [[1, 1], [0, 0], [2, 2]],
        "auto_pad": ["NOTSET", "SAME_UPPER", "VALID", "nonsense", 3],
    },
    "MaxPool": {
        "kernel_shape": [[2, 2], [1, 1], [], [0, 2], [9, 9]],
        "strides": [[2, 2], [0, 0], [1]],
        "pads": [[0, 0, 0, 0], [5, 5, 5, 5]],
        "ceil_mode": [0, 1, 7],
    },
    "Flatten": {"axis": [0, 1, 2, -1, 9, "1"]},
    "Concat": {"axis": [0, 1, -1, 5, 1.5]},
    "Softmax": {"axis": [-1, 0, 1, 3, "a"]},
    "Transpose": {"perm": [[1, 0], [0, 1], [2, 0, 1], [0, 0], [5, 1]]},
    "ReduceMean": {"keepdims": [0, 1, 3]},
    "BatchNormalization": {"epsilon": [1e-5, 0.0, -1.0], "momentum": [0.9, 2]},
    "Cast": {"to": [1, 7, 9, 11, 0, 99, 8, 16, 22]},
    "Gather": {"axis": [0, 1, -1, 4]},
}


@st.composite
def shapes(draw, rank=None):
    rank = draw(st.integers(0, 4)) if rank is None else rank
    return [draw(st.sampled_from([1, 2, 3, 4, 1, 2, 0, "N", 6, -1, 2**62, 40000])) for _ in range(rank)]


@st.composite
def tensors(draw, name: str) -> onnx.TensorProto:
    dims = [d for d in draw(shapes()) if isinstance(d, int)]
    elem = draw(st.sampled_from([1, 1, 1, 7, 7, 11, 6, 9, 10, 99]))
    safe = [max(0, min(d, 6)) for d in dims]
    if elem == 99:
        t = helper.make_tensor(name, TensorProto.FLOAT, safe, np.zeros(safe, np.float32).ravel().tolist())
        t.data_type = 99
        return t
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    values = (np.random.default_rng(draw(st.integers(0, 3))).standard_normal(safe) * 3).astype(dtype)
    t = numpy_helper.from_array(values, name)
    if safe != dims and draw(st.booleans()):  # declared dims that the data does not fill
        del t.dims[:]
        t.dims.extend(dims)
    if draw(st.integers(0, 5)) == 0:
        t.raw_data = t.raw_data[: draw(st.integers(0, len(t.raw_data)))]
    return t


def _attribute_values(draw, op: str) -> dict:
    out = {}
    for key, options in _ATTRS.get(op, {}).items():
        if draw(st.integers(0, 2)) == 0:
            out[key] = draw(st.sampled_from(options))
    return out


@st.composite
def wild_models(draw) -> bytes:
    """Graphs wired at random from the vocabulary: names, element types, shapes and attributes mostly wrong."""
    opset = draw(st.sampled_from([17, 17, 13, 18, 11, 7, 21]))
    inputs = []
    names: list[str] = []
    for k in range(draw(st.integers(1, 2))):
        name = draw(st.sampled_from([f"x{k}", "x0", "", "w0", "\u00e9"]))
        elem = draw(st.sampled_from([1, 1, 1, 7, 11, 99, 0]))
        inputs.append(helper.make_tensor_value_info(name, elem, draw(shapes())))
        names.append(name)
    inits = []
    for k in range(draw(st.integers(0, 4))):
        name = draw(st.sampled_from([f"w{k}", "w0", f"x{k}", "shape", "axes"]))
        if name in ("shape", "axes"):
            v = np.array(
                draw(st.lists(st.sampled_from([-1, 0, 1, 2, 3, 4, 12, 2**40]), max_size=4)), np.int64
            )
            inits.append(numpy_helper.from_array(v, name))
        else:
            inits.append(draw(tensors(name)))
        names.append(name)
    nodes = []
    for k in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(_OPS))
        pool = names + ["ghost", "", f"h{k + 1}"]  # undefined names, omitted inputs, a value defined later
        ins = [draw(st.sampled_from(pool)) for _ in range(draw(st.integers(0, 3)))]
        if names and draw(st.integers(0, 3)):
            ins = [names[-1]] + ins[1:] if ins else [names[-1]]  # mostly a chain
        out = draw(st.sampled_from([f"h{k}", f"h{k}", "x0", "w0", f"h{max(k - 1, 0)}"]))
        nodes.append(_node(op, ins, [out], f"{op}_{k}", _attribute_values(draw, op)))
        names.append(out)
    outs = [helper.make_tensor_value_info(draw(st.sampled_from(names[-2:] + ["nowhere"])), 1, None)]
    g = helper.make_graph(nodes, "fuzz", inputs, outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return m.SerializeToString()


def _node(op: str, ins, outs, name: str, attrs: dict) -> onnx.NodeProto:
    try:
        return helper.make_node(op, list(ins), list(outs), name=name, **attrs)
    except ValueError:  # an empty list: onnx.helper cannot tell its attribute type
        return helper.make_node(op, list(ins), list(outs), name=name)


class _Builder:
    """A plausible model grown op by op, keeping track of each value's shape so that most nodes fit."""

    def __init__(self, draw, batch, opset: int):
        self.draw, self.batch, self.opset = draw, batch, opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.k = 0
        self.rng = np.random.default_rng(draw(st.integers(0, 7)))

    def fresh(self, hint: str) -> str:
        self.k += 1
        return f"{hint}{self.k}"

    def const(self, arr, hint="c") -> str:
        name = self.fresh(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def weight(self, *shape) -> str:
        return self.const((self.rng.standard_normal(shape) * 0.5).astype(np.float32), "w")

    def add(self, op, ins, **attrs) -> str:
        out = self.fresh(op.lower())
        self.nodes.append(_node(op, ins, [out], f"{op}_{self.k}", attrs))
        return out

    def step(self, x: str, shape: list) -> tuple[str, list]:
        """One more op on x (its shape), chosen to fit; returns the new value and its shape."""
        draw, b = self.draw, shape[0]
        rank = len(shape)
        choices = ["Relu", "Sigmoid", "Add", "Mul", "Identity", "Softmax", "Transpose", "ReduceMean", "Cast"]
        choices += ["Gemm", "MatMul", "Flatten", "Reshape", "ShapeReshape", "Concat", "Unsqueeze", "Slice"]
        choices += ["Expand", "ConstantOfShape", "Unary", "Binary", "Clip", "Where", "Pad", "Tile", "Split"]
        choices += ["LayerNormalization", "Dropout", "Recurrent", "Embedding"]
        if rank == 4:
            choices += ["Conv", "Conv", "MaxPool", "BatchNormalization", "AveragePool", "GlobalAveragePool"]
            choices += ["ConvTranspose", "Resize", "InstanceNormalization"]
        op = draw(st.sampled_from(choices))
        made = self.more(op, x, shape)
        if made is not None:
            return made
        if op in ("Relu", "Sigmoid", "Identity"):
            return self.add(op, [x]), shape
        if op in ("Add", "Mul"):
            other = self.weight(*shape[draw(st.integers(1, rank)) :]) if rank else self.weight()
            return self.add(op, [x, other]), shape
        if op == "Softmax":
            return self.add(op, [x], axis=-1), shape
        if op == "Cast":
            to = draw(st.sampled_from([1, 1, 11, 7]))
            y = self.add("Cast", [x], to=to)
            return (self.add("Cast", [y], to=1) if to != 1 else y), shape
        if op == "Transpose" and rank >= 2:
            return self.add(op, [x], perm=[0, *range(rank - 1, 0, -1)]), [b, *shape[:0:-1]]
        if op == "ReduceMean" and rank >= 2:
            if self.opset < 18:  # axes became an input in opset 18
                return self.add(op, [x], axes=[rank - 1], keepdims=1), [*shape[:-1], 1]
            axes = self.const(np.array([rank - 1], np.int64), "axes")
            return self.add(op, [x, axes], keepdims=1), [*shape[:-1], 1]
        if op in ("Gemm", "MatMul") and rank == 2:
            m = draw(st.integers(1, 6))
            if op == "Gemm":
                trans = draw(st.integers(0, 1))
                w = self.weight(m, shape[1]) if trans else self.weight(shape[1], m)
                return self.add("Gemm", [x, w, self.weight(m)], transB=trans), [b, m]
            return self.add("MatMul", [x, self.weight(shape[1], m)]), [b, m]
        if op == "Flatten" and rank >= 2:
            return self.add(op, [x], axis=1), [b, int(np.prod(shape[1:]))]
        if op == "Reshape" and rank >= 1:
            target = self.const(np.array([b if self.batch else 0, -1], np.int64), "shape")
            return self.add(op, [x, target]), [b, int(np.prod(shape[1:]))]
        if op == "ShapeReshape" and rank >= 2:  # the dynamic form exporters write: Shape, Gather, Concat
            s = self.add("Shape", [x])
            first = self.add("Gather", [s, self.const(np.array([0], np.int64), "i")], axis=0)
            target = self.add("Concat", [first, self.const(np.array([-1], np.int64), "m")], axis=0)
            return self.add("Reshape", [x, target]), [b, int(np.prod(shape[1:]))]
        if op == "Concat" and rank >= 2:
            y = self.add("Relu", [x])
            return self.add(op, [x, y], axis=1), [b, 2 * shape[1], *shape[2:]]
        if op == "Unsqueeze":
            axes = self.const(np.array([rank], np.int64), "axes")
            return self.add(op, [x, axes]), [*shape, 1]
        if op == "Slice" and rank >= 2 and shape[1] > 1:
            starts, ends = self.const(np.array([1], np.int64), "s"), self.const(np.array([99], np.int64), "e")
            axes = self.const(np.array([1], np.int64), "a")
            return self.add(op, [x, starts, ends, axes]), [b, shape[1] - 1, *shape[2:]]
        if op == "Expand" and rank >= 1:
            return self.add(op, [x, self.const(np.array(shape, np.int64), "shape")]), shape
        if op == "ConstantOfShape" and rank == 2:  # a weight fill, as old exporters write
            fill = numpy_helper.from_array(np.array([0.1], np.float32))
            w = self.add("ConstantOfShape", [self.const(np.array([shape[1], 3], np.int64), "ws")], value=fill)
            return self.add("MatMul", [x, w]), [b, 3]
        if op == "Conv":
            c, m, k = shape[1], draw(st.integers(1, 4)), draw(st.sampled_from([1, 3]))
            pad = k // 2
            y = self.add(
                op, [x, self.weight(m, c, k, k), self.weight(m)], kernel_shape=[k, k], pads=[pad] * 4
            )
            return y, [b, m, shape[2], shape[3]]
        if op == "MaxPool" and shape[2] >= 2 and shape[3] >= 2:
            return self.add(op, [x], kernel_shape=[2, 2], strides=[2, 2]), [
                b,
                shape[1],
                shape[2] // 2,
                shape[3] // 2,
            ]
        if op == "BatchNormalization":
            c = shape[1]
            stats = [self.weight(c), self.weight(c), self.weight(c)]
            var = self.const(np.abs(self.rng.standard_normal(c)).astype(np.float32) + 0.5, "var")
            return self.add(op, [x, *stats, var], epsilon=1e-5), shape
        return self.add("Relu", [x]), shape

    def more(self, op: str, x: str, shape: list) -> tuple[str, list] | None:
        """The rest of the vocabulary: elementwise math, padding and tiling, normalizations, recurrences."""
        draw, b, rank = self.draw, shape[0], len(shape)
        if op == "Unary":
            u = draw(
                st.sampled_from(["Tanh", "Exp", "Abs", "Neg", "LeakyRelu", "Softplus", "Erf", "Sqrt", "Log"])
            )
            if u in ("Sqrt", "Log"):
                x = self.add("Abs", [x])
            return self.add(u, [x]), shape
        if op == "Binary":
            u = draw(st.sampled_from(["Sub", "Div", "Pow", "Max", "Min", "Sum", "Mean"]))
            other = self.const(
                np.abs(self.rng.standard_normal(shape[-1:] or [1])).astype(np.float32) + 1, "k"
            )
            return self.add(u, [x, other]), shape
        if op == "Clip":
            lo, hi = self.const(np.float32(-1), "lo"), self.const(np.float32(1), "hi")
            return self.add(op, [x, lo, hi]), shape
        if op == "Where":
            cond = self.add("Greater", [x, self.const(np.float32(0), "zero")])
            return self.add(op, [cond, x, self.add("Neg", [x])]), shape
        if op == "Pad" and rank >= 1:
            pads = self.const(np.array([0] * rank + [0] * (rank - 1) + [1], np.int64), "pads")
            mode = draw(st.sampled_from(["constant", "reflect", "edge"]))
            if mode == "reflect" and shape[-1] < 2:
                mode = "edge"
            return self.add(op, [x, pads], mode=mode), [*shape[:-1], shape[-1] + 1]
        if op == "Tile" and rank >= 1:
            reps = self.const(np.array([1] * (rank - 1) + [2], np.int64), "reps")
            return self.add(op, [x, reps]), [*shape[:-1], 2 * shape[-1]]
        if op == "Split" and rank >= 2 and shape[1] % 2 == 0:
            half = self.const(np.array([shape[1] // 2] * 2, np.int64), "split")
            out = [self.fresh("split"), self.fresh("split")]
            self.nodes.append(_node("Split", [x, half], out, f"Split_{self.k}", {"axis": 1}))
            return self.add("Add", out), [b, shape[1] // 2, *shape[2:]]
        if op == "LayerNormalization" and rank >= 2:
            scale, bias = self.weight(shape[-1]), self.weight(shape[-1])
            return self.add(op, [x, scale, bias], axis=-1, epsilon=1e-5), shape
        if op == "Dropout":
            return self.add(op, [x, self.const(np.float32(0.5), "ratio")]), shape
        if op == "Recurrent" and rank == 2:  # [b, k] read as k steps of one feature
            seq = self.add(
                "Transpose", [self.add("Unsqueeze", [x, self.const(np.array([2]), "ax")])], perm=[1, 0, 2]
            )
            kind, h = draw(st.sampled_from(["LSTM", "GRU", "RNN"])), draw(st.integers(1, 3))
            gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[kind]
            w, r, bias = (
                self.weight(1, gates * h, 1),
                self.weight(1, gates * h, h),
                self.weight(1, 2 * gates * h),
            )
            out = [self.fresh("y"), self.fresh("yh")]
            self.nodes.append(_node(kind, [seq, w, r, bias], out, f"{kind}_{self.k}", {"hidden_size": h}))
            return self.add("Squeeze", [out[1], self.const(np.array([0]), "ax")]), [b, h]
        if op == "Embedding" and rank == 2:
            idx = self.add(
                "Cast",
                [self.add("Clip", [x, self.const(np.float32(0), "lo"), self.const(np.float32(3), "hi")])],
                to=7,
            )
            return self.add("Gather", [self.weight(4, 2), idx], axis=0), [*shape, 2]
        if op in ("AveragePool", "GlobalAveragePool") and rank == 4:
            if op == "GlobalAveragePool":
                return self.add(op, [x]), [b, shape[1], 1, 1]
            return self.add(op, [x], kernel_shape=[1, 1]), shape
        if op == "ConvTranspose" and rank == 4:
            m = draw(st.integers(1, 3))
            return self.add(op, [x, self.weight(shape[1], m, 3, 3)], pads=[1, 1, 1, 1]), [b, m, *shape[2:]]
        if op == "Resize" and rank == 4:
            scales = self.const(np.array([1, 1, 2, 2], np.float32), "scales")
            return self.add(op, [x, "", scales], mode="nearest"), [*shape[:2], 2 * shape[2], 2 * shape[3]]
        if op == "InstanceNormalization" and rank == 4:
            return self.add(op, [x, self.weight(shape[1]), self.weight(shape[1])]), shape
        return None


@st.composite
def plausible_models(draw) -> bytes:
    """A model that mostly fits together (grown op by op from a 2-D or 4-D input), with a few of its fields then
    made wrong: wiring, names, element types, shapes, attributes (of wrong types too), initializers."""
    batch = draw(st.sampled_from([None, 2, 1]))
    shape = draw(st.sampled_from([[2, 5], [2, 3], [2, 1, 4, 4], [2, 2, 6, 6], [2, 3, 5, 5]]))
    shape = [batch or 2, *shape[1:]]
    opset = draw(st.sampled_from([17, 18, 13]))
    b = _Builder(draw, batch, opset)
    x, cur = "input", list(shape)
    for _ in range(draw(st.integers(1, 7))):
        x, cur = b.step(x, cur)
    if len(cur) != 2:
        x = b.add("Flatten", [x], axis=1)
        cur = [cur[0], int(np.prod(cur[1:]))]
    x = b.add("Gemm", [x, b.weight(3, cur[1]), b.weight(3)], transB=1)
    b.nodes[-1].output[0] = "output"
    declared = ["N" if batch is None else batch, *shape[1:]]
    g = helper.make_graph(
        b.nodes,
        "plausible",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, declared)],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [declared[0], 3])],
        b.inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    data = m.SerializeToString()
    if draw(st.integers(0, 2)):  # two in three are made wrong somewhere
        data = _fields_of(draw, data)
    return data


generated_models = st.one_of(plausible_models(), plausible_models(), wild_models())


# ---- the targets ---------------------------------------------------------------------------------------------


def _named(path: Path, fn):
    """Runs fn; an EdgeTrainError must name the model file."""
    try:
        return fn()
    except et.EdgeTrainError as e:
        assert str(path) in str(e), f"{type(e).__name__} does not name the model file: {e}"
        raise


def _write(example: bytes, workdir: Path) -> Path:
    path = workdir / "model.onnx"
    path.write_bytes(example)
    return path


def _keeping(run):
    """run, and with EDGETRAIN_FUZZ_KEEP=DIR, an input that escapes is kept there (DIR/HASH.onnx and the
    traceback in DIR/HASH.txt) to become a regression test: hypothesis's report of a model's bytes is long."""

    @functools.wraps(run)
    def wrapped(example: bytes, workdir: Path):
        try:
            return run(example, workdir)
        except et.EdgeTrainError:
            raise
        except BaseException as e:
            keep = os.environ.get("EDGETRAIN_FUZZ_KEEP")
            if keep and not isinstance(e, KeyboardInterrupt):
                name = hashlib.sha256(example).hexdigest()[:12]
                Path(keep).mkdir(parents=True, exist_ok=True)
                (Path(keep) / f"{name}.onnx").write_bytes(example)
                (Path(keep) / f"{name}.txt").write_text(traceback.format_exc())
            raise

    return wrapped


def import_and_convert(example: bytes, workdir: Path, *, train: bool = False) -> None:
    path = _write(example, workdir)
    _named(path, lambda: et.import_model(path, batch_size=2))
    art = _named(path, lambda: et.convert(path, loss=et.MSELoss(), optimizer=et.SGD(lr=0.1), batch_size=2))
    if train:
        one_step(art, workdir)


# A generated model whose step needs more memory, or loops over more recurrent steps, is converted but not trained:
# it is large or slow by design (the runtime bounds its memory on its own).
STEP_BYTES = 64 << 20
STEP_LOOPS = 4096


def one_step(art, workdir: Path) -> None:
    """One training step of the converted model on a batch of random data."""
    if sum(v.nbytes or 0 for v in art.graph.values.values()) > STEP_BYTES:
        return
    for n in art.graph.nodes:
        if n.op_type in ("LSTM", "GRU", "RNN") and art.graph.values[n.inputs[0]].shape[0] > STEP_LOOPS:
            return
    path = workdir / "model.etrain"
    art.save(path)
    sess = et.TrainingSession(path)
    rng = np.random.default_rng(0)
    feeds = {}
    for name in art.data_inputs:
        info = art.graph.values[name]
        feeds[name] = (
            rng.standard_normal(info.shape) if np.dtype(info.dtype).kind == "f" else np.zeros(info.shape)
        )
        feeds[name] = feeds[name].astype(info.dtype)
    target = art.graph.values[art.target]
    try:
        sess.train_step(feeds, rng.standard_normal(target.shape).astype(target.dtype))
    except et.NonFiniteError:
        pass  # a generated model may well overflow: refused as the runtime promises


def check_model(example: bytes, workdir: Path) -> None:
    from edgetrain.derive.check import check

    path = _write(example, workdir)
    report = _named(path, lambda: check(path))
    report.text()


PROTO_BYTES = fuzzing.FuzzTarget(mutated_bytes(), _keeping(import_and_convert))
PROTO_FIELDS = fuzzing.FuzzTarget(mutated_fields(), _keeping(import_and_convert))
GRAPHS = fuzzing.FuzzTarget(generated_models, _keeping(functools.partial(import_and_convert, train=True)))
CHECK = fuzzing.FuzzTarget(generated_models, _keeping(check_model))


def test_fuzz_onnx_bytes():
    result = fuzzing.run_target("test_fuzz_onnx:PROTO_BYTES")
    assert result["tried"] > 0 and result["refused"] > 0


def test_fuzz_onnx_fields():
    result = fuzzing.run_target("test_fuzz_onnx:PROTO_FIELDS")
    assert result["tried"] > 0 and result["refused"] > 0


def test_fuzz_onnx_generated_graphs():
    result = fuzzing.run_target("test_fuzz_onnx:GRAPHS")
    assert result["tried"] > 0 and result["refused"] > 0


def test_fuzz_check():
    result = fuzzing.run_target("test_fuzz_onnx:CHECK")
    assert result["tried"] > 0 and result["refused"] > 0
