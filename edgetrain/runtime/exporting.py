"""The personalized inference model of a TrainingSession -> an ONNX file (numpy here; the writer needs onnx), and a
LoRA artifact's adapters -> a file of their own.

The export starts from the artifact's inference graph with the trained parameters; each section of the artifact's
record (edgetrain.graph.sections) then undoes or writes back what its rewrite did at convert (an int8 model written
in its own form again, LoRA adapters merged or served, split layers whole again), in the sections' order; the
declared input pipeline goes in as graph nodes before the model (or into its metadata, for the app to apply)."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from edgetrain.core.container import write_container
from edgetrain.core.errors import ArtifactError, ConfigError, UnsupportedError
from edgetrain.graph.record import ArtifactRecord
from edgetrain.graph.sections import SECTIONS, AdaptersSection, ExportView

from .checkpoints import read_adapters
from .fused import finite


def export_options(record: ArtifactRecord, path: str, options: dict[str, Any]) -> dict[str, Any]:
    """The export options, each one a section of the artifact reads (with its default where not given): an option
    no section knows is refused, and so is one whose section this artifact does not have (set to other than its
    default), in that section's words."""
    owners = {name: cls for cls in SECTIONS.values() for name in cls.OPTIONS}
    unknown = [k for k in options if k not in owners]
    if unknown:
        raise ConfigError(f"export option '{unknown[0]}' is not one of {', '.join(sorted(owners))}")
    out = {}
    for name, cls in owners.items():
        value = options.get(name, cls.OPTIONS[name])
        cls.check_options({name: value})
        if value != cls.OPTIONS[name] and cls.KEY not in record.sections and cls.ABSENT:
            raise ConfigError(f"'{path}' {cls.ABSENT}")
        out[name] = value
    return out


def export_model(
    record: ArtifactRecord,
    params: dict[str, np.ndarray],
    path: str | os.PathLike,
    *,
    source: str,
    step: int,
    pipeline: Any,
    preprocessing: bool,
    options: dict[str, Any],
) -> None:
    """Writes the inference model with the trained parameters `params` (see the module docstring). source: the
    artifact's path, for messages; pipeline: the session's input pipeline (None, or one not declared: none goes
    in); preprocessing=False leaves it out of the graph (the metadata_props "edgetrain.preprocessing" says it)."""
    try:
        from edgetrain.onnx_io.writer import export_inference  # needs onnx: an optional dependency
    except ImportError as e:
        raise UnsupportedError(
            "export_onnx needs the onnx package, which is not installed here: pip install 'edgetrain[convert]' (or "
            "export on a workstation from a checkpoint with `edgetrain export`)"
        ) from e
    chosen = export_options(record, source, options)
    props = {"edgetrain.steps": str(step), "edgetrain.source_sha256": record.provenance.source_sha256}
    view = ExportView(record.base, dict(params), props)
    for section in record.sections.values():
        view = section.export(view, chosen)
    if pipeline is not None and pipeline.declared:
        spec = json.dumps(pipeline.to_json())
        if preprocessing:
            from edgetrain.graph.preprocessing import with_preprocessing  # start-up: only exports load it

            view.graph = with_preprocessing(view.graph, pipeline)
            view.props["edgetrain.preprocessing_in_graph"] = spec
        else:
            view.props["edgetrain.preprocessing"] = spec
    export_inference(view.graph, view.params, path, props=view.props, inputs_with_defaults=view.defaults)


def adapters_of(record: ArtifactRecord, source: str) -> AdaptersSection:
    a = record.section(AdaptersSection)
    if a is None:
        raise ConfigError(f"'{source}' has no adapters: convert with adapters=et.LoRA(...)")
    return a


def write_adapters(
    record: ArtifactRecord,
    values: dict[str, np.ndarray],
    path: str | os.PathLike,
    *,
    source: str,
    step: int,
    format: str,
) -> int:
    """Writes the trained adapters alone, atomically; returns the file's bytes (TrainingSession.export_adapters)."""
    a = adapters_of(record, source)
    tensors = {p: np.ascontiguousarray(values[p]) for p in a.tensors}
    if format == "onnxruntime":
        from edgetrain.onnx_io.writer import write_ort_adapter  # build side: needs onnxruntime

        return write_ort_adapter(path, tensors)
    if format != "edgetrain":
        raise ConfigError(f"format='{format}': give 'edgetrain' or 'onnxruntime'")
    header = {
        "config": a.config,
        "modules": [m.to_dict() for m in a.modules],
        "program_id": record.program_id,
        "source_sha256": record.provenance.source_sha256,
        "step": step,
    }
    return write_container(path, kind="adapters", header=header, tensors=tensors)


def read_adapter_values(
    record: ArtifactRecord, path: str | os.PathLike, *, source: str
) -> dict[str, np.ndarray]:
    """The adapters an adapters file holds, for an artifact of the same program (TrainingSession.load_adapters):
    the same adapted layers, each A and B of the dtype and shape the artifact declares (nothing broadcast or cast)
    and finite. Every tensor is checked before the caller assigns any: a refused file changes nothing."""
    found, tensors = read_adapters(path)
    if found.program_id != record.program_id:
        raise ArtifactError(
            f"'{path}' holds adapters of another training program than '{source}'s; convert the same model with the "
            "same LoRA settings"
        )
    a = record.section(AdaptersSection)
    if a is None:
        raise ConfigError(f"'{source}' has no adapters: convert with adapters=et.LoRA(...)")
    names = list(a.tensors)
    if set(tensors) != set(names):
        gone, extra = [n for n in names if n not in tensors], [n for n in tensors if n not in names]
        raise ArtifactError(
            f"'{path}' holds other adapter tensors than '{source}': "
            + (f"it lacks '{gone[0]}'" if gone else f"'{extra[0]}' is not one of its adapters")
            + f" (they are {', '.join(names[:6])}{' ...' if len(names) > 6 else ''}); export the adapters again"
        )
    layers = [(m.get("weight"), m.get("A"), m.get("B")) for m in found.modules]
    if layers != [(m.weight, m.A, m.B) for m in a.modules]:
        raise ArtifactError(
            f"'{path}' lists other adapted layers than '{source}' (its modules name other weights or adapters); "
            "export the adapters again"
        )
    for name in names:
        want, arr = record.values[name], tensors[name]
        if arr.dtype != want.dtype or arr.shape != want.shape:
            raise ArtifactError(
                f"'{path}': adapter '{name}' is {arr.dtype}{list(arr.shape)}; '{source}' declares it "
                f"{want.dtype}{list(want.shape)} (nothing is cast or broadcast): export the adapters again from a "
                "session of this artifact"
            )
        if not finite(arr):
            raise ArtifactError(
                f"'{path}': adapter '{name}' holds non-finite values (NaN or infinity); edgetrain never writes such "
                "a file, so it was made elsewhere or damaged: use an earlier one"
            )
    return tensors
