"""Trainer: epochs of a TrainingSession over a DataLoader, with learning-rate schedules, validation, JSON-lines
history, crash-safe checkpoints with exact resume, a non-finite-loss guard, early stopping, and a stop on request
(request_stop: an app leaving, a signal the command line caught) that saves the step it stopped at.

Device side: numpy, loaders and edgetrain.runtime only (never onnx).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgetrain.core.errors import ArtifactError, ConfigError, MissingFileError, NonFiniteError, StorageError
from loaders import DataLoader, fingerprint

from . import TrainingSession
from .schedules import ConstantLR, CosineLR, ILRSchedule, StepLR, WarmupLR, schedule_from_config

__all__ = [
    "ConstantLR",
    "CosineLR",
    "ILRSchedule",
    "StepLR",
    "TrainResult",
    "Trainer",
    "WarmupLR",
    "evaluate",
    "schedule_from_config",
    "session_batch",
]


def _sample_loss_sum(session: TrainingSession, loss: float, n: int) -> float:
    """The sum of per-sample losses behind a batch loss of n samples."""
    return loss * n if session.record.loss.reduction == "mean" else loss


def session_batch(session: TrainingSession) -> int | None:
    """The batch size the artifact's training program was built for (None when it is symbolic)."""
    return session.batch_size


def evaluate(
    session: TrainingSession,
    loader: DataLoader,
    *,
    classification: bool = True,
    on_batch: Callable[[np.ndarray, np.ndarray], None] | None = None,
) -> tuple[float, float | None]:
    """(mean loss per sample, accuracy or None) of the session's current parameters over one pass of `loader`,
    with inference semantics. on_batch(outputs, targets) sees each batch's model outputs (e.g. to tally
    predictions per class).

    A short last batch is padded with copies of its first sample; the padding's share of the loss is taken
    off using the loss of a batch made of that sample alone (exact for mean and sum reductions)."""
    total, correct, n = 0.0, 0, 0
    batch = session_batch(session)
    for x, y in loader:
        k = len(x)
        b = batch or k
        if k < b:
            pad = b - k
            xp = np.concatenate([x, np.repeat(x[:1], pad, axis=0)])
            yp = np.concatenate([y, np.repeat(y[:1], pad, axis=0)])
            loss, out = session.evaluate(xp, yp)
            first, _ = session.evaluate(np.repeat(x[:1], b, axis=0), np.repeat(y[:1], b, axis=0))
            s = _sample_loss_sum(session, loss, b) - pad * _sample_loss_sum(session, first, b) / b
            out = out[:k]
        else:
            loss, out = session.evaluate(x, y)
            s = _sample_loss_sum(session, loss, k)
        total += s
        n += k
        if on_batch is not None:
            on_batch(out, y)
        if classification:
            # [k, C, 1, 1] scores give [k, 1, 1] predictions: compared one per sample, as labels [k] or [k, 1, 1]
            predicted = np.argmax(out, axis=1).reshape(k, -1)[:, 0]
            correct += int(np.sum(predicted == np.asarray(y).reshape(k, -1)[:, 0]))
    if n == 0:
        return float("nan"), None
    return total / n, (correct / n if classification else None)


# ---- the trainer ----------------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    epochs: int  # epochs completed (including any done before a resume)
    steps: int  # optimizer steps completed (a step with a non-finite loss is not counted)
    metric: str  # the metric `best` refers to: the early-stopping metric, else val_loss, else train_loss
    best: float | None
    stopped_early: bool
    stop_reason: str
    history: list[dict[str, Any]] = field(default_factory=list)
    kept: str = "last"  # the weights the session holds at the end: "last", or "best" (early stopping)
    best_epoch: int | None = None  # the epoch whose weights are best by `metric`
    best_checkpoint: str | None = None  # the file holding them, when the trainer writes checkpoints
    interrupted: bool = False  # stopped by request_stop(); fit(resume=True) continues the run
    train_seconds: float = 0.0  # this fit() call's time in training steps
    val_seconds: float = 0.0  # ... and in validation


_METRICS = {"val_loss": "min", "val_accuracy": "max"}


class Trainer:
    """Runs `epochs` epochs of `session` over `train_loader`.

    Each step takes the learning rate from `schedule` (steps counted from 0 over the whole run; the base rate
    is the session's lr when the trainer is made), then `session.train_step`. After each epoch the validation
    set is evaluated (inference semantics) and a history record is appended (and written as a JSON line to
    `history`). With `checkpoint`, the session and the trainer's position are saved atomically every
    `checkpoint_every` steps and at the end, so that `fit(resume=True)` continues exactly where it stood: the
    same batches, the same numbers, bit for bit.

    `request_stop()` (from another thread, or a signal handler of the application's) makes fit() stop at the next
    step boundary and save that step: the Trainer itself never touches the process's signals.

    The loaders' batches go to the session as they are: integer or bool batches for a float input follow the
    session's rule (TrainingSession's docstring): the model's input pipeline scales integers it takes, and
    anything else is refused with a FeedError at the first step unless the session's `allow_cast` is set.
    """

    def __init__(
        self,
        session: TrainingSession,
        train_loader: DataLoader,
        *,
        val_loader: DataLoader | None = None,
        epochs: int = 1,
        schedule: ILRSchedule | None = None,
        checkpoint: str | os.PathLike | None = None,
        checkpoint_every: int | None = None,
        early_stopping: Mapping[str, Any] | None = None,
        history: str | os.PathLike | None = None,
        progress: Callable[[dict[str, Any]], None] | None = None,
        classification: bool = True,
        keep_best: bool | None = None,
        run_options: Mapping[str, Any] | None = None,
        feature_cache: bool = True,
        feature_cache_bytes: int | None = None,
    ):
        if int(epochs) != epochs or epochs < 1:
            raise ConfigError(f"epochs must be a positive integer, got {epochs!r}")
        if checkpoint_every is not None:
            if int(checkpoint_every) != checkpoint_every or checkpoint_every < 1:
                raise ConfigError(f"checkpoint_every must be a positive integer, got {checkpoint_every!r}")
            if checkpoint is None:
                raise ConfigError("checkpoint_every needs a checkpoint path")
        self.session, self.train_loader, self.val_loader = session, train_loader, val_loader
        self.epochs = int(epochs)
        self.schedule = schedule if schedule is not None else ConstantLR()
        self.checkpoint = None if checkpoint is None else os.fspath(checkpoint)
        self.checkpoint_every = None if checkpoint_every is None else int(checkpoint_every)
        self.history_path = None if history is None else os.fspath(history)
        self.progress = progress
        self.classification = bool(classification)
        self.early_stopping = self._check_early_stopping(early_stopping)
        self._batch = session_batch(session)
        self._check_loader(train_loader, "train_loader", train=True)
        if val_loader is not None:
            self._check_loader(val_loader, "val_loader", train=False)
        if self.early_stopping is not None:
            self.metric = self.early_stopping["metric"]
        else:
            self.metric = "val_loss" if val_loader is not None else "train_loss"
        self.base_lr = float(session.lr)
        # what the caller wants recorded with the run (the command line's options, which --resume restores)
        self.run_options = json.loads(json.dumps(dict(run_options or {})))
        # Early stopping keeps the best weights (keep_best=False keeps the last); they live in a checkpoint beside
        # the last one (run.etck -> run.best.etck), or in memory when there is no checkpoint path.
        self.keep_best = self.early_stopping is not None if keep_best is None else bool(keep_best)
        if self.keep_best and self.val_loader is None:
            raise ConfigError(
                "keep_best needs a val_loader: the best weights are the best on validation data"
            )
        self.best_checkpoint = None
        if self.keep_best and self.checkpoint is not None:
            root, ext = os.path.splitext(self.checkpoint)
            self.best_checkpoint = f"{root}.best{ext or '.etck'}"
        self.feature_cache = self._setup_feature_cache(feature_cache, feature_cache_bytes)
        self._stop_reason: str | None = None  # set by request_stop() (any thread), read between steps
        self._writing = 0  # files being written now (checkpoints, history lines): see `writing`
        self.saved_step: int | None = None  # the step the checkpoint holds, as last written or read here
        self._reset()

    # ---- checks ------------------------------------------------------------------------------------------------
    def _check_early_stopping(self, cfg: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if cfg is None:
            return None
        unknown = set(cfg) - {"metric", "patience", "min_delta"}
        if unknown:
            raise ConfigError(
                f"early_stopping has unknown keys {sorted(unknown)}; use metric, patience, min_delta"
            )
        metric = cfg.get("metric", "val_loss")
        if metric not in _METRICS:
            raise ConfigError(f"early_stopping metric must be one of {list(_METRICS)}, got {metric!r}")
        if self.val_loader is None:
            raise ConfigError(f"early stopping on {metric} needs a val_loader")
        if metric == "val_accuracy" and not self.classification:
            raise ConfigError("early stopping on val_accuracy needs classification=True")
        patience = cfg.get("patience", 3)
        if int(patience) != patience or patience < 1:
            raise ConfigError(f"early_stopping patience must be a positive integer, got {patience!r}")
        min_delta = float(cfg.get("min_delta", 0.0))
        if not math.isfinite(min_delta) or min_delta < 0:
            raise ConfigError(f"early_stopping min_delta must be a finite number >= 0, got {min_delta}")
        return {"metric": metric, "patience": int(patience), "min_delta": min_delta}

    def _check_loader(self, loader: DataLoader, name: str, *, train: bool) -> None:
        b = self._batch
        if b is None:
            return
        if loader.batch_size != b:
            raise ConfigError(
                f"{name} gives batches of {loader.batch_size}, but the artifact was built for batch {b}: "
                f"make the loader with batch_size={b}"
            )
        n = loader.view.size()
        if train and not loader.drop_last and n % b:
            raise ConfigError(
                f"{name} has {n} samples, not a multiple of the artifact's batch {b}, so its last "
                f"batch would be short: make the loader with drop_last=True"
            )

    def _setup_feature_cache(self, wanted: bool, max_bytes: int | None) -> dict[str, Any]:
        """Turns the session's frozen-prefix feature cache on when it is valid for this run (see
        TrainingSession.enable_feature_cache); returns what fit() tells the user about it."""
        session, loader = self.session, self.train_loader
        if not wanted:
            session.disable_feature_cache("turned off")
        elif loader.transform is not None:
            session.disable_feature_cache(
                "the train loader has a per-sample transform (augmentation): a sample's data differs each time "
                "it is seen, so the frozen part's results cannot be reused"
            )
        elif getattr(loader, "augment", None) is not None:
            session.disable_feature_cache(
                "the train loader augments its batches (augment=): a sample's data differs each epoch, so the "
                "frozen part's results cannot be reused"
            )
        elif not session.feature_cache_info()["enabled"]:  # a session that has one (e.g. shared) keeps it
            session.enable_feature_cache(max_bytes)
        return session.feature_cache_info()

    # ---- state -------------------------------------------------------------------------------------------------
    def _reset(self) -> None:
        self.epoch = 0  # epochs completed
        self.step = 0  # optimizer steps completed
        self.best: float | None = None
        self.best_epoch: int | None = None
        self._best_snapshot: dict[str, Any] | None = None
        self._kept = "last"
        self.bad_epochs = 0
        self.history: list[dict[str, Any]] = []
        self._loss_sum, self._loss_n = 0.0, 0  # running train loss of the current epoch
        self._epoch_seconds = 0.0  # training time of the current epoch (validation and checkpoints apart)
        self._run_seconds = {"train": 0.0, "val": 0.0}  # of the current fit() call
        self._cache_hits = self.session.feature_cache_info().get("hits", 0)

    def _user_state(self) -> dict[str, Any]:
        return {
            "trainer": 1,
            "loader": self.train_loader.state(),
            "val_loader": None if self.val_loader is None else self.val_loader.state(),
            "epoch": self.epoch,
            "step": self.step,
            "best": self.best,
            "best_epoch": self.best_epoch,
            "bad_epochs": self.bad_epochs,
            "history": self.history,
            "loss_sum": self._loss_sum,
            "loss_n": self._loss_n,
            "base_lr": self.base_lr,
            "metric": self.metric,
            "settings": self.settings(),
            "run_options": self.run_options,
        }

    def settings(self) -> dict[str, Any]:
        """What makes this run this run (JSON values): schedule, epochs, base lr, batching, shuffling, early
        stopping, and fingerprints of the data. Checkpoints record it; resume() refuses a trainer that differs."""

        t = self.train_loader
        return {
            "schedule": self.schedule.config(),
            "epochs": self.epochs,
            "base_lr": self.base_lr,
            "batch_size": t.batch_size,
            "shuffle": t.shuffle,
            "drop_last": t.drop_last,
            "seed": t.seed,
            "early_stopping": self.early_stopping,
            "data": fingerprint(t.view),
            "val_data": None if self.val_loader is None else fingerprint(self.val_loader.view),
        }

    def save_checkpoint(self) -> None:
        """Writes the session and the trainer's position to the checkpoint path (atomically)."""
        if self.checkpoint is None:
            raise ConfigError("this trainer has no checkpoint path")
        with self._files():
            self.session.save_checkpoint(self.checkpoint, user_state=self._user_state())
        self.saved_step = self.step

    def request_stop(self, reason: str = "stop requested") -> None:
        """Asks fit() to stop at the next step boundary, e.g. when the user leaves the app or presses Ctrl-C.

        fit() finishes the step it is in (or the epoch's validation), writes a checkpoint of that step when the
        trainer has a checkpoint path, and returns a TrainResult with interrupted=True whose stop_reason starts
        with `reason`; fit(resume=True), or fit() on this same trainer, continues the run exactly. Safe to call
        from another thread or a signal handler: it only sets a flag. A request made before fit() starts stops
        it at once."""
        self._stop_reason = str(reason)

    @property
    def writing(self) -> bool:
        """Whether a checkpoint or history line is being written at this instant (a signal handler that would
        end the process should let it finish: the files stay whole either way, but the step is kept)."""
        return self._writing > 0

    @contextmanager
    def _files(self) -> Iterator[None]:
        self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1

    def resume(self) -> None:
        """Loads the checkpoint: session parameters and optimizer state, loader positions and counters."""
        if self.checkpoint is None:
            raise ConfigError("resume needs a checkpoint path")
        if not os.path.exists(self.checkpoint):
            raise MissingFileError(
                f"no checkpoint to resume from at '{self.checkpoint}'", path=self.checkpoint, errno=2
            )
        state = self.session.load_checkpoint(self.checkpoint)
        where = f"checkpoint '{self.checkpoint}'"
        if not isinstance(state, dict) or state.get("trainer") != 1:
            raise ConfigError(
                f"checkpoint '{self.checkpoint}' was not written by a Trainer (its user_state has no trainer "
                "position); load it with TrainingSession.load_checkpoint instead"
            )
        settings = state.get("settings")
        if settings is not None and not isinstance(settings, dict):
            raise ArtifactError(
                f"{where}: its trainer settings are {type(settings).__name__}, not a JSON object"
            )
        self._check_settings(settings)
        try:
            self.train_loader.restore(state["loader"])
            if self.val_loader is not None and state.get("val_loader") is not None:
                self.val_loader.restore(state["val_loader"])
        except KeyError:
            raise ArtifactError(f"{where}: its trainer position has no 'loader' entry") from None
        except ValueError as e:
            raise ConfigError(
                f"checkpoint '{self.checkpoint}' continues a run over other data ({e}); resume with the "
                f"data, validation split and batch size of the run that wrote it"
            ) from e
        self.epoch, self.step = _field(state, "epoch", int, where), _field(state, "step", int, where)
        self.best = _field(state, "best", float, where, none=True)
        self.best_epoch = _field(state, "best_epoch", int, where, none=True, default=None)
        self.bad_epochs = _field(state, "bad_epochs", int, where)
        self.history = _field(state, "history", list, where)
        self._loss_sum, self._loss_n = (
            _field(state, "loss_sum", float, where),
            _field(state, "loss_n", int, where),
        )
        self.base_lr = _field(state, "base_lr", float, where)
        self._epoch_seconds = 0.0
        self.saved_step = self.step

    def _check_settings(self, recorded: Mapping[str, Any] | None) -> None:
        """Refuses to continue a run with other data or other settings than those it was started with (epochs
        may grow: a resumed run can be made longer)."""
        if not recorded:
            return  # a checkpoint from before settings were recorded
        mine = self.settings()
        for key in ("data", "val_data"):
            old, new = recorded.get(key), mine[key]
            if old != new:
                what = "training" if key == "data" else "validation"
                sizes = (
                    f"{old['size']:,} samples then, {new['size']:,} now"
                    if old and new
                    else "added or removed"
                )
                raise ConfigError(
                    f"checkpoint '{self.checkpoint}' continues a run over other {what} data ({sizes}, and the "
                    f"samples differ); to train on the data as it is now from the checkpoint's weights, start a "
                    f"new run from them (edgetrain train --init-from CHECKPOINT; in Python, "
                    f"session.load_checkpoint(...) and a new Trainer)"
                )
        for key in (
            "schedule",
            "base_lr",
            "batch_size",
            "shuffle",
            "drop_last",
            "early_stopping",
        ):  # the seed comes back
            if key in recorded and recorded[key] != mine[key]:
                raise ConfigError(
                    f"checkpoint '{self.checkpoint}' continues a run whose {key.replace('_', ' ')} was "
                    f"{recorded[key]!r}, but this trainer's is {mine[key]!r}: resume with the run's own settings "
                    f"(the command line restores them by itself), or start a new run from the checkpoint"
                )

    # ---- evaluation --------------------------------------------------------------------------------------------
    def evaluate(self, loader: DataLoader | None = None) -> tuple[float, float | None]:
        """(mean loss per sample, accuracy or None) over one pass of `loader` (default: the val_loader)."""
        loader = self.val_loader if loader is None else loader
        return evaluate(self.session, loader, classification=self.classification)

    # ---- the loop ----------------------------------------------------------------------------------------------
    def _improved(self, value: float) -> bool:
        if self.best is None:
            return True
        delta = self.early_stopping["min_delta"] if self.early_stopping else 0.0
        if _METRICS.get(self.metric, "min") == "max":
            return value > self.best + delta
        return value < self.best - delta

    def _emit(self, info: dict[str, Any]) -> None:
        if self.progress is not None:
            self.progress(info)

    def _write_history(self, record: dict[str, Any] | None = None, *, mode: str = "a") -> None:
        """Appends one record to the history file (mode "w": rewrites it with self.history, or empties it)."""
        if self.history_path is None:
            return
        lines = [record] if record is not None else self.history if mode == "w" else []
        try:
            with self._files(), open(self.history_path, mode, encoding="utf-8") as f:
                f.writelines(json.dumps(r, allow_nan=True) + "\n" for r in lines)
                f.flush()
        except OSError as e:  # a full disk, a missing or read-only folder: say which file
            raise StorageError.of(e, self.history_path, "cannot write the training history") from e

    def _continue_history(self) -> None:
        """On resume, the history file goes on from the epochs the checkpoint covers: lines past them (the run
        logged an epoch after its last checkpoint, then died) are cut off, so that the file ends up as an
        uninterrupted run's. A file that does not begin with the checkpoint's records (another file, or none) is
        written anew from them."""
        if self.history_path is None:
            return
        try:
            with self._files(), open(self.history_path, "r+b") as f:
                if all(_same_record(f.readline(), r) for r in self.history):
                    f.truncate(f.tell())
                    return
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StorageError.of(e, self.history_path, "cannot continue the training history") from e
        self._write_history(mode="w")

    def _result(self, stopped_early: bool, reason: str, *, interrupted: bool = False) -> TrainResult:
        return TrainResult(
            epochs=self.epoch,
            steps=self.step,
            metric=self.metric,
            best=self.best,
            stopped_early=stopped_early,
            stop_reason=reason,
            history=list(self.history),
            kept=self._kept,
            best_epoch=self.best_epoch,
            best_checkpoint=self.best_checkpoint if self.keep_best and self.best_epoch is not None else None,
            interrupted=interrupted,
            train_seconds=self._run_seconds["train"],
            val_seconds=self._run_seconds["val"],
        )

    def fit(self, resume: bool = False) -> TrainResult:
        """Trains until `epochs` epochs are done, early stopping triggers, a loss is not finite or request_stop()
        is called."""
        try:
            return self._fit(resume)
        finally:
            self._stop_reason = None  # a request is for this fit(): the one it stopped, or that ended anyway

    def _fit(self, resume: bool) -> TrainResult:
        self._run_seconds = {"train": 0.0, "val": 0.0}
        if resume:
            self.resume()
            self._continue_history()  # records written after the checkpoint are redone: drop them
        elif self.step == 0 and self.epoch == 0:
            self._write_history(mode="w")  # a fresh run starts a fresh history
        self._emit({"event": "feature_cache", **self.session.feature_cache_info()})
        while self.epoch < self.epochs:
            result = self._stopped() if self._stop_reason is not None else self._train_epoch()
            if result is not None:
                return result
        if self.checkpoint is not None:
            self.save_checkpoint()
        return self._result(False, f"completed {self.epochs} epochs" + self._restore_best())

    def _train_epoch(self) -> TrainResult | None:
        """Trains the rest of the current epoch and ends it; the TrainResult when the run stops in it, else None."""
        session, loader = self.session, self.train_loader
        epoch_of_loader = loader.epoch
        t0 = time.perf_counter()
        defer_checkpoint = False
        for x, y in loader:
            lr = self.schedule.lr_at(self.step, self.base_lr)
            session.lr = lr
            try:
                loss = session.train_step(x, y)
            except NonFiniteError as e:  # the session committed nothing of the step
                return self._non_finite(e, lr)
            self.step += 1
            self._loss_sum += loss * len(x)
            self._loss_n += len(x)
            last = loader.epoch != epoch_of_loader  # the epoch's last batch: its bookkeeping comes first
            if self.checkpoint_every is not None and self.step % self.checkpoint_every == 0:
                if last:
                    defer_checkpoint = True
                else:
                    t0 = self._lap(t0)
                    self.save_checkpoint()
                    t0 = time.perf_counter()
            self._emit(
                {
                    "event": "step",
                    "epoch": self.epoch + 1,
                    "epochs": self.epochs,
                    "batch": loader.state()["position"] // loader.batch_size if not last else len(loader),
                    "batches": len(loader),
                    "step": self.step,
                    "loss": loss,
                    "lr": lr,
                }
            )
            if self._stop_reason is not None and not last:  # (at an epoch's end: after its bookkeeping)
                self._lap(t0)
                return self._stopped()
        self._lap(t0)
        return self._finish_epoch(defer_checkpoint)

    def _lap(self, t0: float) -> float:
        """Adds the training time since t0 to the epoch's and the run's; returns now."""
        now = time.perf_counter()
        self._epoch_seconds += now - t0
        self._run_seconds["train"] += now - t0
        return now

    def _non_finite(self, e: NonFiniteError, lr: float) -> TrainResult:
        what = (
            f"loss {e.loss}"
            if not math.isfinite(e.loss)
            else f"update of '{e.values[0]}' (or one so large the next step would overflow)"
        )
        reason = (
            f"non-finite {what} at step {self.step + 1} (epoch {self.epoch + 1}, lr {lr:g}); nothing "
            f"of that step was committed: parameters and optimizer state are those of step "
            f"{self.step}, and no checkpoint was written after it"
        )
        self._emit({"event": "stop", "reason": reason})
        return self._result(True, reason)

    def _stopped(self) -> TrainResult:
        """Ends fit() where request_stop() asked it to: the checkpoint holds this step, mid-epoch or not."""
        reason = self._stop_reason
        if self.checkpoint is not None and self.saved_step != self.step:  # (not saved this very step already)
            self.save_checkpoint()
        position = self.train_loader.state()["position"]
        if position == 0:
            where = f"after epoch {self.epoch} of {self.epochs}"
        else:
            batches = f"{position // self.train_loader.batch_size} of {len(self.train_loader)} batches"
            where = f"in epoch {self.epoch + 1} of {self.epochs}, {batches} done"
        text = f"{reason} at step {self.step} ({where})"
        if self.checkpoint is not None:
            text += f"; checkpoint {self.checkpoint} holds it"
        self._emit({"event": "stop", "reason": text})
        return self._result(True, text, interrupted=True)

    def _finish_epoch(self, defer_checkpoint: bool) -> TrainResult | None:
        """Validation, the history record, early stopping and the epoch's checkpoint; the TrainResult when the run
        stops here, else None."""
        record = self._end_epoch(lr=self.session.lr)
        if record is None:
            reason = f"non-finite validation loss after epoch {self.epoch + 1}; no checkpoint written"
            self._emit({"event": "stop", "reason": reason})
            return self._result(True, reason)
        stop = None
        if self.early_stopping is not None and self.bad_epochs >= self.early_stopping["patience"]:
            stop = (
                f"early stopping: {self.metric} did not improve by more than "
                f"{self.early_stopping['min_delta']:g} for {self.bad_epochs} epochs (best {self.best:.6g})"
            )
        if defer_checkpoint and self.epoch < self.epochs and stop is None and self._stop_reason is None:
            self.save_checkpoint()  # (a requested stop saves this step by itself)
        self._emit({"event": "epoch", **record})
        if stop is None:
            return None
        if self.checkpoint is not None:
            self.save_checkpoint()
        stop += self._restore_best()
        self._emit({"event": "stop", "reason": stop})
        return self._result(True, stop)

    def _save_best(self) -> None:
        """Keeps the weights of the epoch just ended as the best: in the best checkpoint, or in memory."""
        if self.best_checkpoint is not None:
            with self._files():
                self.session.save_checkpoint(self.best_checkpoint, user_state={"best_of": self._user_state()})
        else:
            self._best_snapshot = self.session.snapshot()

    def _restore_best(self) -> str:
        """Puts the best weights back into the session when they are not the last ones; says which it kept."""
        if not self.keep_best or self.best_epoch is None:
            return ""
        if self.best_epoch == self.epoch:
            return f"; kept the last weights, which are the best ({self.metric} at epoch {self.best_epoch})"
        lr = self.session.lr
        if self.best_checkpoint is not None:
            self.session.load_checkpoint(self.best_checkpoint)
        elif self._best_snapshot is not None:
            self.session.restore(self._best_snapshot)
        else:
            return ""
        self.session.lr = lr
        self._kept = "best"
        where = f" ({self.best_checkpoint})" if self.best_checkpoint else ""
        return (
            f"; kept the best weights, of epoch {self.best_epoch}{where}, not the last ones of epoch {self.epoch}"
            + (f" (those are in {self.checkpoint})" if self.checkpoint else "")
        )

    def _end_epoch(self, *, lr: float) -> dict[str, Any] | None:
        train_loss = self._loss_sum / self._loss_n if self._loss_n else None
        val_loss = val_acc = None
        val_seconds = 0.0
        if self.val_loader is not None:
            t0 = time.perf_counter()
            val_loss, val_acc = self.evaluate()
            val_seconds = time.perf_counter() - t0
            self._run_seconds["val"] += val_seconds
            if not math.isfinite(val_loss):
                return None
        self.epoch += 1
        record = {
            "epoch": self.epoch,
            "step": self.step,
            "train_loss": train_loss,
            "val_loss": val_loss,
            "val_accuracy": val_acc,
            "lr": lr,
            "seconds": round(self._epoch_seconds + val_seconds, 6),  # the epoch's: training and validation
            "train_seconds": round(self._epoch_seconds, 6),
            "val_seconds": round(val_seconds, 6),
        }
        cache = self.session.feature_cache_info()
        if cache["enabled"]:  # samples of the epoch whose frozen part came from the cache
            record["feature_cache_hits"] = cache["hits"] - self._cache_hits
            self._cache_hits = cache["hits"]
        value = record[self.metric]
        if value is not None:
            if self._improved(value):
                self.best, self.bad_epochs, self.best_epoch = float(value), 0, self.epoch
                if self.keep_best:
                    self._save_best()
            else:
                self.bad_epochs += 1
        self.history.append(record)
        self._write_history(record)
        self._loss_sum, self._loss_n, self._epoch_seconds = 0.0, 0, 0.0
        return record


def _same_record(line: bytes, record: dict[str, Any]) -> bool:
    """Whether a line of a history file holds `record` (the checkpoint stores its records with sorted keys)."""
    try:
        return json.loads(line) == record
    except ValueError:  # a line cut short when the run was killed, or not JSON at all
        return False


_MISSING = object()


def _field(
    state: Mapping[str, Any], key: str, kind: type, where: str, *, none: bool = False, default=_MISSING
):
    """state[key] as kind (int, float or list), or an ArtifactError naming the checkpoint and the field: a
    checkpoint is outside input, and its trainer position must be what a Trainer wrote."""
    if key not in state:
        if default is not _MISSING:
            return default
        raise ArtifactError(
            f"{where}: its trainer position has no '{key}' field; it was not written by a Trainer"
        )
    v = state[key]
    if v is None and none:
        return None
    ok = (
        isinstance(v, list)
        if kind is list
        else isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and (kind is float or float(v).is_integer() and v >= 0)
    )
    if not ok:
        want = {int: "an integer >= 0", float: "a finite number", list: "a list"}[kind]
        raise ArtifactError(f"{where}: its trainer field '{key}' is {v!r:.60}, not {want}")
    return kind(v)
