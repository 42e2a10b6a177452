"""The build-side commands: convert (ONNX model -> training artifact), check, inspect, export, demo. convert, check,
export and demo need onnx; inspect needs numpy alone, so this module imports the build side (the converter, the
trainability check, the demo, onnxruntime) only inside the commands that use it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

from edgetrain.core.atomic import atomic_write
from edgetrain.core.container import inspect_container
from edgetrain.core.errors import EdgeTrainError, RebatchError, StorageError, UsageError
from edgetrain.graph.sections import AdaptersSection, BatchPlanSection, QuantizedSection
from edgetrain.runtime.describe import describe, summary
from edgetrain.runtime.progress import duration, mb
from loaders import imageops

from .build_config import (
    CheckConfig,
    ConvertConfig,
    ExportConfig,
    LoraConfig,
    LossConfig,
    OptimizerConfig,
)
from .common import load_weights, open_session, plural
from .names import LOSSES


def _make_loss(cfg: LossConfig):
    from edgetrain.derive import losses  # build side: loaded only for convert

    smoothing = cfg.label_smoothing or 0.0
    if cfg.loss == "cross-entropy":
        axis = 1 if cfg.class_axis is None else cfg.class_axis
        return losses.CrossEntropyLoss(
            label_smoothing=smoothing, ignore_index=cfg.ignore_index, class_axis=axis
        )
    if cfg.loss == "next-token":
        ignore = -100 if cfg.ignore_index is None else cfg.ignore_index
        return losses.NextTokenLoss(ignore_index=ignore, label_smoothing=smoothing)
    return getattr(losses, LOSSES[cfg.loss])()


def _make_optimizer(cfg: OptimizerConfig):
    from edgetrain.derive.optimizers import SGD, Adam, AdamW  # build side: loaded only for convert

    lr = cfg.learning_rate
    clip = {"clip_grad_norm": cfg.clip_grad_norm} if cfg.clip_grad_norm is not None else {}
    if cfg.optimizer == "sgd":
        momentum = 0.9 if cfg.momentum is None else cfg.momentum
        return SGD(
            lr=lr, momentum=momentum, weight_decay=cfg.weight_decay or 0.0, nesterov=cfg.nesterov, **clip
        )
    cls = Adam if cfg.optimizer == "adam" else AdamW
    wd = cfg.weight_decay if cfg.weight_decay is not None else (0.01 if cfg.optimizer == "adamw" else 0.0)
    return cls(lr=lr, weight_decay=wd, **clip)


def _config_text(cfg: dict[str, Any]) -> str:
    """SGD (lr 0.01, momentum 0.9): the settings that are on (None and False ones left out)."""
    shown = {k: v for k, v in cfg.items() if k != "type" and v is not None and v is not False}
    rest = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items())
    return f"{cfg.get('type', '?')} ({rest})" if rest else str(cfg.get("type", "?"))


def run_convert(args: argparse.Namespace) -> int:
    cfg = ConvertConfig.from_args(args)
    if not os.path.isfile(cfg.model):
        raise EdgeTrainError(f"{cfg.model}: no such file (convert takes an ONNX inference model)")
    from edgetrain.derive.check import (
        frozen_tensors,
        int8_weights,
    )  # build side: loaded once there is a model to convert
    from edgetrain.derive.pipeline import convert  # build side: loaded once there is a model to convert

    loss, optimizer = _make_loss(cfg.loss), _make_optimizer(cfg.optimizer)
    out = cfg.output or os.path.splitext(cfg.model)[0] + ".etrain"
    if sys.stderr.isatty():  # a status line while it works (seconds for large models); logs get the summary
        print(f"converting {cfg.model}: import, loss, gradients, optimizer, memory plan ...", file=sys.stderr)
    t0 = time.perf_counter()
    options = dict(
        loss=loss,
        optimizer=optimizer,
        trainable=_listed(cfg.trainable),
        output=cfg.model_output,
        untie=cfg.untie if isinstance(cfg.untie, bool) else list(cfg.untie),
        parameters=cfg.parameters,
        preprocessing=cfg.pipeline.pipeline(),
        adapters=_lora(cfg.lora),
        recompute=cfg.recompute,
        memory_budget=cfg.memory_budget,
        progress=_budget_progress(cfg.memory_budget),
    )
    fallback = None
    try:
        art = convert(cfg.model, batch_size=cfg.batch_size or 32, **options)
    except RebatchError as e:
        if cfg.batch_size is not None:
            raise
        # --batch-size was not given: a model whose fixed batch cannot be moved trains at that batch
        art = convert(cfg.model, batch_size=None, **options)
        fallback = f"kept the model's fixed batch: {e}"
    size = art.save(out)
    seconds = time.perf_counter() - t0
    plan = inspect_container(out)["header"].get("plan", {})  # the header alone: no second read of the tensors
    n_train = sum(int(art.initial[p].size) for p in art.parameters)
    frozen = frozen_tensors(art.base, art.parameters)  # counted as `edgetrain check` counts them
    n_frozen = sum(int(art.base.initializers[p].size) for p in frozen)
    batch = art.graph.values[art.data_inputs[0]].shape[0]
    backward = len(art.graph.nodes) - len(art.inference.nodes)
    print(f"converted {cfg.model} -> {out} ({mb(size)}) in {duration(seconds)}")
    for line in art.notes + ([fallback] if fallback else []):
        print(f"  {line}")
    rebatched = art.section(BatchPlanSection)
    if cfg.debug and rebatched is not None:  # every rewritten node, not the summary
        print("  every rewritten node:")
        for line in rebatched.plan.describe(art.base, batch):
            print(f"    {line}")
    print(f"  loss        {_config_text(art.loss_config)}")
    print(f"  labels      {loss.describe_target(art.inference.info(cfg.model_output or art.outputs[0]))}")
    print(f"  optimizer   {_config_text(art.optimizer_config)}")
    print(f"  batch       {batch}")
    ints = int8_weights(art.base)
    stays = (
        f"; {len(ints)} stay int8, {mb(sum(art.base.initializers[p].nbytes for p in ints))}" if ints else ""
    )
    print(
        f"  parameters  {len(art.parameters)} trainable ({n_train:,} values), "
        f"{len(frozen)} frozen ({n_frozen:,} values{stays})"
    )
    print(
        f"  program     {plural(len(art.inference.nodes), 'forward node')}, "
        f"{plural(backward, 'loss, gradient and update node')}; "
        f"memory plan {mb(plan.get('arena_size', 0))} (lower bound {mb(plan.get('lower_bound', 0))})"
    )
    if cfg.emit_onnx:
        model = art.training_onnx()
        atomic_write(cfg.emit_onnx, model.SerializeToString())
        print(f"  step ONNX   {cfg.emit_onnx} (one training step in standard ONNX; onnxruntime runs it)")
    print(f"next: edgetrain train {out} --data DATA --epochs 5")
    return 0


def run_check(args: argparse.Namespace) -> int:
    cfg = CheckConfig.from_args(args)
    if cfg.ops:
        from edgetrain.derive.supported import ops_text  # start-up: the rule table loads only for --ops

        print(ops_text())
        if not cfg.model:
            return 0
        print()
    if not cfg.model:
        raise UsageError("give the MODEL to check, or --ops to list the ops edgetrain supports")
    from edgetrain.derive.check import check  # needs onnx to read the model (inspect and check --ops do not)

    if cfg.memory_budget:
        return _check_budget(cfg)
    report = check(cfg.model, batch_size=cfg.batch_size or 1)
    print(report.text())
    return 0 if report.derivable else 1


def _budget_progress(memory_budget: str | None):
    """Each option weighed for --memory-budget, as a line on stderr (tens of seconds on a large model)."""
    if not memory_budget:
        return None
    return lambda line: print(line, file=sys.stderr, flush=True)


def _check_budget(cfg: CheckConfig) -> int:
    """`check --memory-budget SIZE`: every option weighed, its planned peak and what it trains, and the pick."""
    from edgetrain.derive.budget import parse_bytes, size_text  # build side
    from edgetrain.derive.pipeline import memory_options  # build side

    budget = parse_bytes(cfg.memory_budget)
    batch = cfg.batch_size or 32
    print(
        f"weighing the ways to train {cfg.model} at batch {batch} within {size_text(budget)} ...",
        file=sys.stderr,
    )
    optimizer = _make_optimizer(cfg.optimizer)
    options, pick = memory_options(
        cfg.model,
        loss=_make_loss(LossConfig()),
        optimizer=optimizer,
        memory_budget=budget,
        trainable=_listed(cfg.trainable),
        batch_size=batch,
        progress=_budget_progress(cfg.memory_budget),
    )
    print(
        f"memory budget {size_text(budget)} ({budget:,} bytes), batch {batch}, {_config_text(optimizer.config())}"
    )
    print(
        "the budget counts the step's planned peak without the frozen weights, which stay in the file's pages "
        "(edgetrain inspect shows both)"
    )
    rows = [("option", "recompute", "frozen part", "trainable", "values", "budgeted", "planned peak", "")]
    shown: dict[tuple, int] = {}
    for o in options:
        same = shown.get((o.name, tuple(o.trainable)))
        if same == o.peak and o is not pick:  # a recomputation level that changes nothing: not a row
            continue
        shown[(o.name, tuple(o.trainable))] = o.peak
        mark = "<- convert picks" if o is pick else ("fits" if o.peak <= budget else "")
        rows.append(
            (
                o.name,
                o.recompute,
                "whole batch" if o.chunks == 1 else f"{o.chunks} chunks",
                str(len(o.trainable)),
                f"{o.values:,}",
                size_text(o.peak),
                size_text(int(o.parts["peak_bytes"])),
                mark,
            )
        )
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    if pick is None:
        smallest = min(options, key=lambda o: o.peak)
        print(
            f"nothing fits: the smallest option needs {size_text(smallest.peak)}; give at least that, or a "
            "smaller --batch-size"
        )
        return 1
    chunked = f", frozen part in {pick.chunks} chunks" if pick.chunks > 1 else ""
    print(
        f"convert --memory-budget {cfg.memory_budget} trains {pick.name} (recompute {pick.recompute}{chunked})"
    )
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    if getattr(args, "json", False):
        print(json.dumps(summary(args.file), indent=1, default=str))
    else:
        print(describe(args.file))
    return 0


def _lora(cfg: LoraConfig):
    """The LoRA adapter module --lora-rank asks for, or None."""
    if cfg.rank is None:
        return None
    from edgetrain.derive.adapters import LoRA, lora_rank  # build side

    rank = lora_rank(cfg.rank)  # checked before 2.0 * R, which overflows for a huge R
    alpha = cfg.alpha if cfg.alpha is not None else 2.0 * rank
    return LoRA(rank=cfg.rank, alpha=alpha, targets=_listed(cfg.targets))


def _listed(patterns: tuple[str, ...] | None) -> list[str] | None:
    """Names or patterns as the derive side takes them (a list, or None for its default)."""
    return None if patterns is None else list(patterns)


def run_export(args: argparse.Namespace) -> int:
    cfg = ExportConfig.from_args(args)
    sess = open_session(cfg.artifact)
    which = load_weights(sess, cfg.checkpoint, cfg.artifact)
    if (cfg.requantize or cfg.float_model) and sess.record.section(QuantizedSection) is None:
        raise UsageError(
            f"--{'requantize' if cfg.requantize else 'float'} applies to an int8 model; '{cfg.artifact}' was "
            "converted from a float model"
        )
    sess.export_onnx(
        cfg.output,
        preprocessing=cfg.preprocessing,
        requantize=cfg.requantize,
        float_model=cfg.float_model,
        adapters=cfg.adapters,
    )
    print(f"exported {cfg.output} ({mb(os.path.getsize(cfg.output))}) from {which}")
    _export_adapters(sess, cfg)
    q = sess.record.section(QuantizedSection)
    if q is not None:
        form = "float (no quantization)" if cfg.float_model else f"int8, {q.form} form as it came"
        scales = "new scales fitted to the trained weights" if cfg.requantize else "the model's scales"
        print(
            f"  {form}; {len(q.weights)} trained tensor(s) requantized with {scales}"
            if not cfg.float_model
            else f"  {form}"
        )
    pipeline = sess.preprocessing
    if pipeline.declared:
        where = (
            "in the model: it takes raw data"
            if cfg.preprocessing
            else "left to the app (metadata 'edgetrain.preprocessing')"
        )
        print(f"  input pipeline {pipeline.describe()}; {where}")
    if not cfg.check:
        return 0
    return _check_export(sess, cfg)


def _check_export(sess, cfg: ExportConfig) -> int:
    """The exported model run by onnxruntime on a random batch, against the session (0 when they match)."""
    try:
        import onnxruntime as ort  # optional: the check is skipped without it
    except ImportError:
        print("  not checked: onnxruntime is not installed (pip install onnxruntime)")
        return 0
    q, pipeline = sess.record.section(QuantizedSection), sess.preprocessing
    options = ort.SessionOptions()
    if q is not None:  # the int8 graph as written: onnxruntime's fusions round otherwise than the spec's ops
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort_sess = ort.InferenceSession(cfg.output, options, providers=["CPUExecutionProvider"])
    x = _random_batch(ort_sess.get_inputs()[0], sess)
    raw, x = _raw_batch(sess, x) if cfg.preprocessing and pipeline.declared else (x, x)
    got = ort_sess.run(None, {ort_sess.get_inputs()[0].name: raw})[0]
    ref = sess.run(x)
    diff = float(np.max(np.abs(got - ref)))
    if cfg.requantize or cfg.float_model:  # the session runs the int8 model with its own scales: a comparison
        print(
            f"  run by onnxruntime; against the int8 model with the model's scales, on a random batch: largest "
            f"difference {diff:.1e}"
        )
        return 0
    scale = float(np.max(np.abs(ref))) or 1.0
    ok = diff <= 1e-4 * scale + 1e-5
    print(
        f"  checked with onnxruntime on a random batch: largest difference {diff:.1e} "
        f"({'matches' if ok else 'DOES NOT MATCH'} edgetrain)"
    )
    return 0 if ok else 1


def _export_adapters(sess, cfg: ExportConfig) -> None:
    """Says how the adapters went into the export; writes --adapter-file."""
    a = sess.record.section(AdaptersSection)
    path = cfg.adapter_file
    if a is None:
        if path:
            raise UsageError(f"--adapter-file: '{cfg.artifact}' has no adapters (convert with --lora-rank R)")
        return
    n = len(a.modules)
    print(
        f"  {n} LoRA adapter(s) "
        + ("merged into the weights" if cfg.adapters == "merged" else "served: inputs with defaults")
    )
    if path:
        fmt = "onnxruntime" if path.endswith(".onnx_adapter") else "edgetrain"
        size = sess.export_adapters(path, format=fmt)
        print(f"  adapters alone: {path} ({mb(size)}, {fmt} format)")


def _random_batch(arg, sess):
    """A random batch the exported model accepts: of its own fixed batch, or 2 for a symbolic one; token ids are
    0 (a valid index whatever the vocabulary)."""
    info = sess.record.program.values[sess.data_inputs[0]]
    batch = arg.shape[0] if arg.shape and isinstance(arg.shape[0], int) else 2
    shape = (batch, *info.shape[1:])
    if np.dtype(info.dtype).kind != "f":
        return np.zeros(shape, info.dtype)
    return np.random.default_rng(0).random(shape).astype(info.dtype)


def _raw_batch(sess, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(raw data for a model that holds its input pipeline, what the session's pipeline makes of it): random values in
    the pipeline's raw range and dtype, in its raw layout, at the model's input size."""
    pipeline = sess.preprocessing
    lo, hi = pipeline.expected_range() or (0.0, 1.0)
    raw_dtype = np.dtype(pipeline.raw_dtype or x.dtype)
    shape = (
        x.shape[:2] + tuple(pipeline.size) if pipeline.size else x.shape
    )  # its resize then changes nothing
    rng = np.random.default_rng(0)
    integers = raw_dtype.kind in "iu"
    values = rng.integers(int(lo), int(hi) + 1, shape) if integers else rng.uniform(lo, hi, shape)
    raw = values.astype(raw_dtype)
    if pipeline.layout == "nhwc" and raw.ndim >= 3:
        raw = np.ascontiguousarray(np.moveaxis(raw, 1, -1))
    layout = pipeline.layout or "nchw"
    cropped = (
        imageops.center_crop(raw, pipeline.crop, layout=layout) if pipeline.crop else raw
    )  # as readers crop
    return raw, sess.preprocess(cropped, source="the random batch")


def run_demo(args: argparse.Namespace) -> int:
    from edgetrain import demo  # build side: the demo converts (onnx) and loads the converter

    if args.epochs < 1:
        raise UsageError(f"--epochs must be a positive integer, got {args.epochs}")
    result = demo.run_demo(args.out, model=args.model, epochs=args.epochs, plot=not args.no_plot)
    if args.json:
        try:
            atomic_write(args.json, (result.to_json() + "\n").encode("utf-8"))
        except OSError as e:
            raise StorageError.of(e, args.json, "cannot write the demo's summary") from e
    return 0
