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
from typing import Any

import edgetrain as et
from edgetrain.core.atomic import atomic_write
from edgetrain.graph.sections import QuantizedSection
from edgetrain.runtime import checkpoints
from edgetrain.runtime.trainer import session_batch
from loaders import SampleStore
from loaders.limits import read_capped
from loaders.values import JSON_MAX_DEPTH, bounded_json, count

from .burst import Bursts
from .policy import may_train
from .settings import (
    ADAPTERS,
    ARTIFACT,
    CHECKPOINT,
    CURRENT,
    DEFAULTS,
    HOME_JSON_MAX_BYTES,
    LOG,
    MAX_VERSION,
    SETTINGS,
    STORE,
    VERSIONS,
    AppError,
    VersionError,
    checked_settings,
)


def _int8_form(sess: et.TrainingSession) -> str | None:
    q = sess.record.section(QuantizedSection)
    return None if q is None else q.form


class BaseHome(Bursts):
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
