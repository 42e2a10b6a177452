"""`edgetrain inspect`: an artifact or checkpoint file -> a readable description (numpy only): ops,
parameters (trainable or frozen), bytes by part, the memory plan against its lower bound, provenance."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import numpy as np


def _mb(n: float) -> str:
    return f"{n / 2**20:8.2f} MiB" if n >= 2**20 else f"{n / 1024:8.1f} KiB"


def describe(path: str | os.PathLike) -> str:
    from .container import read_container

    header, tensors = read_container(path, verify=True)
    size = os.path.getsize(path)
    if "program" in header:
        return _describe_artifact(path, header, tensors, size)
    return _describe_checkpoint(path, header, tensors, size)


def _describe_artifact(path: Any, header: dict, tensors: dict, size: int) -> str:
    io = header["io"]
    nodes = header["program"]["nodes"]
    base_nodes = header["base"]["nodes"]
    params, state = set(io["parameters"]), set(io["state"])
    frozen = [
        k
        for k, v in tensors.items()
        if k not in params and k not in state and v.dtype.kind == "f" and v.size > 1
    ]
    zeros = header.get("zeros", {})
    by_part = {
        "trainable parameters": sum(tensors[k].nbytes for k in params),
        "optimizer state": sum(tensors[k].nbytes for k in state if k in tensors),
        "frozen parameters and constants": sum(
            v.nbytes for k, v in tensors.items() if k not in params | state
        ),
    }
    by_part["header, alignment, checksum"] = size - sum(by_part.values())
    if zeros:
        n = sum(int(np.prod(shape)) * np.dtype(dt).itemsize for dt, shape in zeros.values())
        by_part[f"(+ {len(zeros)} zero state tensors, declared, not stored)"] = n
    plan = header.get("plan", {})
    lines = [
        f"artifact   {path}  ({_mb(size).strip()}, format of edgetrain {header.get('edgetrain_version')})",
        f"model      {header['base'].get('name', '?')}: inputs {', '.join(io['data_inputs'])}; "
        f"outputs {', '.join(io['outputs'])}",
        f"training   loss {header['loss'].get('type')}, optimizer {_config(header['optimizer'])}",
        f"program    {len(nodes)} nodes (inference graph: {len(base_nodes)})",
        "",
    ]
    ops = Counter(n[0] for n in nodes)
    lines.append(
        "ops        " + ", ".join(f"{op} x{c}" for op, c in sorted(ops.items(), key=lambda t: (-t[1], t[0])))
    )
    lines += ["", "bytes by part:"] + [f"  {k:34s} {_mb(v)}" for k, v in by_part.items()]
    if plan:
        lines += [
            "",
            "memory plan (activations, gradients, temporaries; parameters and state not included):",
            f"  planned arena (peak)               {_mb(plan.get('arena_size', 0))}",
            f"  lower bound (most bytes live at once) {_mb(plan.get('lower_bound', 0))}",
            f"  no planning (one buffer per value) {_mb(plan.get('no_plan', 0))}",
        ]
    lines += ["", f"parameters: {len(params)} trainable, {len(frozen)} frozen"]
    for k in io["parameters"]:
        lines.append(f"  trainable {k:40s} {str(list(tensors[k].shape)):18s} {_mb(tensors[k].nbytes)}")
    for k in frozen[:40]:
        lines.append(f"  frozen    {k:40s} {str(list(tensors[k].shape)):18s} {_mb(tensors[k].nbytes)}")
    if len(frozen) > 40:
        lines.append(f"  ... and {len(frozen) - 40} more frozen")
    prov = header.get("provenance", {})
    if prov:
        lines += ["", "provenance: " + ", ".join(f"{k} {v}" for k, v in sorted(prov.items()))]
    return "\n".join(lines)


def _describe_checkpoint(path: Any, header: dict, tensors: dict, size: int) -> str:
    lines = [
        f"checkpoint {path}  ({_mb(size).strip()})",
        f"model      {header.get('artifact', '?')} (program {str(header.get('program_id', '?'))[:16]})",
        f"step       {header.get('step')}   lr {header.get('lr')}",
        f"user state {header.get('user_state', {})}",
        "",
        f"tensors: {len(tensors)}",
    ]
    for k, v in tensors.items():
        lines.append(f"  {k:48s} {str(list(v.shape)):18s} {_mb(v.nbytes)}")
    return "\n".join(lines)


def _config(cfg: dict) -> str:
    kind = cfg.get("type", "?")
    rest = ", ".join(f"{k}={v}" for k, v in cfg.items() if k != "type" and v not in (None, 0.0, False))
    return f"{kind}({rest})"
