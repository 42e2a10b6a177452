"""The phone app's settings and errors (numpy-free): what a home's settings.json may hold, each value checked
where it enters (loaders/values.py: `init`'s options, update_settings, a burst's arguments, the file when a home
opens), and the errors the app raises."""

from __future__ import annotations

from typing import Any

import edgetrain as et
from loaders.values import count, number

from .policy import POLICIES

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
MAX_VERSION = 999_999  # versions/vNNNNNN: six digits
HOME_JSON_MAX_BYTES = 1 << 20  # settings.json and current.json hold a few hundred bytes


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


class AppError(et.ConfigError):
    """A home that does not exist or is not set up, or a request the app cannot carry out; says what to do."""


class VersionError(AppError):
    """A model version that cannot be used: its file damaged, missing, or holding values the model cannot take
    (NaN or infinity, another shape or dtype), or scores that are not finite. Says which, and what would work; the
    home is left as it was."""


class HomeKindError(AppError, AttributeError):
    """A method this kind of home does not have, asked for (a text home's add): says what the home takes instead.
    An AttributeError too, so that hasattr() tells the kinds apart."""


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
