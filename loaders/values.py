"""Values where they enter (numpy only): every number a user, a file or a header gives is checked for its type, for
finiteness and for a range that float32 and the machine can hold, and JSON from a file or a model's metadata is
read within a depth and a size, before anything is computed or allocated from them. A value that fails is a
ConfigError (a ValueError) that names it, says what it is and what would work; nothing is reinterpreted.

Both sides use these (loaders imports nothing of edgetrain but its errors; edgetrain imports loaders): the input
pipeline, image options, augmentation, LoRA settings, memory budgets, seeds and counts."""

from __future__ import annotations

import json
import math
import numbers
from typing import Any

import numpy as np

from .errors import ConfigError

FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(
    np.finfo(np.float32).tiny
)  # the smallest normal float32: below it a factor flushes towards 0
JSON_MAX_DEPTH = 64  # nesting of arrays and objects in a JSON value from a file or a model's metadata
JSON_MAX_BYTES = 16 << 20  # the text of one such JSON value


def number(
    value: Any,
    what: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    positive: bool = False,
    nonzero: bool = False,
    float32: bool = True,
    fix: str = "",
) -> float:
    """A finite real number (not a bool, not a string) within [lo, hi]; positive: > 0; nonzero: != 0; float32: its
    magnitude is one float32 holds as a normal number (0 aside), so that a factor, its inverse and its products
    neither overflow nor vanish. Refused with a ConfigError naming `what`, the value and the range; fix says what
    would work."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(_says(what, value, "is not a number", fix))
    try:
        v = float(value)
    except OverflowError:  # an int of hundreds of digits has no float
        raise ConfigError(_says(what, value, "is beyond what a float holds", fix)) from None
    if not math.isfinite(v):
        raise ConfigError(_says(what, value, "is not finite", fix))
    if float32 and v != 0 and not FLOAT32_TINY <= abs(v) <= FLOAT32_MAX:
        raise ConfigError(
            _says(
                what,
                value,
                f"is beyond what float32 holds ({FLOAT32_TINY:.3g} to {FLOAT32_MAX:.3g} in size)",
                fix,
            )
        )
    if positive and v <= 0:
        raise ConfigError(_says(what, value, "must be greater than 0", fix))
    if nonzero and v == 0:
        raise ConfigError(_says(what, value, "must not be 0", fix))
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        span = f"from {lo:g}" if hi is None else f"up to {hi:g}" if lo is None else f"from {lo:g} to {hi:g}"
        raise ConfigError(_says(what, value, f"is out of range ({span})", fix))
    return v


def count(value: Any, what: str, *, lo: int = 0, hi: int | None = None, fix: str = "") -> int:
    """A whole number (an int, not a bool or a float) within [lo, hi]; ConfigError naming `what` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(_says(what, value, "is not a whole number", fix))
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        span = f"at least {lo}" if hi is None else f"from {lo} to {hi}"
        raise ConfigError(_says(what, value, f"is out of range ({span})", fix))
    return v


def bounded_json(
    text: str | bytes, what: str, *, max_depth: int = JSON_MAX_DEPTH, max_bytes: int = JSON_MAX_BYTES
):
    """A JSON value read from text no longer than max_bytes and nested no deeper than max_depth (checked on the text,
    before the parser's recursion meets it); ConfigError naming `what` otherwise, or when it is not JSON."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{what} is not UTF-8 text ({e})") from None
    if not isinstance(text, str):
        raise ConfigError(f"{what} is a {type(text).__name__}, not JSON text")
    if len(text) > max_bytes:
        raise ConfigError(f"{what} is {len(text)} characters of JSON, more than the {max_bytes} read")
    depth = _depth(text)
    if depth > max_depth:
        raise ConfigError(f"{what} nests arrays and objects {depth} deep, more than the {max_depth} read")
    try:
        return json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{what} is not valid JSON ({e})") from None


def _depth(text: str) -> int:
    """The deepest nesting of [ and { outside strings."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _says(what: str, value: Any, problem: str, fix: str) -> str:
    return f"{what} {shown(value)} {problem}" + (f"; {fix}" if fix else "")


def shown(value: Any, n: int = 60) -> str:
    """A value as a message quotes it: a string in quotes, else its repr, cut to about n characters; an integer of
    hundreds of digits by its size (repr refuses one of more than 4300)."""
    if isinstance(value, numbers.Integral) and abs(int(value)).bit_length() > 200:
        return f"(a whole number of about {int(abs(int(value)).bit_length() * math.log10(2)) + 1} digits)"
    text = repr(value) if not isinstance(value, str) else f"'{value}'"
    return text if len(text) <= n else text[: n - 3] + "..."
