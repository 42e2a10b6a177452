"""`edgetrain demo`: the embedded base model and a new user's digits -> the personalization story on screen (base
accuracy, head-only and full fine-tuning side by side, accuracy after, export checked by onnxruntime), a table, a
JSON summary and, with matplotlib, a training-curve plot. Build side: needs onnx; onnxruntime for the check."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import numpy as np

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
BASE_MODEL = os.path.join(DATA, "digits_lenet.onnx")
BASE_DIGITS = os.path.join(DATA, "digits")  # the base model's training and test sets (MNIST idx files)
NEW_USER = os.path.join(DATA, "newuser")  # train: the user's samples to learn from; t10k: held out
USER_STYLE = "rotated 25 degrees, slanted and written with a heavier pen"

# The two ways to personalize, side by side: the same data, epochs and batches; each with the step size that
# suits it (measured in tools/build_demo_assets.py's experiments: more makes full fine-tuning unstable).
VARIANTS = {
    "head-only": {"trainable": ["fc3.*"], "lr": 0.05},
    "full": {"trainable": None, "lr": 0.01},
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

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def _accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(probs, axis=1) == labels))


def _count(session) -> int:
    return int(sum(v.size for v in session.parameters().values()))


def _check_with_onnxruntime(path: str, x: np.ndarray, y: np.ndarray, reference: np.ndarray):
    """(accuracy, max |diff| against edgetrain's output) of the exported model under onnxruntime, or Nones."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None, None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    (probs,) = sess.run(None, {sess.get_inputs()[0].name: x})
    return _accuracy(probs, y), float(np.max(np.abs(probs - reference)))


def _plot(path: str, result: DemoResult) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
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
    fig.suptitle("edgetrain demo: personalizing a handwriting model on the device")
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def run_demo(
    out_dir: str = "edgetrain-demo",
    *,
    epochs: int = 20,
    plot: bool = True,
    stream: TextIO | None = None,
    progress_stream: TextIO | None = None,
    seed: int = 0,
) -> DemoResult:
    """The whole story; writes artifacts, checkpoints, personalized models, summary.json and curves.png into
    out_dir, and tells it on `stream` (stdout), with progress bars on `progress_stream` (stderr)."""
    import edgetrain as et
    from loaders import DataLoader, MnistDataView

    from .progress import TrainProgress, duration, percent

    out = stream if stream is not None else sys.stdout
    t_start = time.perf_counter()

    def say(text: str = "") -> None:
        out.write(text + "\n")
        out.flush()

    os.makedirs(out_dir, exist_ok=True)
    original = MnistDataView.from_dir(BASE_DIGITS, "test")
    base_train = MnistDataView.from_dir(BASE_DIGITS, "train")
    user_train = MnistDataView.from_dir(NEW_USER, "train")
    user_held = MnistDataView.from_dir(NEW_USER, "test")
    xo, yo = original.get_batch(np.arange(original.size()))
    xu, yu = user_held.get_batch(np.arange(user_held.size()))

    say("edgetrain demo: personalizing a handwriting model on the device")
    say("")
    say(
        f"  base model  {os.path.basename(BASE_MODEL)}: LeNet-5 style, trained by edgetrain on "
        f"{base_train.size():,} UCI handwritten digits"
    )
    say(f"  new user    writes digits {USER_STYLE};")
    say(f"              {user_train.size()} samples to learn from, {user_held.size()} held out to measure")
    say("")

    base = et.InferenceSession(BASE_MODEL)
    (p_user,) = base.run(None, {"image": xu})
    (p_orig,) = base.run(None, {"image": xo})
    base_user, base_orig = _accuracy(p_user, yu), _accuracy(p_orig, yo)
    say(
        f"[1/4] the base model reads the new user's digits with {percent(base_user)} accuracy "
        f"({percent(base_orig)} on the handwriting it learned)"
    )

    t0 = time.perf_counter()
    paths = {}
    for name, cfg in VARIANTS.items():
        art = et.convert(
            BASE_MODEL,
            loss=et.CrossEntropyLoss(),
            optimizer=et.SGD(lr=cfg["lr"], momentum=0.9, weight_decay=5e-4),
            trainable=cfg["trainable"],
            batch_size=BATCH,
        )
        paths[name] = os.path.join(out_dir, f"{name}.etrain")
        art.save(paths[name])
    say(
        f"[2/4] converted it into two training programs (.etrain), head-only (fc3) and full, "
        f"in {duration(time.perf_counter() - t0)}"
    )

    say(
        f"[3/4] fine-tuning on the device: {epochs} epochs of the user's {user_train.size()} samples, "
        f"batch {BATCH}, SGD with momentum"
    )
    variants: dict[str, VariantResult] = {}
    sessions = {}
    user_probs = {}  # each personalized model's outputs on the user's held-out digits
    for name in VARIANTS:
        sess = sessions[name] = et.TrainingSession(paths[name])
        loader = DataLoader(user_train, BATCH, shuffle=True, seed=seed)
        bar = TrainProgress(
            epochs * len(loader), BATCH, label=f"      {name:9s}", stream=progress_stream, epoch_lines=False
        )
        trainer = et.Trainer(
            sess,
            loader,
            val_loader=DataLoader(user_held, BATCH),
            epochs=epochs,
            checkpoint=os.path.join(out_dir, f"{name}.etck"),
            progress=bar,
        )
        t0 = time.perf_counter()
        result = trainer.fit()
        bar.close()
        seconds = time.perf_counter() - t0
        user_probs[name] = sess.run(xu)
        variants[name] = VariantResult(
            name=name,
            trainable=_count(sess),
            user_accuracy=_accuracy(user_probs[name], yu),
            original_accuracy=_accuracy(sess.run(xo), yo),
            train_seconds=seconds,
            steps=result.steps,
            onnx_path="",
            onnxruntime_accuracy=None,
            onnxruntime_max_diff=None,
            curve=result.history,
        )
        say(
            f"      {name:9s} {result.steps} steps in {duration(seconds)}: "
            f"{percent(base_user)} -> {percent(variants[name].user_accuracy)} on the new user's held-out digits"
        )

    t0 = time.perf_counter()
    checked = []
    for name, v in variants.items():
        v.onnx_path = os.path.join(out_dir, f"personalized-{name}.onnx")
        sessions[name].export_onnx(v.onnx_path)
        v.onnxruntime_accuracy, v.onnxruntime_max_diff = _check_with_onnxruntime(
            v.onnx_path, xu, yu, user_probs[name]
        )
        if v.onnxruntime_accuracy is not None:
            checked.append(v)
    if checked:
        worst = max(v.onnxruntime_max_diff for v in checked)
        same = all(v.onnxruntime_accuracy == v.user_accuracy for v in checked)
        say(
            f"[4/4] exported the personalized models to ONNX; onnxruntime runs them "
            f"{'with the same accuracy' if same else 'with a DIFFERENT accuracy'} "
            f"(largest probability difference {worst:.1e}), in {duration(time.perf_counter() - t0)}"
        )
    else:
        say("[4/4] exported the personalized models to ONNX (onnxruntime is not installed: not checked)")

    demo = DemoResult(
        base_user_accuracy=base_user,
        base_original_accuracy=base_orig,
        user_train_samples=user_train.size(),
        user_heldout_samples=user_held.size(),
        epochs=epochs,
        variants=variants,
        seconds=0.0,
        plot=None,
        out_dir=out_dir,
    )
    if plot:
        demo.plot = _plot(os.path.join(out_dir, "curves.png"), demo)

    say("")
    rows = [("", "new user", "original", "trainable", "time")]
    rows.append(("", "(held out)", "handwriting", "parameters", ""))
    rows.append(("base model", percent(base_user), percent(base_orig), "-", "-"))
    for name, v in variants.items():
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
    for k, r in enumerate(rows):
        say("  " + r[0].ljust(widths[0]) + "".join("   " + c.rjust(w) for c, w in zip(r[1:], widths[1:])))
        if k == 1:
            say("  " + "-" * (sum(widths) + 3 * 4))
    say("")
    for v in variants.values():
        extra = (
            "" if v.onnxruntime_accuracy is None else f"  (onnxruntime: {percent(v.onnxruntime_accuracy)})"
        )
        say(f"  {v.name + ' model':16s} {v.onnx_path}{extra}")
    if demo.plot:
        say(f"  {'training curves':16s} {demo.plot}")
    elif plot:
        say("  (pip install matplotlib to get a plot of the training curves)")
    demo.seconds = time.perf_counter() - t_start
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as f:
        f.write(demo.to_json() + "\n")
    say(f"  {'summary':16s} {os.path.join(out_dir, 'summary.json')}")
    say("")
    say(
        f"done in {duration(demo.seconds)}. Try the same on your own data: edgetrain convert MODEL.onnx, "
        "edgetrain train ... --data DIR"
    )
    return demo
