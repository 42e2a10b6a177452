"""`edgetrain demo --quantized`: the digits story told with the LeNet quantized to int8 by onnxruntime's static
quantizer (needs onnxruntime): float and int8 personalized side by side, the int8 ones exported int8 and float, every
model file measured by onnxruntime."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from ..core.errors import UsageError
from ..derive.losses import CrossEntropyLoss
from ..derive.optimizers import SGD
from ..derive.pipeline import convert
from ..runtime import TrainingSession
from ..runtime.progress import duration, percent
from .common import Summary, _accuracy, _onnxruntime, _timed, write_json
from .digits import BATCH, VARIANTS, _Story

# How the int8 model is made: onnxruntime's static quantizer, as a team would run it before shipping (build side),
# after its quant_pre_process. reduce_range (7-bit weights) because onnxruntime's fused uint8 x int8 kernels on x86
# without VNNI add pairs of products in int16, which 8-bit weights can saturate: measured on an AVX2 machine, the
# base int8 model read the new user's digits with 34.5% accuracy under onnxruntime's default optimizations and 39.0%
# with them off; with 7-bit weights both gave 38.8%.
QUANTIZATION = {
    "quant_format": "QDQ",
    "per_channel": True,  # a scale per output channel of each weight
    "weight_type": "QInt8",  # symmetric
    "activation_type": "QUInt8",  # asymmetric, a zero point per activation
    "reduce_range": True,
    "calibrate_method": "MinMax",
}
CALIBRATION_BATCH = 105  # the base model's 1,050 training digits, in 10 batches


@dataclass
class ModelRow:
    """One model file of the int8 demo's table, measured by onnxruntime (default optimizations, one thread)."""

    name: str
    path: str
    model: str  # the model that was trained (or is the base model): "float" or "int8"
    export: str  # the file's form: "float" or "int8"
    variant: str | None  # "head-only", "full", or None for a base model
    user_accuracy: float  # onnxruntime on the new user's held-out digits
    original_accuracy: float  # onnxruntime on the base model's test digits (the original handwriting)
    model_bytes: int
    artifact_bytes: int | None = None  # the training artifact (.etrain) it was trained from
    median_step_ms: float | None = None  # the median train_step of its fine-tuning, in ms
    steps: int | None = None
    train_seconds: float | None = None
    edgetrain_user_accuracy: float | None = None  # the training session's own run() on the same digits
    onnxruntime_max_diff: float | None = None  # largest |output difference|, onnxruntime against edgetrain


@dataclass
class QuantizedDemoResult(Summary):
    quantization: dict[str, Any]  # QUANTIZATION, the calibration samples and onnxruntime's version
    epochs: int
    user_train_samples: int
    user_heldout_samples: int
    rows: list[ModelRow]
    seconds: float
    out_dir: str
    model: str = "lenet"

    def row(self, name: str) -> ModelRow:
        return next(r for r in self.rows if r.name == name)


def quantize_model(src: str, dst: str, calibration: np.ndarray, *, batch: int = CALIBRATION_BATCH) -> dict:
    """src (a float ONNX model) -> dst, int8 in the QDQ form: onnxruntime's quant_pre_process, then quantize_static
    with QUANTIZATION's settings, its activation ranges calibrated on `calibration` (the model's input) in batches
    of `batch`. Returns the settings, with onnxruntime's version and the calibration samples."""
    ort = _onnxruntime()
    from onnxruntime.quantization import (  # build side, as above
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process  # as above

    name = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).get_inputs()[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter(
                [{name: calibration[k : k + batch]} for k in range(0, len(calibration), batch)]
            )

        def get_next(self):
            return next(self.batches, None)

    q = QUANTIZATION
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(dst))) as tmp:
        pre = os.path.join(tmp, "preprocessed.onnx")
        quant_pre_process(src, pre)
        quantize_static(
            pre,
            dst,
            Reader(),
            quant_format=getattr(QuantFormat, q["quant_format"]),
            per_channel=q["per_channel"],
            weight_type=getattr(QuantType, q["weight_type"]),
            activation_type=getattr(QuantType, q["activation_type"]),
            reduce_range=q["reduce_range"],
            calibrate_method=getattr(CalibrationMethod, q["calibrate_method"]),
        )
    return {**q, "calibration_samples": int(len(calibration)), "onnxruntime": ort.__version__}


def _ort_outputs(path: str, normalized: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """The model's first output under onnxruntime (default optimizations, one thread), fed the digits as it takes
    them: raw uint8 when it holds its input pipeline (an edgetrain export), else normalized floats (the base
    models)."""
    ort = _onnxruntime()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    first = sess.get_inputs()[0]
    x = raw.astype(np.uint8) if first.type == "tensor(uint8)" else normalized
    return sess.run(None, {first.name: x})[0]


def _output_step(path: str) -> float | None:
    """The quantization step of an int8 model's output (its last DequantizeLinear's scale), or None."""
    import onnx  # build side
    from onnx import numpy_helper  # as above

    graph = onnx.load(path).graph
    last = next((n for n in graph.node if graph.output[0].name in n.output), None)
    if last is None or last.op_type != "DequantizeLinear":
        return None
    scale = next((t for t in graph.initializer if t.name == last.input[1]), None)
    return None if scale is None else float(numpy_helper.to_array(scale).max())


def run_quantized_demo(
    out_dir: str | None = None,
    *,
    epochs: int = 20,
    stream: TextIO | None = None,
    progress_stream: TextIO | None = None,
    seed: int = 0,
) -> QuantizedDemoResult:
    """The LeNet quantized to int8 by onnxruntime, calibrated on the base model's training digits, personalized on
    the new user's samples as the float model is (head-only and full, same epochs, batches and step sizes), exported
    int8 and float; every model file measured by onnxruntime. Writes into out_dir (default ./edgetrain-demo-int8)
    the int8 base model, the artifacts and checkpoints, the exported models and summary.json."""
    _onnxruntime()
    out_dir = out_dir or "edgetrain-demo-int8"
    t_start = time.perf_counter()
    story = _QuantizedStory(out_dir, epochs=epochs, seed=seed, stream=stream, progress_stream=progress_stream)
    story.introduce("personalizing an int8 handwriting model on the device")
    settings = story.quantize()
    paths = story.convert_all()
    trained = story.fine_tune_all(paths)
    story.export_all(trained, paths)
    demo = QuantizedDemoResult(
        quantization=settings,
        epochs=epochs,
        user_train_samples=story.user_train.size(),
        user_heldout_samples=story.user_held.size(),
        rows=list(story.rows.values()),
        seconds=0.0,
        out_dir=out_dir,
    )
    story.quantized_table(demo)
    demo.seconds = time.perf_counter() - t_start
    story.say(f"  {'summary':16s} {story.write_summary(demo)}")
    story.say("")
    story.say(
        f"done in {duration(demo.seconds)}. Your own int8 model: edgetrain convert MODEL_INT8.onnx ...; "
        "edgetrain export ART -o OUT.onnx [--float]"
    )
    return demo


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


class _QuantizedStory(_Story):
    """The int8 demo's telling: the float LeNet and its int8 quantization, each trained head-only and full, every
    model file measured by onnxruntime (self.rows, by name, in the table's order)."""

    def __init__(self, out_dir: str, **kwargs):
        super().__init__(out_dir, "lenet", **kwargs)
        self.rows: dict[str, ModelRow] = {}
        self.xo_raw = self.original.raw().get_batch(np.arange(self.original.size()))[0].astype(np.uint8)
        self.int8_path = os.path.join(out_dir, "base-int8.onnx")

    def _measure(
        self, name: str, path: str, model: str, export: str, variant: str | None, **extra
    ) -> ModelRow:
        """A model file -> its row, measured by onnxruntime; extra: the training's fields. Kept in self.rows, and
        onnxruntime's outputs on the user's held-out digits in self.ort_user_outputs."""
        user = _ort_outputs(path, self.xu, self.xu_raw)
        original = _ort_outputs(path, self.xo, self.xo_raw)
        self.rows[name] = row = ModelRow(
            name=name,
            path=path,
            model=model,
            export=export,
            variant=variant,
            user_accuracy=_accuracy(user, self.yu),
            original_accuracy=_accuracy(original, self.yo),
            model_bytes=os.path.getsize(path),
            **extra,
        )
        self.ort_user_outputs = user  # for the comparison with edgetrain
        return row

    def quantize(self) -> dict[str, Any]:
        """[1/4] the base model -> int8, by onnxruntime's static quantizer calibrated on the base model's training
        digits; both measured by onnxruntime -> the quantizer's settings."""
        t0 = time.perf_counter()
        calibration = self.base_train.get_batch(np.arange(self.base_train.size()))[0]
        settings = quantize_model(self.base_path, self.int8_path, calibration)
        seconds = time.perf_counter() - t0
        fl = self._measure("base model, float", self.base_path, "float", "float", None)
        q = self._measure("base model, int8", self.int8_path, "int8", "int8", None)
        self.say(
            f"[1/4] quantized it to int8 with onnxruntime {settings['onnxruntime']}'s static quantizer in "
            f"{duration(seconds)}, {_kib(fl.model_bytes)} -> {_kib(q.model_bytes)}:"
        )
        self.say(
            "      QDQ, int8 weights per channel (7-bit: reduce_range), uint8 activations, MinMax ranges"
        )
        self.say(f"      calibrated on the base model's {len(calibration):,} training digits")
        self.say(
            f"      onnxruntime: the new user's digits {percent(fl.user_accuracy)} float, {percent(q.user_accuracy)} "
            f"int8 (the handwriting it learned: {percent(fl.original_accuracy)}, {percent(q.original_accuracy)})"
        )
        return settings

    def convert_all(self) -> dict[str, str]:
        """[2/4] the float and the int8 model -> a training artifact per variant -> their paths, by
        "VARIANT-float" and "VARIANT-int8"."""
        t0 = time.perf_counter()
        paths = {}
        for kind, source in (("float", self.base_path), ("int8", self.int8_path)):
            for name, cfg in VARIANTS.items():
                art = convert(
                    source,
                    loss=CrossEntropyLoss(),
                    optimizer=SGD(lr=cfg["lr"], momentum=0.9, weight_decay=5e-4),
                    trainable=[f"{self.spec.head}.*"] if cfg["head_only"] else None,
                    batch_size=BATCH,
                )
                paths[f"{name}-{kind}"] = path = os.path.join(self.out_dir, f"{name}-{kind}.etrain")
                art.save(path)
        self.say(
            f"[2/4] converted both into two training programs (.etrain) each, head-only ({self.spec.head}) and "
            f"full, in {duration(time.perf_counter() - t0)}"
        )
        self.say("      int8: the weights that train are float masters read through fake quantization on the")
        self.say("      model's int8 grid (straight-through gradients); frozen weights stay int8")
        sizes = "; ".join(
            f"{name} {_kib(os.path.getsize(paths[name + '-float']))} float, "
            f"{_kib(os.path.getsize(paths[name + '-int8']))} int8"
            for name in VARIANTS
        )
        self.say(f"      artifacts: {sizes}")
        return paths

    def fine_tune_all(self, paths: dict[str, str]) -> dict[str, tuple]:
        """[3/4] each artifact trained on the user's samples as the float demo trains -> by key, (its result, its
        session, its outputs on the held-out digits, its steps' seconds)."""
        self.say(
            f"[3/4] fine-tuning on the device: {self.epochs} epochs of the user's {self.user_train.size()} samples, "
            f"batch {BATCH}, SGD with momentum"
        )
        trained = {}
        for name in VARIANTS:
            for kind in ("float", "int8"):
                key = f"{name}-{kind}"
                sess = TrainingSession(paths[key])
                seconds = _timed(sess)
                variant, probs = self._fine_tune_one(key, sess, label=f"{name} {kind}")
                trained[key] = (variant, sess, probs, seconds)
                base = self.rows[f"base model, {kind}"].user_accuracy
                self.say(
                    f"      {name + ' ' + kind:15s} {variant.steps} steps in {duration(variant.train_seconds)} "
                    f"(median step {1000 * float(np.median(seconds)):.1f} ms): {percent(base)} -> "
                    f"{percent(variant.user_accuracy)} on the new user's held-out digits"
                )
        return trained

    def export_all(self, trained: dict[str, tuple], paths: dict[str, str]) -> None:
        """[4/4] each personalized model -> ONNX (the int8 ones as int8 and as float), measured by onnxruntime;
        onnxruntime's outputs compared with edgetrain's."""
        t0 = time.perf_counter()
        diffs: dict[str, list[float]] = {"float": [], "int8": []}
        same = True
        for name in VARIANTS:
            for kind in ("float", "int8"):
                variant, sess, probs, seconds = trained[f"{name}-{kind}"]
                path = os.path.join(self.out_dir, f"personalized-{name}-{kind}.onnx")
                sess.export_onnx(path)
                row = self._measure(
                    f"{name}, {kind}",
                    path,
                    kind,
                    kind,
                    name,
                    artifact_bytes=os.path.getsize(paths[f"{name}-{kind}"]),
                    median_step_ms=1000 * float(np.median(seconds)),
                    steps=variant.steps,
                    train_seconds=variant.train_seconds,
                    edgetrain_user_accuracy=variant.user_accuracy,
                )
                row.onnxruntime_max_diff = float(np.max(np.abs(self.ort_user_outputs - probs)))
                diffs[kind].append(row.onnxruntime_max_diff)
                same = same and row.user_accuracy == variant.user_accuracy
                if kind == "int8":
                    path = os.path.join(self.out_dir, f"personalized-{name}-int8-float.onnx")
                    sess.export_onnx(path, float_model=True)
                    self._measure(f"{name}, int8 -> float export", path, "int8", "float", name)
        self._say_exports(diffs, same, time.perf_counter() - t0)

    def _say_exports(self, diffs: dict[str, list[float]], same: bool, seconds: float) -> None:
        step = _output_step(self.int8_path)
        worst = max(diffs["int8"])
        n = int(round(worst / step)) if step else 0
        steps = f"{n} output step{'' if n == 1 else 's'} ({worst:.4f})" if step else f"{worst:.1e}"
        self.say(
            f"[4/4] exported them to ONNX in {duration(seconds)}: the float models; the int8 models as int8 (QDQ as "
            "they came, the trained"
        )
        self.say("      weights requantized on the model's scales) and as float (float_model=True)")
        self.say(
            f"      onnxruntime against edgetrain: float largest difference {max(diffs['float']):.1e}; int8 within "
            f"{steps}"
        )
        self.say(
            "      (onnxruntime fuses the int8 graph into integer kernels); accuracy "
            + ("the same" if same else "NOT the same: the table gives onnxruntime's")
        )

    def quantized_table(self, demo: QuantizedDemoResult) -> None:
        """The table: onnxruntime's accuracy on the user's and the original digits, file sizes, step time."""
        rows = [("", "new user", "original", "model", "artifact", "median")]
        rows.append(("", "(held out)", "handwriting", "bytes", "bytes", "ms/step"))
        for r in demo.rows:
            rows.append(
                (
                    r.name,
                    percent(r.user_accuracy),
                    percent(r.original_accuracy),
                    f"{r.model_bytes:,}",
                    "-" if r.artifact_bytes is None else f"{r.artifact_bytes:,}",
                    "-" if r.median_step_ms is None else f"{r.median_step_ms:.1f}",
                )
            )
        self.say_table(rows)
        self.say(f"  accuracy by onnxruntime on the files in {self.out_dir}; step times on this machine")
        self.say(f"  {'int8 base model':16s} {self.int8_path}")
        for name in VARIANTS:
            self.say(f"  {name + ' models':16s} {os.path.join(self.out_dir, f'personalized-{name}-*.onnx')}")


def run_quantized_command(args) -> int:
    """`edgetrain demo --quantized` (its parsed arguments: --epochs, --out, --json; --model lenet only) -> 0."""
    if args.epochs < 1:
        raise UsageError(f"--epochs must be a positive integer, got {args.epochs}")
    if args.model != "lenet":
        raise UsageError(f"--quantized runs with the LeNet (--model lenet), not --model {args.model}")
    result = run_quantized_demo(args.out, epochs=args.epochs)
    if args.json:
        write_json(args.json, result)
    return 0
