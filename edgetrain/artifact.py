"""TrainingArtifact <-> one `.etrain` file (numpy only): the planned training program, the inference graph for
run() and export, the initial parameters and optimizer state, the io and optimizer settings, provenance."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ArtifactError
from .ir import Graph
from .rebatch import BatchPlan

if TYPE_CHECKING:
    from .convert import TrainingArtifact
    from .memory import MemoryPlan

IO_KEYS = ("data_inputs", "target", "lr", "loss", "outputs", "parameters", "state", "updates")


def program_id(program: dict[str, Any], io: dict[str, Any]) -> str:
    """What a checkpoint is bound to: a hash of the training program's structure and interface (not of the
    weights), so a checkpoint of one model is refused by a session of another."""
    blob = json.dumps({"program": program, "io": io}, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def save_artifact(art: TrainingArtifact, path: str | os.PathLike) -> int:
    """Plans memory, serializes and writes the artifact atomically; returns the file size in bytes."""
    from . import __version__
    from .container import write_container
    from .memory import plan_memory
    from .serialize import graph_to_dict

    program, plan = plan_memory(art.graph)
    prog_dict, tensors = graph_to_dict(program)
    fused = None
    if (
        art.fused is not None
    ):  # the step without its update nodes, planned on its own (see convert._fused_program)
        fprogram, fplan = plan_memory(art.fused["graph"])
        fdict, ftensors = graph_to_dict(fprogram)
        for name, arr in ftensors.items():
            assert name not in tensors or np.array_equal(tensors[name], arr), f"tensor '{name}' differs"
            tensors.setdefault(name, arr)
        fused = {
            "program": fdict,
            "plan": fplan.to_dict(),
            "gradients": art.fused["gradients"],
            "state_roles": art.fused["state_roles"],
        }
    base_dict, base_tensors = graph_to_dict(art.base)
    for name, arr in base_tensors.items():
        if name in tensors:
            assert np.array_equal(tensors[name], arr), (
                f"tensor '{name}' differs between program and base graph"
            )
        tensors.setdefault(name, arr)
    # Optimizer state that starts at zero (momentum, Adam's moments) is declared, not stored: for Adam that is
    # two thirds of the file.
    zeros = {
        name: [arr.dtype.name, [int(d) for d in arr.shape]]
        for name, arr in art.initial.items()
        if name in art.state and name not in tensors and not np.any(arr)
    }
    for name, arr in art.initial.items():
        if name in zeros:
            continue
        tensors.setdefault(name, arr)
        assert tensors[name] is arr or np.array_equal(tensors[name], arr), f"initial '{name}' differs"
    io = {k: getattr(art, k) for k in IO_KEYS}
    header = {
        "edgetrain_version": __version__,
        "program": prog_dict,
        "program_id": program_id(prog_dict, io),
        "plan": plan.to_dict(),
        "base": base_dict,
        "io": io,
        "initial": [n for n in art.initial if n not in zeros],
        "zeros": zeros,
        "batch_plan": None if art.batch_plan is None else art.batch_plan.to_dict(),
        "fused": fused,
        "loss": art.loss_config,
        "optimizer": art.optimizer_config,
        "provenance": art.provenance,
    }
    return write_container(path, kind="artifact", header=header, tensors=tensors)


@dataclass
class LoadedArtifact:
    """What a device needs from an artifact file, read with numpy alone (tensors are read-only memory maps)."""

    path: str
    header: dict[str, Any]
    program: Graph
    base: Graph
    plan: MemoryPlan
    initial: dict[str, np.ndarray]
    tensors: dict[str, np.ndarray]
    batch_plan: BatchPlan | None = None
    fused: dict[str, Any] | None = None  # {"program": Graph, "plan": MemoryPlan, "gradients", "state_roles"}

    @property
    def io(self) -> dict[str, Any]:
        return self.header["io"]

    @property
    def program_id(self) -> str:
        return self.header["program_id"]


def load_artifact(path: str | os.PathLike, *, verify: bool = True) -> LoadedArtifact:
    from .container import read_container
    from .memory import MemoryPlan
    from .serialize import graph_from_dict

    header, tensors = read_container(path, kind="artifact", verify=verify)
    try:
        program = graph_from_dict(header["program"], tensors)
        base = graph_from_dict(header["base"], tensors)
        plan = MemoryPlan.from_dict(header["plan"])
        initial = {name: tensors[name] for name in header["initial"]}
        for name, (dtype, shape) in header.get("zeros", {}).items():
            initial[name] = _zeros(dtype, shape)
        initial = {name: initial[name] for name in header["io"]["parameters"] + header["io"]["state"]}
        batch_plan = BatchPlan.from_dict(header["batch_plan"]) if header.get("batch_plan") else None
        fused = None
        if header.get("fused"):
            f = header["fused"]
            fused = {
                "program": graph_from_dict(f["program"], tensors),
                "plan": MemoryPlan.from_dict(f["plan"]),
                "gradients": dict(f["gradients"]),
                "state_roles": {k: tuple(v) for k, v in f["state_roles"].items()},
            }
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(
            f"'{path}' is an edgetrain artifact, but its header is incomplete or damaged "
            f"({type(e).__name__}: {e}); rebuild it with `edgetrain convert`"
        ) from e
    return LoadedArtifact(os.fspath(path), header, program, base, plan, initial, tensors, batch_plan, fused)


def _zeros(dtype: str, shape: list[int]) -> np.ndarray:
    """A declared zero state tensor; np.zeros of a large shape costs no memory until it is written."""
    if (
        not isinstance(dtype, str)
        or not isinstance(shape, list)
        or not all(isinstance(d, int) for d in shape)
    ):
        raise TypeError(
            f"a declared zero tensor needs a dtype name and a list of ints, got {dtype!r}, {shape!r}"
        )
    return np.zeros(shape, np.dtype(dtype))
