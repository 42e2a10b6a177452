"""One `.etrain` file -> LoadedArtifact (numpy only): its typed record (edgetrain.graph.record: the planned training
program, the inference graph for run() and export, the initial parameters and optimizer state, the io and optimizer
settings, provenance, the rewrites' sections) and its tensors (edgetrain.derive.artifact writes it).

Loading trusts nothing a file says (anyone can recompute its checksum): the record's reader checks every field
(ArtifactRecord.read), so a bad artifact is an ArtifactError (ArtifactLimitError when it asks for more than a bound)
naming the file, the first fault and the header field it lies in."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from edgetrain.core import container
from edgetrain.core import plan as plans
from edgetrain.core.container import read_container
from edgetrain.core.errors import ConfigError
from edgetrain.core.ir import Graph
from edgetrain.core.plan import MemoryPlan
from edgetrain.graph.record import ArtifactRecord, FusedRecord, IORecord


@dataclass
class LoadedArtifact:
    """What a device needs from an artifact file, read with numpy alone (tensors are read-only memory maps)."""

    path: str
    record: ArtifactRecord
    tensors: dict[str, np.ndarray]

    @property
    def program(self) -> Graph:
        return self.record.program

    @property
    def plan(self) -> MemoryPlan:
        return self.record.plan

    @property
    def base(self) -> Graph:
        return self.record.base

    @property
    def initial(self) -> dict[str, np.ndarray]:
        return self.record.values

    @property
    def io(self) -> IORecord:
        return self.record.io

    @property
    def fused(self) -> FusedRecord | None:
        return self.record.fused

    @property
    def program_id(self) -> str:
        return self.record.program_id


def load_artifact(
    path: str | os.PathLike,
    *,
    verify: bool = True,
    max_header_bytes: int | None = None,
    max_arena_bytes: int | None = None,
) -> LoadedArtifact:
    """Reads and checks an artifact (see the module docstring). max_header_bytes bounds its header
    (container.MAX_HEADER_BYTES), max_arena_bytes its memory plans' arenas and every value it declares
    (plan.MAX_ARENA_BYTES)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(
            "an artifact is read from its file: give the path (str or os.PathLike) of an .etrain file, not a value "
            f"of type {type(path).__name__}"
        )
    path = os.fspath(path)
    max_header = container.MAX_HEADER_BYTES if max_header_bytes is None else max_header_bytes
    max_arena = plans.MAX_ARENA_BYTES if max_arena_bytes is None else max_arena_bytes
    header, tensors = read_container(path, kind="artifact", verify=verify, max_header_bytes=max_header)
    record = ArtifactRecord.read(header, tensors, path=path, max_arena_bytes=max_arena)
    return LoadedArtifact(path, record, tensors)
