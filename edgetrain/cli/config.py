"""The typed configurations of the device-side commands: train's run and eval's reading of data, frozen
dataclasses built from the parsed arguments in one place (`from_args`) and checked there (a UsageError naming the
option), then passed to the commands' functions instead of the argparse Namespace.

A run's options are also what its checkpoints record and --resume restores: `RunConfig.to_json()` is the
checkpoint's `run_options`, in the command line's own words (one key per option, as `edgetrain inspect` shows
them), and `RunConfig.from_json()` reads them back, from checkpoints of any edgetrain that wrote them so,
including the ones written while the options travelled as the Namespace itself (the same keys; older runs lack
some, which then take their defaults)."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgetrain.core.container import inspect_container
from edgetrain.core.errors import ArtifactError, ConfigError, EdgeTrainError, UsageError
from edgetrain.core.paths import same_file
from edgetrain.runtime.feeding import DataOptions, parse_options
from edgetrain.runtime.schedules import ConstantLR, CosineLR, StepLR, WarmupLR
from loaders import parse_normalize, parse_scale
from loaders.values import number

from .common import default_checkpoint
from .names import flag


@dataclass(frozen=True)
class ReadingConfig:
    """How train and eval read the user's data and fit it to the model's input: --layout, --scale and
    --normalize as the user wrote them (a checkpoint records the words, 1/255, not 0.00392...), --cast, and an
    .npz's --x-key and --y-key."""

    layout: str | None = None
    scale: str | None = None
    normalize: str | None = None
    cast: bool = False
    x_key: str | None = None
    y_key: str | None = None

    def data_options(self) -> DataOptions:
        """The runtime's DataOptions (a UsageError names a --scale or --normalize it cannot read)."""
        try:
            return parse_options(self.layout, self.scale, self.normalize, self.x_key, self.y_key)
        except ValueError as e:
            raise UsageError(str(e)) from None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ReadingConfig:
        cfg = cls(args.layout, args.scale, args.normalize, bool(args.cast), args.x_key, args.y_key)
        cfg.data_options()
        return cfg


@dataclass(frozen=True)
class DataConfig:
    """The run's data: --data (None only for a resumed run whose checkpoint predates recording it), validation
    by --val-data or a --val-split of --data, and how both are read."""

    data: str | None
    val_data: str | None = None
    val_split: float | None = None
    reading: ReadingConfig = field(default_factory=ReadingConfig)


@dataclass(frozen=True)
class ScheduleConfig:
    """The learning rate: --lr (None: the artifact's), --lr-schedule's text, --warmup steps."""

    lr: float | None = None
    lr_schedule: str | None = None
    warmup: int = 0

    def make(self, total_steps: int):
        """The schedule over a run of `total_steps` (a cosine decays over all of them)."""
        text = self.lr_schedule
        kind, _, rest = (text or "constant").partition(":")
        values = [v for v in rest.split(":") if v] if rest else []
        try:
            nums = [float(v) for v in values]
        except ValueError:
            raise UsageError(f"--lr-schedule {text}: the values after ':' must be numbers") from None
        try:
            for v in nums:
                number(v, f"--lr-schedule {text}: the value")
        except ConfigError as e:
            raise UsageError(str(e)) from None
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
        return WarmupLR(schedule, self.warmup) if self.warmup else schedule


# The options of `train` that a checkpoint records and --resume restores: key -> default when neither given nor
# recorded. The keys are the options' names (val_split: --val-split), as checkpoints have always recorded them.
RECORDED: dict[str, Any] = {
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
_INTS = ("epochs", "warmup", "seed", "early_stopping", "checkpoint_every")
_FLOATS = ("lr", "val_split")
_BOOLS = ("no_shuffle", "cast")


@dataclass(frozen=True)
class RunConfig:
    """A training run: what its checkpoints record and --resume restores."""

    data: DataConfig
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    epochs: int = 1
    seed: int = 0
    shuffle: bool = True
    augment: str | None = None
    early_stopping: int | None = None  # patience in epochs
    checkpoint_every: int | None = None  # steps
    log: str | None = None  # the history file (JSON lines)
    plot: str | None = None  # the curves' PNG

    def to_json(self) -> dict[str, Any]:
        """The checkpoint's record of the run (`run_options`): one JSON value per option."""
        d, r, s = self.data, self.data.reading, self.schedule
        return {
            "epochs": self.epochs,
            "lr": s.lr,
            "lr_schedule": s.lr_schedule,
            "warmup": s.warmup,
            "seed": self.seed,
            "val_split": d.val_split,
            "val_data": d.val_data,
            "early_stopping": self.early_stopping,
            "no_shuffle": not self.shuffle,
            "layout": r.layout,
            "scale": r.scale,
            "normalize": r.normalize,
            "cast": r.cast,
            "x_key": r.x_key,
            "y_key": r.y_key,
            "augment": self.augment,
            "checkpoint_every": self.checkpoint_every,
            "data": d.data,
            "log": self.log,
            "plot": self.plot,
        }

    @classmethod
    def from_json(cls, recorded: Mapping[str, Any], source: str = "the record") -> RunConfig:
        """A run from its record (`to_json`'s, or a checkpoint's run_options of any version): options it lacks take
        their defaults, keys it does not know are left out; a value of the wrong type is an ArtifactError naming
        `source` and the option, one out of range a UsageError naming the option."""
        options = {**RECORDED, **{k: None for k in CARRIED}}
        options.update({k: v for k, v in _checked(recorded, source).items() if v is not None})
        return cls._from_options(options)

    @classmethod
    def _from_options(cls, o: Mapping[str, Any]) -> RunConfig:
        """From every option's value (RECORDED's and CARRIED's keys, defaults filled), checked."""
        reading = ReadingConfig(
            o["layout"], o["scale"], o["normalize"], bool(o["cast"]), o["x_key"], o["y_key"]
        )
        run = cls(
            data=DataConfig(o["data"], o["val_data"], o["val_split"], reading),
            schedule=ScheduleConfig(o["lr"], o["lr_schedule"], o["warmup"]),
            epochs=o["epochs"],
            seed=o["seed"],
            shuffle=not o["no_shuffle"],
            augment=o["augment"],
            early_stopping=o["early_stopping"],
            checkpoint_every=o["checkpoint_every"],
            log=o["log"],
            plot=o["plot"],
        )
        run._check()
        return run

    def _check(self) -> None:
        d = self.data
        if d.val_data is not None and d.val_split is not None:
            raise UsageError("give --val-data or --val-split, not both")
        if d.val_split is not None and not 0 < d.val_split < 1:
            raise UsageError(f"--val-split must lie between 0 and 1, got {d.val_split}")
        for option, value, fix in (
            ("--val-split", d.val_split, "give e.g. 0.1"),
            ("--lr", self.schedule.lr, "give e.g. 0.01"),
        ):
            if value is not None:
                try:
                    number(value, option, fix=fix)
                except ConfigError as e:
                    raise UsageError(str(e)) from None
        for dest in ("epochs", "checkpoint_every", "early_stopping"):
            value = getattr(self, dest)
            if value is not None and value < 1:
                raise UsageError(f"{flag(dest)} must be a positive integer, got {value}")
        if self.schedule.warmup < 0:
            raise UsageError(f"--warmup must be 0 or more steps, got {self.schedule.warmup}")
        if self.early_stopping and d.val_data is None and not d.val_split:
            raise UsageError("--early-stopping needs validation data: --val-data PATH or --val-split F")
        self.schedule.make(1)  # its text, read now: a misspelt --lr-schedule stops the run before it starts
        d.reading.data_options()


def _shown(value: Any) -> str:
    """A recorded value in a message, cut short when it is long."""
    try:
        text = repr(value)
    except ValueError:  # an int of more digits than Python converts to text
        text = f"an integer of {value.bit_length()} bits"
    return text if len(text) <= 60 else text[:57] + "..."


def _finite(value: float) -> bool:
    """A finite float, or an int a float holds (a recorded 10**400 is no learning rate any run records)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _checked(recorded: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The record's known options, each of its type (an int for a float is taken as the float it was)."""
    if not isinstance(recorded, Mapping):
        raise ArtifactError(
            f"{source}: its recorded options are {type(recorded).__name__}, not a JSON object"
        )
    out = {}
    for key, value in recorded.items():
        if key not in RECORDED and key not in CARRIED:
            continue
        if value is None:
            out[key] = None
            continue
        if key in _BOOLS:
            ok = isinstance(value, bool)
        elif key in _INTS:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif key in _FLOATS:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and _finite(value)
            value = float(value) if ok else value
        else:
            ok = isinstance(value, str)
        if not ok:
            raise ArtifactError(
                f"{source}: its recorded {flag(key)} is {_shown(value)}, which no edgetrain run records there; "
                f"start a new run from its weights with --init-from"
            )
        out[key] = value
    return out


@dataclass(frozen=True)
class TrainConfig:
    """`edgetrain train`: the run, and how this command line runs it (the checkpoint, whether it continues the run
    there or starts from other weights, the machine's threads and the feature cache's memory)."""

    artifact: str
    checkpoint: str
    run: RunConfig
    resume: bool = False
    init_from: str | None = None
    overwrite: bool = False
    threads: int | None = None
    feature_cache_mb: float = 64.0
    # the trainer settings of the run --resume continues (its schedule, data fingerprints, step and epoch); {}
    resumed: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TrainConfig:
        """The command line -> the run: with --resume, the options the checkpoint recorded fill the ones not
        given, and a given one that contradicts the run is a usage error (--epochs excepted: a run can be made
        longer); options that do not go together, or out of range, are refused here, naming the option."""
        checkpoint = args.checkpoint or default_checkpoint(args.artifact)
        _check_start(args, checkpoint)
        given = {dest: getattr(args, dest) for dest in (*RECORDED, *CARRIED)}
        resumed: dict[str, Any] = {}
        if args.resume:
            given, resumed = _resumed_options(args.artifact, given, checkpoint)
        options = {
            dest: default if given[dest] is None else given[dest] for dest, default in RECORDED.items()
        }
        options.update({dest: given[dest] for dest in CARRIED})
        if args.threads is not None and args.threads < 1:
            raise UsageError(f"--threads must be at least 1, not {args.threads}")
        if not args.feature_cache_mb >= 0 or not math.isfinite(args.feature_cache_mb):
            raise UsageError(f"--feature-cache-mb must be 0 (off) or more, not {args.feature_cache_mb:g}")
        return cls(
            artifact=args.artifact,
            checkpoint=checkpoint,
            run=RunConfig._from_options(options),
            resume=bool(args.resume),
            init_from=args.init_from,
            overwrite=bool(args.overwrite),
            threads=args.threads,
            feature_cache_mb=float(args.feature_cache_mb),
            resumed=resumed,
        )


def _check_start(args: argparse.Namespace, checkpoint: str) -> None:
    """A run continued, started anew, or from other weights: refuses what does not go together, and a new run
    over an existing checkpoint."""
    if args.resume and args.init_from:
        raise UsageError("--resume continues a run, --init-from starts a new one from a checkpoint: give one")
    if args.resume and not os.path.exists(checkpoint):
        raise EdgeTrainError(f"--resume: there is no checkpoint at {checkpoint} to continue from")
    if args.data is None and not args.resume:
        raise UsageError(
            "--data is required: the training data (an MNIST directory or idx pair, .npz or .csv); only --resume "
            "finds it in the checkpoint"
        )
    replaces_own_start = args.init_from and same_file(args.init_from, checkpoint)
    if os.path.exists(checkpoint) and not (args.resume or args.overwrite or replaces_own_start):
        raise UsageError(
            f"checkpoint {checkpoint} exists: --resume to continue that run, --init-from {checkpoint} to start a "
            f"new run from its weights, --overwrite to start over, or --checkpoint NEW.etck"
        )


def _resumed_options(
    artifact: str, given: dict[str, Any], checkpoint: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """--resume: (the options given, with what the checkpoint's run recorded filled in; its trainer settings)."""
    state = inspect_container(checkpoint)["header"].get("user_state", {})
    if not isinstance(state, dict) or state.get("trainer") != 1:
        raise EdgeTrainError(
            f"--resume: {checkpoint} was not written by `edgetrain train`; it holds no run to continue"
        )
    recorded = _checked(state.get("run_options") or {}, checkpoint)
    options = dict(given)
    for dest, value in recorded.items():
        if dest not in RECORDED or dest == "epochs":
            continue
        if given[dest] is not None and not _same_option(dest, given[dest], value):
            raise UsageError(_conflict(dest, given[dest], value, checkpoint))
        options[dest] = value
    if options["epochs"] is None:
        options["epochs"] = recorded.get("epochs")
    for dest in CARRIED:
        if options[dest] is None:
            options[dest] = recorded.get(dest)
    data = options["data"]
    if data is None:
        raise UsageError(f"--resume: the run in {checkpoint} recorded no training data: give it with --data")
    if not os.path.exists(data):
        raise ConfigError(
            f"--resume: the run in {checkpoint} trained on {data}, which is not there any more: put it back "
            f"(or give its new place with --data), or train on other data from the run's weights: "
            f"edgetrain train {artifact} --data NEW --init-from {checkpoint}"
        )
    settings = state.get("settings") or {}
    return options, {**settings, "step": state.get("step", 0), "epoch": state.get("epoch", 0)}


def _same_option(dest: str, given: Any, recorded: Any) -> bool:
    """Whether a repeated option says what the run recorded (values, not spellings: 1/255 is 0.00392...)."""
    parse = {"scale": parse_scale, "normalize": parse_normalize}.get(dest)
    if parse is None or given is None or recorded is None:
        return given == recorded
    try:
        return bool(np.allclose(np.ravel(parse(given)), np.ravel(parse(recorded)), rtol=1e-12, atol=0))
    except ValueError:
        return False


def _conflict(dest: str, given: Any, recorded: Any, checkpoint: str) -> str:
    was = (
        "not set"
        if recorded in (None, False)
        else f"{flag(dest)} {recorded}"
        if recorded is not True
        else "set"
    )
    return (
        f"{flag(dest)} {given if given is not True else ''}".rstrip()
        + f" conflicts with the run in {checkpoint} ({was} there): leave it out to continue that run as "
        f"it was, or start a new run from its weights with --init-from {checkpoint}"
    )


@dataclass(frozen=True)
class EvalConfig:
    """`edgetrain eval`: the artifact, the weights (a checkpoint, else the artifact's own), the data and how it is
    read, and an MNIST directory's split."""

    artifact: str
    data: str
    checkpoint: str | None = None
    split: str = "test"
    reading: ReadingConfig = field(default_factory=ReadingConfig)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EvalConfig:
        return cls(args.artifact, args.data, args.checkpoint, args.split, ReadingConfig.from_args(args))
