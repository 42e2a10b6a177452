"""`edgetrain demo`: the embedded base model and a new user's digits -> the personalization story on screen (base
accuracy, head-only and full fine-tuning side by side, accuracy after, export checked by onnxruntime), a table, a
JSON summary and, with matplotlib, a training-curve plot. Build side: needs onnx; onnxruntime for the check.
`--model lstm` (or gru) tells the same story with a sequence model that reads each digit row by row.
`--quantized` tells it with the LeNet quantized to int8 by onnxruntime's static quantizer (needs onnxruntime): float
and int8 personalized side by side, exported int8 and float, every model file measured by onnxruntime.
`--model keyboard` tells it with a next-word language model (data/keyboard/, tools/build_keyboard.py) and a new
user's sentences: LoRA, head-only and full fine-tuning, the adapters exported for onnxruntime's multi-LoRA serving."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import numpy as np

from loaders import DataLoader, MnistDataView
from loaders.text import TokenWindowView, WordVocab

from .core.atomic import atomic_write
from .core.errors import ConfigError, StorageError, UnsupportedError, UsageError
from .derive.adapters import LoRA
from .derive.losses import CrossEntropyLoss, NextTokenLoss
from .derive.optimizers import SGD, Adam
from .derive.pipeline import convert
from .runtime import InferenceSession, TrainingSession
from .runtime.progress import TrainProgress, duration, percent
from .runtime.schedules import CosineLR
from .runtime.threads import blas_threads
from .runtime.trainer import Trainer

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
BASE_MODEL = os.path.join(DATA, "digits_lenet.onnx")  # the default model's
BASE_DIGITS = os.path.join(DATA, "digits")  # the base model's training and test sets (MNIST idx files)
NEW_USER = os.path.join(DATA, "newuser")  # train: the user's samples to learn from; t10k: held out
USER_STYLE = "rotated 25 degrees, slanted and written with a heavier pen"


@dataclass(frozen=True)
class BaseModel:
    """One of the embedded base models (tools/build_demo_assets.py builds them): same input, same output."""

    file: str  # in DATA
    description: str  # what it is, on screen after its file name
    head: str  # the classifier layer (node) that head-only fine-tuning trains: its parameters are f"{head}.*"
    recurrent: str | None = None  # the recurrent op (LSTM, GRU) the head sits on, if any


MODELS = {
    "lenet": BaseModel("digits_lenet.onnx", "LeNet-5 style", "fc3"),
    "lstm": BaseModel(
        "digits_lstm.onnx", "an LSTM (64 units) reading each digit row by row, 28 steps", "fc", "LSTM"
    ),
    "gru": BaseModel(
        "digits_gru.onnx", "a GRU (64 units) reading each digit row by row, 28 steps", "fc", "GRU"
    ),
}

# The two ways to personalize, side by side: the same data, epochs and batches; each with the step size that
# suits it (measured in tools/build_demo_assets.py's experiments: more makes full fine-tuning unstable; the
# recurrent models were measured with the same rates). The head-only variant trains MODELS[...].head alone.
VARIANTS = {
    "head-only": {"head_only": True, "lr": 0.05},
    "full": {"head_only": False, "lr": 0.01},
}
BATCH = 10


@dataclass
class VariantResult:
    name: str
    trainable: int  # trainable parameter values
    user_accuracy: float  # on the new user's held-out digits, after fine-tuning
    original_accuracy: float  # on the base model's test digits (original handwriting), after fine-tuning
    train_seconds: float
    steps: int
    onnx_path: str
    onnxruntime_accuracy: float | None  # the exported model's user accuracy, run by onnxruntime
    onnxruntime_max_diff: float | None  # largest |probability difference| between onnxruntime and edgetrain
    curve: list[dict[str, Any]] = field(default_factory=list)  # the Trainer's history, epoch by epoch


@dataclass
class DemoResult:
    base_user_accuracy: float
    base_original_accuracy: float
    user_train_samples: int
    user_heldout_samples: int
    epochs: int
    variants: dict[str, VariantResult]
    seconds: float
    plot: str | None
    out_dir: str
    model: str = "lenet"  # a key of MODELS

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def _accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(probs, axis=1) == labels))


def _count(session) -> int:
    return int(sum(v.size for v in session.parameters().values()))


def _check_with_onnxruntime(path: str, x: np.ndarray, y: np.ndarray, reference: np.ndarray):
    """(accuracy, max |diff| against edgetrain's output) of the exported model under onnxruntime, or Nones."""
    try:
        import onnxruntime as ort  # optional: the exported models are checked only where it is installed
    except ImportError:
        return None, None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    (probs,) = sess.run(None, {sess.get_inputs()[0].name: x})
    return _accuracy(probs, y), float(np.max(np.abs(probs - reference)))


def _recurrent_weights(path: str, op: str) -> tuple[int, dict[str, np.ndarray]]:
    """(how many `op` nodes the ONNX model holds, the initializers they read (W, R, B) by name)."""
    import onnx  # build side: the demo needs onnx; importing this module does not
    from onnx import numpy_helper  # as above

    graph = onnx.load(path).graph
    nodes = [n for n in graph.node if n.op_type == op]
    names = {i for n in nodes for i in n.input}
    return len(nodes), {t.name: numpy_helper.to_array(t) for t in graph.initializer if t.name in names}


def _plot(path: str, result: DemoResult) -> str | None:
    try:
        import matplotlib  # optional: the demo plots only when matplotlib is installed

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # optional, as above
    except ImportError:
        return None
    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
    colors = {"head-only": "tab:blue", "full": "tab:orange"}
    for name, v in result.variants.items():
        epochs = [0] + [r["epoch"] for r in v.curve]
        acc = [result.base_user_accuracy] + [r["val_accuracy"] for r in v.curve]
        acc_ax.plot(epochs, [100 * a for a in acc], label=f"{name} fine-tuning", color=colors.get(name))
        loss_ax.plot(
            [r["epoch"] for r in v.curve],
            [r["train_loss"] for r in v.curve],
            label=name,
            color=colors.get(name),
        )
    acc_ax.axhline(100 * result.base_user_accuracy, color="gray", ls="--", label="base model")
    acc_ax.set(
        xlabel="epoch",
        ylabel="accuracy (%)",
        title="new user's held-out digits",
        ylim=(0, 100),
        xlim=(0, None),
    )
    acc_ax.legend(loc="lower right")
    loss_ax.set(xlabel="epoch", ylabel="loss", title=f"training loss ({result.user_train_samples} samples)")
    loss_ax.set_yscale("log")
    loss_ax.legend()
    op = MODELS[result.model].recurrent
    fig.suptitle(
        "edgetrain demo: personalizing a handwriting model on the device" + (f" ({op})" if op else "")
    )
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def run_demo(
    out_dir: str | None = None,
    *,
    model: str = "lenet",
    epochs: int = 20,
    plot: bool = True,
    stream: TextIO | None = None,
    progress_stream: TextIO | None = None,
    seed: int = 0,
) -> DemoResult:
    """The whole story with MODELS[model]; writes artifacts, checkpoints, personalized models, summary.json and
    curves.png into out_dir (default ./edgetrain-demo, ./edgetrain-demo-MODEL for another model than lenet), and
    tells it on `stream` (stdout), with progress bars on `progress_stream` (stderr)."""
    if model not in MODELS:
        raise ConfigError(f"the demo has no model {model!r}; it has {', '.join(MODELS)}")
    if out_dir is None:
        out_dir = "edgetrain-demo" if model == "lenet" else f"edgetrain-demo-{model}"
    # A recurrence is a chain of small matrix products (28 steps of [10, 64] x [64, 256]) that gains nothing from a
    # second BLAS thread on an idle 2-core x86-64, and ran 4 times slower with two on a busy one (15 s against
    # 3.7 s for head-only's 100 steps, with 4 times the CPU time). The process's setting is restored after.
    with _blas_threads(1 if MODELS[model].recurrent else None):
        return _tell_story(
            out_dir,
            model,
            epochs=epochs,
            plot=plot,
            stream=stream,
            progress_stream=progress_stream,
            seed=seed,
        )


@contextlib.contextmanager
def _blas_threads(n: int | None):
    """numpy's BLAS at n threads (None: as it is) inside the block, as before after it (when it can be told)."""
    if n is None:
        yield
        return
    before, _ = blas_threads()
    blas_threads(n)
    try:
        yield
    finally:
        if before is not None:
            blas_threads(before)


def _tell_story(
    out_dir: str,
    model: str,
    *,
    epochs: int,
    plot: bool,
    stream: TextIO | None,
    progress_stream: TextIO | None,
    seed: int,
) -> DemoResult:
    """The scenes in order -> the result, also written to out_dir/summary.json."""
    t_start = time.perf_counter()
    story = _Story(out_dir, model, epochs=epochs, seed=seed, stream=stream, progress_stream=progress_stream)
    story.introduce()
    base_user, base_orig = story.measure_base()
    paths = story.convert_variants()
    variants, sessions, user_probs = story.fine_tune(paths, base_user)
    story.export(variants, sessions, user_probs)
    demo = DemoResult(
        base_user_accuracy=base_user,
        base_original_accuracy=base_orig,
        user_train_samples=story.user_train.size(),
        user_heldout_samples=story.user_held.size(),
        epochs=epochs,
        variants=variants,
        seconds=0.0,
        plot=None,
        out_dir=out_dir,
        model=model,
    )
    if plot:
        demo.plot = _plot(os.path.join(out_dir, "curves.png"), demo)
    story.table(demo)
    story.files(demo, plot)
    demo.seconds = time.perf_counter() - t_start
    story.finish(demo)
    return demo


class _Story:
    """One telling of the demo: the base model, the user's and the original digits, the folder it writes to, and a
    method per scene, each printing its lines."""

    def __init__(
        self,
        out_dir: str,
        model: str,
        *,
        epochs: int,
        seed: int,
        stream: TextIO | None,
        progress_stream: TextIO | None,
    ):
        self.out = stream if stream is not None else sys.stdout
        self.out_dir, self.epochs, self.seed, self.progress_stream = out_dir, epochs, seed, progress_stream
        self.spec = MODELS[model]
        self.base_path = os.path.join(DATA, self.spec.file)
        os.makedirs(out_dir, exist_ok=True)
        self.original = MnistDataView.from_dir(BASE_DIGITS, "test")
        self.base_train = MnistDataView.from_dir(BASE_DIGITS, "train")
        self.user_train = MnistDataView.from_dir(NEW_USER, "train")
        self.user_held = MnistDataView.from_dir(NEW_USER, "test")
        self.xo, self.yo = self.original.get_batch(np.arange(self.original.size()))
        self.xu, self.yu = self.user_held.get_batch(np.arange(self.user_held.size()))
        # the held-out digits as stored (0..255): what the exported models take, their input pipeline inside
        self.xu_raw = self.user_held.raw().get_batch(np.arange(self.user_held.size()))[0].astype(np.uint8)

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def introduce(self, title: str = "personalizing a handwriting model on the device") -> None:
        """The title, the base model and the new user."""
        say, spec = self.say, self.spec
        say(f"edgetrain demo: {title}")
        say("")
        what = f"  base model  {spec.file}: {spec.description},"
        trained = f"trained by edgetrain on {self.base_train.size():,} UCI handwritten digits"
        if len(what) + 1 + len(trained) <= 110:
            say(f"{what} {trained}")
        else:
            say(what)
            say(f"              {trained}")
        say(f"  new user    writes digits {USER_STYLE};")
        say(
            f"              {self.user_train.size()} samples to learn from, {self.user_held.size()} held out to measure"
        )
        say("")

    def measure_base(self) -> tuple[float, float]:
        """[1/4] -> the base model's accuracy on the user's held-out digits and on the handwriting it learned."""
        base = InferenceSession(self.base_path)
        (p_user,) = base.run(None, {"image": self.xu})
        (p_orig,) = base.run(None, {"image": self.xo})
        base_user, base_orig = _accuracy(p_user, self.yu), _accuracy(p_orig, self.yo)
        self.say(
            f"[1/4] the base model reads the new user's digits with {percent(base_user)} accuracy "
            f"({percent(base_orig)} on the handwriting it learned)"
        )
        return base_user, base_orig

    def convert_variants(self) -> dict[str, str]:
        """[2/4] the base model -> a training artifact (.etrain) per variant -> their paths."""
        spec = self.spec
        t0 = time.perf_counter()
        paths = {}
        program_ops = {}  # variant -> the op types of its training program
        for name, cfg in VARIANTS.items():
            art = convert(
                self.base_path,
                loss=CrossEntropyLoss(),
                optimizer=SGD(lr=cfg["lr"], momentum=0.9, weight_decay=5e-4),
                trainable=[f"{spec.head}.*"] if cfg["head_only"] else None,
                batch_size=BATCH,
            )
            paths[name] = os.path.join(self.out_dir, f"{name}.etrain")
            art.save(paths[name])
            program_ops[name] = {n.op_type for n in art.graph.nodes}
        self.say(
            f"[2/4] converted it into two training programs (.etrain), head-only ({spec.head}) and full, "
            f"in {duration(time.perf_counter() - t0)}"
        )
        if spec.recurrent:
            grad = f"{spec.recurrent}Grad"  # the recurrence's fused backward: back through time in one op
            head_has, full_has = grad in program_ops["head-only"], grad in program_ops["full"]
            self.say(
                f"      head-only {'still goes back through' if head_has else 'has no backward through'} the "
                f"{spec.recurrent}; full {'goes back through' if full_has else 'does NOT go back through'} it, "
                f"all {self.xu.shape[2]} steps"
            )
        return paths

    def fine_tune(self, paths: dict[str, str], base_user: float):
        """[3/4] each artifact trained on the user's samples -> (the variants' results, their sessions, their
        outputs on the user's held-out digits)."""
        self.say(
            f"[3/4] fine-tuning on the device: {self.epochs} epochs of the user's {self.user_train.size()} samples, "
            f"batch {BATCH}, SGD with momentum" + (", one BLAS thread" if self.spec.recurrent else "")
        )
        variants: dict[str, VariantResult] = {}
        sessions = {}
        user_probs = {}  # each personalized model's outputs on the user's held-out digits
        for name in VARIANTS:
            sess = sessions[name] = TrainingSession(paths[name])
            variants[name], user_probs[name] = self._fine_tune_one(name, sess)
            self.say(
                f"      {name:9s} {variants[name].steps} steps in {duration(variants[name].train_seconds)}: "
                f"{percent(base_user)} -> {percent(variants[name].user_accuracy)} on the new user's held-out digits"
            )
        return variants, sessions, user_probs

    def _fine_tune_one(
        self, name: str, sess: TrainingSession, label: str | None = None
    ) -> tuple[VariantResult, np.ndarray]:
        """One variant's training, with its progress bar -> (its result, its outputs on the held-out digits)."""
        loader = DataLoader(self.user_train, BATCH, shuffle=True, seed=self.seed)
        bar = TrainProgress(
            self.epochs * len(loader),
            BATCH,
            label=f"      {label or name:9s}",
            stream=self.progress_stream,
            epoch_lines=False,
        )
        trainer = Trainer(
            sess,
            loader,
            val_loader=DataLoader(self.user_held, BATCH),
            epochs=self.epochs,
            checkpoint=os.path.join(self.out_dir, f"{name}.etck"),
            progress=bar,
        )
        t0 = time.perf_counter()
        result = trainer.fit()
        bar.close()
        seconds = time.perf_counter() - t0
        user_probs = sess.run(self.xu)
        variant = VariantResult(
            name=name,
            trainable=_count(sess),
            user_accuracy=_accuracy(user_probs, self.yu),
            original_accuracy=_accuracy(sess.run(self.xo), self.yo),
            train_seconds=seconds,
            steps=result.steps,
            onnx_path="",
            onnxruntime_accuracy=None,
            onnxruntime_max_diff=None,
            curve=result.history,
        )
        return variant, user_probs

    def export(self, variants: dict[str, VariantResult], sessions, user_probs) -> None:
        """[4/4] each personalized model -> ONNX, run by onnxruntime where it is installed (fills in the variants'
        onnx fields)."""
        t0 = time.perf_counter()
        checked = []
        for name, v in variants.items():
            v.onnx_path = os.path.join(self.out_dir, f"personalized-{name}.onnx")
            sessions[name].export_onnx(v.onnx_path)
            raw = self.xu_raw if sessions[name].preprocessing.declared else self.xu
            v.onnxruntime_accuracy, v.onnxruntime_max_diff = _check_with_onnxruntime(
                v.onnx_path, raw, self.yu, user_probs[name]
            )
            if v.onnxruntime_accuracy is not None:
                checked.append(v)
        if checked:
            worst = max(v.onnxruntime_max_diff for v in checked)
            same = all(v.onnxruntime_accuracy == v.user_accuracy for v in checked)
            self.say(
                f"[4/4] exported the personalized models to ONNX; onnxruntime runs them "
                f"{'with the same accuracy' if same else 'with a DIFFERENT accuracy'} "
                f"(largest probability difference {worst:.1e}), in {duration(time.perf_counter() - t0)}"
            )
        else:
            self.say(
                "[4/4] exported the personalized models to ONNX (onnxruntime is not installed: not checked)"
            )
        if self.spec.recurrent:
            self._recurrent_weights_note(variants)

    def _recurrent_weights_note(self, variants: dict[str, VariantResult]) -> None:
        """Whether the recurrence stayed one ONNX node in the exported models, and which of its weights trained."""
        op = self.spec.recurrent
        _, shipped = _recurrent_weights(self.base_path, op)
        kept, changed = [], {}
        for name, v in variants.items():
            count, mine = _recurrent_weights(v.onnx_path, op)
            kept.append(count)
            changed[name] = [k for k in shipped if not np.array_equal(mine.get(k), shipped[k])]
        weights = "; ".join(
            f"{name}'s {', '.join(c) + ' trained' if c else 'weights as shipped'}"
            for name, c in changed.items()
        )
        if set(kept) == {1}:
            self.say(f"      the {op} stays one ONNX node: {weights}")
        else:
            self.say(f"      {op} nodes in the exported models: {kept} (the base model has one); {weights}")

    def table(self, demo: DemoResult) -> None:
        """The summary table: accuracy on the user's and on the original handwriting, trainable parameters, time."""
        rows = [("", "new user", "original", "trainable", "time")]
        rows.append(("", "(held out)", "handwriting", "parameters", ""))
        rows.append(
            ("base model", percent(demo.base_user_accuracy), percent(demo.base_original_accuracy), "-", "-")
        )
        for name, v in demo.variants.items():
            rows.append(
                (
                    f"{name} fine-tuning",
                    percent(v.user_accuracy),
                    percent(v.original_accuracy),
                    f"{v.trainable:,}",
                    duration(v.train_seconds),
                )
            )
        widths = [max(len(r[k]) for r in rows) for k in range(5)]
        self.say("")
        for k, r in enumerate(rows):
            self.say(
                "  " + r[0].ljust(widths[0]) + "".join("   " + c.rjust(w) for c, w in zip(r[1:], widths[1:]))
            )
            if k == 1:
                self.say("  " + "-" * (sum(widths) + 3 * 4))
        self.say("")

    def files(self, demo: DemoResult, plot: bool) -> None:
        """The personalized models and the plot, where they are."""
        for v in demo.variants.values():
            extra = (
                ""
                if v.onnxruntime_accuracy is None
                else f"  (onnxruntime: {percent(v.onnxruntime_accuracy)})"
            )
            self.say(f"  {v.name + ' model':16s} {v.onnx_path}{extra}")
        if demo.plot:
            self.say(f"  {'training curves':16s} {demo.plot}")
        elif plot:
            self.say("  (pip install matplotlib to get a plot of the training curves)")

    def finish(self, demo: DemoResult) -> None:
        """summary.json, and the closing line."""
        with open(os.path.join(self.out_dir, "summary.json"), "w", encoding="utf-8") as f:
            f.write(demo.to_json() + "\n")
        self.say(f"  {'summary':16s} {os.path.join(self.out_dir, 'summary.json')}")
        self.say("")
        self.say(
            f"done in {duration(demo.seconds)}. Try the same on your own data: edgetrain convert MODEL.onnx, "
            "edgetrain train ... --data DIR"
        )


# ---- an int8 model: `edgetrain demo --quantized` ------------------------------------------------------------------

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
class QuantizedDemoResult:
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

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def _onnxruntime():
    """onnxruntime and its quantizer, or an UnsupportedError saying how to get them."""
    try:
        import onnxruntime  # build side: the int8 demo quantizes and measures with it
        import onnxruntime.quantization  # noqa: F401  (as above)
    except ImportError as e:
        raise UnsupportedError(
            "`edgetrain demo --quantized` makes the int8 model with onnxruntime's quantizer and measures every "
            "model with onnxruntime, which is not installed here: pip install onnxruntime (or pip install -e "
            "'.[demo]')"
        ) from e
    return onnxruntime


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


def _timed(sess: TrainingSession) -> list[float]:
    """The session's train_step timed from now on: the list its steps' seconds are appended to."""
    seconds: list[float] = []
    step = sess.train_step

    def train_step(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return step(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - t0)

    sess.train_step = train_step
    return seconds


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
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as f:
        f.write(demo.to_json() + "\n")
    story.say(f"  {'summary':16s} {os.path.join(out_dir, 'summary.json')}")
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
        widths = [max(len(r[k]) for r in rows) for k in range(6)]
        self.say("")
        for k, r in enumerate(rows):
            self.say(
                "  " + r[0].ljust(widths[0]) + "".join("   " + c.rjust(w) for c, w in zip(r[1:], widths[1:]))
            )
            if k == 1:
                self.say("  " + "-" * (sum(widths) + 3 * 5))
        self.say("")
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
        try:
            atomic_write(args.json, (result.to_json() + "\n").encode("utf-8"))
        except OSError as e:
            raise StorageError.of(e, args.json, "cannot write the demo's summary") from e
    return 0


# ---- a language model: `edgetrain demo --model keyboard` ----------------------------------------------------------

# tools/build_keyboard.py's assets: the model, its vocabulary, the texts, SOURCES.md (their licenses)
KEYBOARD = os.path.join(DATA, "keyboard")
KEYBOARD_MODEL = os.path.join(KEYBOARD, "keyboard_lm.onnx")
# over the user's 300 sentences, 18 steps an epoch: more overfits (the held-out perplexity rises again)
KEYBOARD_EPOCHS = 5
KEYBOARD_BATCH = 16
EVAL_BATCH = 64  # windows per run() when measuring: one compiled program for every chunk (the last is padded)
SPECIALS = 4  # <pad> <unk> <bos> <eos>: never suggested, and not counted as words
LORA = {"rank": 8, "alpha": 16.0, "targets": ["*attn*", "*mlp*"]}  # q, k, v, proj, fc, proj of both blocks
# The three ways to personalize, each with Adam at the step size that suits it (measured on the user's held-out
# sentences, 5 epochs with a cosine decay; LoRA's B starts at zero, so it takes the largest step)
KEYBOARD_VARIANTS = {
    "LoRA": {"lr": 1e-2, "lora": True, "trainable": None},
    "head-only": {"lr": 5e-3, "lora": False, "trainable": ["head.*"]},
    "full": {"lr": 1e-3, "lora": False, "trainable": None},
}
RSS_STEPS = 10  # training steps of the fresh process that measures a variant's peak RSS

# The peak-RSS probe: a fresh interpreter with the device side alone (numpy, edgetrain.runtime) loads a variant's
# artifact and trains RSS_STEPS steps on one batch, one BLAS thread; its own VmHWM (ru_maxrss would carry the
# parent's over exec).
_RSS_WORKER = r"""
import json, sys
import numpy as np
from edgetrain.runtime import TrainingSession
def kib(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))
batch = np.load(sys.argv[2])
start = kib("VmRSS")
sess = TrainingSession(sys.argv[1], threads=1)
for _ in range(int(sys.argv[3])):
    sess.train_step(batch["x"], batch["y"])
print(json.dumps({"start_kib": start, "peak_kib": kib("VmHWM")}))
"""


@dataclass
class LMFigures:
    """A model's next-word figures on a set of sentences: perplexity over every target token (the next token after
    each position, <unk> and <eos> included); top-1 and top-3 accuracy over the targets that are words, ranked among
    the words (a keyboard suggests no special token)."""

    perplexity: float
    top1: float
    top3: float
    targets: int
    word_targets: int


@dataclass
class KeyboardVariant:
    name: str
    trainable: int  # trainable values (LoRA: the adapters')
    trainable_bytes: int  # their float32 bytes: what one user's personalization changes
    artifact_bytes: int
    steps: int
    train_seconds: float
    median_step_ms: float
    user: LMFigures  # on the user's held-out sentences, after
    base: LMFigures  # on the base corpus's held-out sentences, after
    peak_rss_mib: float | None = None  # VmHWM of a fresh process training the artifact RSS_STEPS steps
    start_rss_mib: float | None = (
        None  # ... its RSS before loading the artifact (the interpreter, numpy, edgetrain)
    )
    onnx_path: str = ""
    onnx_bytes: int = 0
    onnxruntime_max_diff: float | None = None  # largest |logit difference|, onnxruntime against the session
    onnxruntime_top1: float | None = None  # onnxruntime's top-1 on the user's held-out sentences
    adapter_path: str | None = None  # LoRA: the onnxruntime adapter file served with served_path
    adapter_bytes: int | None = None
    etad_bytes: int | None = None  # LoRA: the adapters in edgetrain's own container
    served_path: str | None = None
    served_max_diff: float | None = None  # onnxruntime: served base + adapter file against the merged model
    curve: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class KeyboardDemoResult:
    base_user: LMFigures
    base_base: LMFigures  # the base model on its own held-out sentences (what it learned)
    parameters: int
    model_bytes: int
    vocabulary: int
    user_known_words: float  # share of the user's held-out words in the vocabulary
    user_train_sentences: int
    user_heldout_sentences: int
    base_heldout_sentences: int
    epochs: int
    batch: int
    lora: dict[str, Any]
    variants: dict[str, KeyboardVariant]
    seconds: float
    out_dir: str
    model: str = "keyboard"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def lm_figures(logits: np.ndarray, labels: np.ndarray) -> LMFigures:
    """LMFigures of logits [N, T, V] against NextTokenLoss's labels [N, T] (position t scores token t + 1; -100:
    nothing to score)."""
    z = logits[:, :-1].reshape(-1, logits.shape[-1]).astype(np.float64)
    t = labels[:, 1:].reshape(-1)
    keep = t >= 0
    z, t = z[keep], t[keep]
    z -= z.max(axis=1, keepdims=True)
    logp = z[np.arange(t.size), t] - np.log(np.exp(z).sum(axis=1))
    wordy = t >= SPECIALS
    w = z[wordy][:, SPECIALS:]
    rank = (w > w[np.arange(w.shape[0]), t[wordy] - SPECIALS][:, None]).sum(axis=1)
    return LMFigures(
        perplexity=float(np.exp(-logp.mean())),
        top1=float(np.mean(rank < 1)),
        top3=float(np.mean(rank < 3)),
        targets=int(t.size),
        word_targets=int(wordy.sum()),
    )


def _chunked(run, x: np.ndarray, batch: int = EVAL_BATCH) -> np.ndarray:
    """run(x) over x in chunks of `batch` rows, the last padded (one program, one shape), concatenated."""
    out = []
    for a in range(0, len(x), batch):
        part = x[a : a + batch]
        n = len(part)
        if n < batch:
            part = np.concatenate([part, np.zeros((batch - n, *part.shape[1:]), part.dtype)])
        out.append(run(part)[:n])
    return np.concatenate(out)


def _ort_logits(path: str, x: np.ndarray, adapter: str | None = None) -> np.ndarray:
    """The model's logits under onnxruntime (one thread), with an onnxruntime adapter file active if given."""
    ort = _onnxruntime()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    run_options = None
    if adapter is not None:
        lora = ort.LoraAdapter()
        lora.Load(adapter)
        run_options = ort.RunOptions()
        run_options.add_active_adapter(lora)
    return _chunked(lambda part: sess.run(None, {"ids": part}, run_options)[0], x)


def _read_lines(name: str) -> list[str]:
    with open(os.path.join(KEYBOARD, name), encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def _mib(kib: int) -> float:
    return kib / 1024


def run_keyboard_demo(
    out_dir: str | None = None,
    *,
    epochs: int = KEYBOARD_EPOCHS,
    stream: TextIO | None = None,
    progress_stream: TextIO | None = None,
    seed: int = 0,
    base_sentences: int | None = None,
    measure_memory: bool = True,
) -> KeyboardDemoResult:
    """A keyboard's next-word model personalized on the device: the embedded GPT-style LM (trained on the KJV)
    learns a new user's sentences (fortune cookies) with LoRA, head-only and full fine-tuning; held-out top-1/top-3
    and perplexity before and after, trainable and adapter bytes, step time, peak RSS (measure_memory), the exports
    checked in onnxruntime (merged LoRA, and the served base with the user's onnxruntime adapter file). Writes into
    out_dir (default ./edgetrain-demo-keyboard) the artifacts, checkpoints, exported models, adapter files and
    summary.json. base_sentences: measure the base corpus on its first so many held-out sentences (all 1,000 by
    default; fewer for a quick run)."""
    _onnxruntime()
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ConfigError(f"epochs must be a positive integer, got {epochs!r}")
    out_dir = out_dir or "edgetrain-demo-keyboard"
    # one BLAS thread, as a phone's training thread would run: on a busy 2-core x86-64 a step ran 4 times slower
    # with two (530 ms against 125 for LoRA's); the process's setting is restored after
    with _blas_threads(1):
        return _tell_keyboard_story(
            out_dir, epochs, seed, stream, progress_stream, base_sentences, measure_memory
        )


def _tell_keyboard_story(
    out_dir, epochs, seed, stream, progress_stream, base_sentences, measure_memory
) -> KeyboardDemoResult:
    """The keyboard demo's scenes in order -> the result, also written to out_dir/summary.json."""
    t_start = time.perf_counter()
    story = _KeyboardStory(out_dir, epochs, seed, stream, progress_stream, base_sentences)
    story.introduce()
    base_user, base_base = story.measure_base()
    paths = story.convert_variants()
    variants, sessions = story.fine_tune(paths, base_user)
    if measure_memory:
        story.memory(variants, paths)
    story.export(variants, sessions, paths)
    demo = KeyboardDemoResult(
        base_user=base_user,
        base_base=base_base,
        parameters=story.parameters,
        model_bytes=os.path.getsize(KEYBOARD_MODEL),
        vocabulary=len(story.vocab),
        user_known_words=story.known,
        user_train_sentences=len(story.user_train_text),
        user_heldout_sentences=len(story.user_held_text),
        base_heldout_sentences=len(story.base_held_text),
        epochs=epochs,
        batch=KEYBOARD_BATCH,
        lora=dict(LORA),
        variants=variants,
        seconds=0.0,
        out_dir=out_dir,
    )
    story.keyboard_table(demo)
    demo.seconds = time.perf_counter() - t_start
    story.keyboard_finish(demo)
    return demo


class _KeyboardStory(_Story):
    """The keyboard demo's telling: the vocabulary, the user's and the base corpus's sentences as token windows, a
    method per scene (the say() of the digits demo's story)."""

    def __init__(self, out_dir, epochs, seed, stream, progress_stream, base_sentences):
        self.out = stream if stream is not None else sys.stdout
        self.out_dir, self.epochs, self.seed, self.progress_stream = out_dir, epochs, seed, progress_stream
        os.makedirs(out_dir, exist_ok=True)
        self.vocab = WordVocab.load(os.path.join(KEYBOARD, "vocab.json"))
        self.user_train_text = _read_lines("user_train.txt")
        self.user_held_text = _read_lines("user_heldout.txt")
        self.base_held_text = _read_lines("base_heldout.txt")[:base_sentences]
        self.length = int(InferenceSession(KEYBOARD_MODEL).get_inputs()[0].shape[1])

        def windows(texts):
            return TokenWindowView.from_texts(self.vocab, texts, self.length)

        self.user_train = windows(self.user_train_text)
        self.user_held, self.base_held = windows(self.user_held_text), windows(self.base_held_text)
        ids = np.concatenate([self.vocab.encode(t) for t in self.user_held_text])
        self.known = float(np.mean(ids != self.vocab.unk_id))

    def introduce(self, title: str = "personalizing a keyboard's next-word model on the device") -> None:
        self.say(f"edgetrain demo: {title}")
        self.say("")
        self.say(
            f"  base model  keyboard_lm.onnx: a GPT-style language model (2 decoder blocks, d 64, 4 heads), a "
            f"{len(self.vocab):,}-word"
        )
        self.say(
            "              vocabulary, trained on the King James Bible (public domain; tools/build_keyboard.py)"
        )
        self.say(
            "  new user    writes fortune cookies (fortune-mod's `fortunes`, BSD license): modern, short, "
            "second person;"
        )
        self.say(
            f"              {len(self.user_train_text)} sentences to learn from, {len(self.user_held_text)} held out "
            f"to measure ({percent(self.known)} of their words in the vocabulary)"
        )
        self.say("")

    def _figures(self, run) -> tuple[LMFigures, LMFigures]:
        """(on the user's held-out sentences, on the base corpus's) of a model's run(ids) -> logits."""
        user = lm_figures(_chunked(run, self.user_held.x), self.user_held.y)
        base = lm_figures(_chunked(run, self.base_held.x), self.base_held.y)
        return user, base

    def measure_base(self) -> tuple[LMFigures, LMFigures]:
        """[1/5] the base model on the user's held-out sentences and on the base corpus's."""
        base = InferenceSession(KEYBOARD_MODEL)
        user, kjv = self._figures(lambda x: base.run(None, {"ids": x})[0])
        self.say(
            f"[1/5] the base model guesses the new user's next word {percent(user.top1)} of the time (top 3: "
            f"{percent(user.top3)}, perplexity {user.perplexity:.0f});"
        )
        self.say(
            f"      on the Bible verses it never saw: {percent(kjv.top1)} (top 3: {percent(kjv.top3)}, perplexity "
            f"{kjv.perplexity:.0f})"
        )
        return user, kjv

    def convert_variants(self) -> dict[str, str]:
        """[2/5] the base model -> a training artifact per variant, NextTokenLoss and Adam -> their paths."""
        t0 = time.perf_counter()
        paths, counts = {}, {}
        for name, cfg in KEYBOARD_VARIANTS.items():
            art = convert(
                KEYBOARD_MODEL,
                loss=NextTokenLoss(),
                optimizer=Adam(lr=cfg["lr"]),
                trainable=cfg["trainable"],
                adapters=LoRA(**LORA, seed=self.seed) if cfg["lora"] else None,
                batch_size=KEYBOARD_BATCH,
            )
            paths[name] = os.path.join(self.out_dir, f"{name.lower()}.etrain")
            art.save(paths[name])
            counts[name] = int(sum(art.initial[p].size for p in art.parameters))
        self.parameters, self.counts = counts["full"], counts
        self.say(
            f"[2/5] converted it into three training programs (.etrain) with edgetrain's next-token loss, in "
            f"{duration(time.perf_counter() - t0)}:"
        )
        targets = ", ".join(LORA["targets"])
        self.say(
            f"      LoRA rank {LORA['rank']}, alpha {LORA['alpha']:g} on {targets} (q, k, v, proj, fc, proj of both "
            f"blocks): {counts['LoRA']:,} values"
        )
        self.say(
            f"      head-only (head): {counts['head-only']:,} values; full: all {counts['full']:,}; the rest "
            "frozen, its gradients never computed"
        )
        return paths

    def fine_tune(self, paths: dict[str, str], base_user: LMFigures):
        """[3/5] each artifact trained on the user's sentences -> (the variants' results, their sessions)."""
        self.say(
            f"[3/5] fine-tuning on the device: {self.epochs} epochs of {self.user_train.size()} sentences, batch "
            f"{KEYBOARD_BATCH}, Adam with cosine decay, one BLAS thread"
        )
        variants, sessions = {}, {}
        for name in KEYBOARD_VARIANTS:
            sess = sessions[name] = TrainingSession(paths[name])
            variants[name] = v = self._train_one(name, sess, paths[name])
            self.say(
                f"      {name:9s} {v.steps} steps in {duration(v.train_seconds)} (median step "
                f"{v.median_step_ms:.0f} ms): top-1 {percent(base_user.top1)} -> {percent(v.user.top1)}, "
                f"perplexity {base_user.perplexity:.0f} -> {v.user.perplexity:.0f}"
            )
        return variants, sessions

    def _train_one(self, name: str, sess: TrainingSession, path: str) -> KeyboardVariant:
        """One variant's training (a Trainer: cosine decay, the user's held-out loss each epoch, a checkpoint) ->
        its result, measured after."""
        loader = DataLoader(self.user_train, KEYBOARD_BATCH, shuffle=True, seed=self.seed, drop_last=True)
        steps = self.epochs * len(loader)
        bar = TrainProgress(
            steps, KEYBOARD_BATCH, label=f"      {name:9s}", stream=self.progress_stream, epoch_lines=False
        )
        seconds = _timed(sess)
        trainer = Trainer(
            sess,
            loader,
            val_loader=DataLoader(self.user_held, KEYBOARD_BATCH),
            epochs=self.epochs,
            schedule=CosineLR(steps),
            checkpoint=os.path.join(self.out_dir, f"{name.lower()}.etck"),
            progress=bar,
            classification=False,
        )
        t0 = time.perf_counter()
        result = trainer.fit()
        bar.close()
        train_seconds = time.perf_counter() - t0
        user, base = self._figures(sess.run)
        count = self.counts[name]
        return KeyboardVariant(
            name=name,
            trainable=count,
            trainable_bytes=4 * count,
            artifact_bytes=os.path.getsize(path),
            steps=result.steps,
            train_seconds=train_seconds,
            median_step_ms=1000 * float(np.median(seconds)),
            user=user,
            base=base,
            curve=result.history,
        )

    def memory(self, variants: dict[str, KeyboardVariant], paths: dict[str, str]) -> None:
        """[4/5] each variant's peak RSS: a fresh process with the device side alone trains its artifact
        RSS_STEPS steps on one batch of the user's sentences (_RSS_WORKER); its VmHWM."""
        batch = os.path.join(self.out_dir, "rss-batch.npz")
        x, y = self.user_train.get_batch(np.arange(KEYBOARD_BATCH))
        np.savez(batch, x=x, y=y)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        )
        for name, v in variants.items():
            proc = subprocess.run(
                [sys.executable, "-c", _RSS_WORKER, paths[name], batch, str(RSS_STEPS)],
                capture_output=True,
                text=True,
                env=env,
                timeout=600,
            )
            if proc.returncode != 0:
                self.say(f"      {name}: the memory probe failed: {proc.stderr.strip().splitlines()[-1:]}")
                continue
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            v.peak_rss_mib, v.start_rss_mib = _mib(got["peak_kib"]), _mib(got["start_kib"])
        measured = [v for v in variants.values() if v.peak_rss_mib is not None]
        if not measured:
            return
        start = min(v.start_rss_mib for v in measured)
        peaks = ", ".join(f"{v.name} {v.peak_rss_mib:.0f} MiB" for v in measured)
        self.say(
            f"[4/5] peak RSS of a fresh process training {RSS_STEPS} steps (numpy and edgetrain's runtime alone, "
            f"{start:.0f} MiB before"
        )
        self.say(f"      loading the artifact): {peaks}")

    def export(
        self, variants: dict[str, KeyboardVariant], sessions: dict[str, TrainingSession], paths
    ) -> None:
        """[5/5] every personalized model -> ONNX, checked in onnxruntime; LoRA's also served: the base model with
        the adapters as inputs (their defaults untrained: B = 0, the base model) plus this user's onnxruntime
        adapter file, and the adapters in edgetrain's .etad."""
        t0 = time.perf_counter()
        x = self.user_held.x
        for name, v in variants.items():
            sess = sessions[name]
            v.onnx_path = os.path.join(self.out_dir, f"personalized-{name.lower()}.onnx")
            sess.export_onnx(v.onnx_path)
            v.onnx_bytes = os.path.getsize(v.onnx_path)
            ort = _ort_logits(v.onnx_path, x)
            v.onnxruntime_max_diff = float(np.max(np.abs(ort - _chunked(sess.run, x))))
            v.onnxruntime_top1 = lm_figures(ort, self.user_held.y).top1
        lora, sess = variants["LoRA"], sessions["LoRA"]
        lora.served_path = os.path.join(self.out_dir, "served-base.onnx")
        TrainingSession(paths["LoRA"]).export_onnx(lora.served_path, adapters="serving")  # one for every user
        lora.adapter_path = os.path.join(self.out_dir, "user.onnx_adapter")
        lora.adapter_bytes = sess.export_adapters(lora.adapter_path, format="onnxruntime")
        lora.etad_bytes = sess.export_adapters(os.path.join(self.out_dir, "user.etad"))
        served = _ort_logits(lora.served_path, x, lora.adapter_path)
        lora.served_max_diff = float(np.max(np.abs(served - _ort_logits(lora.onnx_path, x))))
        plain = _ort_logits(lora.served_path, x)  # no adapter active: the base model's defaults
        base_diff = float(np.max(np.abs(plain - _ort_logits(KEYBOARD_MODEL, x))))
        same = all(v.onnxruntime_top1 == v.user.top1 for v in variants.values())
        worst = max(v.onnxruntime_max_diff for v in variants.values())
        self.say(
            f"[5/5] exported the personalized models to ONNX in {duration(time.perf_counter() - t0)}; onnxruntime "
            f"runs them {'with the same top-1' if same else 'with a DIFFERENT top-1'} (largest logit"
        )
        self.say(
            f"      difference {worst:.1e}). LoRA's merged model is the original graph with W + (alpha/rank) A B"
        )
        self.say(
            f"      served: one base model with the adapters as inputs, plus this user's onnxruntime adapter file "
            f"({lora.adapter_bytes:,} bytes):"
        )
        self.say(
            f"      the same logits as the merged model within {lora.served_max_diff:.1e}; without the adapter, "
            f"the base model's within {base_diff:.1e}"
        )

    def keyboard_table(self, demo: KeyboardDemoResult) -> None:
        """The table: next-word figures on the user's and the Bible's held-out sentences, what trains, cost."""
        rows = [("", "new user", "", "", "Bible", "", "trainable", "median", "peak")]
        rows.append(
            ("", "top-1", "top-3", "perplexity", "top-1", "perplexity", "bytes", "ms/step", "RSS MiB")
        )

        def figures(user: LMFigures, base: LMFigures) -> tuple[str, ...]:
            return (
                percent(user.top1),
                percent(user.top3),
                f"{user.perplexity:.1f}",
                percent(base.top1),
                f"{base.perplexity:.1f}",
            )

        rows.append(("base model", *figures(demo.base_user, demo.base_base), "-", "-", "-"))
        for name, v in demo.variants.items():
            label = f"LoRA r{demo.lora['rank']} (attn, MLP)" if name == "LoRA" else name
            rss = "-" if v.peak_rss_mib is None else f"{v.peak_rss_mib:.0f}"
            rows.append(
                (label, *figures(v.user, v.base), f"{v.trainable_bytes:,}", f"{v.median_step_ms:.0f}", rss)
            )
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        self.say("")
        for k, r in enumerate(rows):
            self.say(
                "  " + r[0].ljust(widths[0]) + "".join("   " + c.rjust(w) for c, w in zip(r[1:], widths[1:]))
            )
            if k == 1:
                self.say("  " + "-" * (sum(widths) + 3 * (len(widths) - 1)))
        self.say("")
        lora = demo.variants["LoRA"]
        self.say(
            f"  held out: the new user's {demo.user_heldout_sentences} sentences ({demo.base_user.word_targets:,} "
            f"words to guess), {demo.base_heldout_sentences:,} Bible sentences; top-1/top-3 among the words"
        )
        self.say(
            f"  per user: LoRA's adapter file {lora.adapter_bytes:,} bytes for onnxruntime, {lora.etad_bytes:,} "
            f"as .etad, against the model's {demo.model_bytes:,}"
        )
        self.say(
            f"  ({100 * lora.adapter_bytes / demo.model_bytes:.1f}%); head-only changes "
            f"{demo.variants['head-only'].trainable_bytes:,} bytes of it, full all of them"
        )
        self.say("")

    def keyboard_finish(self, demo: KeyboardDemoResult) -> None:
        """The files, summary.json and the closing line."""
        lora = demo.variants["LoRA"]
        for v in demo.variants.values():
            self.say(f"  {v.name + ' model':17s} {v.onnx_path}")
        self.say(f"  {'served base':17s} {lora.served_path}  (+ {lora.adapter_path})")
        path = os.path.join(self.out_dir, "summary.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(demo.to_json() + "\n")
        self.say(f"  {'summary':17s} {path}")
        self.say("")
        self.say(
            f"done in {duration(demo.seconds)}. Your own model: edgetrain convert LM.onnx --loss next-token "
            "--lora-rank 8 ..."
        )


def run_keyboard_command(args) -> int:
    """`edgetrain demo --model keyboard` (its parsed arguments: --epochs, --out, --json) -> 0."""
    epochs = KEYBOARD_EPOCHS if args.epochs is None else args.epochs
    if epochs < 1:
        raise UsageError(f"--epochs must be a positive integer, got {epochs}")
    result = run_keyboard_demo(args.out, epochs=epochs)
    if args.json:
        try:
            atomic_write(args.json, (result.to_json() + "\n").encode("utf-8"))
        except OSError as e:
            raise StorageError.of(e, args.json, "cannot write the demo's summary") from e
    return 0
