"""The device-side commands train and eval (numpy, loaders and the runtime only): the user's data fitted to the
model's input, learning-rate schedules from their command-line text, a run's options recorded in its checkpoint
and restored by --resume, --init-from, Ctrl-C and SIGTERM saving the step a run stopped at, and the summaries a
person reads."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
import time
from typing import Any

import numpy as np

from edgetrain.core.container import inspect_container
from edgetrain.core.errors import ConfigError, EdgeTrainError, FeedError, UsageError
from edgetrain.runtime.feeding import open_feed, parse_options
from edgetrain.runtime.progress import TrainProgress, duration, epoch_line, percent
from edgetrain.runtime.schedules import ConstantLR, CosineLR, StepLR, WarmupLR, schedule_from_config
from edgetrain.runtime.threads import blas_threads
from edgetrain.runtime.trainer import Trainer, evaluate, session_batch
from loaders import Augment, DataLoader, fingerprint, parse_normalize, parse_scale, split

from .common import default_checkpoint, load_weights, open_session, plural
from .curves import plot_history


def _data_options(args: argparse.Namespace):
    try:
        return parse_options(
            args.layout,
            args.scale,
            args.normalize,
            getattr(args, "x_key", None),
            getattr(args, "y_key", None),
        )
    except ValueError as e:
        raise UsageError(str(e)) from None


def _feed(path: str, which: str, session, args: argparse.Namespace):
    # --cast: integer samples fed to a float input as they are
    session.allow_cast = bool(getattr(args, "cast", None))
    try:
        feed = open_feed(path, which, session, _data_options(args))
    except FeedError as e:
        if getattr(e, "cast_refused", False):  # an option is missing: --scale or --cast
            raise UsageError(str(e)) from None
        raise
    for notice in feed.notices:
        print(f"note: {notice}", file=sys.stderr)
    return feed


def _loaders(args: argparse.Namespace, session, batch: int):
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
        augment=_augment(args.augment, transform),
    )
    val = None if val_view is None else DataLoader(val_view, batch, batch_transform=vtransform)
    return train, val


def _augment(text: str | None, transform) -> Augment | None:
    """--augment crop:4,flip,rotate:10 -> the Augment of the training batches, on the samples as the data holds
    them (channels last when the pipeline transposes them), drawn from the run's seed (so --resume repeats it)."""
    if text is None:
        return None
    adapter = getattr(transform, "adapter", None)
    sample, model = (adapter.sample_shape, adapter.model_shape) if adapter is not None else ((), ())
    channels_last = len(model) == 3 and sample != model and sample == model[1:] + model[:1]
    layout = "nhwc" if channels_last else "nchw"
    try:
        return Augment.parse(text, layout=layout)
    except ValueError as e:
        raise UsageError(f"--augment {text}: {e}") from None


def _schedule(text: str | None, warmup: int, total_steps: int):
    kind, _, rest = (text or "constant").partition(":")
    values = [v for v in rest.split(":") if v] if rest else []
    try:
        nums = [float(v) for v in values]
    except ValueError:
        raise UsageError(f"--lr-schedule {text}: the values after ':' must be numbers") from None
    if kind == "constant" and not nums:
        schedule = ConstantLR()
    elif kind == "step" and 1 <= len(nums) <= 2 and nums[0] == int(nums[0]) and nums[0] >= 1:
        schedule = StepLR(int(nums[0]), *nums[1:])
    elif kind == "cosine" and len(nums) <= 1:
        schedule = CosineLR(total_steps, *nums)
    else:
        raise UsageError(
            f"--lr-schedule {text}: use constant, step:STEPS[:GAMMA] (e.g. step:100:0.5) or cosine[:MIN_LR]"
        )
    return WarmupLR(schedule, warmup) if warmup else schedule


def _schedule_text(cfg: dict[str, Any]) -> str:
    kind = cfg.get("type")
    if kind == "StepLR":
        return f"times {cfg['gamma']:g} every {cfg['step_size']} steps"
    if kind == "CosineLR":
        return f"cosine decay to {cfg['min_lr']:g} over {cfg['total_steps']} steps"
    if kind == "WarmupLR":
        return f"linear warm-up over {cfg['warmup_steps']} steps, then {_schedule_text(cfg['schedule'])}"
    return "constant"


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
    "cast": False,
    "x_key": None,
    "y_key": None,
    "augment": None,
    "checkpoint_every": None,
}
# Options a checkpoint also records, which --resume takes when they are not given and which may be given anew: the
# data (checked to be the same samples), the history file (continued) and the plot.
CARRIED = ("data", "log", "plot")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _same_option(dest: str, given: Any, recorded: Any) -> bool:
    """Whether a repeated option says what the run recorded (values, not spellings: 1/255 is 0.00392...)."""
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
    for dest in CARRIED:
        if getattr(args, dest) is None:
            setattr(args, dest, recorded.get(dest))
    if args.data is None:
        raise UsageError(f"--resume: the run in {checkpoint} recorded no training data: give it with --data")
    if not os.path.exists(args.data):
        raise ConfigError(
            f"--resume: the run in {checkpoint} trained on {args.data}, which is not there any more: put it back "
            f"(or give its new place with --data), or train on other data from the run's weights: "
            f"edgetrain train {args.artifact} --data NEW --init-from {checkpoint}"
        )
    return {**(state.get("settings") or {}), "step": state.get("step", 0), "epoch": state.get("epoch", 0)}


def _check_same_data(args: argparse.Namespace, settings: dict[str, Any], train, val, checkpoint: str) -> None:
    """--resume: the samples must be those the run trained and validated on (the checkpoint's fingerprints of
    them), or the result would be no continuation of that run; new data starts a new run from its weights."""
    for key, loader, path in (("data", train, args.data), ("val_data", val, args.val_data or args.data)):
        if key not in settings:  # a checkpoint from before fingerprints were recorded
            continue
        then, now = settings[key], None if loader is None else fingerprint(loader.view)
        if then == now:
            continue
        if then and now and then["size"] != now["size"]:
            how = f"{then['size']:,} samples then, {now['size']:,} now"
        elif then and now:
            how = f"{now['size']:,} samples then and now, but other ones"
        else:
            how = "validation added or removed"
        raise ConfigError(
            f"--resume: {path} is not the data the run in {checkpoint} "
            f"{'trained' if key == 'data' else 'validated'} on ({how}): to continue that run, put its data back; "
            f"to train on this data from the run's weights, start a new run: "
            f"edgetrain train {args.artifact} --data {args.data} --init-from {checkpoint}"
        )


def run_train(args: argparse.Namespace) -> int:
    """`edgetrain train`: options -> session -> data -> the run -> its summary; 1 when the loss went non-finite,
    130 (Ctrl-C) or 143 (SIGTERM) when a signal stopped the run (which saved the step it stopped at)."""
    checkpoint, settings = _train_options(args)
    sess = _train_session(args)
    batch = session_batch(sess) or 32
    train, val = _loaders(args, sess, batch)
    if args.resume:
        _check_same_data(args, settings, train, val, checkpoint)
    if args.early_stopping and val is None:
        raise UsageError("--early-stopping needs validation data: --val-data PATH or --val-split F")
    total = args.epochs * len(train)
    schedule = _run_schedule(args, settings, total, checkpoint)
    bar = TrainProgress(total, batch, done_steps=int(settings.get("step", 0)))
    trainer = _trainer(args, sess, train, val, schedule, checkpoint, bar)
    print(_data_line(args, train, val, batch), file=sys.stderr)
    base_lr = trainer.base_lr if args.resume else sess.lr
    print(_lr_line(args, base_lr, schedule, checkpoint, settings), file=sys.stderr)
    return _fit_and_report(args, trainer, bar, checkpoint, batch)


def _fit_and_report(
    args: argparse.Namespace, trainer: Trainer, bar: TrainProgress, checkpoint: str, batch: int
) -> int:
    """The run, stopped by Ctrl-C or SIGTERM as _SignalStop says, then its summary and plot; the exit code."""
    t0 = time.perf_counter()
    with _SignalStop(trainer) as signals:
        try:
            result = trainer.fit(resume=args.resume)
        except KeyboardInterrupt:  # a second signal: quit now, with the checkpoint the run last wrote
            result = None
        signals.ended = True
        bar.close()
        if result is None:
            _quit_unsaved(args, checkpoint, trainer, signals.caught[-1])
            return 128 + signals.caught[0]
        _train_summary(args, result, time.perf_counter() - t0, batch, checkpoint, bar)
        if args.plot:
            _plot(args, result)
    if result.interrupted:
        return 128 + signals.caught[0]
    nonfinite = result.stopped_early and result.stop_reason.startswith("non-finite")
    return 1 if nonfinite else 0


_SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


class _SignalStop:
    """Ctrl-C (SIGINT) and SIGTERM while a run trains: the first asks the trainer to stop after the step it is in and
    save that step (the handler only sets a flag, so no file is cut short); a second quits at once, leaving the
    checkpoint the run wrote last, whole, unless a checkpoint is being written: that one is let finish. Once the
    run has ended (`ended`), a signal waits for its summary. A signal the caller ignores (a background job, nohup)
    stays ignored; the handlers are the caller's again on leaving."""

    def __init__(self, trainer: Trainer):
        self.trainer, self.caught, self.ended = trainer, [], False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _SignalStop:
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            for sig in _SIGNAL_NAMES:
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._previous.items():
            signal.signal(sig, old)

    def _handle(self, signum: int, frame) -> None:
        self.caught.append(signum)
        name = _SIGNAL_NAMES[signum]
        if self.ended:
            _say(f"{name}: the run has ended and is saved; its summary comes in a moment\n")
        elif len(self.caught) == 1:
            self.trainer.request_stop(name)
            _say(f"\n{name}: stopping after this step and saving it ({name} again quits without saving it)\n")
        elif self.trainer.writing:
            _say(f"{name}: a checkpoint is being written; it is let finish, then the run stops\n")
        else:
            raise KeyboardInterrupt


def _say(text: str) -> None:
    """Writes to stderr from a signal handler: straight to the file descriptor, as the handler may run while
    Python's own stderr object is in the middle of a write."""
    os.write(2, text.encode("utf-8", "replace"))


def _resume_command(args: argparse.Namespace, checkpoint: str) -> str:
    """The command that continues the run: its options are in the checkpoint, all but where that is."""
    words = ["edgetrain", "train", args.artifact, "--resume"]
    if os.path.abspath(checkpoint) != os.path.abspath(default_checkpoint(args.artifact)):
        words += ["--checkpoint", checkpoint]
    return shlex.join(words)


def _position(checkpoint: str) -> str:
    """Where the run in a checkpoint stands: "step 137 (epoch 2 of 3, 32 of 105 batches done)"."""
    state = inspect_container(checkpoint)["header"].get("user_state", {})
    loader, settings = state.get("loader") or {}, state.get("settings") or {}
    epoch, epochs = state.get("epoch", 0), settings.get("epochs", "?")
    if not loader.get("position"):
        return f"step {state.get('step')} (after epoch {epoch} of {epochs})"
    batch = settings.get("batch_size") or 1
    batches = (
        loader.get("size", 0) // batch if settings.get("drop_last") else -(-loader.get("size", 0) // batch)
    )
    done = f"{loader['position'] // batch} of {batches} batches done"
    return f"step {state.get('step')} (epoch {epoch + 1} of {epochs}, {done})"


def _quit_unsaved(args: argparse.Namespace, checkpoint: str, trainer: Trainer, signum: int) -> None:
    """After a second signal: what the checkpoint on disk holds, and how to go on from it."""
    print(f"quit at step {trainer.step} without saving it ({_SIGNAL_NAMES[signum]} twice)")
    if trainer.saved_step is None:
        print(f"  no checkpoint of this run was written yet ({checkpoint}): there is nothing to continue")
        return
    print(f"  checkpoint  {checkpoint}: {_position(checkpoint)}")
    print(f"continue with: {_resume_command(args, checkpoint)}")


def _plot(args: argparse.Namespace, result) -> None:
    """--plot: the curves of the run's whole history (a resumed run's included)."""
    title = f"edgetrain train {os.path.basename(args.artifact)} on {args.data}"
    if plot_history(args.plot, result.history, title=title):
        print(f"  plot        {args.plot}")
    else:
        print(
            f"note: --plot {args.plot}: no plot drawn, matplotlib is not installed (pip install matplotlib); "
            f"the run itself is complete",
            file=sys.stderr,
        )


def _train_options(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The command line -> (the checkpoint, the trainer settings of the run --resume continues, else {}); fills in
    the options a resumed run recorded and the defaults, and refuses options that do not go together."""
    checkpoint = args.checkpoint or default_checkpoint(args.artifact)
    if args.resume and args.init_from:
        raise UsageError("--resume continues a run, --init-from starts a new one from a checkpoint: give one")
    if args.resume and not os.path.exists(checkpoint):
        raise EdgeTrainError(f"--resume: there is no checkpoint at {checkpoint} to continue from")
    if args.data is None and not args.resume:
        raise UsageError(
            "--data is required: the training data (an MNIST directory or idx pair, .npz or .csv); only --resume "
            "finds it in the checkpoint"
        )
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
    return checkpoint, settings


def _train_session(args: argparse.Namespace):
    """The artifact's session, from --init-from's weights when given, at --lr; and the process's BLAS threads."""
    sess = open_session(args.artifact)
    if args.init_from:
        sess.load_checkpoint(args.init_from)
        print(
            f"starting a new run from the weights of {args.init_from} (step {sess.step} of its run)",
            file=sys.stderr,
        )
        sess.lr = sess.record.optimizer.lr
    if args.lr is not None:
        sess.lr = args.lr
    if args.threads is not None:
        if args.threads < 1:
            raise UsageError(f"--threads must be at least 1, not {args.threads}")
        now, how = blas_threads(args.threads)
        if now is None:
            print(f"--threads {args.threads} was not applied: {how}", file=sys.stderr)
    if args.feature_cache_mb < 0:
        raise UsageError(f"--feature-cache-mb must be 0 (off) or more, not {args.feature_cache_mb:g}")
    return sess


def _run_schedule(args: argparse.Namespace, settings: dict[str, Any], total: int, checkpoint: str):
    """The learning-rate schedule: a resumed run keeps its own exactly (a cosine keeps its length), a new one
    follows --lr-schedule and --warmup."""
    if settings.get("schedule"):
        schedule = schedule_from_config(settings["schedule"])
        _check_schedule_covers(schedule, total, int(settings.get("step", 0)), checkpoint)
        return schedule
    return _schedule(args.lr_schedule, args.warmup, total)


def _trainer(
    args: argparse.Namespace, sess, train, val, schedule, checkpoint: str, bar: TrainProgress
) -> Trainer:
    """The Trainer of the run, with the options --resume will restore recorded in its checkpoints."""
    classification = sess.num_classes is not None
    return Trainer(
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
        run_options={dest: getattr(args, dest) for dest in (*RECORDED, *CARRIED)},
        feature_cache=args.feature_cache_mb > 0,
        feature_cache_bytes=int(args.feature_cache_mb * 2**20),
    )


def _data_line(args: argparse.Namespace, train: DataLoader, val: DataLoader | None, batch: int) -> str:
    """What trains on what: the samples, those held out, the batches."""
    n_train, n_val = train.view.size(), (val.view.size() if val is not None else 0)
    return (
        f"training {args.artifact} on {args.data}: {n_train:,} samples"
        + (f", {n_val:,} for validation" if val is not None else "")
        + f"; batch {batch}, {plural(len(train), 'step')} per epoch"
    )


def _lr_line(
    args: argparse.Namespace, base_lr: float, schedule, checkpoint: str, settings: dict[str, Any]
) -> str:
    """The learning rate the run starts from and its schedule; a resumed run also says where it stood."""
    lr = f"base lr {base_lr:g}, {_schedule_text(schedule.config())}"
    if not args.resume:
        return lr
    done = int(settings.get("step", 0))
    return f"resuming from {checkpoint}: {settings.get('epoch', '?')} epoch(s), {done} steps done; {lr}"


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
    """What the run did and where its files are; for an interrupted run, how to continue it."""
    head = f"trained {result.epochs} epoch(s), {result.steps} steps"
    if bar.last:
        head += "; this run: " + _run_times(result, result.steps - bar.start_step, batch, seconds)
    print(head)
    if result.history:
        last = result.history[-1]
        print("  last  " + epoch_line(last).strip())
        if result.best is not None and result.metric.startswith("val"):
            best = percent(result.best) if result.metric == "val_accuracy" else f"{result.best:.4f}"
            print(f"  best  {result.metric.replace('_', ' ')} {best} at epoch {result.best_epoch}")
    if result.stopped_early:
        print(f"  stopped: {result.stop_reason}")
    if result.interrupted:
        print(f"  checkpoint  {checkpoint}: {_position(checkpoint)}")
        if args.log:
            print(f"  history     {args.log} (JSON lines)")
        print(f"continue with: {_resume_command(args, checkpoint)}")
        return
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


def _run_times(result, steps: int, batch: int, seconds: float) -> str:
    """The run's steps and times, the steps' apart from validation's, which can take far longer: 100 steps in
    0.07 s of training (14,000 samples/s), validation 8.0 s; 8.1 s in all."""
    train = result.train_seconds
    rate = f" ({steps * batch / train:,.0f} samples/s)" if train > 0 else ""
    text = f"{steps} steps in {duration(train)} of training{rate}"
    if result.val_seconds:
        text += f", validation {duration(result.val_seconds)}"
    return text + f"; {duration(seconds)} in all"


def run_eval(args: argparse.Namespace) -> int:
    sess = open_session(args.artifact)
    which = load_weights(sess, args.checkpoint, args.artifact)
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
    if feed.pipeline is not None and feed.pipeline.declared:
        print(f"  input       {feed.pipeline.describe()}")
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
