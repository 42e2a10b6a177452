"""The device-side commands train and eval (numpy, loaders and the runtime only): a run's configuration
(edgetrain.cli.config, which --resume fills from the checkpoint) turned into the session, the user's data fitted to
the model's input, the schedule and the Trainer, which records the run's options in its checkpoints; --init-from,
Ctrl-C and SIGTERM saving the step a run stopped at, and the summaries a person reads."""

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
from edgetrain.core.paths import outputs_apart, replaceable, same_file
from edgetrain.runtime.feeding import open_feed
from edgetrain.runtime.progress import TrainProgress, duration, epoch_line, percent
from edgetrain.runtime.schedules import schedule_from_config
from edgetrain.runtime.threads import blas_threads
from edgetrain.runtime.trainer import Trainer, evaluate, session_batch
from loaders import Augment, DataLoader, fingerprint, split

from .common import default_checkpoint, load_weights, open_session, plural
from .config import EvalConfig, ReadingConfig, RunConfig, TrainConfig
from .curves import plot_history


def _feed(path: str, which: str, session, reading: ReadingConfig):
    # --cast: integer samples fed to a float input as they are
    session.allow_cast = reading.cast
    try:
        feed = open_feed(path, which, session, reading.data_options())
    except FeedError as e:
        if getattr(e, "cast_refused", False):  # an option is missing: --scale or --cast
            raise UsageError(str(e)) from None
        raise
    for notice in feed.notices:
        print(f"note: {notice}", file=sys.stderr)
    return feed


def _loaders(run: RunConfig, session, batch: int):
    data = run.data
    feed = _feed(data.data, "train", session, data.reading)
    view, transform = feed.view, feed.transform
    val_view = None
    if data.val_data is not None:
        val_feed = _feed(data.val_data, "test", session, data.reading)
        val_view, vtransform = val_feed.view, val_feed.transform
    elif data.val_split:
        view, val_view = split(view, (1 - data.val_split, data.val_split), seed=run.seed)
        vtransform = transform
    n = view.size()
    if n < batch:
        raise EdgeTrainError(
            f"{data.data}: {n} training samples make no batch of {batch} (the artifact's batch size); "
            f"convert with --batch-size {n} or less"
        )
    augment = _augment(run.augment, transform)
    if augment is not None:  # against the data's own samples now, not at the first batch of training
        first, _ = view.get_batch(np.arange(1))
        try:
            augment.check((batch, *np.shape(first)[1:]), np.asarray(first).dtype)
        except ValueError as e:
            raise UsageError(f"--augment {run.augment}: {e}") from None
    train = DataLoader(
        view,
        batch,
        shuffle=run.shuffle,
        seed=run.seed,
        drop_last=n % batch != 0,
        batch_transform=transform,
        augment=augment,
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


def _schedule_text(cfg: dict[str, Any]) -> str:
    kind = cfg.get("type")
    if kind == "StepLR":
        return f"times {cfg['gamma']:g} every {cfg['step_size']} steps"
    if kind == "CosineLR":
        return f"cosine decay to {cfg['min_lr']:g} over {cfg['total_steps']} steps"
    if kind == "WarmupLR":
        return f"linear warm-up over {cfg['warmup_steps']} steps, then {_schedule_text(cfg['schedule'])}"
    return "constant"


def _check_same_data(cfg: TrainConfig, train, val) -> None:
    """--resume: the samples must be those the run trained and validated on (the checkpoint's fingerprints of
    them), or the result would be no continuation of that run; new data starts a new run from its weights."""
    settings, data, checkpoint = cfg.resumed, cfg.run.data, cfg.checkpoint
    for key, loader, path in (("data", train, data.data), ("val_data", val, data.val_data or data.data)):
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
            f"edgetrain train {cfg.artifact} --data {data.data} --init-from {checkpoint}"
        )


def run_train(args: argparse.Namespace) -> int:
    """`edgetrain train`: options -> session -> data -> the run -> its summary; 1 when the loss went non-finite,
    130 (Ctrl-C) or 143 (SIGTERM) when a signal stopped the run (which saved the step it stopped at)."""
    cfg = _config(args)
    sess = _train_session(cfg)
    batch = session_batch(sess) or 32
    train, val = _loaders(cfg.run, sess, batch)
    if cfg.resume:
        _check_same_data(cfg, train, val)
    total = cfg.run.epochs * len(train)
    schedule = _run_schedule(cfg, total)
    bar = TrainProgress(total, batch, done_steps=int(cfg.resumed.get("step", 0)))
    trainer = _trainer(cfg, sess, train, val, schedule, bar)
    print(_data_line(cfg, train, val, batch), file=sys.stderr)
    base_lr = trainer.base_lr if cfg.resume else sess.lr
    print(_lr_line(cfg, base_lr, schedule), file=sys.stderr)
    return _fit_and_report(cfg, trainer, bar, batch)


def _config(args: argparse.Namespace) -> TrainConfig:
    """The run's configuration; the files it reads and writes are checked apart first (_paths_apart), before the
    checkpoint is read (--resume) or anything written, and once more with what --resume took from the checkpoint."""
    a = args
    _paths_apart(
        a.artifact,
        a.checkpoint or default_checkpoint(a.artifact),
        data=a.data,
        val_data=a.val_data,
        log=a.log,
        plot=a.plot,
        early_stopping=a.early_stopping,
        init_from=a.init_from,
        overwrite=a.overwrite,
    )
    cfg = TrainConfig.from_args(args)
    run = cfg.run
    if cfg.resume:  # the data, --log and --plot the checkpoint's run recorded are the run's files too
        _paths_apart(
            cfg.artifact,
            cfg.checkpoint,
            data=run.data.data,
            val_data=run.data.val_data,
            log=run.log,
            plot=run.plot,
            early_stopping=run.early_stopping,
        )
    return cfg


def best_beside(checkpoint: str) -> str:
    """The checkpoint early stopping keeps the best weights in, beside the run's (as the Trainer names it)."""
    root, ext = os.path.splitext(checkpoint)
    return f"{root}.best{ext or '.etck'}"


def _paths_apart(
    artifact: str,
    checkpoint: str,
    *,
    data: str | None,
    val_data: str | None,
    log: str | None,
    plot: str | None,
    early_stopping: int | None,
    init_from: str | None = None,
    overwrite: bool = False,
) -> None:
    """Refuses a run that would write over a file it reads (the artifact, --data, --val-data, --init-from but as
    its own checkpoint: a new run may replace its own start), write one file twice, or replace a file of another
    kind with its checkpoint, the best checkpoint early stopping keeps, --log or --plot."""
    best = best_beside(checkpoint) if early_stopping else None
    inputs = [("the artifact", artifact), ("--data", data), ("--val-data", val_data)]
    if init_from is not None and not same_file(init_from, checkpoint):
        inputs.append(("--init-from", init_from))
    outputs = [
        ("--checkpoint", checkpoint),
        ("--checkpoint's best checkpoint", best),
        ("--log", log),
        ("--plot", plot),
    ]
    outputs_apart(inputs=inputs, outputs=outputs, command="train")
    replaceable(checkpoint, "checkpoint", option="--checkpoint", command="train", overwrite=overwrite)
    replaceable(best, "checkpoint", option="--checkpoint's best checkpoint", command="train")
    replaceable(log, "history", option="--log", command="train")
    replaceable(plot, "plot", option="--plot", command="train")


def _fit_and_report(cfg: TrainConfig, trainer: Trainer, bar: TrainProgress, batch: int) -> int:
    """The run, stopped by Ctrl-C or SIGTERM as _SignalStop says, then its summary and plot; the exit code."""
    t0 = time.perf_counter()
    with _SignalStop(trainer) as signals:
        try:
            result = trainer.fit(resume=cfg.resume)
        except KeyboardInterrupt:  # a second signal: quit now, with the checkpoint the run last wrote
            result = None
        signals.ended = True
        bar.close()
        if result is None:
            _quit_unsaved(cfg, trainer, signals.caught[-1])
            return 128 + signals.caught[0]
        _train_summary(cfg, result, time.perf_counter() - t0, batch, bar)
        if cfg.run.plot:
            _plot(cfg, result)
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


def _resume_command(cfg: TrainConfig) -> str:
    """The command that continues the run: its options are in the checkpoint, all but where that is."""
    words = ["edgetrain", "train", cfg.artifact, "--resume"]
    if not same_file(cfg.checkpoint, default_checkpoint(cfg.artifact)):
        words += ["--checkpoint", cfg.checkpoint]
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


def _quit_unsaved(cfg: TrainConfig, trainer: Trainer, signum: int) -> None:
    """After a second signal: what the checkpoint on disk holds, and how to go on from it."""
    print(f"quit at step {trainer.step} without saving it ({_SIGNAL_NAMES[signum]} twice)")
    if trainer.saved_step is None:
        print(f"  no checkpoint of this run was written yet ({cfg.checkpoint}): there is nothing to continue")
        return
    print(f"  checkpoint  {cfg.checkpoint}: {_position(cfg.checkpoint)}")
    print(f"continue with: {_resume_command(cfg)}")


def _plot(cfg: TrainConfig, result) -> None:
    """--plot: the curves of the run's whole history (a resumed run's included)."""
    plot = cfg.run.plot
    title = f"edgetrain train {os.path.basename(cfg.artifact)} on {cfg.run.data.data}"
    if plot_history(plot, result.history, title=title):
        print(f"  plot        {plot}")
    else:
        print(
            f"note: --plot {plot}: no plot drawn, matplotlib is not installed (pip install matplotlib); "
            f"the run itself is complete",
            file=sys.stderr,
        )


def _train_session(cfg: TrainConfig):
    """The artifact's session, from --init-from's weights when given, at --lr; and the process's BLAS threads."""
    sess = open_session(cfg.artifact)
    if cfg.init_from:
        sess.load_checkpoint(cfg.init_from)
        print(
            f"starting a new run from the weights of {cfg.init_from} (step {sess.step} of its run)",
            file=sys.stderr,
        )
        sess.lr = sess.record.optimizer.lr
    if cfg.run.schedule.lr is not None:
        sess.lr = cfg.run.schedule.lr
    if cfg.threads is not None:
        now, how = blas_threads(cfg.threads)
        if now is None:
            print(f"--threads {cfg.threads} was not applied: {how}", file=sys.stderr)
    return sess


def _run_schedule(cfg: TrainConfig, total: int):
    """The learning-rate schedule: a resumed run keeps its own exactly (a cosine keeps its length), a new one
    follows --lr-schedule and --warmup."""
    if cfg.resumed.get("schedule"):
        schedule = schedule_from_config(cfg.resumed["schedule"])
        _check_schedule_covers(schedule, total, int(cfg.resumed.get("step", 0)), cfg.checkpoint)
        return schedule
    return cfg.run.schedule.make(total)


def _trainer(cfg: TrainConfig, sess, train, val, schedule, bar: TrainProgress) -> Trainer:
    """The Trainer of the run, with the options --resume will restore recorded in its checkpoints."""
    classification = sess.num_classes is not None
    run = cfg.run
    return Trainer(
        sess,
        train,
        val_loader=val,
        epochs=run.epochs,
        schedule=schedule,
        checkpoint=cfg.checkpoint,
        checkpoint_every=run.checkpoint_every,
        early_stopping=(
            {"metric": "val_accuracy" if classification else "val_loss", "patience": run.early_stopping}
            if run.early_stopping
            else None
        ),
        history=run.log,
        progress=bar,
        classification=classification,
        run_options=run.to_json(),
        feature_cache=cfg.feature_cache_mb > 0,
        feature_cache_bytes=int(cfg.feature_cache_mb * 2**20),
    )


def _data_line(cfg: TrainConfig, train: DataLoader, val: DataLoader | None, batch: int) -> str:
    """What trains on what: the samples, those held out, the batches."""
    n_train, n_val = train.view.size(), (val.view.size() if val is not None else 0)
    return (
        f"training {cfg.artifact} on {cfg.run.data.data}: {n_train:,} samples"
        + (f", {n_val:,} for validation" if val is not None else "")
        + f"; batch {batch}, {plural(len(train), 'step')} per epoch"
    )


def _lr_line(cfg: TrainConfig, base_lr: float, schedule) -> str:
    """The learning rate the run starts from and its schedule; a resumed run also says where it stood."""
    lr = f"base lr {base_lr:g}, {_schedule_text(schedule.config())}"
    if not cfg.resume:
        return lr
    done = int(cfg.resumed.get("step", 0))
    return (
        f"resuming from {cfg.checkpoint}: {cfg.resumed.get('epoch', '?')} epoch(s), {done} steps done; {lr}"
    )


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


def _train_summary(cfg: TrainConfig, result, seconds: float, batch: int, bar: TrainProgress) -> None:
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
        print(f"  checkpoint  {cfg.checkpoint}: {_position(cfg.checkpoint)}")
        if cfg.run.log:
            print(f"  history     {cfg.run.log} (JSON lines)")
        print(f"continue with: {_resume_command(cfg)}")
        return
    keep = cfg.checkpoint
    if result.best_checkpoint is not None:
        which = "the best" if result.kept == "best" else "the last, which are the best"
        print(f"  kept        {which} weights (epoch {result.best_epoch}): {result.best_checkpoint}")
        print(f"  checkpoint  {cfg.checkpoint} (the last weights, for --resume)")
        keep = result.best_checkpoint
    else:
        print(f"  checkpoint  {cfg.checkpoint}")
    if cfg.run.log:
        print(f"  history     {cfg.run.log} (JSON lines)")
    print(f"next: edgetrain eval {cfg.artifact} --data DATA --checkpoint {keep}")
    print(f"      edgetrain export {cfg.artifact} --checkpoint {keep} -o personalized.onnx")


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
    cfg = EvalConfig.from_args(args)
    sess = open_session(cfg.artifact)
    which = load_weights(sess, cfg.checkpoint, cfg.artifact)
    feed = _feed(cfg.data, cfg.split, sess, cfg.reading)
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
    print(f"evaluated {cfg.artifact} on {cfg.data}: {n:,} samples in {duration(seconds)}")
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
