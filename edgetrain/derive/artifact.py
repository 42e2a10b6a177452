"""TrainingArtifact, the derived training step and all a device needs to run, resume and export it -> one `.etrain`
file (numpy only): the step planned (edgetrain.graph.memory), the inference graph for run() and export, the
initial parameters and optimizer state, the io and optimizer settings, provenance. edgetrain.runtime.artifact
reads it back."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from edgetrain import __version__
from edgetrain.core.container import write_container
from edgetrain.core.ir import Graph
from edgetrain.graph.memory import plan_memory
from edgetrain.graph.record import (
    ArtifactRecord,
    FusedRecord,
    IORecord,
    ProvenanceRecord,
    loss_record,
    optimizer_record,
)
from edgetrain.graph.sections import Section

from .autodiff import expand_body
from .params import Roles

S = TypeVar("S", bound=Section)
UPDATED = ".updated"  # output name of the next value of a parameter or state tensor: f"{name}.updated"


@dataclass(frozen=True)
class FusedStep:
    """The step without its update nodes, for an optimizer the runtime runs as a fused kernel (SGD, Adam, AdamW):
    its outputs are the loss, the model's outputs and each parameter's gradient (`gradients`: parameter -> output),
    and each optimizer state tensor's role (`state_roles`: name -> (kind, parameter))."""

    graph: Graph
    gradients: dict[str, str]
    state_roles: dict[str, tuple[str, str]]


@dataclass
class TrainingArtifact:
    """One derived training step and everything needed to run, resume and export it."""

    graph: Graph  # the step; parameters and optimizer state are graph inputs
    inference: Graph  # the static inference graph, with the initial parameters
    base: Graph  # the inference graph before shapes were fixed (symbolic batch kept): for run() and export
    parameters: list[str]  # trainable parameters (ONNX initializer names)
    state: list[str]  # optimizer state inputs
    initial: dict[str, np.ndarray]  # initial value of every parameter and state input
    updates: dict[str, str]  # parameter or state input -> output holding its next value
    data_inputs: list[str]
    target: str
    lr: str
    loss: str
    outputs: list[str]  # the model's outputs, also outputs of the step
    loss_config: dict[str, Any] = field(default_factory=dict)
    optimizer_config: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    roles: Roles | None = None  # every initializer's role in the imported model (build side only)
    # what conversion did that the user should know (re-batching)
    notes: list[str] = field(default_factory=list)
    # the step for the runtime's fused optimizer (see pipeline._fused_program), or None: the runtime runs `graph`
    fused: FusedStep | None = None
    # the sections the rewrites applied at convert leave for the device, by header key (edgetrain.graph.sections)
    sections: dict[str, Section] = field(default_factory=dict)

    def section(self, cls: type[S]) -> S | None:
        """The section of that kind, if a rewrite left one."""
        s = self.sections.get(cls.KEY)
        return s if isinstance(s, cls) else None

    @property
    def frozen(self) -> list[str]:
        """Parameters of the model (by role) that this artifact does not train."""
        candidates = self.roles.parameters if self.roles is not None else []
        return [p for p in candidates if p not in self.parameters]

    def feeds(
        self,
        x: dict[str, np.ndarray] | np.ndarray,
        y: np.ndarray,
        lr: float | None = None,
        values: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """The step's feeds: data (a dict, or one array for a single-input model), target, lr, and parameters
        and state (their initial values unless given)."""
        data = x if isinstance(x, dict) else {self.data_inputs[0]: x}
        lr_value = self.optimizer_config.get("lr", 0.0) if lr is None else lr
        feeds = {**data, self.target: y, self.lr: np.asarray(lr_value, np.float32)}
        feeds.update(values if values is not None else self.initial)
        return feeds

    def save(self, path) -> int:
        """Writes the artifact (`.etrain`): planned program, inference graph, initial state; returns its size."""
        return save_artifact(self, path)

    def training_onnx(self):
        """One training step as a standard ONNX model: parameters and optimizer state are graph inputs whose
        initial values are initializers, so feeding only data, target and lr runs one step from the initial
        state. Fused ops become ONNX functions in standard ops. Needs onnx."""
        from edgetrain.onnx_io.writer import to_onnx  # needs onnx: an optional dependency

        stateful = self.parameters + self.state
        g = self.graph.copy(
            inputs=[i for i in self.graph.inputs if i not in stateful],
            initializers={**self.graph.initializers, **self.initial},
        )
        g.name = f"{self.inference.name}_training_step"
        return to_onnx(g, inputs_with_defaults=stateful, body=expand_body)


def save_artifact(art: TrainingArtifact, path: str | os.PathLike) -> int:
    """Plans memory, serializes and writes the artifact atomically; returns the file size in bytes."""
    header, tensors = artifact_contents(art)
    return write_container(path, kind="artifact", header=header, tensors=tensors)


def artifact_record(art: TrainingArtifact, *, fused_only: bool = False) -> ArtifactRecord:
    """The artifact's record (edgetrain.graph.record): the step planned (and the fused step, planned on its own),
    the base graph, the initial state, the settings, and the rewrites' sections. fused_only: the whole step is not
    planned when there is a fused one (for its planned peak, not for a file)."""
    program, plan = plan_memory(art.graph, reorder=not (fused_only and art.fused is not None))
    fused = None
    if (
        art.fused is not None
    ):  # the step without its update nodes, planned on its own (see convert._fused_program)
        fprogram, fplan = plan_memory(art.fused.graph)
        roles = dict(art.fused.state_roles)
        fused = FusedRecord(program=fprogram, plan=fplan, gradients=art.fused.gradients, state_roles=roles)
    io = IORecord(**{f: tuple(v) if isinstance(v, list) else v for f, v in _io(art).items()})
    return ArtifactRecord(
        values=dict(art.initial),
        sections=dict(art.sections),
        program_id="",
        optimizer=optimizer_record(art.optimizer_config),
        loss=loss_record(art.loss_config),
        program=program,
        base=art.base,
        plan=plan,
        io=io,
        initial=(),
        fused=fused,
        provenance=ProvenanceRecord(**art.provenance),
        edgetrain_version=__version__,
    )


def _io(art: TrainingArtifact) -> dict[str, Any]:
    return {
        "data_inputs": art.data_inputs,
        "target": art.target,
        "lr": art.lr,
        "loss": art.loss,
        "outputs": art.outputs,
        "parameters": art.parameters,
        "state": art.state,
        "updates": art.updates,
    }


def artifact_contents(
    art: TrainingArtifact, *, fused_only: bool = False
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The artifact file's header and tensors (artifact_record, written)."""
    return artifact_record(art, fused_only=fused_only).write()
