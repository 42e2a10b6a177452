"""A home's bursts of training (numpy, loaders and edgetrain's device side only): a few steps on the user's
samples within a time bound, judged on the held-out share, kept as a new model version only when validation says
the model did not get worse; the new version's checkpoint is written whole and read back before current.json points
at it (crash safety: home.py's docstring)."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

import edgetrain as et
from edgetrain.core.atomic import atomic_write
from edgetrain.runtime.trainer import evaluate, session_batch
from loaders import DataLoader

from .policy import may_train
from .settings import (
    ADAPTERS,
    CHECKPOINT,
    CURRENT,
    KEEP_VERSIONS,
    VERSIONS,
    AppError,
    VersionError,
    checked_settings,
)


@dataclass
class BurstResult:
    """What one burst did; the first keys are the `personalize --json` contract."""

    kept: bool
    steps: int
    val_accuracy_before: float | None
    val_accuracy_after: float | None
    model_version: int
    seconds: float
    val_loss_before: float | None = None
    val_loss_after: float | None = None
    reason: str = ""
    losses: list[float] = field(default_factory=list)
    train_samples: int = 0
    val_samples: int = 0
    feature_cache: str = ""  # whether the frozen part's results came from the cache, in a sentence

    def to_json(self) -> str:
        return json.dumps(asdict(self), allow_nan=False)


def _cache_sentence(info: dict[str, Any]) -> str:
    if not info["enabled"]:
        return f"off: {info['reason']}"
    seen = info["hits"] + info["misses"]
    return (
        f"on: {info['hits']} of {seen} samples' frozen-part results came from the cache "
        f"({info['samples']} samples cached, {info['bytes'] / 2**20:.2f} MiB)"
    )


def json_number(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


class Bursts:
    """The bursts of a home (BaseHome's): its settings, files, versions and session are the home's own."""

    def personalize(
        self,
        *,
        max_steps: int | None = None,
        max_seconds: float | None = None,
        lr: float | None = None,
        batch_size: int | None = None,
        force: bool = False,
        progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> BurstResult:
        """One burst: train the current version on the store's training part for at most max_steps steps and
        max_seconds seconds, judge it on the validation part, and keep it as a new version only if validation did
        not get worse (accuracy; loss for regression) and everything stayed finite; else roll back."""
        asked = {"max_steps": max_steps, "max_seconds": max_seconds, "lr": lr, "batch_size": batch_size}
        asked = checked_settings({k: v for k, v in asked.items() if v is not None})
        s = checked_settings(self.settings)  # a setting changed in memory since it was read is checked too
        max_steps = asked.get("max_steps", s["max_steps"])
        max_seconds = asked.get("max_seconds", s["max_seconds"])
        lr, batch_size = asked.get("lr"), asked.get("batch_size")
        allowed, why = (True, "forced") if force else may_train(s["policy"])
        if not allowed:
            return self._done(BurstResult(False, 0, None, None, self.version, 0.0, reason=why))
        with self._lock:
            return self._burst(max_steps, max_seconds, lr, batch_size, progress)

    def _burst(self, max_steps, max_seconds, lr, batch_size, progress) -> BurstResult:
        t0 = time.perf_counter()
        version, name = self._current()
        sess = self._open_version(version, name)
        if lr is not None or self.settings["lr"] is not None:
            sess.lr = float(lr if lr is not None else self.settings["lr"])
        batch, real = self._batch_sizes(sess, batch_size)
        mb = self.settings["feature_cache_mb"] or 0  # checked with the other settings by personalize
        if mb > 0:  # exact; a session of a fully trained model says why there is nothing to cache
            sess.enable_feature_cache(int(mb * 2**20), rows=self._feature_rows)
        else:
            sess.disable_feature_cache("turned off (feature_cache_mb is 0)")
        padding = sess.record.loss.ignore_index is not None
        need = 1 if padding else batch  # without padding, every step needs a whole batch
        with self.store() as store:
            train, val = store.split(self.settings["val_fraction"])
            n_train, n_val = train.size(), val.size()
            if n_val == 0 or n_train < need:
                reason = (
                    f"not enough samples yet: {n_train} for training (a burst needs {need}) and {n_val} for "
                    f"validation (needs 1); add more"
                )
                return self._done(BurstResult(False, 0, None, None, version, 0.0, reason=reason))
            classification = sess.num_classes is not None
            val_loader = DataLoader(val, batch)
            before = self._evaluate(sess, val_loader, classification)
            loader = DataLoader(
                train, min(real, n_train), shuffle=True, seed=version + 1, drop_last=not padding
            )
            losses, reason = self._train(sess, loader, batch, max_steps, max_seconds, t0, progress)
            self._feature_rows = sess.feature_rows
            after = self._evaluate(sess, val_loader, classification) if not reason else (math.nan, None)
        result = BurstResult(
            kept=False,
            steps=len(losses),
            val_accuracy_before=json_number(before[1]),
            val_accuracy_after=json_number(after[1]),
            model_version=version,
            seconds=0.0,
            val_loss_before=json_number(before[0]),
            val_loss_after=json_number(after[0]),
            losses=losses,
            train_samples=n_train,
            val_samples=n_val,
            feature_cache=_cache_sentence(sess.feature_cache_info()),
        )
        if not reason:
            reason = self._verdict(result, classification)
        if reason is None:
            try:
                result.model_version = self._keep(sess, version + 1, result)
                result.kept, result.reason = True, "validation did not get worse: kept as a new version"
            except VersionError as e:  # written, but not read back whole: never made current
                result.reason = f"the new version was not kept: {e}"
        else:
            result.reason = reason + "; rolled back to the previous version"
        result.seconds = round(time.perf_counter() - t0, 4)
        return self._done(result)

    def _batch_sizes(self, sess: et.TrainingSession, asked: int | None) -> tuple[int, int]:
        """(the artifact's batch, real samples per step): fewer than the artifact's batch are padded with samples
        the loss ignores, which the artifact's loss must allow (CrossEntropyLoss(ignore_index=...))."""
        batch = session_batch(sess) or 1
        real = int(asked or self.settings["batch_size"] or batch)
        if real == batch:
            return batch, real
        ignore = sess.record.loss.ignore_index
        if real > batch or real < 1 or ignore is None:
            raise AppError(
                f"batch size {real}: this artifact trains batches of {batch}"
                + ("" if ignore is not None or real > batch else " and its loss cannot ignore padding")
                + f"; use a batch of {batch}"
                + (" or fewer" if ignore is not None else "")
                + ", or convert the model with --batch-size on the workstation"
            )
        return batch, real

    def _train(self, sess, loader, batch, max_steps, max_seconds, t0, progress) -> tuple[list[float], str]:
        losses: list[float] = []
        ignore = sess.record.loss.ignore_index
        while len(losses) < max_steps:
            if max_seconds is not None and losses and time.perf_counter() - t0 >= max_seconds:
                break
            x, y = loader.next()
            # padded rows carry the label the loss ignores: the step is exact for the real ones
            if len(x) < batch:
                pad = batch - len(x)
                x = np.concatenate([x, np.repeat(x[:1], pad, axis=0)])
                y = np.concatenate([y, np.full((pad, *y.shape[1:]), ignore, y.dtype)])
            try:
                losses.append(sess.train_step(x, y))
            except et.NonFiniteError as e:
                return losses, f"step {len(losses) + 1} was not finite ({str(e).split(';')[0]})"
            if progress is not None:
                progress({"step": len(losses), "of": max_steps, "loss": losses[-1]})
        return losses, ""

    @staticmethod
    def _verdict(r: BurstResult, classification: bool) -> str | None:
        """None when the burst is kept; else why not."""
        if r.val_loss_after is None:
            return "the validation loss after the burst is not finite"
        if classification:
            if r.val_accuracy_after < r.val_accuracy_before:
                return (
                    f"validation accuracy fell from {r.val_accuracy_before:.1%} to {r.val_accuracy_after:.1%}"
                )
            return None
        if r.val_loss_before is not None and r.val_loss_after > r.val_loss_before:
            return f"validation loss rose from {r.val_loss_before:.4g} to {r.val_loss_after:.4g}"
        return None

    def _keep(self, sess: et.TrainingSession, version: int, result: BurstResult) -> int:
        """Writes the new version whole and reads it back as a session would load it, then points current.json at
        it (both atomically); prunes old files. A file that does not read back whole is removed, and the current
        version stays (VersionError)."""
        name = self._save_version(sess, version, result)
        try:
            loaded = self._open_version(version, name)
        except VersionError:
            os.remove(self._file(name))
            raise
        atomic_write(self._file(CURRENT), json.dumps({"version": version, "checkpoint": name}).encode())
        with self._cache_lock:  # the predictions' session: the version just read back
            self._session_cache = (version, loaded)
        self._prune(version)
        return version

    def _save_version(self, sess: et.TrainingSession, version: int, result: BurstResult) -> str:
        """Writes a version's file whole (atomically) -> its name in the home."""
        name = os.path.join(VERSIONS, f"v{version:06d}{CHECKPOINT}")
        sess.save_checkpoint(self._file(name), user_state={"version": version, "burst": asdict(result)})
        return name

    def _evaluate(self, sess: et.TrainingSession, loader: DataLoader, classification: bool):
        """(mean loss, accuracy or None) of the session on the validation part: what a burst is judged by."""
        return evaluate(sess, loader, classification=classification)

    def _prune(self, current: int) -> None:
        """Removes versions older than the last KEEP_VERSIONS, and files a killed burst left behind."""
        folder = self._file(VERSIONS)
        for f in os.listdir(folder):
            stem = f[1:7] if f.startswith("v") and f.endswith((CHECKPOINT, ADAPTERS)) else None
            if stem is None or not stem.isdigit():
                if f.startswith("."):  # an atomic write's temporary file, left by a kill
                    os.remove(os.path.join(folder, f))
                continue
            v = int(stem)
            if v > current or v <= current - KEEP_VERSIONS:
                os.remove(os.path.join(folder, f))

    def _done(self, r: BurstResult) -> BurstResult:
        fields = asdict(r)
        fields["losses"] = [round(v, 6) for v in r.losses]
        self._log("burst", **fields)
        return r

    # ---- reports -------------------------------------------------------------------------------------------------
