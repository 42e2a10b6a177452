"""The nine real model graphs onnx ships under backend/test/data/light, and a way to give them random weights
(their stored weights are ConstantOfShape fills, which make every output a uniform softmax)."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import numpy_helper

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = [
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
]


def load(name: str) -> onnx.ModelProto:
    return onnx.load(os.path.join(LIGHT, f"light_{name}.onnx"))


def input_name(model: onnx.ModelProto) -> str:
    inits = {t.name for t in model.graph.initializer}
    return next(i.name for i in model.graph.input if i.name not in inits)


def randomize_weights(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Replaces every ConstantOfShape weight fill by seeded random values: He-normal for Conv and Gemm weights,
    the constant times a uniform factor in [0.9, 1.1] elsewhere (BatchNorm variances stay positive)."""
    rng = np.random.default_rng(seed)
    g = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    weight_of = {}  # value name -> (op, node) reading it as input 1
    for n in g.node:
        if n.op_type in ("Conv", "Gemm") and len(n.input) > 1:
            weight_of[n.input[1]] = n
    nodes = []
    for n in g.node:
        if n.op_type != "ConstantOfShape" or n.input[0] not in inits:
            nodes.append(n)
            continue
        shape = tuple(int(d) for d in inits[n.input[0]])
        fill = float(numpy_helper.to_array(n.attribute[0].t).ravel()[0]) if n.attribute else 0.0
        user = weight_of.get(n.output[0])
        if user is not None:
            if user.op_type == "Conv":
                fan_in = int(np.prod(shape[1:]))
            else:
                trans_b = next((a.i for a in user.attribute if a.name == "transB"), 0)
                fan_in = shape[1] if trans_b else shape[0]
            w = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        else:
            w = fill * rng.uniform(0.9, 1.1, size=shape)
        g.initializer.append(numpy_helper.from_array(w.astype(np.float32), n.output[0]))
    del g.node[:]
    g.node.extend(nodes)
    return model
