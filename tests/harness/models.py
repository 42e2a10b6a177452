"""Small ONNX models for training tests, built with onnx.helper and seeded random weights:
MLP, LeNet, a conv + BatchNorm + residual network, and a depthwise-separable network."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Net:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.k = 0

    def array(self, name: str, arr: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(arr, np.float32), name))
        return name

    def weight(self, name: str, shape, fan_in: int | None = None) -> str:
        """He-normal when fan_in is given, else uniform in [-0.1, 0.1]."""
        if fan_in is None:
            return self.array(name, self.rng.uniform(-0.1, 0.1, shape))
        return self.array(name, self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in))

    def node(self, op: str, inputs, **attrs) -> str:
        self.k += 1
        out = f"{op.lower()}{self.k}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=f"{op}_{self.k}", **attrs))
        return out

    def conv(self, x, name, cin, cout, k, *, group=1, bias=True, **attrs):
        w = self.weight(f"{name}.weight", (cout, cin // group, k, k), fan_in=cin // group * k * k)
        ins = [x, w] + ([self.weight(f"{name}.bias", (cout,))] if bias else [])
        return self.node("Conv", ins, kernel_shape=[k, k], group=group, **attrs)

    def bn(self, x, name, c):
        s = self.array(f"{name}.weight", 1 + self.rng.uniform(-0.2, 0.2, c))
        b = self.weight(f"{name}.bias", (c,))
        m = self.weight(f"{name}.running_mean", (c,))
        v = self.array(f"{name}.running_var", self.rng.uniform(0.5, 1.5, c))
        return self.node("BatchNormalization", [x, s, b, m, v], epsilon=1e-5)

    def gemm(self, x, name, fin, fout):
        w = self.weight(f"{name}.weight", (fout, fin), fan_in=fin)
        return self.node("Gemm", [x, w, self.weight(f"{name}.bias", (fout,))], transB=1)

    def model(self, x_shape, classes: int, name: str, opset: int = 17) -> onnx.ModelProto:
        self.nodes[-1].output[0] = "output"
        g = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, x_shape)],
            [helper.make_tensor_value_info("output", TensorProto.FLOAT, [x_shape[0], classes])],
            self.inits,
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m


def mlp(batch="N", seed: int = 0) -> onnx.ModelProto:
    """784 -> 128 (ReLU) -> 10 logits."""
    n = _Net(seed)
    h = n.node("Relu", [n.gemm("input", "fc1", 784, 128)])
    n.gemm(h, "fc2", 128, 10)
    return n.model([batch, 784], 10, "mlp")


def lenet(batch="N", seed: int = 0) -> onnx.ModelProto:
    """Conv(1->6, 5x5, pad 2)+ReLU+MaxPool2, Conv(6->16, 5x5)+ReLU+MaxPool2, FC 400-120-84-10, Softmax."""
    n = _Net(seed)
    h = n.node("Relu", [n.conv("input", "conv1", 1, 6, 5, pads=[2, 2, 2, 2])])
    h = n.node("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    h = n.node("Relu", [n.conv(h, "conv2", 6, 16, 5)])
    h = n.node("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    h = n.node("Flatten", [h])
    h = n.node("Relu", [n.gemm(h, "fc1", 400, 120)])
    h = n.node("Relu", [n.gemm(h, "fc2", 120, 84)])
    n.node("Softmax", [n.gemm(h, "fc3", 84, 10)], axis=1)
    return n.model([batch, 1, 28, 28], 10, "lenet")


def resnet_tiny(batch="N", seed: int = 0) -> onnx.ModelProto:
    """Conv+BN+ReLU stem, one residual block (conv-BN-ReLU-conv-BN + skip, ReLU), global pool, FC."""
    n = _Net(seed)
    h = n.node("Relu", [n.bn(n.conv("input", "stem", 3, 8, 3, pads=[1, 1, 1, 1], bias=False), "stem_bn", 8)])
    r = n.node(
        "Relu", [n.bn(n.conv(h, "block.conv1", 8, 8, 3, pads=[1, 1, 1, 1], bias=False), "block.bn1", 8)]
    )
    r = n.bn(n.conv(r, "block.conv2", 8, 8, 3, pads=[1, 1, 1, 1], bias=False), "block.bn2", 8)
    h = n.node("Relu", [n.node("Add", [r, h])])
    h = n.node("Flatten", [n.node("GlobalAveragePool", [h])])
    n.gemm(h, "fc", 8, 10)
    return n.model([batch, 3, 12, 12], 10, "resnet_tiny")


def depthwise_separable(batch="N", seed: int = 0) -> onnx.ModelProto:
    """Strided conv, depthwise 3x3 + BN + ReLU, pointwise 1x1 + ReLU, average pool, MatMul + bias."""
    n = _Net(seed)
    h = n.node("Relu", [n.conv("input", "conv1", 3, 8, 3, strides=[2, 2], pads=[1, 1, 1, 1])])
    h = n.node("Relu", [n.bn(n.conv(h, "dw", 8, 8, 3, group=8, pads=[1, 1, 1, 1], bias=False), "dw_bn", 8)])
    h = n.node("Relu", [n.conv(h, "pw", 8, 16, 1)])
    h = n.node("Flatten", [n.node("AveragePool", [h], kernel_shape=[8, 8])])
    w = n.weight("head.weight", (16, 5), fan_in=16)
    n.node("Add", [n.node("MatMul", [h, w]), n.weight("head.bias", (5,))])
    return n.model([batch, 3, 16, 16], 5, "depthwise_separable")


MODELS = {
    "mlp": (mlp, (784,), 10),
    "lenet": (lenet, (1, 28, 28), 10),
    "resnet_tiny": (resnet_tiny, (3, 12, 12), 10),
    "depthwise_separable": (depthwise_separable, (3, 16, 16), 5),
}


def batch_for(name: str, batch: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """A fixed random batch (inputs, int64 labels) for model `name`."""
    _, shape, classes = MODELS[name]
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, *shape)).astype(np.float32), rng.integers(0, classes, batch)
