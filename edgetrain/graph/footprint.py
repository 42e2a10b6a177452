"""The planned peak of a training step (numpy only): what a TrainingSession holds while it runs one, by part.

Both sides read it: `edgetrain inspect` (edgetrain.runtime.describe.step_memory) on an artifact file, and
`convert --memory-budget` (edgetrain.derive.budget) on an artifact being chosen, before any file is written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

# elements per chunk of the fused optimizer's update (edgetrain.runtime.fused.CHUNK: a test keeps them equal)
FUSED_CHUNK = 1 << 15


def value_bytes(program: dict[str, Any], name: str) -> int:
    """Bytes of a value of a stored program; 0 when its shape is not static."""
    dtype, shape = program["values"].get(name, ("float32", None))
    if shape is None or not all(isinstance(d, int) for d in shape):
        return 0
    return math.prod(shape) * np.dtype(dtype).itemsize


def step_footprint(
    header: dict[str, Any], tensors: Mapping[str, np.ndarray], *, fused: bool, chunk: int = FUSED_CHUNK
) -> dict[str, Any]:
    """An artifact's header and tensors -> the bytes a TrainingSession holds while it runs a training step, by part,
    and their sum, the planned peak. fused: whether the session runs the fused optimizer (the header's fused
    program, when it has one and the runtime can fuse the optimizer). The parts are what the session allocates:

    - arena: the step program's memory plan (activations, gradients, temporaries); with the fused optimizer
      (edgetrain.runtime.fused) the program is the step without its update nodes, planned on its own;
    - parameters and state: the session's own copies of the trainable parameters and the optimizer state;
    - constants: the step program's initializers (frozen weights, folded constants), read from the file's map;
    - optimizer buffers: the fused optimizer updates the parameters and state in place (they are its flat
      buffers) and holds the gradients, flat, and two chunk-sized scratch buffers per dtype (a step its bound
      cannot vouch for keeps a copy of the parameters and state for that step only: not planned); without it,
      the step's new parameters and state are outputs of the program, outside the arena;
    - outputs: the step's other outputs outside the arena (the loss, the model's outputs).

    Not counted: the interpreter's Python objects, temporaries inside kernels, the caller's batch, and the file's
    pages the map brings in beyond the constants (the initial values, read once when the session copies them)."""

    io = header["io"]
    zeros = header.get("zeros", {})

    def nbytes(name: str) -> int:
        if name in tensors:
            return int(tensors[name].nbytes)
        dtype, shape = zeros[name]
        return math.prod(shape) * np.dtype(dtype).itemsize

    params, state = list(io["parameters"]), list(io["state"])
    dtypes = [tensors[p].dtype for p in params]
    spec = header.get("fused") if fused else None
    program, plan = (spec["program"], spec["plan"]) if spec else (header["program"], header["plan"])
    p_bytes = sum(nbytes(p) for p in params)
    s_bytes = sum(nbytes(s) for s in state)
    owned = set(params) | set(state)
    constants = sum(
        int(tensors[program.get("prefix", "") + n].nbytes) for n in program["initializers"] if n not in owned
    )
    bound: set[str] = set()  # outputs written into the session's buffers, not allocated by the step
    if spec:
        bound = {spec["gradients"][p] for p in params}
        # the gradients, and two scratch chunks for each dtype's group
        sizes: dict[np.dtype, int] = {}
        for p, dt in zip(params, dtypes):
            sizes[np.dtype(dt)] = sizes.get(np.dtype(dt), 0) + int(tensors[p].size)
        buffers = p_bytes + sum(2 * min(n, chunk) * dt.itemsize for dt, n in sizes.items())
    else:
        buffers = sum(value_bytes(program, n) for n in io["updates"].values())
        bound = set(io["updates"].values())
    outputs = sum(value_bytes(program, n) for n in dict.fromkeys(program["outputs"]) if n not in bound)
    parts = {
        "arena_bytes": int(plan["arena_size"]),
        "parameters_bytes": p_bytes,
        "state_bytes": s_bytes,
        "constants_bytes": constants,
        "optimizer_buffers_bytes": buffers,
        "outputs_bytes": outputs,
    }
    peak = sum(parts.values())
    # what a memory budget counts: the frozen weights stay in the file's read-only pages (the OS drops and reads
    # them again as it needs, as a microcontroller keeps them in flash), the rest the step allocates and writes
    return {**parts, "peak_bytes": peak, "budgeted_bytes": peak - constants, "fused": bool(spec)}
