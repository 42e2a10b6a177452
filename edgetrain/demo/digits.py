"""`edgetrain demo` (and `--model lstm`, `--model gru`): the embedded base model and a new user's digits -> the
personalization story on screen (base accuracy, head-only and full fine-tuning side by side, accuracy after, export
checked by onnxruntime), a table, a JSON summary and, with matplotlib, a training-curve plot. The LSTM and GRU tell
it with a sequence model that reads each digit row by row. Build side: needs onnx; onnxruntime for the check."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from loaders import DataLoader, MnistDataView

from ..core.errors import ConfigError
from ..derive.losses import CrossEntropyLoss
from ..derive.optimizers import SGD
from ..derive.pipeline import convert
from ..runtime import InferenceSession, TrainingSession
from ..runtime.progress import TrainProgress, duration, percent
from ..runtime.trainer import Trainer
from .common import DATA, Summary, _accuracy, _blas_threads, _Teller

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
class DemoResult(Summary):
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


class _Story(_Teller):
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
        super().__init__(out_dir, epochs=epochs, seed=seed, stream=stream, progress_stream=progress_stream)
        self.spec = MODELS[model]
        self.base_path = os.path.join(DATA, self.spec.file)
        self.original = MnistDataView.from_dir(BASE_DIGITS, "test")
        self.base_train = MnistDataView.from_dir(BASE_DIGITS, "train")
        self.user_train = MnistDataView.from_dir(NEW_USER, "train")
        self.user_held = MnistDataView.from_dir(NEW_USER, "test")
        self.xo, self.yo = self.original.get_batch(np.arange(self.original.size()))
        self.xu, self.yu = self.user_held.get_batch(np.arange(self.user_held.size()))
        # the held-out digits as stored (0..255): what the exported models take, their input pipeline inside
        self.xu_raw = self.user_held.raw().get_batch(np.arange(self.user_held.size()))[0].astype(np.uint8)

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
        self.say_table(rows)

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
        self.say(f"  {'summary':16s} {self.write_summary(demo)}")
        self.say("")
        self.say(
            f"done in {duration(demo.seconds)}. Try the same on your own data: edgetrain convert MODEL.onnx, "
            "edgetrain train ... --data DIR"
        )
