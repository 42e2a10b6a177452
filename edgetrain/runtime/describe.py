"""`edgetrain inspect`: an artifact or checkpoint file -> a readable description (numpy only): ops,
parameters (trainable or frozen), bytes by part, the memory plan against its lower bound, the planned peak of a
training step, provenance."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import numpy as np

from edgetrain.core.container import file_kind
from edgetrain.graph.fields import to_json
from edgetrain.graph.footprint import step_footprint
from edgetrain.graph.record import ArtifactRecord
from edgetrain.graph.sections import PreprocessingSection

from .artifact import load_artifact
from .checkpoints import AdaptersFileRecord, CheckpointRecord, read_adapters, read_checkpoint
from .fused import CHUNK, fusable


def _mb(n: float) -> str:
    return f"{n / 2**20:8.2f} MiB" if n >= 2**20 else f"{n / 1024:8.1f} KiB"


def step_memory(record: ArtifactRecord) -> dict[str, Any]:
    """An artifact's record -> the bytes a TrainingSession holds while it runs a training step, by part, and their
    sum, the planned peak (edgetrain.graph.footprint.step_footprint says what each part is), with the fused
    optimizer when this runtime runs it."""
    dtypes = [record.values[p].dtype for p in record.io.parameters]
    fused = record.fused is not None and fusable(record.optimizer, dtypes)
    return step_footprint(record, fused=fused, chunk=CHUNK)


def artifact_step_memory(path: str | os.PathLike) -> dict[str, Any]:
    """step_memory of an artifact file (the benchmark sets it beside the RSS it measures)."""
    return step_memory(load_artifact(path).record)


def _load(path: str | os.PathLike) -> tuple[str, Any, dict[str, np.ndarray]]:
    """(kind, record, tensors) of an artifact, checkpoint or adapters file, its header read into its typed record
    (every field checked as a session would check it). A crafted header (a valid checksum is no proof: anyone can
    recompute it) is an ArtifactError naming the file and the field, never a KeyError halfway through a
    description."""
    kind = file_kind(path)
    if kind == "artifact":
        art = load_artifact(path)
        return kind, art.record, art.tensors
    if kind == "adapters":
        record, tensors = read_adapters(path)
        return kind, record, tensors
    record, tensors = read_checkpoint(path)
    return kind, record, tensors


def describe(path: str | os.PathLike) -> str:
    """An artifact or checkpoint file -> what `edgetrain inspect` prints."""
    kind, record, tensors = _load(path)
    size = os.path.getsize(path)
    if kind == "artifact":
        return _describe_artifact(path, record, tensors, size)
    if kind == "adapters":
        return _describe_adapters(path, record, tensors, size)
    return _describe_checkpoint(path, record, tensors, size)


def _describe_adapters(path, record: AdaptersFileRecord, tensors: dict[str, np.ndarray], size: int) -> str:
    c = record.config
    values = sum(int(v.size) for v in tensors.values())
    lines = [
        f"{os.fspath(path)}: LoRA adapters ({_mb(size).strip()}), rank {c.get('rank')}, alpha {c.get('alpha')}, "
        f"{len(record.modules)} layer(s), {values:,} values, after step {record.step}",
        f"  for the training program {record.program_id[:16]} (base model sha256 {record.source_sha256[:16]})",
    ]
    for m in record.modules:
        a, b = tensors[m["A"]], tensors[m["B"]]
        lines.append(f"  {m['weight']}: A {list(a.shape)}, B {list(b.shape)}")
    return "\n".join(lines)


def summary(path: str | os.PathLike) -> dict[str, Any]:
    """An artifact or checkpoint file -> the facts `edgetrain inspect --json` prints (JSON-ready)."""
    kind, record, tensors = _load(path)
    out: dict[str, Any] = {"path": os.fspath(path), "size_bytes": os.path.getsize(path)}
    shapes = {k: list(v.shape) for k, v in tensors.items()}
    if kind == "adapters":
        return {**out, "kind": "adapters", "config": record.config, "step": record.step, "tensors": shapes}
    if kind == "checkpoint":
        return {
            **out,
            "kind": "checkpoint",
            "step": record.step,
            "lr": record.lr,
            "user_state": record.user_state,
            "preprocessing": record.preprocessing,
            "tensors": shapes,
        }
    plan = record.plan
    pipeline = record.section(PreprocessingSection)
    return {
        **out,
        "kind": "artifact",
        "model": record.base.name,
        "loss": record.loss.config,
        "optimizer": record.optimizer.config,
        "nodes": len(record.program.nodes),
        "parameters": {k: list(tensors[k].shape) for k in record.io.parameters},
        "plan": {"arena_size": plan.arena_size, "lower_bound": plan.lower_bound, "no_plan": plan.no_plan},
        "memory": step_memory(record),
        "preprocessing": None if pipeline is None else pipeline.spec,
        "provenance": to_json(record.provenance, skip_defaults=True),
    }


def _describe_artifact(path: Any, record: ArtifactRecord, tensors: dict, size: int) -> str:
    io = record.io
    params, state = set(io.parameters), set(io.state)
    frozen = [
        k
        for k, v in tensors.items()
        if k not in params and k not in state and v.dtype.kind == "f" and v.size > 1
    ]
    by_part = {
        "trainable parameters": sum(tensors[k].nbytes for k in params),
        "optimizer state": sum(tensors[k].nbytes for k in state if k in tensors),
        "frozen parameters and constants": sum(
            v.nbytes for k, v in tensors.items() if k not in params | state
        ),
    }
    by_part["header, alignment, checksum"] = size - sum(by_part.values())
    if record.zeros:
        n = sum(int(np.prod(shape)) * np.dtype(dt).itemsize for dt, shape in record.zeros.values())
        by_part[f"(+ {len(record.zeros)} zero state tensors, declared, not stored)"] = n
    plan = record.plan
    described = [line for s in record.sections.values() for line in s.describe()]
    pipeline = [line for line in described if line.startswith("input ")]
    lines = [
        f"artifact   {path}  ({_mb(size).strip()}, format of edgetrain {record.edgetrain_version})",
        f"model      {record.base.name or '?'}: inputs {', '.join(io.data_inputs)}; "
        f"outputs {', '.join(io.outputs)}",
        f"training   loss {record.loss.type}, optimizer {_config(record.optimizer.config)}",
        *(pipeline or ["input      no input pipeline declared: data is fed as each reader gives it"]),
        f"program    {len(record.program.nodes)} nodes (inference graph: {len(record.base.nodes)})",
        "",
    ]
    ops = Counter(n.op_type for n in record.program.nodes)
    lines.append(
        "ops        " + ", ".join(f"{op} x{c}" for op, c in sorted(ops.items(), key=lambda t: (-t[1], t[0])))
    )
    lines += ["", "bytes by part:"] + [f"  {k:34s} {_mb(v)}" for k, v in by_part.items()]
    lines += [
        "",
        "memory plan (activations, gradients, temporaries; parameters and state not included):",
        f"  planned arena (peak)               {_mb(plan.arena_size)}",
        f"  lower bound (most bytes live at once) {_mb(plan.lower_bound)}",
        f"  no planning (one buffer per value) {_mb(plan.no_plan)}",
    ]
    lines += _memory_lines(step_memory(record))
    lines += [line for line in described if not line.startswith("input ")]
    lines += ["", f"parameters: {len(params)} trainable, {len(frozen)} frozen"]
    for k in io.parameters:
        lines.append(f"  trainable {k:40s} {str(list(tensors[k].shape)):18s} {_mb(tensors[k].nbytes)}")
    for k in frozen[:40]:
        lines.append(f"  frozen    {k:40s} {str(list(tensors[k].shape)):18s} {_mb(tensors[k].nbytes)}")
    if len(frozen) > 40:
        lines.append(f"  ... and {len(frozen) - 40} more frozen")
    prov = to_json(record.provenance, skip_defaults=True)
    if prov:
        lines += ["", "provenance: " + ", ".join(f"{k} {v}" for k, v in sorted(prov.items()))]
    return "\n".join(lines)


def _memory_lines(mem: dict[str, Any]) -> list[str]:
    """The planned peak of a training step, part by part."""
    which = "fused step program" if mem["fused"] else "step program"
    update = "gradients, scratch" if mem["fused"] else "new values"
    rows = [
        ("arena_bytes", f"arena ({which})"),
        ("parameters_bytes", "parameters"),
        ("state_bytes", "optimizer state"),
        ("constants_bytes", "frozen weights and constants"),
        ("optimizer_buffers_bytes", f"optimizer buffers ({update})"),
        ("outputs_bytes", "step outputs (loss, model outputs)"),
    ]
    lines = [
        "",
        f"planned peak of a training step: {_mb(mem['peak_bytes']).strip()} "
        f"(= {' + '.join(_mb(mem[k]).strip() for k, _ in rows)})",
    ] + [f"  {label:52s} {_mb(mem[k])}" for k, label in rows]
    return lines + [f"  {'what a memory budget counts (no frozen weights)':52s} {_mb(mem['budgeted_bytes'])}"]


def _pipeline(spec: Any) -> str:
    """The input pipeline a checkpoint records, in words."""
    from loaders import (  # start-up: only inspect of a file that records one loads it
        ConfigError,
        InputPipeline,
    )

    try:
        return "pipeline " + InputPipeline.from_json(spec).describe()
    except ConfigError as e:
        return f"an input pipeline this edgetrain cannot read ({e})"


def _describe_checkpoint(path: Any, record: CheckpointRecord, tensors: dict, size: int) -> str:
    lines = [
        f"checkpoint {path}  ({_mb(size).strip()})",
        f"model      {record.artifact or '?'} (program {record.program_id[:16]})",
        f"step       {record.step}   lr {record.lr}",
        *([f"input      {_pipeline(record.preprocessing)}"] if record.preprocessing else []),
        *_user_state_lines(record.user_state),
        "",
        f"tensors: {len(tensors)}",
    ]
    for k, v in tensors.items():
        lines.append(f"  {k:48s} {str(list(v.shape)):18s} {_mb(v.nbytes)}")
    return "\n".join(lines)


def _user_state_lines(state: Any) -> list[str]:
    """A Trainer's run in a few lines and its history as a short table (`inspect --json` has all of it); another
    user_state as one shortened line."""
    run = state.get("best_of", state) if isinstance(state, dict) else state  # a best checkpoint: the run then
    if not isinstance(run, dict) or run.get("trainer") != 1:
        text = str(state)
        return [f"user state {text if len(text) <= 200 else text[:200] + ' ...'}"]
    # the run's own record, shown as it is: a Trainer that resumes from it checks it in its own words
    settings, options, loader = (_object(run.get(k)) for k in ("settings", "run_options", "loader"))
    epoch = run.get("epoch", 0)
    where = f"{epoch} of {settings.get('epochs', options.get('epochs', '?'))} epochs done"
    position = loader.get("position")
    if _is_int(position) and position > 0 and _is_int(epoch):
        where += f", and {position:,} of the {_cell(loader.get('size'), 'd')} samples of epoch {epoch + 1}"
    what = "the best weights of a run, as of its epoch" if "best_of" in state else "a training run"
    lines = [f"run        {what}: {where}"]
    if options:
        shown = ", ".join(f"{k} {v}" for k, v in options.items() if v is not None and v is not False)
        lines.append(f"options    {shown}")
    if run.get("best") is not None:
        lines.append(
            f"best       {run.get('metric')} {_cell(run['best'], '.6g')} at epoch {run.get('best_epoch')}"
        )
    history = run.get("history")
    return lines + history_table(history if isinstance(history, list) else [])


def history_table(history: list[dict[str, Any]], *, last: int = 10) -> list[str]:
    """The last `last` records of a Trainer's history as table rows (epoch, step, losses, accuracy, lr, seconds),
    after a line that counts the earlier ones."""
    if not history:
        return ["history    none yet (no epoch has ended)"]
    records = [r for r in history[-last:] if isinstance(r, dict)]
    columns = [c for c in _COLUMNS if any(r.get(c[0]) is not None for r in records)]
    keys = {key for key, _, _ in columns}
    if "train_seconds" in keys:  # split times: their sum is no news; no validation, no validation time
        columns = [c for c in columns if c[0] != "seconds" and (c[0] != "val_seconds" or "val_loss" in keys)]
    head = f"history    {len(history)} epoch(s)" + (
        f"; the last {len(records)} (... {len(history) - len(records)} earlier epochs)"
        if len(history) > len(records)
        else ""
    )
    rows = [[title for _, title, _ in columns]]
    rows += [[_cell(r.get(key), fmt) for key, _, fmt in columns] for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    return [head] + ["  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]


# (history key, column title, format): the columns of history_table, in order
_COLUMNS = [
    ("epoch", "epoch", "d"),
    ("step", "step", "d"),
    ("train_loss", "train loss", ".4f"),
    ("val_loss", "val loss", ".4f"),
    ("val_accuracy", "val accuracy", "%"),
    ("lr", "lr", ".3g"),
    ("seconds", "seconds", ".2f"),
    ("train_seconds", "train s", ".2f"),
    ("val_seconds", "val s", ".2f"),
]


def _cell(value: Any, fmt: str) -> str:
    """A number as the table shows it; anything else (a checkpoint is outside input) as it is, shortened."""
    if value is None:
        return "-"
    try:
        if fmt == "%":
            return f"{100 * float(value):.1f}%"
        return format(value, ",d" if fmt == "d" else fmt)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond float's range, as a %
        return str(value)[:16]


def _object(value: Any) -> dict[str, Any]:
    """A JSON object of a run's record, or {} for anything else there."""
    return value if isinstance(value, dict) else {}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _config(cfg: dict) -> str:
    kind = cfg.get("type", "?")
    rest = ", ".join(f"{k}={v}" for k, v in cfg.items() if k != "type" and v not in (None, 0.0, False))
    return f"{kind}({rest})"
