"""Checkpoints and adapter files of a TrainingSession (numpy only): their typed records, read and checked in one
place before anything is restored, and written atomically (edgetrain.core.container: a kill at any instant leaves
the old file or the new one, whole).

A checkpoint (kind "checkpoint", `.etck`) holds the parameters and optimizer state, the step count and learning
rate, the input pipeline the data was fed by when one was declared, and the caller's user_state (a Trainer's run:
edgetrain.runtime.trainer). An adapters file (kind "adapters", `.etad`) holds a LoRA artifact's trained adapters
alone, for rollback and the fleet."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgetrain.core.container import read_container, write_container
from edgetrain.core.declared import short
from edgetrain.core.errors import ArtifactError, FeedError
from edgetrain.graph.fields import (
    ADAPTERS_FAULT,
    CHECKPOINT_FAULT,
    GHOST,
    SAYS_NUMBER,
    Count,
    Obj,
    Optional,
    Reader,
    Real,
    Spec,
    Text,
    read_fields,
    spec,
    to_json,
)
from edgetrain.graph.record import FLOAT32_MAX

from .fused import finite


class UserState(Obj):
    """A JSON object of the caller's (a Trainer's run)."""

    what = "a JSON object"

    def read(self, v, r, values, refuse):
        if not isinstance(v, dict):
            raise r.bad(f"its user_state is a {type(v).__name__} ({short(v)}), not a JSON object")
        return dict(v)


@dataclass(frozen=True, kw_only=True)
class CheckpointRecord:
    """A checkpoint's header, typed."""

    program_id: str = spec(Text(), label="program_id", says=SAYS_NUMBER, required=False)
    artifact: str = spec(Text(), label="artifact name", says=SAYS_NUMBER, default="")
    step: int = spec(Count(0), label="step count", says=SAYS_NUMBER, required=False)
    lr: float = spec(Real(below=FLOAT32_MAX), label="learning rate", says=SAYS_NUMBER, required=False)
    user_state: dict[str, Any] = spec(UserState(), label="user_state", default={})
    preprocessing: dict[str, Any] | None = spec(Optional(Obj()), label="input pipeline", default=None)

    @classmethod
    def read(cls, header: Any, path: str | os.PathLike) -> CheckpointRecord:
        r = Reader(os.fspath(path), form=CHECKPOINT_FAULT)
        return read_fields(cls, header, r, where="header", prefix="checkpoint")

    def pipeline(self, path: str | os.PathLike) -> Any:
        """The input pipeline the checkpoint's data was fed by (a loaders.InputPipeline), when it records one."""
        if self.preprocessing is None:
            return None
        from loaders import (  # start-up: only checkpoints that record one load loaders
            ConfigError,
            InputPipeline,
        )

        try:
            return InputPipeline.from_json(self.preprocessing, source=f"checkpoint '{path}'")
        except ConfigError as e:
            raise ArtifactError(f"{e}: the file is damaged or was made elsewhere") from None


def read_checkpoint(path: str | os.PathLike) -> tuple[CheckpointRecord, dict[str, np.ndarray]]:
    """A checkpoint's record and tensors, its header checked field by field (ArtifactError naming the field)."""
    header, tensors = read_container(path, kind="checkpoint")
    return CheckpointRecord.read(header, path), tensors


def check_values(
    path: str | os.PathLike, tensors: dict[str, np.ndarray], values: dict[str, np.ndarray]
) -> None:
    """Every tensor a session owns is in the checkpoint, of its shape and dtype, and finite."""
    missing = [k for k in values if k not in tensors]
    if missing:
        raise ArtifactError(f"checkpoint '{path}' lacks '{missing[0]}'; it is damaged or incomplete")
    for k, own in values.items():
        arr = tensors[k]
        if arr.shape != own.shape or arr.dtype != own.dtype:
            raise ArtifactError(
                f"checkpoint '{path}': '{k}' is {arr.dtype}{list(arr.shape)}, expected {own.dtype}{list(own.shape)}"
            )
        if not finite(arr):
            raise ArtifactError(
                f"checkpoint '{path}': '{k}' holds non-finite values (NaN or infinity); edgetrain never writes "
                "such a checkpoint, so the file was made elsewhere or damaged: use an earlier checkpoint"
            )


def write_checkpoint(
    path: str | os.PathLike,
    values: dict[str, np.ndarray],
    *,
    program_id: str,
    artifact: str,
    step: int,
    lr: float,
    user_state: Any,
    preprocessing: dict[str, Any] | None,
) -> int:
    """Writes a checkpoint atomically; returns its size. user_state must hold JSON values only."""
    try:
        user = json.loads(json.dumps(dict(user_state or {}), allow_nan=False))
    except (TypeError, ValueError) as e:
        raise FeedError(f"user_state must hold JSON values only (numbers, strings, lists, dicts): {e}") from e
    bad = [k for k, v in values.items() if not finite(v)]
    if bad or not math.isfinite(lr):  # train_step and set_parameters refuse these: a bug if seen here
        raise ArtifactError(
            f"refusing to write checkpoint '{path}': '{bad[0] if bad else 'lr'}' is not finite"
        )
    record = CheckpointRecord(
        program_id=program_id,
        artifact=os.path.basename(artifact),
        step=step,
        lr=lr,
        user_state=user,
        preprocessing=preprocessing,  # how the data was fed: eval and export apply it
    )
    header = to_json(record, skip_defaults=True)
    header.setdefault("user_state", user)  # always written, {} too
    return write_container(path, kind="checkpoint", header=header, tensors=values)


class AdapterEntry(Spec):
    """The adapters a file lists: each a record of the layer's weight and its A and B, both held by the file; every
    tensor of the file is one layer's A or B, and no tensor is two of them."""

    what = "a list of adapted layers"

    def read(self, v, r, values, refuse):
        ok = isinstance(v, list) and all(isinstance(m, dict) for m in v)
        ok = ok and all(
            isinstance(m.get(k), str) and (k == "weight" or m[k] in r.tensors)
            for m in v
            for k in ("weight", "A", "B")
        )
        if not ok:
            raise r.bad("its header lacks a LoRA config or lists adapters it does not hold")
        listed: set[str] = set()
        for n in (m[k] for m in v for k in ("A", "B")):
            if n in listed:
                raise r.bad(
                    f"its modules list the tensor {short(n)} twice (each layer has an A and a B of its own)"
                )
            listed.add(n)
        unlisted = [n for n in r.tensors if n not in listed]
        if unlisted:
            raise r.bad(
                f"it holds the tensor {short(unlisted[0])}, which no adapted layer of its modules lists"
            )
        return list(v)

    def breaking(self):
        return ["x", [{"weight": "w", "A": GHOST, "B": GHOST}], [], None]


@dataclass(frozen=True, kw_only=True)
class AdaptersFileRecord:
    """An adapters file's header, typed: the LoRA settings, the adapted layers, the training program and base
    model they belong to, and the step they were taken at."""

    config: dict[str, Any] = spec(Obj(), label="LoRA config", says="its header lacks a {label} ({value})")
    modules: list[dict[str, Any]] = spec(AdapterEntry())
    program_id: str = spec(Text(), default="")
    source_sha256: str = spec(Text(), default="")
    step: int = spec(Count(0), label="step", default=0)

    @classmethod
    def read(cls, header: Any, tensors: dict[str, np.ndarray], path: str | os.PathLike) -> AdaptersFileRecord:
        r = Reader(os.fspath(path), tensors=tensors, form=ADAPTERS_FAULT)
        return read_fields(cls, header, r, where="header", prefix="adapters file")


def read_adapters(path: str | os.PathLike) -> tuple[AdaptersFileRecord, dict[str, np.ndarray]]:
    header, tensors = read_container(path, kind="adapters")
    return AdaptersFileRecord.read(header, tensors, path), tensors
