"""The `edgetrain` command line: argv -> exit code (0 success, 1 failure with one clear line, 2 usage error).

    edgetrain convert | check | inspect | train | eval | export | demo
    convert-inference-model  (the same as `edgetrain convert`)

convert, check, export and demo need onnx (the build side); train, eval and inspect run with numpy alone.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from .errors import EdgeTrainError, RebatchError
from .progress import TrainProgress, duration, epoch_line, percent


class UsageError(Exception):
    """Arguments that cannot work together: exit code 2, like argparse's own errors."""


def _mb(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def _plural(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def _default_checkpoint(artifact: str) -> str:
    root, ext = os.path.splitext(artifact)
    return (root if ext == ".etrain" else artifact) + ".etck"


# ---- convert -----------------------------------------------------------------------------------------------------
LOSSES = {"cross-entropy": "CrossEntropyLoss", "mse": "MSELoss", "l1": "L1Loss", "bce": "BCEWithLogitsLoss"}
DEFAULT_LR = {"sgd": 0.01, "adam": 0.001, "adamw": 0.001}


def _make_loss(args: argparse.Namespace):
    import edgetrain as et

    if args.label_smoothing and args.loss != "cross-entropy":
        raise UsageError("--label-smoothing applies to --loss cross-entropy only")
    if args.loss == "cross-entropy":
        return et.CrossEntropyLoss(label_smoothing=args.label_smoothing or 0.0)
    return getattr(et, LOSSES[args.loss])()


def _make_optimizer(args: argparse.Namespace):
    import edgetrain as et

    lr = DEFAULT_LR[args.optimizer] if args.lr is None else args.lr
    clip = {"clip_grad_norm": args.clip_grad_norm} if args.clip_grad_norm is not None else {}
    if args.optimizer == "sgd":
        momentum = 0.9 if args.momentum is None else args.momentum
        return et.SGD(
            lr=lr, momentum=momentum, weight_decay=args.weight_decay or 0.0, nesterov=args.nesterov, **clip
        )
    for flag, value in (("--momentum", args.momentum), ("--nesterov", args.nesterov or None)):
        if value is not None:
            raise UsageError(f"{flag} applies to --optimizer sgd only (Adam and AdamW have betas instead)")
    cls = et.Adam if args.optimizer == "adam" else et.AdamW
    wd = args.weight_decay if args.weight_decay is not None else (0.01 if args.optimizer == "adamw" else 0.0)
    return cls(lr=lr, weight_decay=wd, **clip)


def _config_text(cfg: dict[str, Any]) -> str:
    """SGD (lr 0.01, momentum 0.9): the settings that are on (None and False ones left out)."""
    shown = {k: v for k, v in cfg.items() if k != "type" and v is not None and v is not False}
    rest = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items())
    return f"{cfg.get('type', '?')} ({rest})" if rest else str(cfg.get("type", "?"))


def _convert(args: argparse.Namespace) -> int:
    import numpy as np

    import edgetrain as et

    from .container import inspect_container

    if not os.path.isfile(args.model):
        raise EdgeTrainError(f"{args.model}: no such file (convert takes an ONNX inference model)")
    loss, optimizer = _make_loss(args), _make_optimizer(args)
    out = args.output or os.path.splitext(args.model)[0] + ".etrain"
    if sys.stderr.isatty():  # a status line while it works (seconds for large models); logs get the summary
        print(
            f"converting {args.model}: import, loss, gradients, optimizer, memory plan ...", file=sys.stderr
        )
    t0 = time.perf_counter()
    options = dict(loss=loss, optimizer=optimizer, trainable=args.trainable, output=args.model_output)
    fallback = None
    try:
        art = et.convert(args.model, batch_size=args.batch_size or 32, **options)
    except RebatchError as e:
        if args.batch_size is not None:
            raise
        # --batch-size was not given: a model whose fixed batch cannot be moved trains at that batch
        art = et.convert(args.model, batch_size=None, **options)
        fallback = f"kept the model's fixed batch: {e}"
    size = art.save(out)
    seconds = time.perf_counter() - t0
    plan = inspect_container(out)["header"].get("plan", {})  # the header alone: no second read of the tensors
    n_train = sum(int(art.initial[p].size) for p in art.parameters)
    frozen = art.frozen
    n_frozen = sum(int(np.prod(art.roles.entries[p].shape)) for p in frozen)  # folded ones too
    batch = art.graph.values[art.data_inputs[0]].shape[0]
    backward = len(art.graph.nodes) - len(art.inference.nodes)
    print(f"converted {args.model} -> {out} ({_mb(size)}) in {duration(seconds)}")
    for line in art.notes + ([fallback] if fallback else []):
        print(f"  {line}")
    print(f"  loss        {_config_text(art.loss_config)}")
    print(f"  optimizer   {_config_text(art.optimizer_config)}")
    print(f"  batch       {batch}")
    print(
        f"  parameters  {len(art.parameters)} trainable ({n_train:,} values), "
        f"{len(frozen)} frozen ({n_frozen:,} values)"
    )
    print(
        f"  program     {_plural(len(art.inference.nodes), 'forward node')}, "
        f"{_plural(backward, 'loss, gradient and update node')}; "
        f"memory plan {_mb(plan.get('arena_size', 0))} (lower bound {_mb(plan.get('lower_bound', 0))})"
    )
    if args.emit_onnx:
        from .container import atomic_write

        model = art.training_onnx()
        atomic_write(args.emit_onnx, model.SerializeToString())
        print(f"  step ONNX   {args.emit_onnx} (one training step in standard ONNX; onnxruntime runs it)")
    print(f"next: edgetrain train {out} --data DATA --epochs 5")
    return 0


def _check(args: argparse.Namespace) -> int:
    from .check import check

    report = check(args.model, batch_size=args.batch_size)
    print(report.text())
    return 0 if report.derivable else 1


def _inspect(args: argparse.Namespace) -> int:
    from .describe import describe

    print(describe(args.file))
    return 0


# ---- data for train and eval --------------------------------------------------------------------------------------
def _data_options(args: argparse.Namespace):
    from .feeding import parse_options

    try:
        return parse_options(args.layout, args.scale, args.normalize)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _feed(path: str, split: str, session, args: argparse.Namespace):
    from .feeding import open_feed

    feed = open_feed(path, split, session, _data_options(args))
    for notice in feed.notices:
        print(f"note: {notice}", file=sys.stderr)
    return feed


def _loaders(args: argparse.Namespace, session, batch: int):
    from loaders import DataLoader, split

    feed = _feed(args.data, "train", session, args)
    view, transform = feed.view, feed.transform
    val_view = None
    if args.val_data is not None:
        val_feed = _feed(args.val_data, "test", session, args)
        val_view, vtransform = val_feed.view, val_feed.transform
    elif args.val_split:
        view, val_view = split(view, (1 - args.val_split, args.val_split), seed=args.seed)
        vtransform = transform
    n = view.size()
    if n < batch:
        raise EdgeTrainError(
            f"{args.data}: {n} training samples make no batch of {batch} (the artifact's batch size); "
            f"convert with --batch-size {n} or less"
        )
    train = DataLoader(
        view,
        batch,
        shuffle=not args.no_shuffle,
        seed=args.seed,
        drop_last=n % batch != 0,
        batch_transform=transform,
    )
    val = None if val_view is None else DataLoader(val_view, batch, batch_transform=vtransform)
    return train, val


def _schedule(text: str | None, warmup: int, total_steps: int):
    import edgetrain as et

    kind, _, rest = (text or "constant").partition(":")
    values = [v for v in rest.split(":") if v] if rest else []
    try:
        nums = [float(v) for v in values]
    except ValueError:
        raise UsageError(f"--lr-schedule {text}: the values after ':' must be numbers") from None
    if kind == "constant" and not nums:
        schedule = et.ConstantLR()
    elif kind == "step" and 1 <= len(nums) <= 2 and nums[0] == int(nums[0]) and nums[0] >= 1:
        schedule = et.StepLR(int(nums[0]), *nums[1:])
    elif kind == "cosine" and len(nums) <= 1:
        schedule = et.CosineLR(total_steps, *nums)
    else:
        raise UsageError(
            f"--lr-schedule {text}: use constant, step:STEPS[:GAMMA] (e.g. step:100:0.5) or cosine[:MIN_LR]"
        )
    return et.WarmupLR(schedule, warmup) if warmup else schedule


def _schedule_text(cfg: dict[str, Any]) -> str:
    kind = cfg.get("type")
    if kind == "StepLR":
        return f"times {cfg['gamma']:g} every {cfg['step_size']} steps"
    if kind == "CosineLR":
        return f"cosine decay to {cfg['min_lr']:g} over {cfg['total_steps']} steps"
    if kind == "WarmupLR":
        return f"linear warm-up over {cfg['warmup_steps']} steps, then {_schedule_text(cfg['schedule'])}"
    return "constant"


# ---- train, eval, export ------------------------------------------------------------------------------------------
def _session(artifact: str):
    import edgetrain as et

    return et.TrainingSession(artifact)


# Options of `train` that a checkpoint records and --resume restores: dest -> default when neither given nor recorded.
RECORDED = {
    "epochs": 1,
    "lr": None,
    "lr_schedule": None,
    "warmup": 0,
    "seed": 0,
    "val_split": None,
    "val_data": None,
    "early_stopping": None,
    "no_shuffle": False,
    "layout": None,
    "scale": None,
    "normalize": None,
    "checkpoint_every": None,
}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _same_option(dest: str, given: Any, recorded: Any) -> bool:
    """Whether a repeated option says what the run recorded (values, not spellings: 1/255 is 0.00392...)."""
    import numpy as np

    from loaders import parse_normalize, parse_scale

    parse = {"scale": parse_scale, "normalize": parse_normalize}.get(dest)
    if parse is None or given is None or recorded is None:
        return given == recorded
    try:
        return bool(np.allclose(np.ravel(parse(given)), np.ravel(parse(recorded)), rtol=1e-12, atol=0))
    except ValueError:
        return False


def _restore_options(args: argparse.Namespace, checkpoint: str) -> dict[str, Any]:
    """On --resume: the run's recorded options fill the ones not given, and a given one that contradicts the run is
    a usage error (--epochs excepted: a run can be made longer). Returns the checkpoint's trainer settings."""
    from .container import inspect_container

    state = inspect_container(checkpoint)["header"].get("user_state", {})
    if state.get("trainer") != 1:
        raise EdgeTrainError(
            f"--resume: {checkpoint} was not written by `edgetrain train`; it holds no run to continue"
        )
    recorded = state.get("run_options") or {}
    for dest, value in recorded.items():
        given = getattr(args, dest, None)
        if dest not in RECORDED or dest == "epochs":
            continue
        if given is not None and not _same_option(dest, given, value):
            was = (
                "not set"
                if value in (None, False)
                else f"{_flag(dest)} {value}"
                if value is not True
                else "set"
            )
            raise UsageError(
                f"{_flag(dest)} {given if given is not True else ''}".rstrip()
                + f" conflicts with the run in {checkpoint} ({was} there): leave it out to continue that run as "
                f"it was, or start a new run from its weights with --init-from {checkpoint}"
            )
        setattr(args, dest, value)
    if args.epochs is None:
        args.epochs = recorded.get("epochs")
    return {**(state.get("settings") or {}), "step": state.get("step", 0), "epoch": state.get("epoch", 0)}


def _train(args: argparse.Namespace) -> int:
    import edgetrain as et

    from .trainer import schedule_from_config, session_batch

    checkpoint = args.checkpoint or _default_checkpoint(args.artifact)
    if args.resume and args.init_from:
        raise UsageError("--resume continues a run, --init-from starts a new one from a checkpoint: give one")
    if args.resume and not os.path.exists(checkpoint):
        raise EdgeTrainError(f"--resume: there is no checkpoint at {checkpoint} to continue from")
    replaces_own_start = args.init_from and os.path.abspath(args.init_from) == os.path.abspath(checkpoint)
    if os.path.exists(checkpoint) and not (args.resume or args.overwrite or replaces_own_start):
        raise UsageError(
            f"checkpoint {checkpoint} exists: --resume to continue that run, --init-from {checkpoint} to start a "
            f"new run from its weights, --overwrite to start over, or --checkpoint NEW.etck"
        )
    settings = _restore_options(args, checkpoint) if args.resume else {}
    for dest, default in RECORDED.items():
        if getattr(args, dest) is None:
            setattr(args, dest, default)
    _check_train_options(args)
    sess = _session(args.artifact)
    if args.init_from:
        sess.load_checkpoint(args.init_from)
        print(
            f"starting a new run from the weights of {args.init_from} (step {sess.step} of its run)",
            file=sys.stderr,
        )
        sess.lr = float(sess.artifact.header["optimizer"].get("lr", sess.lr))
    if args.lr is not None:
        sess.lr = args.lr
    batch = session_batch(sess) or 32
    train, val = _loaders(args, sess, batch)
    classification = sess.num_classes is not None
    if args.early_stopping and val is None:
        raise UsageError("--early-stopping needs validation data: --val-data PATH or --val-split F")
    total = args.epochs * len(train)
    if settings.get("schedule"):  # a resumed run keeps its schedule exactly (a cosine keeps its length)
        schedule = schedule_from_config(settings["schedule"])
        _check_schedule_covers(schedule, total, int(settings.get("step", 0)), checkpoint)
    else:
        schedule = _schedule(args.lr_schedule, args.warmup, total)
    resumed_steps = int(settings.get("step", 0))
    bar = TrainProgress(total, batch, done_steps=resumed_steps)
    trainer = et.Trainer(
        sess,
        train,
        val_loader=val,
        epochs=args.epochs,
        schedule=schedule,
        checkpoint=checkpoint,
        checkpoint_every=args.checkpoint_every,
        early_stopping=(
            {"metric": "val_accuracy" if classification else "val_loss", "patience": args.early_stopping}
            if args.early_stopping
            else None
        ),
        history=args.log,
        progress=bar,
        classification=classification,
        run_options={dest: getattr(args, dest) for dest in RECORDED} | {"data": args.data},
    )
    n_train, n_val = train.view.size(), (val.view.size() if val is not None else 0)
    print(
        f"training {args.artifact} on {args.data}: {n_train:,} samples"
        + (f", {n_val:,} for validation" if val is not None else "")
        + f"; batch {batch}, {_plural(len(train), 'step')} per epoch",
        file=sys.stderr,
    )
    if args.resume:
        print(
            f"resuming from {checkpoint}: {settings.get('epoch', '?')} epoch(s), {resumed_steps} steps done; "
            f"base lr {trainer.base_lr:g}, "
            f"{_schedule_text(schedule.config())}",
            file=sys.stderr,
        )
    else:
        print(f"base lr {sess.lr:g}, {_schedule_text(schedule.config())}", file=sys.stderr)
    t0 = time.perf_counter()
    result = trainer.fit(resume=args.resume)
    bar.close()
    seconds = time.perf_counter() - t0
    _train_summary(args, result, seconds, batch, checkpoint, bar)
    nonfinite = result.stopped_early and result.stop_reason.startswith("non-finite")
    return 1 if nonfinite else 0


def _check_schedule_covers(schedule, total: int, done: int, checkpoint: str) -> None:
    """A resumed run made longer than its schedule: refused when the steps past its end would train at lr 0."""
    cfg = schedule.config()
    inner = cfg.get("schedule", cfg) if cfg.get("type") == "WarmupLR" else cfg
    if inner.get("type") != "CosineLR" or total <= inner["total_steps"] or inner["min_lr"] > 0:
        return
    raise UsageError(
        f"the run in {checkpoint} decays its learning rate to 0 over {inner['total_steps']} steps (cosine), so the "
        f"{total - max(inner['total_steps'], done)} steps more that --epochs asks for would not train at all; "
        f"start a new run from its weights instead: --init-from {checkpoint} --lr-schedule cosine"
    )


def _check_train_options(args: argparse.Namespace) -> None:
    if args.val_data is not None and args.val_split is not None:
        raise UsageError("give --val-data or --val-split, not both")
    if args.val_split is not None and not 0 < args.val_split < 1:
        raise UsageError(f"--val-split must lie between 0 and 1, got {args.val_split}")
    for flag in ("epochs", "checkpoint_every", "early_stopping"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be a positive integer, got {value}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must be 0 or more steps, got {args.warmup}")


def _train_summary(args, result, seconds: float, batch: int, checkpoint: str, bar: TrainProgress) -> None:
    done = result.steps - bar.start_step if bar.last else 0
    rate = done * batch / seconds if seconds > 0 else 0.0
    head = f"trained {result.epochs} epoch(s), {result.steps} steps"
    if bar.last:
        head += f"; this run: {done} steps in {duration(seconds)} ({rate:,.0f} samples/s)"
    print(head)
    if result.history:
        last = result.history[-1]
        print("  last  " + epoch_line(last).strip())
        if result.best is not None and result.metric.startswith("val"):
            best = percent(result.best) if result.metric == "val_accuracy" else f"{result.best:.4f}"
            print(f"  best  {result.metric.replace('_', ' ')} {best} at epoch {result.best_epoch}")
    if result.stopped_early:
        print(f"  stopped: {result.stop_reason}")
    keep = checkpoint
    if result.best_checkpoint is not None:
        which = "the best" if result.kept == "best" else "the last, which are the best"
        print(f"  kept        {which} weights (epoch {result.best_epoch}): {result.best_checkpoint}")
        print(f"  checkpoint  {checkpoint} (the last weights, for --resume)")
        keep = result.best_checkpoint
    else:
        print(f"  checkpoint  {checkpoint}")
    if args.log:
        print(f"  history     {args.log} (JSON lines)")
    print(f"next: edgetrain eval {args.artifact} --data DATA --checkpoint {keep}")
    print(f"      edgetrain export {args.artifact} --checkpoint {keep} -o personalized.onnx")


def _load(sess, checkpoint: str | None, artifact: str) -> str:
    if checkpoint is not None:
        sess.load_checkpoint(checkpoint)
        return f"checkpoint {checkpoint} (step {sess.step})"
    note = "initial parameters of the artifact"
    if os.path.exists(_default_checkpoint(artifact)):
        note += f"; pass --checkpoint {_default_checkpoint(artifact)} for the trained ones"
    return note


def _eval(args: argparse.Namespace) -> int:
    import numpy as np

    from loaders import DataLoader

    from .trainer import evaluate, session_batch

    sess = _session(args.artifact)
    which = _load(sess, args.checkpoint, args.artifact)
    feed = _feed(args.data, args.split, sess, args)
    view = feed.view
    batch = session_batch(sess) or 32
    loader = DataLoader(view, batch, batch_transform=feed.transform)
    classes = sess.num_classes
    outputs, targets = [], []

    def keep(out, y):
        outputs.append(np.argmax(out, axis=1))
        targets.append(np.asarray(y).reshape(-1))

    t0 = time.perf_counter()
    loss, acc = evaluate(sess, loader, classification=classes is not None, on_batch=keep if classes else None)
    seconds = time.perf_counter() - t0
    n = view.size()
    print(f"evaluated {args.artifact} on {args.data}: {n:,} samples in {duration(seconds)}")
    print(f"  parameters  {which}")
    print(f"  loss        {loss:.4f} (mean per sample)")
    if acc is not None:
        print(f"  accuracy    {percent(acc)} ({int(round(acc * n)):,} of {n:,})")
        if classes <= 20:
            preds, labels = np.concatenate(outputs), np.concatenate(targets)
            per = [
                f"{k}: {percent(float(np.mean(preds[labels == k] == k)))}"
                for k in range(classes)
                if np.any(labels == k)
            ]
            print("  per class   " + "  ".join(per))
    return 0


def _export(args: argparse.Namespace) -> int:
    import numpy as np

    sess = _session(args.artifact)
    which = _load(sess, args.checkpoint, args.artifact)
    sess.export_onnx(args.output)
    print(f"exported {args.output} ({_mb(os.path.getsize(args.output))}) from {which}")
    if args.no_check:
        return 0
    try:
        import onnxruntime as ort
    except ImportError:
        print("  not checked: onnxruntime is not installed (pip install onnxruntime)")
        return 0
    ort_sess = ort.InferenceSession(args.output, providers=["CPUExecutionProvider"])
    x = _random_batch(ort_sess.get_inputs()[0], sess)
    got = ort_sess.run(None, {ort_sess.get_inputs()[0].name: x})[0]
    ref = sess.run(x)
    diff = float(np.max(np.abs(got - ref)))
    scale = float(np.max(np.abs(ref))) or 1.0
    ok = diff <= 1e-4 * scale + 1e-5
    print(
        f"  checked with onnxruntime on a random batch: largest difference {diff:.1e} "
        f"({'matches' if ok else 'DOES NOT MATCH'} edgetrain)"
    )
    return 0 if ok else 1


def _random_batch(arg, sess):
    """A random batch the exported model accepts: of its own fixed batch, or 2 for a symbolic one; token ids are
    0 (a valid index whatever the vocabulary)."""
    import numpy as np

    info = sess.artifact.program.values[sess.artifact.io["data_inputs"][0]]
    batch = arg.shape[0] if arg.shape and isinstance(arg.shape[0], int) else 2
    shape = (batch, *info.shape[1:])
    if np.dtype(info.dtype).kind != "f":
        return np.zeros(shape, info.dtype)
    return np.random.default_rng(0).random(shape).astype(info.dtype)


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    if args.epochs < 1:
        raise UsageError(f"--epochs must be a positive integer, got {args.epochs}")
    result = run_demo(args.out, epochs=args.epochs, plot=not args.no_plot)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(result.to_json() + "\n")
    return 0


# ---- the parser ----------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback on errors"
    )
    p = argparse.ArgumentParser(
        prog="edgetrain",
        parents=[common],
        description="On-device training for ONNX models: convert an inference model into a training program, "
        "train it on a device with numpy alone, export the personalized model.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser(
        "convert", parents=[common], help="ONNX inference model -> training artifact (.etrain)"
    )
    _convert_arguments(c)

    c = sub.add_parser(
        "check",
        parents=[common],
        help="trainability report: ops, gradient coverage, parameters, what fails and why",
    )
    c.add_argument("model", help="an ONNX inference model (.onnx)")
    c.add_argument("--batch-size", type=int, default=1, help="batch size to check shapes at (default 1)")
    c.set_defaults(run=_check, parser=c)

    i = sub.add_parser(
        "inspect", parents=[common], help="what is in an artifact (.etrain) or checkpoint (.etck)"
    )
    i.add_argument("file", help="an artifact or checkpoint file")
    i.set_defaults(run=_inspect, parser=i)

    t = sub.add_parser("train", parents=[common], help="train an artifact on data, with checkpoints")
    t.add_argument("artifact", help="a training artifact (.etrain) from `edgetrain convert`")
    t.add_argument(
        "--data", required=True, help="training data: an MNIST directory or idx pair, .npz or .csv"
    )
    t.add_argument("--val-data", help="validation data (an MNIST directory gives its test split)")
    t.add_argument(
        "--val-split", type=float, help="hold out this fraction of --data for validation, e.g. 0.1"
    )
    t.add_argument("--epochs", type=int, help="epochs to train (in all, when resuming; default 1)")
    t.add_argument("--lr", type=float, help="base learning rate (default: the one given to convert)")
    t.add_argument("--lr-schedule", help="constant (default), step:STEPS[:GAMMA] or cosine[:MIN_LR]")
    t.add_argument("--warmup", type=int, help="steps of linear learning-rate warm-up (default 0)")
    t.add_argument("--checkpoint", help="checkpoint file (default: the artifact's name with .etck)")
    t.add_argument("--checkpoint-every", type=int, help="also save a checkpoint every N steps")
    t.add_argument(
        "--resume",
        action="store_true",
        help="continue the run saved in the checkpoint, exactly, with its own settings (they need not be repeated)",
    )
    t.add_argument(
        "--init-from",
        metavar="CHECKPOINT",
        help="start a new run from a checkpoint's weights and optimizer state, e.g. on data that has grown",
    )
    t.add_argument("--overwrite", action="store_true", help="start over even if the checkpoint exists")
    t.add_argument(
        "--early-stopping",
        type=int,
        metavar="EPOCHS",
        help="stop after this many epochs without improvement of validation accuracy (loss for regression)",
    )
    t.add_argument("--log", help="write the history (one JSON line per epoch) to this file")
    t.add_argument("--seed", type=int, help="shuffling and --val-split seed (default 0)")
    t.add_argument("--no-shuffle", action="store_true", default=None, help="keep the data's order")
    _data_arguments(t)
    t.set_defaults(run=_train, parser=t)

    e = sub.add_parser(
        "eval", parents=[common], help="loss and accuracy of an artifact or checkpoint on data"
    )
    e.add_argument("artifact", help="a training artifact (.etrain)")
    e.add_argument("--data", required=True, help="an MNIST directory or idx pair, .npz or .csv")
    e.add_argument("--checkpoint", help="trained parameters (default: the artifact's initial ones)")
    e.add_argument("--split", default="test", choices=["train", "test"], help="split of an MNIST directory")
    _data_arguments(e)
    e.set_defaults(run=_eval, parser=e)

    x = sub.add_parser("export", parents=[common], help="personalized ONNX inference model from a checkpoint")
    x.add_argument("artifact", help="a training artifact (.etrain)")
    x.add_argument("--checkpoint", help="trained parameters (default: the artifact's initial ones)")
    x.add_argument("-o", "--output", required=True, help="the ONNX file to write")
    x.add_argument("--no-check", action="store_true", help="skip the onnxruntime check")
    x.set_defaults(run=_export, parser=x)

    d = sub.add_parser(
        "demo", parents=[common], help="personalize the embedded handwriting model (< 1 minute)"
    )
    d.add_argument(
        "--out", default="edgetrain-demo", help="directory for the files (default ./edgetrain-demo)"
    )
    d.add_argument("--epochs", type=int, default=20, help="fine-tuning epochs (default 20)")
    d.add_argument("--no-plot", action="store_true", help="do not write the training-curve plot")
    d.add_argument("--json", help="also write the results as JSON to this file")
    d.set_defaults(run=_demo, parser=d)
    return p


def _data_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--layout",
        choices=["nchw", "nhwc"],
        help="the data's image layout: nhwc (channels last, as cameras give) is transposed to the model's "
        "channels first; default: decided from the shapes, refused when ambiguous",
    )
    p.add_argument(
        "--scale",
        nargs="?",
        const="1/255",
        metavar="FACTOR",
        help="multiply the samples by FACTOR (e.g. 0.00392 or 1/255; --scale alone: 1/255, 8-bit images to [0, 1])",
    )
    p.add_argument(
        "--normalize",
        metavar="MEAN,STD",
        help="then (x - MEAN) / STD per channel: 0.5,0.25 or per channel 0.485:0.456:0.406,0.229:0.224:0.225",
    )


def _convert_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("model", help="an ONNX inference model (.onnx)")
    c.add_argument("-o", "--output", help="the artifact to write (default: the model's name with .etrain)")
    c.add_argument("--loss", choices=list(LOSSES), default="cross-entropy", help="default cross-entropy")
    c.add_argument("--label-smoothing", type=float, help="cross-entropy label smoothing, e.g. 0.1")
    c.add_argument("--optimizer", choices=list(DEFAULT_LR), default="sgd", help="default sgd")
    c.add_argument("--lr", type=float, help="learning rate (default 0.01 for sgd, 0.001 for adam and adamw)")
    c.add_argument("--momentum", type=float, help="sgd momentum (default 0.9)")
    c.add_argument("--nesterov", action="store_true", help="sgd with Nesterov momentum")
    c.add_argument("--weight-decay", type=float, help="default 0 (0.01 for adamw)")
    c.add_argument("--clip-grad-norm", type=float, help="clip the global gradient norm to this value")
    c.add_argument(
        "--trainable",
        nargs="+",
        metavar="PATTERN",
        help="parameters to train: names or glob patterns (default: all), e.g. 'fc.*'",
    )
    c.add_argument(
        "--batch-size",
        type=int,
        help="the training batch (default 32): fixes a symbolic batch dimension, and re-batches a model exported "
        "with a fixed one (checked against the model as exported)",
    )
    c.add_argument("--model-output", help="the model output the loss reads (default: the first)")
    c.add_argument("--emit-onnx", metavar="STEP.onnx", help="also write the training step as standard ONNX")
    c.set_defaults(run=_convert, parser=c)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, where: str) -> int:
    debug = getattr(args, "debug", False)
    try:
        code = args.run(args)
        sys.stdout.flush()  # inside the try: a reader that went away must not be reported at exit
        return code
    except BrokenPipeError:
        # the reader went away (`edgetrain check MODEL | head`): what it wanted is written; end quietly, and keep
        # Python from reporting the same broken pipe again when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UsageError as e:
        if debug:
            raise
        getattr(args, "parser", parser).print_usage(sys.stderr)
        print(f"{where}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{where}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # every failure is one clear line; --debug shows the traceback
        if debug:
            raise
        print(f"{where}: error: {_plain(e)}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return _run(parser, args, f"edgetrain {args.command}")


def _plain(e: BaseException) -> str:
    from loaders import DataError

    if isinstance(e, (EdgeTrainError, DataError, ValueError)):  # messages written for users
        return str(e)
    if isinstance(e, OSError) and e.filename:
        return f"{e.filename}: {e.strerror or e}"
    if isinstance(e, ImportError) and e.name:
        return f"this needs the {e.name} package, which is not installed (pip install 'edgetrain[dev]')"
    return f"{type(e).__name__}: {e} (run with --debug for the traceback)"


def convert_main(argv: Sequence[str] | None = None) -> int:
    """`convert-inference-model`: the same as `edgetrain convert`."""
    parser = argparse.ArgumentParser(
        prog="convert-inference-model",
        description="ONNX inference model -> training artifact (.etrain); the same as `edgetrain convert`.",
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    _convert_arguments(parser)
    args = parser.parse_args(argv)
    return _run(parser, args, "convert-inference-model")


if __name__ == "__main__":
    sys.exit(main())
