"""The record a Trainer keeps of its run: the trainer position a checkpoint holds beside the session (its
user_state: epoch, step, loaders, history, the run's settings and options), resume() from it with every field
checked, the refusal to continue a run with other data or settings, and the JSON-lines history file, kept in step
with the checkpoint on resume.

Device side: numpy, loaders and edgetrain.runtime only (never onnx).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from edgetrain.core.declared import short
from edgetrain.core.errors import ArtifactError, ConfigError, EdgeTrainError, MissingFileError, StorageError
from loaders import fingerprint


class RunRecord:
    """The checkpoint and history side of Trainer (its base class): the methods here read and write the
    attributes Trainer.__init__ and Trainer._reset set (session, loaders, checkpoint and history paths, the
    counters, run_options, and the count of files being written)."""

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
        """Loads the checkpoint: session parameters and optimizer state, loader positions and counters. Every field
        of the run's record is checked before anything is kept: a refused checkpoint leaves the session, the
        loaders and the trainer as they were."""
        if self.checkpoint is None:
            raise ConfigError("resume needs a checkpoint path")
        if not os.path.exists(self.checkpoint):
            raise MissingFileError(
                f"no checkpoint to resume from at '{self.checkpoint}'", path=self.checkpoint, errno=2
            )
        before = self.session.snapshot()
        positions = (self.train_loader.state(), None if self.val_loader is None else self.val_loader.state())
        try:
            state = self.session.load_checkpoint(self.checkpoint)
            counters = self._read_position(state)
            self._restore_loaders(state)
        except EdgeTrainError:
            self.session.restore(before)
            self.train_loader.restore(positions[0])
            if self.val_loader is not None:
                self.val_loader.restore(positions[1])
            raise
        (self.epoch, self.step, self.best, self.best_epoch, self.bad_epochs, self.history) = counters[:6]
        self._loss_sum, self._loss_n, self.base_lr = counters[6:]
        self._epoch_seconds = 0.0
        self.saved_step = self.step

    def _read_position(self, state: Any) -> tuple:
        """The trainer's position a checkpoint's user_state records, every field checked (ArtifactError naming it)."""
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
        if "loader" not in state:
            raise ArtifactError(f"{where}: its trainer position has no 'loader' entry")
        counters = (
            _field(state, "epoch", int, where),
            _field(state, "step", int, where),
            _field(state, "best", float, where, none=True),
            _field(state, "best_epoch", int, where, none=True, default=None),
            _field(state, "bad_epochs", int, where),
            _field(state, "history", list, where),
            _field(state, "loss_sum", float, where),
            _field(state, "loss_n", int, where),
            _field(state, "base_lr", float, where),
        )
        self._consistent(counters, settings, where)
        loader = state.get("loader")
        seed = loader.get("seed") if isinstance(loader, dict) else None
        if settings and "seed" in settings and seed != settings["seed"]:
            raise ArtifactError(
                f"{where}: its trainer field 'loader' has seed {seed!r:.40}, but the run's settings record seed "
                f"{settings['seed']!r:.40}; the file was damaged or made elsewhere"
            )
        try:
            json.dumps(counters[5], allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ArtifactError(
                f"{where}: its trainer field 'history' holds a value JSON cannot hold ({e})"
            ) from None
        return counters

    def _consistent(self, counters: tuple, settings: Mapping[str, Any] | None, where: str) -> None:
        """The position's fields agree with each other and with the checkpoint they came with: a crafted count
        would otherwise skip or repeat training without a word."""
        epoch, step, _, best_epoch, bad_epochs, history, _, loss_n, base_lr = counters
        faults = [
            (step != self.session.step, "step", f"{step}, but the checkpoint holds step {self.session.step}"),
            (len(history) != epoch, "history", f"{len(history)} epoch records for {epoch} epochs done"),
            (
                best_epoch is not None and not 1 <= best_epoch <= epoch,
                "best_epoch",
                f"{best_epoch} of {epoch}",
            ),
            (bad_epochs > epoch, "bad_epochs", f"{bad_epochs} of {epoch}"),
            (
                loss_n > step * max(1, self.train_loader.batch_size),
                "loss_n",
                f"{loss_n} samples in {step} steps",
            ),
            (base_lr < 0, "base_lr", f"{base_lr}, a negative learning rate"),
        ]
        recorded = (settings or {}).get("base_lr")
        faults.append(
            (recorded is not None and recorded != base_lr, "base_lr", f"{base_lr}, its settings {recorded}")
        )
        for bad, key, what in faults:
            if bad:
                raise ArtifactError(
                    f"{where}: its trainer field '{key}' is {what}; the file was damaged or made elsewhere: resume "
                    "from an earlier checkpoint, or start a new run from its weights (--init-from)"
                )

    def _restore_loaders(self, state: dict) -> None:
        where = f"checkpoint '{self.checkpoint}'"
        if "loader" not in state:
            raise ArtifactError(f"{where}: its trainer position has no 'loader' entry")
        pairs = [("loader", self.train_loader)]
        if self.val_loader is not None and state.get("val_loader") is not None:
            pairs.append(("val_loader", self.val_loader))
        for key, loader in pairs:
            try:
                loader.restore(state[key])
            except ValueError as e:
                raise ConfigError(
                    f"checkpoint '{self.checkpoint}' continues a run over other data (its '{key}': {e}); resume "
                    "with the data, validation split and batch size of the run that wrote it"
                ) from e

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
                sized = all(isinstance(f, dict) and type(f.get("size")) is int for f in (old, new))
                sizes = (
                    f"{old['size']:,} samples then, {new['size']:,} now"
                    if sized
                    else "added or removed"
                    if not old or not new
                    else f"its settings' '{key}' is {short(old)}"
                )
                raise ConfigError(
                    f"checkpoint '{self.checkpoint}' continues a run over other {what} data (its settings' '{key}': "
                    f"{sizes}, and the "
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
