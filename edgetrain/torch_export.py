"""torch.nn.Module -> an ONNX model ready to train on the device, with its parameter manifest (needs torch and onnx).

    import edgetrain.torch_export as tx
    tx.export(model, (example,), "model.onnx")          # then: edgetrain convert model.onnx

What it does beyond torch.onnx.export: it keeps BatchNorm as nodes (training=PRESERVE, so its weights stay
parameters), makes the batch dimension symbolic, and writes a parameter manifest into the model (metadata_props,
edgetrain.derive.manifest): each ONNX initializer that holds a parameter, with its named_parameters() name, even
where the exporter renamed it (onnx::MatMul_334), stored it transposed, reshaped it, or wrote it twice (a tied head);
and which parameters the author froze (requires_grad=False, as peft leaves a LoRA model's base). `edgetrain convert`
then trains exactly what the author trains.

To find each parameter, the module is exported with probe values: every parameter filled with distinct random
numbers, twice, so that an initializer that changes with them is known to come from the parameters. The saved model
holds the real values. An initializer the exporter computed from several parameters (a BatchNorm folded into its
Conv) has no name to give: export() refuses it and says how to export instead.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgetrain.core.errors import ConfigError, ModelError

try:
    import onnx
    import torch
    from onnx import numpy_helper
except ImportError as _e:  # pragma: no cover - the helper is for PyTorch users
    raise ImportError("edgetrain.torch_export needs torch and onnx: pip install torch onnx") from _e

from edgetrain.derive.manifest import MANIFEST_KEY

__all__ = ["export"]


def export(
    module: torch.nn.Module,
    args: Any,
    path: str | os.PathLike,
    *,
    exporter: str = "torchscript",
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] = ("output",),
    dynamic_batch: bool = True,
    opset: int | None = None,
) -> dict[str, Any]:
    """Exports module(*args) to path (see the module docstring); returns the manifest written into it. exporter:
    "torchscript" (torch.onnx.export(dynamo=False)) or "dynamo"."""
    if exporter not in ("torchscript", "dynamo"):
        raise ConfigError(f"exporter must be 'torchscript' or 'dynamo', not {exporter!r}")
    args = args if isinstance(args, tuple) else (args,)
    names = list(input_names or [f"input_{k}" if len(args) > 1 else "input" for k in range(len(args))])
    params = dict(module.named_parameters())
    real = {k: p.detach().clone() for k, p in params.items()}
    kw = dict(exporter=exporter, names=names, outputs=list(output_names), dynamic=dynamic_batch, opset=opset)
    try:
        probes = []
        for seed in (1, 2):
            values = _probe(params, seed)
            probes.append((values, _export(module, args, **kw)))
    finally:
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(real[k])
    (values, proto), (_, other) = probes
    holders = _holders(proto, values)
    _refuse_folded(proto, other, holders)
    for init in proto.graph.initializer:
        if init.name in holders:
            name, how = holders[init.name]
            init.CopyFrom(numpy_helper.from_array(how(real[name].numpy()), init.name))
    manifest = {
        "version": 1,
        "parameters": {i: n for i, (n, _) in holders.items() if params[n].requires_grad},
        "frozen": {i: n for i, (n, _) in holders.items() if not params[n].requires_grad},
    }
    missing = sorted(set(params) - {n for n, _ in holders.values()})
    if missing:
        warnings.warn(
            f"{len(missing)} parameter(s) are in no initializer of the export (e.g. '{missing[0]}'): the exporter "
            "folded them away, and they will not train",
            RuntimeWarning,
            stacklevel=2,
        )
    onnx.helper.set_model_props(
        proto, {**{p.key: p.value for p in proto.metadata_props}, MANIFEST_KEY: json.dumps(manifest)}
    )
    onnx.save(proto, os.fspath(path))
    return manifest


def _probe(params: dict[str, torch.nn.Parameter], seed: int) -> dict[str, np.ndarray]:
    """Fills every float parameter with distinct random values (seeded), returns them."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    with torch.no_grad():
        for k, p in params.items():
            if p.dtype.is_floating_point:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.1)
                out[k] = p.detach().numpy().copy()
    return out


def _export(module, args, *, exporter, names, outputs, dynamic, opset) -> onnx.ModelProto:
    buf = io.BytesIO()
    kwargs: dict[str, Any] = dict(input_names=names, output_names=outputs, opset_version=opset)
    if exporter == "torchscript":
        kwargs.update(dynamo=False, training=torch.onnx.TrainingMode.PRESERVE)
        if dynamic:
            kwargs["dynamic_axes"] = {n: {0: "batch"} for n in [*names, *outputs]}
    else:
        kwargs.update(dynamo=True, verbose=False)
        if dynamic:
            kwargs["dynamic_shapes"] = tuple({0: torch.export.Dim("batch")} for _ in args)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(module, args, buf, **kwargs)
            return onnx.load_from_string(buf.getvalue())
        program = torch.onnx.export(module, args, **kwargs)
        return program.model_proto


def _holders(proto: onnx.ModelProto, values: dict[str, np.ndarray]) -> dict[str, tuple[str, Any]]:
    """ONNX initializer -> (the parameter it holds, how to lay the parameter's values out as the initializer)."""
    by_size: dict[int, list[str]] = {}
    for k, v in values.items():
        by_size.setdefault(v.size, []).append(k)
    found = {}
    for init in proto.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype.kind != "f":
            continue
        for k in by_size.get(a.size, []):
            how = _layout(values[k], a)
            if how is not None:
                found[init.name] = (k, how)
                break
    return found


def _layout(v: np.ndarray, a: np.ndarray):
    """The function that lays v out as a (equal, transposed, reshaped), or None when a does not hold v."""
    if v.shape == a.shape and np.array_equal(v, a.astype(v.dtype)):
        return lambda x: x
    if v.ndim <= 4:
        for perm in itertools.permutations(range(v.ndim)):
            if v.transpose(perm).shape == a.shape and np.array_equal(v.transpose(perm), a.astype(v.dtype)):
                return lambda x, perm=perm: np.ascontiguousarray(x.transpose(perm))
    if np.array_equal(v.reshape(a.shape), a.astype(v.dtype)):
        return lambda x, shape=a.shape: x.reshape(shape)
    return None


def _refuse_folded(proto: onnx.ModelProto, other: onnx.ModelProto, holders: dict[str, Any]) -> None:
    """An initializer that changes with the probe values but holds no one parameter was computed from several."""
    second = {t.name: t for t in other.graph.initializer}
    folded = []
    for init in proto.graph.initializer:
        twin = second.get(init.name)
        if init.name in holders or twin is None:
            continue
        a, b = numpy_helper.to_array(init), numpy_helper.to_array(twin)
        if a.dtype.kind == "f" and a.shape == b.shape and not np.array_equal(a, b):
            folded.append(init.name)
    if folded:
        raise ModelError(
            f"the exporter computed '{folded[0]}'{f' and {len(folded) - 1} more' if len(folded) > 1 else ''} from "
            "several parameters (a BatchNorm folded into its Conv, say), so no parameter trains there; export with "
            "exporter='torchscript', which keeps BatchNorm as nodes"
        )
