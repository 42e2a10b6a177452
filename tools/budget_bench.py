"""Training within a memory budget, measured (issue 25): the accuracy a model reaches on a new user's digits when
its training step must fit 1/2, 1/4 and 1/8 of full fine-tuning's planned peak, beside full fine-tuning and
head-only, with the true peak RSS of the process that trains.

Models: the demo's digits LeNet (edgetrain/data/digits_lenet.onnx, batch 10) and torchvision's MobileNetV2
(num_classes=10, 3x64x64, batch 8), which this tool pretrains in PyTorch on the base digits (upscaled to 64x64, gray
replicated to 3 channels; cached under build/budget_bench/) and exports with the TorchScript exporter in eval mode.
Each variant is converted here (`et.convert(..., memory_budget=...)` for the budgets), saved, and trained in a fresh
worker process that imports the device side alone (numpy, loaders, edgetrain.runtime) with the Trainer and a
DataLoader as the demo's fine-tuning does (the new user's 50 digits, shuffled with seed 0, the demo's epochs, the
held-out digits as the validation set, a checkpoint), one BLAS thread. The worker reports its VmHWM after its
imports and after training, and the accuracy on the new user's held-out digits and on the original test digits.

    .venv/bin/python tools/budget_bench.py [--models digits mobilenet_v2] [--epochs N] [--quick] [--out DIR]

Writes DIR/memory_budget.{md,json,png} (default docs/; --quick: 1 epoch, the digits only, a temporary folder
unless --out says otherwise). Needs onnx; torch and torchvision for MobileNetV2; matplotlib for the picture.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# The device side only at the top: the worker (this file run with --worker) must train with numpy, loaders and
# edgetrain.runtime alone. `import edgetrain` loads nothing of the build side until a name of it is used.
import edgetrain as et
from edgetrain.graph.sections import MemoryBudgetSection
from edgetrain.runtime import InferenceSession, TrainingSession
from edgetrain.runtime.describe import artifact_step_memory
from edgetrain.runtime.trainer import Trainer
from loaders import DataLoader, MnistDataView, imageops

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "edgetrain" / "data"
BASE_DIGITS, NEW_USER = DATA / "digits", DATA / "newuser"  # as edgetrain.demo's BASE_DIGITS and NEW_USER
CACHE = ROOT / "build" / "budget_bench"
SEED = 0  # the demo's
EPOCHS = 20  # the demo's default
LR_ALL, LR_PART = 0.01, 0.05  # edgetrain/demo/digits.py VARIANTS: full fine-tuning's rate, head-only's
MOMENTUM, WEIGHT_DECAY = 0.9, 5e-4  # the demo's SGD
FRACTIONS = (2, 4, 8)  # the budgets: 1/2, 1/4, 1/8 of full fine-tuning's budgeted bytes
LEAKS = ("onnx", "onnxruntime", "torch", "edgetrain.derive", "edgetrain.onnx_io")  # never in the worker

# MobileNetV2's pretraining in PyTorch on the base digits: long enough to read them well, short enough for a busy
# 2-core machine (about 50 s an epoch on one thread)
PRETRAIN = {"epochs": 5, "batch": 32, "lr": 2e-3}


@dataclass(frozen=True)
class Case:
    """One model of the benchmark: its ONNX, its input, the batch it trains at and the digits' upscaling."""

    key: str
    title: str
    onnx: Path
    input: str
    batch: int
    size: int | None  # the digits upscaled to size x size, gray replicated to 3 channels; None: as they are
    validate: bool  # the Trainer validates on the held-out digits after each epoch (the demo does)


def upscale(x: np.ndarray, size: int) -> np.ndarray:
    """[N, 1, 28, 28] digits -> [N, 3, size, size]: bilinear (ONNX Resize's half-pixel rule), gray to RGB."""
    y = imageops.resize(x, (size, size), layout="nchw")
    return np.ascontiguousarray(np.repeat(y, 3, axis=1), dtype=np.float32)


class Upscale:
    """A DataLoader batch_transform: the images upscaled, the labels as they are (deterministic, so the
    Trainer's frozen-prefix feature cache stays valid)."""

    def __init__(self, size: int):
        self.size = size

    def __call__(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return upscale(x, self.size), y


def predict(run, x: np.ndarray, *, chunk: int | None, transform=None) -> np.ndarray:
    """run(batch) over x in chunks of `chunk` (None: all at once, as the demo does), the last chunk padded with
    its first sample (a model exported at a fixed batch takes no other), transformed on the way."""
    if chunk is None:
        return run(x if transform is None else transform(x, None)[0])
    out = []
    for k in range(0, len(x), chunk):
        part = x[k : k + chunk]
        n = len(part)
        if n < chunk:
            part = np.concatenate([part, np.repeat(part[:1], chunk - n, axis=0)])
        out.append(run(part if transform is None else transform(part, None)[0])[:n])
    return np.concatenate(out)


def accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(probs, axis=1) == labels))


# ---- the worker: a fresh process, the device side alone ------------------------------------------------------
def _kib(key: str) -> int:
    """This process's /proc/self/status figure (ru_maxrss would keep the parent's high-water mark over exec)."""
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def worker(spec_path: str) -> None:
    """One measurement in this fresh process, printed as a JSON line. mode "trainer": the artifact trained as the
    demo's _fine_tune_one trains it (the Trainer: feature cache, validation, checkpoint), then its accuracies;
    mode "step": the training step alone, one epoch of train_step over the same batches (what the budget plans)."""
    start_hwm, start_rss = _kib("VmHWM"), _kib("VmRSS")  # after the imports: interpreter, numpy, runtime
    spec = json.loads(Path(spec_path).read_text())
    batch = spec["batch"]
    transform = Upscale(spec["size"]) if spec["size"] else None
    user_train = MnistDataView.from_dir(spec["user"], "train")
    sess = TrainingSession(spec["artifact"])
    # a training program has a fixed batch: the user's 50 digits in batches of 8 leave 2 out of each epoch
    drop_last = user_train.size() % batch != 0
    loader = DataLoader(
        user_train, batch, shuffle=True, seed=spec["seed"], drop_last=drop_last, batch_transform=transform
    )
    got = {"start_hwm_kib": start_hwm, "start_rss_kib": start_rss, "drop_last": drop_last}
    if spec["mode"] == "step":
        steps = 0
        for x, y in loader:
            sess.train_step(x, y)
            steps += 1
        got.update(peak_hwm_kib=_kib("VmHWM"), steps=steps)
    else:
        got.update(_fit(spec, sess, loader, transform))
    got["leaked"] = [m for m in LEAKS if m in sys.modules]
    print(json.dumps(got))


def _fit(spec: dict, sess: TrainingSession, loader: DataLoader, transform) -> dict:
    """The demo's fine-tuning (validation after each epoch when spec["validate"]), its peak RSS read before the
    accuracy runs, which are not training."""
    batch = spec["batch"]
    user_held = MnistDataView.from_dir(spec["user"], "test")
    val = DataLoader(user_held, batch, batch_transform=transform) if spec["validate"] else None
    trainer = Trainer(sess, loader, val_loader=val, epochs=spec["epochs"], checkpoint=spec["checkpoint"])
    t0 = time.perf_counter()
    result = trainer.fit()
    seconds = time.perf_counter() - t0
    got = {
        "peak_hwm_kib": _kib("VmHWM"),
        "file_kib": _kib("RssFile"),  # the artifact's pages and the libraries' among them
        "train_seconds": seconds,
        "step_seconds": result.train_seconds,
        "val_seconds": result.val_seconds,
        "steps": result.steps,
        "curve": [h.get("val_accuracy") for h in result.history],
        "feature_cache": {
            k: v for k, v in sess.feature_cache_info().items() if k in ("enabled", "bytes", "hits")
        },
    }
    chunk = batch if spec["size"] else None
    for name, view in (("user", user_held), ("original", MnistDataView.from_dir(spec["base"], "test"))):
        x, y = view.get_batch(np.arange(view.size()))
        got[f"{name}_accuracy"] = accuracy(predict(sess.run, x, chunk=chunk, transform=transform), y)
    return got


def run_worker(artifact: Path, case: Case, *, mode: str, epochs: int, folder: Path) -> dict:
    spec = {
        "mode": mode,
        "artifact": str(artifact),
        "checkpoint": str(artifact.with_suffix(".etck")),
        "batch": case.batch,
        "size": case.size,
        "epochs": epochs,
        "validate": case.validate,
        "seed": SEED,
        "user": str(NEW_USER),
        "base": str(BASE_DIGITS),
    }
    path = folder / f"{artifact.stem}-{mode}.json"
    path.write_text(json.dumps(spec))
    # one BLAS thread: the machine is shared, and one thread's figures are the ones to compare
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the {mode} worker of {artifact.name} failed:\n{done.stderr[-3000:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert not got["leaked"], f"the worker imported {got['leaked']}: not the device side alone"
    got["growth_kib"] = got["peak_hwm_kib"] - got["start_hwm_kib"]
    return got


# ---- the build side: the variants, converted -------------------------------------------------------------------
def _convert(case: Case, *, lr: float, trainable=None, budget: int | None = None, say=None):
    return et.convert(
        str(case.onnx),
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY),
        trainable=trainable,
        batch_size=case.batch,
        memory_budget=budget,
        progress=say,
    )


def _row(variant: str, art, path: Path, *, lr: float, seconds: float, option: str | None = None) -> dict:
    """What a converted variant is: what trains and how, and inspect's numbers for its file."""
    size = art.save(path)
    mem = artifact_step_memory(path)
    budget = art.section(MemoryBudgetSection)
    chosen = budget.chosen if budget is not None else None
    weighed = budget.weighed if budget is not None else []
    return {
        "variant": variant,
        "option": chosen["name"] if chosen else option,
        "recompute": chosen["recompute"] if chosen else "none",
        "chunks": chosen["chunks"] if chosen else 1,
        "trainable_tensors": len(art.parameters),
        "trainable_values": int(sum(np.asarray(art.initial[p]).size for p in art.parameters)),
        "lr": lr,
        "budgeted_bytes": int(mem["budgeted_bytes"]),
        "planned_peak_bytes": int(mem["peak_bytes"]),
        "artifact_bytes": int(size),
        "convert_seconds": seconds,
        "options_weighed": len(weighed),
        "artifact": str(path),
    }


_SMALLEST = re.compile(r"smallest planned peak is ([0-9.]+ [KM]iB) \((.+), recompute (\w+)\)")


def _deep(option: str) -> bool:
    """Whether an option trains the weights of more than the last layer (every parameter, or the last k > 1
    layers): then it trains at full fine-tuning's rate, as head-only's rate (5x) is made for the head alone and
    sends deep layers' weights far; the head and the biases train at head-only's rate."""
    m = re.search(r"the last (\d+) of", option)
    return option.startswith("every parameter") or (m is not None and int(m.group(1)) > 1)


def _budgeted(case: Case, budget: int, variant: str, folder: Path, say) -> dict:
    """The variant convert chooses for `budget`: at head-only's rate unless it trains the weights of more than the
    last layer (_deep), then converted again at full fine-tuning's (the same search, the same choice); or the
    refusal, with the smallest option convert names."""
    t0 = time.perf_counter()
    try:
        art = _convert(case, lr=LR_PART, budget=budget, say=lambda line: say("    " + line.strip()))
    except et.ModelError as e:
        m = _SMALLEST.search(str(e))
        say(f"    nothing fits: {e}")
        return {
            "variant": variant,
            "budget_bytes": budget,
            "refused": str(e),
            "smallest": m.group(1) if m else None,
            "smallest_option": f"{m.group(2)}, recompute {m.group(3)}" if m else None,
            "convert_seconds": time.perf_counter() - t0,
        }
    lr = LR_PART
    if _deep(art.section(MemoryBudgetSection).chosen["name"]):
        lr, first = LR_ALL, art.section(MemoryBudgetSection).chosen
        art = _convert(case, lr=lr, budget=budget)
        assert art.section(MemoryBudgetSection).chosen == first, (
            first,
            art.section(MemoryBudgetSection).chosen,
        )
    row = _row(variant, art, folder / f"{case.key}-{variant.replace('/', '_')}.etrain", lr=lr, seconds=0.0)
    row.update(budget_bytes=budget, convert_seconds=time.perf_counter() - t0)
    assert row["budgeted_bytes"] <= budget, row  # inspect's count of the file is what convert planned
    return row


def convert_variants(case: Case, folder: Path, say) -> list[dict]:
    """Full fine-tuning, head-only (the last layer, as the budget search counts layers) and one variant per
    budget -> the rows, each with its artifact's path (a refused budget has none)."""
    from edgetrain.derive.budget import layers  # build side: kept out of the worker's imports

    t0 = time.perf_counter()
    full = _convert(case, lr=LR_ALL)
    rows = [
        _row("full", full, folder / f"{case.key}-full.etrain", lr=LR_ALL, seconds=time.perf_counter() - t0)
    ]
    rows[0]["option"] = "every parameter"
    head = layers(full)[-1]
    t0 = time.perf_counter()
    art = _convert(case, lr=LR_PART, trainable=head)
    rows.append(
        _row(
            "head-only",
            art,
            folder / f"{case.key}-head-only.etrain",
            lr=LR_PART,
            seconds=time.perf_counter() - t0,
            option=f"the head ({', '.join(head)})",
        )
    )
    say(
        f"  full fine-tuning: {_size(rows[0]['budgeted_bytes'])} counted by the budget; "
        f"head-only {_size(rows[1]['budgeted_bytes'])}"
    )
    for frac in FRACTIONS:
        budget = rows[0]["budgeted_bytes"] // frac
        say(f"  budget 1/{frac}: {_size(budget)}")
        rows.append(_budgeted(case, budget, f"budget 1/{frac}", folder, say))
        if "refused" not in rows[-1]:
            r = rows[-1]
            say(
                f"    -> trains {r['option']}, recompute {r['recompute']}, {r['chunks']} chunk(s): "
                f"{_size(r['budgeted_bytes'])} counted ({r['options_weighed']} options weighed, "
                f"{r['convert_seconds']:.0f} s)"
            )
    return rows


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def base_accuracy(case: Case) -> dict:
    """The base model on the new user's held-out digits and on the original test digits (edgetrain's
    InferenceSession, in chunks of its batch when it was exported at a fixed one)."""
    sess = InferenceSession(str(case.onnx))
    transform = Upscale(case.size) if case.size else None
    chunk = case.batch if case.size else None
    got = {}
    for name, view in (
        ("user", MnistDataView.from_dir(NEW_USER, "test")),
        ("original", MnistDataView.from_dir(BASE_DIGITS, "test")),
    ):
        x, y = view.get_batch(np.arange(view.size()))
        run = lambda b: sess.run(None, {case.input: b})[0]  # noqa: E731
        got[f"{name}_accuracy"] = accuracy(predict(run, x, chunk=chunk, transform=transform), y)
    return got


# ---- the models ----------------------------------------------------------------------------------------------
def digits_case() -> Case:
    return Case(
        "digits", "the demo's digits LeNet (batch 10)", DATA / "digits_lenet.onnx", "image", 10, None, True
    )


def mobilenet_case(*, threads: int, say) -> Case:
    """torchvision's MobileNetV2 pretrained on the base digits at 64x64, exported at batch 8 (cached)."""
    p = PRETRAIN
    path = CACHE / f"mobilenet_v2-digits64-b8-e{p['epochs']}-bs{p['batch']}-lr{p['lr']}-s{SEED}.onnx"
    case = Case("mobilenet_v2", "torchvision's MobileNetV2 (3x64x64, batch 8)", path, "input", 8, 64, False)
    if path.exists():
        say(f"  pretrained MobileNetV2 from the cache: {path.relative_to(ROOT)}")
        return case
    _pretrain_mobilenet(path, threads=threads, say=say)
    return case


def _pretrain_mobilenet(path: Path, *, threads: int, say) -> None:
    """PyTorch: MobileNetV2 (num_classes=10) trained on the base digits, upscaled; exported in eval mode."""
    import torch  # the MobileNetV2 part alone needs torch

    sys.path.insert(0, str(ROOT / "tests" / "harness"))
    import exports  # the suite's torchvision loading and export (tests/harness/exports.py)

    exports.declare_torchvision_ops()
    import torchvision

    torch.manual_seed(SEED)
    torch.set_num_threads(threads)
    p = PRETRAIN
    view = MnistDataView.from_dir(BASE_DIGITS, "train")
    x, y = view.get_batch(np.arange(view.size()))
    xt, yt = torch.from_numpy(upscale(x, 64)), torch.from_numpy(y.astype(np.int64))
    model = torchvision.models.mobilenet_v2(weights=None, num_classes=10)
    opt = torch.optim.Adam(model.parameters(), lr=p["lr"])
    batches = -(-len(x) // p["batch"])
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=p["lr"], total_steps=p["epochs"] * batches)
    rng = np.random.default_rng(SEED)
    for epoch in range(p["epochs"]):
        t0, losses = time.perf_counter(), []
        model.train()
        order = rng.permutation(len(x))
        for k in range(batches):
            idx = torch.from_numpy(order[k * p["batch"] : (k + 1) * p["batch"]])
            loss = torch.nn.functional.cross_entropy(model(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
        say(
            f"  pretraining MobileNetV2 in PyTorch: epoch {epoch + 1}/{p['epochs']}, "
            f"loss {np.mean(losses):.3f}, {time.perf_counter() - t0:.0f} s"
        )
    model.eval()
    test = MnistDataView.from_dir(BASE_DIGITS, "test")
    xs, ys = test.get_batch(np.arange(test.size()))
    with torch.no_grad():
        acc = accuracy(model(torch.from_numpy(upscale(xs, 64))).numpy(), ys)
    say(f"  PyTorch's MobileNetV2 reads the original test digits with {_pct(acc)} accuracy")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.onnx")
    exports.export_module(model, xt[:8].clone(), tmp, exporter="torchscript", mode="eval")
    os.replace(tmp, path)
    say(f"  exported (TorchScript, eval mode, batch 8) to {path.relative_to(ROOT)}")


# ---- the run -------------------------------------------------------------------------------------------------
def bench_model(case: Case, *, epochs: int, folder: Path, say) -> dict:
    """One model: the base row, the variants converted, each trained in its own worker."""
    say(f"{case.title}:")
    base = base_accuracy(case)
    say(
        f"  base model: {_pct(base['user_accuracy'])} on the new user's held-out digits, "
        f"{_pct(base['original_accuracy'])} on the original test digits"
    )
    rows = convert_variants(case, folder, say)
    for r in rows:
        if "refused" in r:
            continue
        say(
            f"  {r['variant']}: the step alone, then the demo's fine-tuning ({epochs} epochs), in fresh workers"
        )
        artifact = Path(r.pop("artifact"))
        step = run_worker(artifact, case, mode="step", epochs=epochs, folder=folder)
        r["step_growth_kib"], r["step_peak_hwm_kib"] = step["growth_kib"], step["peak_hwm_kib"]
        r.update(run_worker(artifact, case, mode="trainer", epochs=epochs, folder=folder))
        say(
            f"    {_pct(base['user_accuracy'])} -> {_pct(r['user_accuracy'])} held out, "
            f"{_pct(r['original_accuracy'])} original, {r['train_seconds']:.1f} s; peak RSS growth "
            f"{_mib(r['step_growth_kib'])} the step alone, {_mib(r['growth_kib'])} the fine-tuning "
            f"({_mib(r['start_hwm_kib'])} after the imports)"
        )
    return {
        "title": case.title,
        "onnx": str(case.onnx.relative_to(ROOT)),
        "batch": case.batch,
        "input_size": case.size,
        "validate": case.validate,
        "base": base,
        "full_budgeted_bytes": rows[0]["budgeted_bytes"],
        "rows": rows,
    }


def _mib(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", choices=("digits", "mobilenet_v2"), default=None)
    ap.add_argument(
        "--epochs", type=int, default=None, help=f"fine-tuning epochs (default {EPOCHS}; --quick 1)"
    )
    ap.add_argument("--quick", action="store_true", help="1 epoch, the digits only, a temporary folder")
    ap.add_argument("--out", default=None, help="the folder of memory_budget.{md,json,png} (default docs/)")
    ap.add_argument("--torch-threads", type=int, default=1, help="PyTorch's threads for the pretraining")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    models = args.models or (["digits"] if args.quick else ["digits", "mobilenet_v2"])
    epochs = args.epochs or (1 if args.quick else EPOCHS)
    out = (
        Path(args.out)
        if args.out
        else (Path(tempfile.mkdtemp(prefix="budget-bench-")) if args.quick else ROOT / "docs")
    )
    out.mkdir(parents=True, exist_ok=True)

    def say(line: str) -> None:
        print(line, flush=True)

    t_start = time.perf_counter()
    doc = {"settings": _settings(epochs, quick=args.quick), "models": {}}
    with tempfile.TemporaryDirectory(prefix="budget-bench-") as tmp:
        for key in models:
            case = digits_case() if key == "digits" else mobilenet_case(threads=args.torch_threads, say=say)
            doc["models"][key] = bench_model(case, epochs=epochs, folder=Path(tmp), say=say)
    doc["seconds"] = time.perf_counter() - t_start
    write(out, doc)
    say(f"wrote {out / 'memory_budget.md'}, .json and .png in {doc['seconds']:.0f} s")
    return 0


def _settings(epochs: int, *, quick: bool) -> dict:
    return {
        "quick": quick,
        "epochs": epochs,
        "seed": SEED,
        "optimizer": f"SGD momentum {MOMENTUM}, weight decay {WEIGHT_DECAY}",
        "lr_every_parameter": LR_ALL,
        "lr_otherwise": LR_PART,
        "fractions": [f"1/{f}" for f in FRACTIONS],
        "threads": 1,
        "pretraining": PRETRAIN,
        "numpy": np.__version__,
    }


# ---- the report ----------------------------------------------------------------------------------------------
HEADER = (
    "| variant | budget | trains | recompute | frozen part | trainable values | budgeted | planned peak "
    "| RSS growth: step alone | RSS growth: fine-tuning (peak RSS) | new user (held out) | original digits "
    "| train time |"
)


def table(m: dict) -> list[str]:
    """One model's markdown table: the base model, then each variant."""
    b = m["base"]
    dashes = " - |" * 8
    lines = [HEADER, "|" + "---|" * 13]
    lines.append(f"| base model |{dashes} {_pct(b['user_accuracy'])} | {_pct(b['original_accuracy'])} | - |")
    for r in m["rows"]:
        budget = _size(r.get("budget_bytes"))
        if "refused" in r:
            what = f"nothing fits: the smallest option is {r['smallest']} ({r['smallest_option']})"
            lines.append(f"| {r['variant']} | {budget} | {what} |" + " - |" * 10)
            continue
        chunks = f"{r['chunks']} chunks" if r["chunks"] > 1 else "whole batch"
        cells = [
            r["variant"],
            budget,
            f"{r['option']} (lr {r['lr']:g})",
            r["recompute"],
            chunks,
            f"{r['trainable_values']:,}",
            _size(r["budgeted_bytes"]),
            _size(r["planned_peak_bytes"]),
            _mib(r["step_growth_kib"]),
            f"{_mib(r['growth_kib'])} ({_mib(r['peak_hwm_kib'])})",
            _pct(r["user_accuracy"]),
            _pct(r["original_accuracy"]),
            f"{r['train_seconds']:.1f} s",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write(out: Path, doc: dict) -> None:
    (out / "memory_budget.json").write_text(json.dumps(doc, indent=1) + "\n")
    s = doc["settings"]
    lines = [
        "# Training within a memory budget: accuracy and true memory",
        "",
        "Measured by `tools/budget_bench.py` (issue 25). Each model is personalized on the new user's digits",
        "(edgetrain/data/newuser: 50 to learn from, 400 held out) by full fine-tuning, by head-only fine-tuning (the",
        "last layer) and by what `et.convert(..., memory_budget=B)` chooses for B = 1/2, 1/4 and 1/8 of full",
        "fine-tuning's budgeted bytes.",
        "",
        "- **budgeted**: what a budget counts, the step's planned peak without the frozen weights, which the session",
        "  reads from the file's pages; **planned peak**: the whole of `edgetrain inspect`'s count (frozen weights",
        "  included). Both are `artifact_step_memory` of the saved artifact.",
        "- **training**: each variant trains in a fresh process that imports numpy, loaders and edgetrain.runtime",
        f"  alone, with the Trainer and a DataLoader as the demo's fine-tuning does: {s['epochs']} epochs of the",
        f"  user's digits shuffled with seed {s['seed']}, a checkpoint, the Trainer's defaults (its frozen-prefix",
        f"  feature cache among them); {s['optimizer']}; lr {s['lr_every_parameter']} when the weights of more than",
        f"  the last layer train and {s['lr_otherwise']} for the head and biases (the demo's rates for full and",
        "  head-only fine-tuning, edgetrain.demo.VARIANTS: head-only's, 5x, sends deeper weights far); one BLAS",
        "  thread. The accuracies are the trained session's `run()` on the held-out and the original test digits.",
        "- **RSS growth: fine-tuning**: that process's VmHWM after training minus its VmHWM right after its imports",
        "  (the peak itself in brackets); it holds what the Trainer adds to the step (the feature cache's programs,",
        "  the validation program, the checkpoint) and the frozen weights' file pages. **RSS growth: step alone**:",
        "  the same in another fresh process that opens the artifact and runs one epoch of `train_step` over the same",
        "  batches, nothing else: what the budget plans, plus the interpreter's objects and kernels' temporaries.",
        "",
    ]
    for m in doc["models"].values():
        lines += [f"## {m['title']}", "", *table(m), ""]
        lines += _notes(m)
    lines += ["![accuracy against budgeted memory](memory_budget.png)", ""]
    lines += [f"The whole run took {doc['seconds']:.0f} s. The raw numbers are in memory_budget.json.", ""]
    (out / "memory_budget.md").write_text("\n".join(lines))
    plot(out / "memory_budget.png", doc)
    for m in doc["models"].values():
        print("\n".join([f"{m['title']}:", *table(m)]), flush=True)


def _notes(m: dict) -> list[str]:
    out = []
    if m["validate"]:
        out.append("The Trainer validates on the 400 held-out digits after each epoch, as the demo does.")
    else:
        out.append(
            "The Trainer runs without the per-epoch validation here (the accuracies are measured after training, as "
            "for the digits): 400 images of 3x64x64 after each of 20 epochs would take most of the run's time "
            "(and several times as much with the frozen part in chunks: validation runs the training program "
            "without its updates, chunks included)."
        )
    if m["input_size"]:
        out.append(
            f"MobileNetV2 was pretrained in PyTorch on the base digits ({PRETRAIN['epochs']} epochs, Adam, batch "
            f"{PRETRAIN['batch']}, one-cycle lr up to {PRETRAIN['lr']}), the digits upscaled to {m['input_size']}x"
            f"{m['input_size']} and replicated to 3 channels, and exported with the TorchScript exporter in eval "
            f"mode (BatchNorm folded into the convolutions) at batch {m['batch']}. At batch {m['batch']} the "
            "user's 50 digits give 6 batches an epoch (drop_last: 2 left out each epoch, a different 2 each time)."
        )
    refused = [r for r in m["rows"] if "refused" in r]
    for r in refused:
        out.append(f"{r['variant']} ({_size(r['budget_bytes'])}): convert refuses it: {r['refused']}")
    return [line for note in out for line in (note, "")]  # a paragraph each


def plot(path: Path, doc: dict) -> None:
    """Accuracy on the new user's held-out digits against the budgeted bytes, per variant; the budgets as
    vertical lines; hollow markers at the true peak RSS growth (the step alone, the fine-tuning)."""
    try:
        import matplotlib  # optional: the picture only

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no picture", file=sys.stderr)
        return
    models = list(doc["models"].values())
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.6), squeeze=False)
    for ax, m in zip(axes[0], models):
        _panel(ax, m)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _panel(ax, m: dict) -> None:
    colors = {"full": "C0", "head-only": "C1", "budget 1/2": "C2", "budget 1/4": "C3", "budget 1/8": "C4"}
    for r in m["rows"]:
        c = colors.get(r["variant"], "C5")
        if "budget_bytes" in r:
            ax.axvline(r["budget_bytes"] / 1024, color=c, ls="--", lw=1)
            label = r["variant"].replace("budget ", "")
            ax.text(
                r["budget_bytes"] / 1024, 0.02, f" {label}", color=c, rotation=90, va="bottom", fontsize=8
            )
        if "refused" in r:
            ax.text(r["budget_bytes"] / 1024, 0.5, " nothing fits", color=c, rotation=90, fontsize=8)
            continue
        x, y = r["budgeted_bytes"] / 1024, r["user_accuracy"]
        ax.plot([x], [y], "o", color=c, label=f"{r['variant']}: {r['option']}"[:70])
        ax.plot([r["step_growth_kib"]], [y], "s", mfc="none", color=c, ms=5)
        ax.plot([r["growth_kib"]], [y], "o", mfc="none", color=c)
        ax.plot([x, r["growth_kib"]], [y, y], ":", color=c, lw=0.8)
    ax.axhline(m["base"]["user_accuracy"], color="gray", ls=":", lw=1, label="base model")
    ax.set_xscale("log")
    ax.set_ylim(0, 1)
    ax.set_xlabel("KiB: budgeted (filled); RSS growth: step alone (square), fine-tuning (circle)")
    ax.set_ylabel("accuracy on the new user's held-out digits")
    ax.set_title(m["title"], fontsize=10)
    ax.legend(fontsize=7, loc="lower right")


if __name__ == "__main__":
    sys.exit(main())
