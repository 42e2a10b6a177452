"""An independent PyTorch reference for quantization-aware training (QAT) of an int8 QDQ ONNX model: TorchTwin
runs the graph op by op in torch (it imports nothing of edgetrain), with the model's quantization written as
PyTorch's fake quantization:

- a DequantizeLinear of an int8/uint8 weight initializer `X_quantized` (with its scale, zero point and axis) is
  torch.fake_quantize_per_tensor_affine / per_channel_affine, over the integer type's full range (int8 -128..127,
  uint8 0..255), of a float32 nn.Parameter named `X` (the `_quantized` suffix dropped) that starts at the
  dequantized value (q - zp) * scale, the "master weight";
- a DequantizeLinear of an int32 bias `B_quantized` is a plain nn.Parameter named as the DequantizeLinear's output,
  starting at (B_q - zp) * scale and never fake-quantized (PyTorch's QAT leaves biases float);
- a QuantizeLinear -> DequantizeLinear pair on an activation is torch.fake_quantize_per_tensor_affine (or
  per_channel_affine) with the QuantizeLinear's scale and zero point;
- an int8 initializer of one value (an exporter's literal number quantized as a weight, e.g. attention's 1/sqrt(d)
  or GELU's 0.5) stays a constant: no module trains a literal; train_literals=True makes it a parameter too.

Backward is torch's own autograd: the straight-through estimator that passes the gradient where the rounded value
lies inside the quantization range (the fake_quantize_* "cachemask" rule). Scales and zero points are fixed.
Parameter names keep their dots as module paths, so named_parameters() yields the names edgetrain uses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

F = torch.nn.functional

QRANGE = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}
QTYPE = {onnx.TensorProto.INT8: np.dtype(np.int8), onnx.TensorProto.UINT8: np.dtype(np.uint8)}


class TwinError(NotImplementedError):
    """The model holds something the twin does not evaluate: the node, its op and why."""


class _Scope(torch.nn.Module):
    """A plain container: one level of a dotted parameter name."""


class _FakeQuant:
    """Fake quantization with fixed scale / zero point, per tensor or per channel (torch's own op and gradient)."""

    def __init__(self, scale: np.ndarray, zero_point: np.ndarray, qtype: np.dtype, axis: int, where: str):
        if qtype not in QRANGE:
            raise TwinError(f"{where}: quantized type {qtype} (the twin fake-quantizes int8 and uint8 only)")
        self.qmin, self.qmax = QRANGE[qtype]
        scale = np.asarray(scale, np.float32)
        zero_point = np.asarray(zero_point).astype(np.int64)
        self.per_channel = scale.size > 1
        if self.per_channel:
            if scale.ndim != 1 or zero_point.shape not in ((), scale.shape):
                raise TwinError(f"{where}: scale {scale.shape} / zero point {zero_point.shape} (blocked?)")
            self.axis = axis
            self.scale = torch.from_numpy(scale.copy())
            self.zero_point = torch.from_numpy(np.broadcast_to(zero_point, scale.shape).astype(np.int32))
        else:
            self.scale_f, self.zp_i = float(scale.reshape(-1)[0]), int(zero_point.reshape(-1)[0])
        if np.any(scale <= 0) or not np.all(np.isfinite(scale)):
            raise TwinError(f"{where}: a scale that is not finite and positive")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise TwinError(f"fake quantization of {x.dtype}: torch's fake_quantize needs float32")
        if self.per_channel:
            axis = self.axis % x.dim()
            return torch.fake_quantize_per_channel_affine(
                x, self.scale, self.zero_point, axis, self.qmin, self.qmax
            )
        return torch.fake_quantize_per_tensor_affine(x, self.scale_f, self.zp_i, self.qmin, self.qmax)


def dequantize(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, axis: int) -> np.ndarray:
    """(q - zp) * scale in float32, as DequantizeLinear computes it (the integer difference is exact in float32 for
    8-bit values, and the one product rounds once)."""
    scale = np.asarray(scale, np.float32)
    zp = np.zeros((), np.int64) if zero_point is None else np.asarray(zero_point).astype(np.int64)
    if scale.size > 1:
        shape = [1] * q.ndim
        shape[axis % q.ndim] = scale.size
        scale, zp = scale.reshape(shape), np.broadcast_to(zp, scale.shape).reshape(shape)
    diff = q.astype(np.int64) - zp
    return np.asarray(diff.astype(np.float32) * scale, dtype=np.float32)


def master_name(initializer: str) -> str:
    """The float parameter a quantized weight initializer becomes: `X_quantized` -> `X`."""
    return initializer[: -len("_quantized")] if initializer.endswith("_quantized") else initializer


class TorchTwin(torch.nn.Module):
    """The QDQ model `path` as a torch module for quantization-aware training (see the module's doc).

    forward(*inputs) returns the graph's outputs (one tensor, or a tuple); logits(*inputs) returns what a
    cross-entropy loss reads: the input of a final Softmax/LogSoftmax (through a fake quantization between it and
    the output, if there is one), else the output itself. Inputs may be numpy arrays or tensors."""

    def __init__(self, path: str | Path | onnx.ModelProto, *, train_literals: bool = False):
        super().__init__()
        model = path if isinstance(path, onnx.ModelProto) else onnx.load(str(path))
        graph = model.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.input_names = [i.name for i in graph.input if i.name not in inits]
        self.output_names = [o.name for o in graph.output]
        producer = {o: n for n in graph.node for o in n.output if o}
        consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in graph.node:
            for i in n.input:
                consumers.setdefault(i, []).append(n)
        self._consts: dict[str, torch.Tensor] = {}
        self._params: dict[str, torch.nn.Parameter] = {}
        self._steps: list[tuple[onnx.NodeProto, Callable]] = []
        self.weights: dict[str, str] = {}  # parameter -> the int8 initializer it trains (X -> X_quantized)
        self.biases: dict[str, str] = {}  # parameter -> the int32 initializer it trains
        self.fake_quantized: dict[str, str] = {}  # DequantizeLinear output -> what it fake-quantizes
        # DequantizeLinear output -> its scale (when per tensor), for tolerances
        self.scales: dict[str, float] = {}
        self._weight_fq: dict[str, _FakeQuant] = {}  # parameter -> its (first) fake quantization
        used = {i for n in graph.node for i in n.input}

        def const(name: str, node: onnx.NodeProto) -> np.ndarray:
            if name not in inits:
                raise TwinError(f"node '{node.name}' ({node.op_type}): '{name}' must be an initializer")
            return inits[name]

        def attrs(node: onnx.NodeProto) -> dict:
            return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}

        for node in graph.node:
            if node.domain not in ("", "ai.onnx"):
                raise TwinError(
                    f"node '{node.name}': op {node.domain}:{node.op_type} (standard ONNX ops only)"
                )
            a = attrs(node)
            where = f"node '{node.name}' ({node.op_type})"
            if a.get("block_size", 0):
                raise TwinError(f"{where}: blocked quantization")
            if node.op_type == "QuantizeLinear":
                users = consumers.get(node.output[0], [])
                if node.output[0] in self.output_names or any(u.op_type != "DequantizeLinear" for u in users):
                    raise TwinError(f"{where}: a QuantizeLinear read by anything but DequantizeLinear")
                continue  # its DequantizeLinear is the fake quantization
            if node.op_type != "DequantizeLinear":
                if node.op_type == "LayerNormalization" and any(node.output[1:]):
                    raise TwinError(f"{where}: LayerNormalization's mean / inverse deviation outputs")
                if node.op_type not in OPS:
                    raise TwinError(
                        f"{where}: the twin does not evaluate {node.op_type} (it does: {', '.join(sorted(OPS))})"
                    )
                self._steps.append((node, _bind(OPS[node.op_type], a, self.opset, where)))
                continue
            x, scale_name = node.input[0], node.input[1]
            zp_name = node.input[2] if len(node.input) > 2 and node.input[2] else None
            axis = a.get("axis", 1)
            src = producer.get(x)
            if src is not None and src.op_type == "QuantizeLinear":  # an activation's fake quantization
                q_scale, q_zp = const(src.input[1], src), None
                if len(src.input) > 2 and src.input[2]:
                    q_zp = const(src.input[2], src)
                dq_scale, dq_zp = const(scale_name, node), const(zp_name, node) if zp_name else None
                same_zp = (q_zp is None and dq_zp is None) or (
                    q_zp is not None and dq_zp is not None and np.array_equal(q_zp, dq_zp)
                )
                if not (np.array_equal(q_scale, dq_scale) and same_zp):
                    raise TwinError(
                        f"{where}: its scale / zero point differ from QuantizeLinear '{src.name}'"
                    )
                qtype = q_zp.dtype if q_zp is not None else _output_dtype(src)
                q_axis = attrs(src).get("axis", 1)
                fq = _FakeQuant(q_scale, 0 if q_zp is None else q_zp, qtype, q_axis, where)
                self._steps.append((node, _activation(src.input[0], fq)))
                self.fake_quantized[node.output[0]] = src.input[0]
                if q_scale.size == 1:
                    self.scales[node.output[0]] = float(q_scale.reshape(-1)[0])
                continue
            if x not in inits:
                raise TwinError(
                    f"{where}: dequantizes '{x}', neither an initializer nor a QuantizeLinear's output"
                )
            q = inits[x]
            scale = const(scale_name, node)
            zp = const(zp_name, node) if zp_name else None
            value = dequantize(q, scale, zp, axis)
            if q.dtype == np.int32:  # a bias: float, never fake-quantized
                name = node.output[0]
                self._add_param(name, value)
                self.biases[name] = x
                self._steps.append((node, _read(name, self._params)))
                continue
            fq = _FakeQuant(scale, 0 if zp is None else zp, q.dtype, axis, where)
            if q.size == 1 and not train_literals:  # a literal number: a fake-quantized constant
                self._consts[x + "#master"] = torch.from_numpy(value.copy())
                self._steps.append((node, _activation(x + "#master", fq, self._consts)))
            else:
                name = master_name(x)
                if name in self._params:
                    if not np.array_equal(self._params[name].detach().numpy(), value):
                        raise TwinError(f"{where}: '{x}' dequantized two ways")
                else:
                    self._add_param(name, value)
                    self.weights[name] = x
                    self._weight_fq[name] = fq
                self._steps.append((node, _weight(name, self._params, fq)))
            if scale.size == 1:
                self.scales[node.output[0]] = float(scale.reshape(-1)[0])
            self.fake_quantized[node.output[0]] = x
        for name, arr in inits.items():
            if name in used and not any(
                name == n.input[0] for n in graph.node if n.op_type == "DequantizeLinear"
            ):
                self._consts[name] = torch.from_numpy(np.array(arr))
        self._logits = self._find_logits(producer)

    # ---- structure -------------------------------------------------------------------------------------------
    def _add_param(self, name: str, value: np.ndarray) -> None:
        parts = name.split(".")
        if any(not p for p in parts):
            raise TwinError(f"parameter name '{name}' has an empty part")
        scope: torch.nn.Module = self
        for part in parts[:-1]:
            child = scope._modules.get(part)
            if child is None:
                if hasattr(scope, part):
                    raise TwinError(f"parameter name '{name}': '{part}' clashes with an attribute")
                child = _Scope()
                scope.add_module(part, child)
            scope = child
        if parts[-1] in scope._modules or hasattr(scope, parts[-1]):
            raise TwinError(f"parameter name '{name}' clashes with another name")
        param = torch.nn.Parameter(torch.from_numpy(np.array(value, np.float32)))
        scope.register_parameter(parts[-1], param)
        self._params[name] = param

    def _find_logits(self, producer: Mapping[str, onnx.NodeProto]) -> str:
        out = self.output_names[0]
        value = out
        node = producer.get(value)
        if node is not None and node.op_type == "DequantizeLinear" and value in self.fake_quantized:
            src = self.fake_quantized[value]
            if src in producer:  # an activation's fake quantization: look under it
                value, node = src, producer.get(src)
        if node is not None and node.op_type in ("Softmax", "LogSoftmax"):
            return node.input[0]
        return out

    @property
    def logits_name(self) -> str:
        return self._logits

    def fake_quantize_weight(self, name: str, value: np.ndarray | torch.Tensor | None = None) -> torch.Tensor:
        """The int8 weight `name` as the forward reads it: the fake quantization of `value` (default: the current
        master weight), in the parameter's shape."""
        master = self._params[name]
        v = master.detach() if value is None else torch.as_tensor(np.asarray(value, np.float32))
        with torch.no_grad():
            return self._weight_fq[name](v.reshape(master.shape))

    # ---- running ---------------------------------------------------------------------------------------------
    def values(self, *inputs, **named) -> dict[str, torch.Tensor]:
        """Every value of the graph on these inputs."""
        env: dict[str, torch.Tensor] = dict(self._consts)
        feeds = dict(zip(self.input_names, inputs))
        feeds.update(named)
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise TwinError(f"missing inputs {missing}")
        for k, v in feeds.items():
            env[k] = torch.as_tensor(v) if not isinstance(v, torch.Tensor) else v
        for node, fn in self._steps:
            ins = [env[i] if i else None for i in node.input] if node.op_type != "DequantizeLinear" else []
            outs = fn(env, ins)
            if isinstance(outs, torch.Tensor):
                outs = [outs]
            for name, t in zip(node.output, outs):
                if name:
                    env[name] = t
        return env

    def forward(self, *inputs, **named):
        env = self.values(*inputs, **named)
        outs = tuple(env[o] for o in self.output_names)
        return outs[0] if len(outs) == 1 else outs

    def logits(self, *inputs, **named) -> torch.Tensor:
        return self.values(*inputs, **named)[self._logits]

    def nearest_ties(
        self, env: Mapping[str, torch.Tensor], within: float = 2.0
    ) -> dict[str, tuple[int, float]]:
        """Activations (per-tensor fake quantizations) that came within `within` float32 ulps of a rounding tie in
        the run that made `env` (values()): {value: (how many elements, the nearest in ulps)}. Another float32
        implementation may round those the other way: a one-step difference that training carries on."""
        out = {}
        for dq, src in self.fake_quantized.items():
            if (
                dq not in self.scales
                or src not in env
                or src in self.weights.values()
                or src.endswith("#master")
            ):
                continue
            v = env[src].detach().double().numpy() / self.scales[dq]
            ulps = np.abs(v - np.floor(v) - 0.5) / (np.maximum(np.abs(v), 1.0) * 2.0**-23)
            near = ulps < within
            if near.any():
                out[src] = (int(near.sum()), float(ulps.min()))
        return out


def _output_dtype(q: onnx.NodeProto) -> np.dtype:
    for a in q.attribute:
        if a.name == "output_dtype" and a.i:
            if a.i not in QTYPE:
                raise TwinError(f"node '{q.name}': output_dtype {a.i} (int8 and uint8 only)")
            return QTYPE[a.i]
    return np.dtype(np.uint8)  # QuantizeLinear without a zero point: uint8


def _activation(src: str, fq: _FakeQuant, consts: Mapping[str, torch.Tensor] | None = None) -> Callable:
    def run(env, ins):
        return fq(env[src] if consts is None else consts[src])

    return run


def _weight(name: str, params: Mapping[str, torch.nn.Parameter], fq: _FakeQuant) -> Callable:
    def run(env, ins):
        return fq(params[name])

    return run


def _read(name: str, params: Mapping[str, torch.nn.Parameter]) -> Callable:
    def run(env, ins):
        return params[name]

    return run


def _bind(fn: Callable, a: dict, opset: int, where: str) -> Callable:
    def run(env, ins):
        return fn(ins, a, opset, where)

    return run


# ---- the ops ---------------------------------------------------------------------------------------------------
def _ints(t: torch.Tensor | None) -> list[int]:
    return [] if t is None else [int(v) for v in t.reshape(-1).tolist()]


def _conv(ins, a, opset, where):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    nd = w.dim() - 2
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        raise TwinError(f"{where}: auto_pad {a['auto_pad']}")
    pads = list(a.get("pads", [0] * 2 * nd))
    strides, dil = a.get("strides", [1] * nd), a.get("dilations", [1] * nd)
    if pads[:nd] != pads[nd:]:
        x = F.pad(x, [p for i in reversed(range(nd)) for p in (pads[i], pads[i + nd])])
        pads = [0] * 2 * nd
    conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
    return conv(x, w, b, tuple(strides), tuple(pads[:nd]), tuple(dil), a.get("group", 1))


def _pool(kind):
    def run(ins, a, opset, where):
        x = ins[0]
        k = list(a["kernel_shape"])
        nd = len(k)
        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
            raise TwinError(f"{where}: auto_pad {a['auto_pad']}")
        pads = list(a.get("pads", [0] * 2 * nd))
        strides, dil = list(a.get("strides", [1] * nd)), list(a.get("dilations", [1] * nd))
        ceil = bool(a.get("ceil_mode", 0))
        symmetric = pads[:nd] == pads[nd:] and all(p <= kk // 2 for p, kk in zip(pads[:nd], k))
        if not symmetric:
            if ceil:
                raise TwinError(f"{where}: ceil_mode with asymmetric pads")
            if kind == "avg" and not a.get("count_include_pad", 0) and any(pads):
                raise TwinError(f"{where}: asymmetric pads excluded from the average")
            fill = -math.inf if kind == "max" else 0.0
            x = F.pad(x, [p for i in reversed(range(nd)) for p in (pads[i], pads[i + nd])], value=fill)
            pads = [0] * 2 * nd
        if kind == "max":
            if len(ins) > 1 or a.get("storage_order", 0):
                raise TwinError(f"{where}: MaxPool indices")
            fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[nd - 1]
            return fn(x, k, strides, pads[:nd], dil, ceil_mode=ceil)
        if any(d != 1 for d in dil):
            raise TwinError(f"{where}: dilated AveragePool")
        fn = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[nd - 1]
        return fn(
            x, k, strides, pads[:nd], ceil_mode=ceil, count_include_pad=bool(a.get("count_include_pad", 0))
        )

    return run


def _gemm(ins, a, opset, where):
    A, B = ins[0], ins[1]
    C = ins[2] if len(ins) > 2 else None
    if a.get("transA", 0):
        A = A.t()
    if a.get("transB", 0):
        B = B.t()
    y = A @ B
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
    if alpha != 1.0:
        y = y * alpha
    if C is not None:
        y = y + (C if beta == 1.0 else C * beta)
    return y


def _reshape(ins, a, opset, where):
    x, shape = ins[0], _ints(ins[1])
    if not a.get("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _flatten(ins, a, opset, where):
    x = ins[0]
    axis = a.get("axis", 1) % (x.dim() + 1) if x.dim() else 0
    lead = int(np.prod(x.shape[:axis])) if axis else 1
    return x.reshape(lead, -1)


def _softmax(log: bool):
    def run(ins, a, opset, where):
        if opset < 13:
            raise TwinError(f"{where}: Softmax before opset 13 (2-D coercion)")
        axis = a.get("axis", -1)
        return (F.log_softmax if log else F.softmax)(ins[0], dim=axis)

    return run


def _axes(ins, a, opset, pos=1):
    if "axes" in a:
        return list(a["axes"])
    return _ints(ins[pos]) if len(ins) > pos and ins[pos] is not None else None


def _reduce(fn):
    def run(ins, a, opset, where):
        x = ins[0]
        axes = _axes(ins, a, opset)
        keep = bool(a.get("keepdims", 1))
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                return x
            axes = list(range(x.dim()))
        return fn(x, dim=[ax % x.dim() for ax in axes], keepdim=keep)

    return run


def _layernorm(ins, a, opset, where):
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    axis = a.get("axis", -1) % x.dim()
    shape = tuple(x.shape[axis:])
    eps = a.get("epsilon", 1e-5)
    if tuple(scale.shape) == shape and (bias is None or tuple(bias.shape) == shape):
        return F.layer_norm(x, shape, scale, bias, eps)
    y = F.layer_norm(x, shape, None, None, eps) * scale
    return y if bias is None else y + bias


def _slice(ins, a, opset, where):
    x = ins[0]
    starts, ends = _ints(ins[1]), _ints(ins[2])
    axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
    steps = _ints(ins[4]) if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    index = [slice(None)] * x.dim()
    for s, e, ax, st in zip(starts, ends, axes, steps):
        if st <= 0:
            raise TwinError(f"{where}: a step of {st}")
        n = x.shape[ax]
        s = max(0, min(n, s + n if s < 0 else s))
        e = max(0, min(n, e + n if e < 0 else e))
        index[ax % x.dim()] = slice(s, e, st)
    return x[tuple(index)]


def _split(ins, a, opset, where):
    x = ins[0]
    axis = a.get("axis", 0)
    sizes = _ints(ins[1]) if len(ins) > 1 and ins[1] is not None else list(a.get("split", []))
    if not sizes:
        parts = a.get("num_outputs")
        if parts is None:
            raise TwinError(f"{where}: Split without sizes or num_outputs (the twin needs one)")
        n = x.shape[axis]
        size = -(-n // parts)
        sizes = [min(size, n - i * size) for i in range(parts)]
    return list(torch.split(x, sizes, dim=axis))


def _gelu(ins, a, opset, where):
    approx = a.get("approximate", b"none")
    approx = approx.decode() if isinstance(approx, bytes) else approx
    return F.gelu(ins[0], approximate=approx)


def _unsqueeze(ins, a, opset, where):
    x = ins[0]
    axes = sorted(ax % (x.dim() + len(_axes(ins, a, opset))) for ax in _axes(ins, a, opset))
    for ax in axes:
        x = x.unsqueeze(ax)
    return x


def _squeeze(ins, a, opset, where):
    x = ins[0]
    axes = _axes(ins, a, opset)
    if axes is None:
        return x.squeeze()
    for ax in sorted((ax % x.dim() for ax in axes), reverse=True):
        x = x.squeeze(ax)
    return x


def _clip(ins, a, opset, where):
    lo = ins[1] if len(ins) > 1 and ins[1] is not None else a.get("min")
    hi = ins[2] if len(ins) > 2 and ins[2] is not None else a.get("max")
    return torch.clamp(ins[0], min=lo, max=hi)


def _constant(ins, a, opset, where):
    if "value" not in a:
        raise TwinError(f"{where}: Constant other than a tensor value")
    return torch.from_numpy(np.array(numpy_helper.to_array(a["value"])))


def _gather(ins, a, opset, where):
    x, idx = ins[0], ins[1].long()
    axis = a.get("axis", 0) % x.dim()
    idx = torch.where(idx < 0, idx + x.shape[axis], idx)
    return torch.index_select(x, axis, idx.reshape(-1)).reshape(
        *x.shape[:axis], *idx.shape, *x.shape[axis + 1 :]
    )


def _elementwise(fn):
    return lambda ins, a, opset, where: fn(*ins)


OPS: dict[str, Callable] = {
    "Conv": _conv,
    "Gemm": _gemm,
    "MatMul": _elementwise(torch.matmul),
    "Add": _elementwise(torch.add),
    "Sub": _elementwise(torch.sub),
    "Mul": _elementwise(torch.mul),
    "Div": _elementwise(torch.div),
    "Pow": _elementwise(torch.pow),
    "Relu": _elementwise(F.relu),
    "LeakyRelu": lambda ins, a, opset, where: F.leaky_relu(ins[0], a.get("alpha", 0.01)),
    "Sigmoid": _elementwise(torch.sigmoid),
    "Tanh": _elementwise(torch.tanh),
    "Erf": _elementwise(torch.erf),
    "Sqrt": _elementwise(torch.sqrt),
    "Exp": _elementwise(torch.exp),
    "Neg": _elementwise(torch.neg),
    "Identity": _elementwise(lambda x: x),
    "Gelu": _gelu,
    "Clip": _clip,
    "MaxPool": _pool("max"),
    "AveragePool": _pool("avg"),
    "GlobalAveragePool": lambda ins, a, opset, where: ins[0].mean(
        dim=tuple(range(2, ins[0].dim())), keepdim=True
    ),
    "GlobalMaxPool": lambda ins, a, opset, where: ins[0].amax(
        dim=tuple(range(2, ins[0].dim())), keepdim=True
    ),
    "Flatten": _flatten,
    "Reshape": _reshape,
    "Transpose": lambda ins, a, opset, where: ins[0].permute(
        *a.get("perm", list(reversed(range(ins[0].dim()))))
    ),
    "Softmax": _softmax(False),
    "LogSoftmax": _softmax(True),
    "ReduceMean": _reduce(torch.mean),
    "ReduceSum": _reduce(torch.sum),
    "LayerNormalization": _layernorm,
    "Concat": lambda ins, a, opset, where: torch.cat([t for t in ins if t is not None], dim=a["axis"]),
    "Split": _split,
    "Slice": _slice,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Gather": _gather,
    "Constant": _constant,
}
