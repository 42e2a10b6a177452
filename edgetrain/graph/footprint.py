"""The planned peak of a training step (numpy only): what a TrainingSession holds while it runs one, by part.

Both sides read it, on an artifact's record (edgetrain.graph.record): `edgetrain inspect`
(edgetrain.runtime.describe.step_memory) on an artifact file's, and `convert --memory-budget` (edgetrain.derive.budget)
on the record of an artifact being chosen, before any file is written.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edgetrain.core.ir import Graph

from .record import ArtifactRecord

# elements per chunk of the fused optimizer's update (edgetrain.runtime.fused.CHUNK: a test keeps them equal)
FUSED_CHUNK = 1 << 15


def value_bytes(program: Graph, name: str) -> int:
    """Bytes of a value of a program; 0 when its shape is not static (or the program does not declare it)."""
    info = program.values.get(name)
    if info is None or not info.is_static:
        return 0
    return math.prod(info.shape) * np.dtype(info.dtype).itemsize


def step_footprint(record: ArtifactRecord, *, fused: bool, chunk: int = FUSED_CHUNK) -> dict[str, Any]:
    """An artifact's record -> the bytes a TrainingSession holds while it runs a training step, by part, and their
    sum, the planned peak. fused: whether the session runs the fused optimizer (the record's fused program, when it
    has one and the runtime can fuse the optimizer). The parts are what the session allocates:

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
    io, values = record.io, record.values
    params, state = list(io.parameters), list(io.state)
    spec = record.fused if fused else None
    program, plan = (spec.program, spec.plan) if spec else (record.program, record.plan)
    p_bytes = sum(int(values[p].nbytes) for p in params)
    s_bytes = sum(int(values[s].nbytes) for s in state)
    owned = set(params) | set(state)
    constants = sum(int(a.nbytes) for n, a in program.initializers.items() if n not in owned)
    if spec:
        bound = {
            spec.gradients[p] for p in params
        }  # written into the session's buffers, not allocated by the step
        # the gradients, and two scratch chunks for each dtype's group
        sizes: dict[np.dtype, int] = {}
        for p in params:
            sizes[values[p].dtype] = sizes.get(values[p].dtype, 0) + int(values[p].size)
        buffers = p_bytes + sum(2 * min(n, chunk) * dt.itemsize for dt, n in sizes.items())
    else:
        buffers = sum(value_bytes(program, n) for n in io.updates.values())
        bound = set(io.updates.values())
    outputs = sum(value_bytes(program, n) for n in dict.fromkeys(program.outputs) if n not in bound)
    parts = {
        "arena_bytes": int(plan.arena_size),
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
