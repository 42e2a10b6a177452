"""The on-phone personalization app's home (numpy, loaders and edgetrain's device side only): a home folder ->
the samples' store, bursts of training that are kept only when validation says they did not make the model worse, and
the model versions, status and history that the command line and the page show. What a home does whatever it learns;
how samples come in is its kind's: app.Home takes a classifier's labelled samples (the digits) and predicts,
text.TextHome takes a keyboard's sentences and suggests words (text.open_home opens a home as its kind).

A home folder holds:
    model.etrain     the training artifact, built on a workstation (`edgetrain convert`)
    samples.sqlite   the user's samples (loaders.SampleStore)
    versions/        the kept model versions, vNNNNNN.etck (checkpoints of the artifact)
    current.json     which version is the model now: replaced atomically, after its checkpoint is whole on disk
    settings.json    burst length, learning rate, threads, batch, validation share, training policy
    log.jsonl        what happened, one JSON line per event

Crash safety: a burst trains in memory and writes nothing until it is kept; then the new version's checkpoint is
written atomically, and only then current.json is replaced (atomically). A kill at any instant leaves the previous
version current and working; a version file that current.json never named is removed by the next burst.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

import edgetrain as et
from edgetrain.core.atomic import atomic_write
from edgetrain.graph.sections import QuantizedSection
from edgetrain.runtime import checkpoints
from edgetrain.runtime.trainer import evaluate, session_batch
from loaders import DataLoader, SampleStore
from loaders.limits import read_capped
from loaders.values import JSON_MAX_DEPTH, bounded_json, count, number

from .policy import POLICIES, may_train

ARTIFACT, STORE, CURRENT, SETTINGS, LOG = (
    "model.etrain",
    "samples.sqlite",
    "current.json",
    "settings.json",
    "log.jsonl",
)
VERSIONS = "versions"
CHECKPOINT, ADAPTERS = (
    ".etck",
    ".etad",
)  # a version's file: a whole checkpoint, or a LoRA model's adapters alone
KEEP_VERSIONS = 5  # older kept versions are deleted; the current one and four before it stay for rollback
DEFAULTS = {
    "max_steps": 30,  # steps per burst at most
    "max_seconds": 5.0,  # and seconds per burst at most: a burst is short, a phone does other things
    "lr": None,  # None: the artifact's learning rate
    "threads": 1,
    "batch_size": None,  # None: the artifact's batch; smaller ones are padded (needs a loss with ignore_index)
    "val_fraction": 0.2,  # share of the samples held out to judge a burst (by a stable hash of the sample id)
    "policy": "always",  # when a burst may run: always, charging, charging-idle (see policy.py)
    # memory for the frozen part's results per sample (when only part of the model trains), kept across bursts
    "feature_cache_mb": 16.0,
    # the input pipeline the home adopted (`add --scale ...`) when its artifact declares none (InputPipeline JSON)
    "preprocessing": None,
    "mode": "digits",  # what the home learns: "digits" (a classifier's samples) or "text" (android_demo.text)
}


MAX_STEPS = 1_000_000  # steps of one burst (the time bound usually ends it long before)
MAX_SECONDS = 86_400.0  # seconds of one burst: a day
MAX_THREADS = 256  # numpy's BLAS threads
MAX_BATCH = 1 << 20  # samples a step (the artifact's batch is the most; this bounds the check's arithmetic)
MAX_FEATURE_CACHE_MB = 1 << 16  # 64 GiB: more than any phone has
MODES = ("digits", "text")
MAX_VERSION = 999_999  # versions/vNNNNNN: six digits
HOME_JSON_MAX_BYTES = 1 << 20  # settings.json and current.json hold a few hundred bytes


class AppError(et.ConfigError):
    """A home that does not exist or is not set up, or a request the app cannot carry out; says what to do."""


class VersionError(AppError):
    """A model version that cannot be used: its file damaged, missing, or holding values the model cannot take
    (NaN or infinity, another shape or dtype), or scores that are not finite. Says which, and what would work; the
    home is left as it was."""


class HomeKindError(AppError, AttributeError):
    """A method this kind of home does not have, asked for (a text home's add): says what the home takes instead.
    An AttributeError too, so that hasattr() tells the kinds apart."""


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


def _option(name: str) -> str:
    return f"{name} (--{name.replace('_', '-')})"


# the numeric settings: (values.py's check, its bounds, what would work); None is allowed for those in _OPTIONAL
_NUMBERS = {
    "max_steps": (count, {"lo": 1, "hi": MAX_STEPS}, "give a number of steps, e.g. 30"),
    "max_seconds": (number, {"positive": True, "hi": MAX_SECONDS}, "give seconds, e.g. 5"),
    "lr": (number, {"positive": True}, "give a learning rate such as 0.01 (or none: the artifact's)"),
    "threads": (count, {"lo": 1, "hi": MAX_THREADS}, "give a number of threads, e.g. 1"),
    "batch_size": (
        count,
        {"lo": 1, "hi": MAX_BATCH},
        "give samples per step (or none: the artifact's batch)",
    ),
    "val_fraction": (number, {"lo": 0, "hi": 1}, "give the share held out for validation, e.g. 0.2"),
    "feature_cache_mb": (number, {"lo": 0, "hi": MAX_FEATURE_CACHE_MB}, "give MiB, e.g. 16 (0: off)"),
}
_OPTIONAL = ("max_seconds", "lr", "batch_size")  # None: no time bound, the artifact's rate, its batch


def _option(name: str) -> str:
    return (
        f"{name} (--{name.replace('_', '-')})" if name not in ("val_fraction", "feature_cache_mb") else name
    )


def check_setting(name: str, value: Any) -> Any:
    """One setting's value, checked (loaders/values.py): a ConfigError naming it and saying what would work."""
    if name in ("policy", "mode"):
        choices = POLICIES if name == "policy" else MODES
        if not isinstance(value, str) or value not in choices:
            raise et.ConfigError(f"setting {name} {str(value)[:40]!r}: use one of {', '.join(choices)}")
        return value
    if name == "preprocessing":  # an InputPipeline's JSON, which InputPipeline checks when a session takes it
        if value is not None and not isinstance(value, dict):
            raise et.ConfigError(
                f"setting preprocessing is a {type(value).__name__}: it is an object or null"
            )
        return value
    if value is None and name in _OPTIONAL:
        return None
    check, bounds, fix = _NUMBERS[name]
    return check(value, _option(name), fix=fix, **bounds)


def checked_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings with each value checked (a whole number of steps, seconds and a learning rate within float32,
    a known policy, ...): an AppError naming the first that is not, and what would work; unknown names too."""
    unknown = set(settings) - set(DEFAULTS)
    if unknown:
        raise AppError(f"unknown settings {sorted(unknown)}; known: {', '.join(DEFAULTS)}")
    try:
        return {k: check_setting(k, v) for k, v in settings.items()}
    except et.ConfigError as e:
        raise AppError(str(e)) from None


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


def _int8_form(sess: et.TrainingSession) -> str | None:
    q = sess.record.section(QuantizedSection)
    return None if q is None else q.form


class BaseHome:
    """One user's app state on the device, whatever its samples are (app.Home: labelled samples; text.TextHome:
    sentences). Thread-safe: the page serves requests while a burst runs; bursts and writes to the model take one
    lock, and every thread opens the sample store itself (SQLite connections are not shared between threads)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.path.abspath(os.fspath(path))
        if not os.path.isfile(os.path.join(self.path, CURRENT)):
            raise AppError(
                f"{self.path} is not an app home (no {CURRENT}); set one up with "
                f"`python -m android_demo --home {os.fspath(path)} init --artifact MODEL.etrain`"
            )
        self._lock = threading.RLock()  # bursts and settings
        self._feature_rows = None  # the frozen part's cached results, handed from burst to burst
        self._cache_lock = threading.Lock()  # the cached inference session: predictions go on during a burst
        self.settings = {**DEFAULTS, **self._settings_file()}
        self._session_cache: tuple[int, et.TrainingSession] | None = None

    # ---- setting up ----------------------------------------------------------------------------------------------
    @classmethod
    def init(cls, path: str | os.PathLike, artifact: str | os.PathLike, **settings: Any) -> BaseHome:
        """Sets up a home from an artifact built on a workstation; refuses a home that is already set up."""
        path = os.path.abspath(os.fspath(path))
        if os.path.exists(os.path.join(path, CURRENT)):
            raise AppError(f"{path} is already an app home; pick another folder or delete this one")
        settings = checked_settings({k: v for k, v in settings.items() if v is not None})
        sess = et.TrainingSession(artifact)  # refuses anything that is not a whole, valid artifact
        os.makedirs(os.path.join(path, VERSIONS), exist_ok=True)
        with open(artifact, "rb") as f:
            atomic_write(os.path.join(path, ARTIFACT), f.read())
        SampleStore(os.path.join(path, STORE)).close()
        merged = {**DEFAULTS, **settings}
        atomic_write(os.path.join(path, SETTINGS), json.dumps(merged, indent=2, allow_nan=False).encode())
        atomic_write(os.path.join(path, CURRENT), json.dumps({"version": 0, "checkpoint": None}).encode())
        home = cls(path)
        home._log(
            "init",
            artifact=os.path.basename(os.fspath(artifact)),
            batch=session_batch(sess),
            classes=sess.num_classes,
            parameters=int(sum(v.size for v in sess.parameters().values())),
            int8=_int8_form(sess),
        )
        return home

    def update_settings(self, **changes: Any) -> dict[str, Any]:
        """Changes settings (None leaves one as it is; reset_settings puts one back to its default)."""
        changes = checked_settings({k: v for k, v in changes.items() if v is not None})
        self._same_mode(changes)
        with self._lock:
            self.settings.update(changes)
            atomic_write(
                os.path.join(self.path, SETTINGS),
                json.dumps(self.settings, indent=2, allow_nan=False).encode(),
            )
        return dict(self.settings)

    def reset_settings(self, *names: str) -> dict[str, Any]:
        unknown = set(names) - set(DEFAULTS)
        if unknown:
            raise AppError(f"unknown settings {sorted(unknown)}; known: {', '.join(DEFAULTS)}")
        self._same_mode({k: DEFAULTS[k] for k in names})
        with self._lock:
            self.settings.update({k: DEFAULTS[k] for k in names})
            atomic_write(
                os.path.join(self.path, SETTINGS),
                json.dumps(self.settings, indent=2, allow_nan=False).encode(),
            )
        return dict(self.settings)

    def _same_mode(self, changes: dict[str, Any]) -> None:
        if "mode" in changes and changes["mode"] != self.settings["mode"]:
            raise AppError(
                f"setting mode {changes['mode']!r}: this is a {self.settings['mode']} home, and stays one (its "
                f"store and versions are of that kind); set up a new home for another"
            )

    # ---- files ---------------------------------------------------------------------------------------------------
    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _read_json(self, name: str, default: Any) -> Any:
        """A home's JSON file (settings.json, current.json), read within HOME_JSON_MAX_BYTES and a nesting depth."""
        path = self._file(name)
        try:
            with open(path, "rb") as f:
                raw, over = read_capped(f, HOME_JSON_MAX_BYTES)
        except FileNotFoundError:
            return default
        except OSError as e:
            raise AppError(f"{path} cannot be read ({e}); the home is damaged") from e
        if over:
            raise AppError(
                f"{path} holds over {HOME_JSON_MAX_BYTES} bytes, not the app's few; the home is damaged"
            )
        try:
            return bounded_json(raw, path)
        except et.ConfigError as e:
            raise AppError(f"{e}; the home is damaged") from None

    def _settings_file(self) -> dict[str, Any]:
        """settings.json, each value checked: a damaged one is named, with the file, before anything uses it."""
        found = self._read_json(SETTINGS, {})
        if not isinstance(found, dict):
            raise AppError(
                f"{self._file(SETTINGS)} holds a JSON {type(found).__name__}, not the settings' object"
            )
        try:
            return checked_settings(found)
        except AppError as e:
            raise AppError(
                f"{self._file(SETTINGS)}: {e}; the home's settings are damaged: fix that value in the file (or "
                "set it again with init's options on a new home)"
            ) from None

    def _log(self, event: str, **fields: Any) -> None:
        line = json.dumps({"time": round(time.time(), 3), "event": event, **fields}, allow_nan=False)
        try:
            with open(self._file(LOG), "a", encoding="utf-8") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:  # a full or read-only storage: say which file
            raise et.StorageError.of(e, self._file(LOG), "cannot write the app's log") from e

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The log's events, oldest first (a line cut short by a kill, or damaged, is skipped)."""
        out = []
        try:
            with open(self._file(LOG), encoding="utf-8", errors="replace") as f:
                for line in f:
                    e = _event(line)
                    if e is not None and (kind is None or e.get("event") == kind):
                        out.append(e)
        except FileNotFoundError:
            pass
        return out

    def store(self) -> SampleStore:
        """A connection to the sample store for this thread (close it, or use it in a with block)."""
        return SampleStore(self._file(STORE), create=False)

    # ---- the model -----------------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._current()[0]

    def _current(self) -> tuple[int, str | None]:
        """(the current version, its file in the home: None for version 0, the artifact's own parameters), from
        current.json, checked: a version number, and the file the app writes for it (never a path elsewhere)."""
        cur = self._read_json(CURRENT, {"version": 0, "checkpoint": None})
        v = cur.get("version") if isinstance(cur, dict) else None
        name = cur.get("checkpoint") if isinstance(cur, dict) else None
        ok = type(v) is int and 0 <= v <= MAX_VERSION
        files = (
            [os.path.join(VERSIONS, f"v{v:06d}{e}") for e in (CHECKPOINT, ADAPTERS)] if ok and v else [None]
        )
        if not ok or name not in files:
            raise AppError(
                f"{self._file(CURRENT)} is damaged: {json.dumps(cur)[:120]} names no version the app kept; "
                f"{self._kept_sentence()}"
            )
        return v, name

    def kept_versions(self) -> list[int]:
        """The versions whose files are in versions/, newest first (the current one among them, once kept)."""
        found = set()
        for f in os.listdir(self._file(VERSIONS)) if os.path.isdir(self._file(VERSIONS)) else ():
            stem = f[1:7] if f.startswith("v") and f.endswith((CHECKPOINT, ADAPTERS)) and len(f) == 12 else ""
            if stem.isdigit():
                found.add(int(stem))
        return sorted(found, reverse=True)

    def _kept_sentence(self, but: int | None = None) -> str:
        """What would work when the current version cannot be used: an earlier kept version (or 0, the artifact's
        own parameters, always there), made current."""
        kept = [v for v in self.kept_versions() if v != but] + [0]
        return (
            f"restore the file, or make a kept version current (kept: {', '.join(map(str, kept))}; 0 is the "
            f"artifact's own): home.use_version({kept[0]}) in Python"
        )

    def session(self) -> et.TrainingSession:
        """A new session of the artifact holding the current version's parameters and optimizer state."""
        return self._open_version(*self._current())

    def _open_version(self, version: int, name: str | None) -> et.TrainingSession:
        """A session of the artifact holding a version's parameters, from its file checked whole first (values of
        the artifact's shapes and dtypes, every one finite): a VersionError naming the file and what would work,
        and nothing changed, for one that is not."""
        sess = et.TrainingSession(self._file(ARTIFACT))
        if name is not None:
            path = self._file(name)
            try:
                if name.endswith(ADAPTERS):  # a LoRA home keeps the adapters alone
                    _, tensors = checkpoints.read_adapters(path)
                    own = sess.parameters()
                    checkpoints.check_values(path, tensors, {k: own[k] for k in tensors if k in own})
                    sess.load_adapters(path)
                else:
                    sess.load_checkpoint(path)
            except et.EdgeTrainError as e:
                raise VersionError(
                    f"version {version}'s file {name} cannot be used ({e}); the home was left as it was: "
                    f"{self._kept_sentence(but=version)}"
                ) from None
        adopted = self.settings.get("preprocessing")
        if adopted and not sess.preprocessing.declared:
            sess.preprocessing = adopted
        return sess

    def use_version(self, version: int) -> int:
        """Makes a kept version (or 0, the artifact's own parameters) current, once its file has loaded whole; a
        version that cannot be used is refused (VersionError) and the current one stays. Returns the version."""
        version = count(version, "version", lo=0, hi=MAX_VERSION, fix="give a kept version (kept_versions())")
        with self._lock:
            name = None
            if version:
                names = [os.path.join(VERSIONS, f"v{version:06d}{e}") for e in (CHECKPOINT, ADAPTERS)]
                name = next((n for n in names if os.path.isfile(self._file(n))), None)
                if name is None:
                    raise VersionError(f"there is no version {version}; {self._kept_sentence()}")
            sess = self._open_version(version, name)
            atomic_write(self._file(CURRENT), json.dumps({"version": version, "checkpoint": name}).encode())
            with self._cache_lock:
                self._session_cache = (version, sess)
            self._log("use_version", version=version)
        return version

    def _cached(self) -> tuple[int, et.TrainingSession]:
        """(the current version, its session), cached until current.json names another; call under _cache_lock. A
        version that cannot be loaded leaves the cache as it was."""
        v, name = self._current()
        if self._session_cache is None or self._session_cache[0] != v:
            self._session_cache = (v, self._open_version(v, name))
        return self._session_cache

    def input_range(self) -> tuple[float, float]:
        """The raw values samples are given in (the page's pixels): the model's input pipeline's, else [0, 1]."""
        return self._inference().preprocessing.expected_range() or (0.0, 1.0)

    def _inference(self) -> et.TrainingSession:
        """The current version for predictions, cached until the version changes."""
        with self._cache_lock:
            return self._cached()[1]

    def input_shape(self) -> tuple[int, ...]:
        sess = self._inference()
        name = sess.data_inputs[0]
        return tuple(int(d) for d in sess.artifact.program.values[name].shape[1:])

    @property
    def int8_form(self) -> str | None:
        """An int8 model's form as it came ("qdq", ...), which its versions export in; None for a float model."""
        return _int8_form(self._inference())

    @property
    def num_classes(self) -> int | None:
        """The model's classes (None for a regression model)."""
        return self._inference().num_classes

    # ---- samples -------------------------------------------------------------------------------------------------
    def sample_count(self) -> int:
        """How many samples the store holds now."""
        with self.store() as s:
            return len(s.ids())

    # ---- a burst -------------------------------------------------------------------------------------------------
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
    def status(self) -> dict[str, Any]:
        with self.store() as s:
            n = s.size()
            train, val = s.split(self.settings["val_fraction"])
            n_train, n_val = train.size(), val.size()
        bursts = self.events("burst")
        allowed, why = may_train(self.settings["policy"])
        return {
            "samples": n,
            "train_samples": n_train,
            "val_samples": n_val,
            "model_version": self.version,
            "bursts": len(bursts),
            "kept": sum(bool(b.get("kept")) for b in bursts),
            "last_bursts": [
                {
                    k: b.get(k)
                    for k in ("time", "kept", "steps", "val_accuracy_after", "model_version", "reason")
                }
                for b in bursts[-3:]
            ],
            "may_train": allowed,
            "policy": f"{self.settings['policy']}: {why}",
            "settings": dict(self.settings),
            "home": self.path,
        }

    def accuracy_by_version(self) -> list[dict[str, Any]]:
        """Per kept version, the validation accuracy (or loss) that let it in: the page's chart."""
        points = []
        for b in self.events("burst"):
            v = b.get("model_version")
            if b.get("kept") is True and type(v) is int:  # a damaged line's burst is left out
                if not points:
                    points.append(
                        {
                            "version": v - 1,
                            "accuracy": _figure(b.get("val_accuracy_before")),
                            "loss": _figure(b.get("val_loss_before")),
                        }
                    )
                points.append(
                    {
                        "version": v,
                        "accuracy": _figure(b.get("val_accuracy_after")),
                        "loss": _figure(b.get("val_loss_after")),
                    }
                )
        return points


def _event(line: str) -> dict[str, Any] | None:
    """One line of the log as an event; None for a damaged one. Its nesting is checked before it is parsed, on the
    lines that could nest deeper than bounded_json reads (as many brackets at least): the others, all the app
    writes, go to the parser at once."""
    try:
        many = line.count("[") + line.count("{") > JSON_MAX_DEPTH
        e = bounded_json(line, "a line of the app's log") if many else json.loads(line)
    except ValueError:  # bounded_json's ConfigError too
        return None
    return e if isinstance(e, dict) else None


def _figure(v: Any) -> float | None:
    """A logged accuracy or loss for the page: a finite number, else None."""
    return float(v) if type(v) in (int, float) and math.isfinite(v) else None


def remove_home(path: str) -> None:
    """Deletes a home folder (used by simulate for its temporary home)."""
    shutil.rmtree(path, ignore_errors=True)
