"""The architectures of tests/harness/models.py in PyTorch, loaded with the ONNX models' initializers (needs torch)."""

from __future__ import annotations

import numpy as np
import torch

nn = torch.nn

# torch Sequential indices -> the layer names of tests/harness/models.py (the ONNX initializer prefixes)
LAYER_NAMES = {
    "mlp": {"0": "fc1", "2": "fc2"},
    "lenet": {"0": "conv1", "3": "conv2", "7": "fc1", "9": "fc2", "11": "fc3"},
}


def torch_model(name: str, weights: dict[str, np.ndarray]) -> nn.Module:
    """The same architecture as tests/harness/models.py, in torch, with the ONNX initializers as parameters."""
    if name == "mlp":
        net = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    elif name == "lenet":
        net = nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(400, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, 10),
        )
    elif name == "resnet_tiny":
        net = _ResNetTiny()
    elif name == "depthwise_separable":
        net = _Depthwise()
    else:
        raise KeyError(name)
    names = LAYER_NAMES.get(name, {})
    state = {}
    for key in net.state_dict():
        prefix, _, leaf = key.rpartition(".")
        onnx_name = f"{names.get(prefix, prefix)}.{leaf}"
        if onnx_name == "head.weight":
            state[key] = torch.from_numpy(weights["head.weight"].T.copy())  # MatMul [16, 5] = Linear weight^T
        elif leaf == "num_batches_tracked":
            state[key] = torch.tensor(0)
        else:
            state[key] = torch.from_numpy(weights[onnx_name].copy())
    net.load_state_dict(state)
    return net


class _ResNetTiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(8)
        self.block = nn.Module()
        self.block.conv1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.block.bn1 = nn.BatchNorm2d(8)
        self.block.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.block.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        h = torch.relu(self.stem_bn(self.stem(x)))
        r = torch.relu(self.block.bn1(self.block.conv1(h)))
        h = torch.relu(self.block.bn2(self.block.conv2(r)) + h)
        return self.fc(h.mean(dim=(2, 3)))


class _Depthwise(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.dw_bn = nn.BatchNorm2d(8)
        self.pw = nn.Conv2d(8, 16, 1)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        h = torch.relu(self.conv1(x))
        h = torch.relu(self.dw_bn(self.dw(h)))
        h = torch.relu(self.pw(h))
        return self.head(nn.functional.avg_pool2d(h, 8).flatten(1))
