"""A request body's bytes -> checked JSON values for the page's API: UTF-8, bounded in nesting and item count before
it is parsed, numbers of sane size; "pixels" nested lists of numbers in the model's input range, "label" a class
number written as an integer. Anything else is an ApiError whose message names what is wrong and what would work."""

from __future__ import annotations

import json
import math
from http import HTTPStatus
from typing import Any

import numpy as np

from edgetrain.core.declared import json_shape
from edgetrain.core.errors import ConfigError
from loaders.values import FLOAT32_MAX, FLOAT32_TINY, number

MAX_DEPTH = 32  # the digits model's pixels nest 3 deep in an object: 4
MAX_DIGITS = 30  # of an integer anywhere in a body; a pixel or a label has a few


class ApiError(Exception):
    """A request the API refuses (400 unless said otherwise); its message is the one line the page shows."""

    def __init__(self, message: str, status: int = HTTPStatus.BAD_REQUEST):
        super().__init__(message)
        self.status = status


class Unfit:
    """A number no request has a use for, kept as what it is: an integer of more than MAX_DIGITS digits (Python's
    int() of thousands of digits is slow, and numpy's float64 overflows), a float beyond float64 or NaN/Infinity
    (which JSON does not have). It is no number to the checks below, which name the field that holds it."""

    def __init__(self, what: str):
        self.what = what

    def __str__(self) -> str:
        return self.what


def _int(text: str) -> int | Unfit:
    digits = len(text.lstrip("-"))
    if digits > MAX_DIGITS:
        return Unfit(f"an integer of {digits} digits ({text[:12]}...)")
    return int(text)


def _float(text: str) -> float | Unfit:
    x = float(text)
    return x if math.isfinite(x) else Unfit(f"{text[:24]}, beyond a float's range")


def _constant(name: str) -> Unfit:
    return Unfit(f"{name}, which is not a JSON number")


def parse(raw: bytes, *, max_items: int) -> dict[str, Any]:
    """The body as a JSON object ({} for an empty body). The nesting and the item count are bounded on the bytes
    before json.loads sees them: a deeply nested body would otherwise exhaust the parser's recursion."""
    if not raw.strip():
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(
            f"the body is not UTF-8 text (byte {raw[e.start]:#04x} at offset {e.start}); send JSON as UTF-8"
        ) from None
    depth, items = json_shape(raw)
    if depth > MAX_DEPTH:
        raise ApiError(f"the body's JSON nests {depth} levels deep; a request nests at most {MAX_DEPTH}")
    if items > max_items:
        raise ApiError(
            f"the body holds {items} JSON values; a request of this model holds at most {max_items}",
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
        )
    try:
        body = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except ValueError as e:
        raise ApiError(f"the body is not JSON ({e})") from None
    if not isinstance(body, dict):
        raise ApiError(f"the body must be a JSON object, not {_kind(body)}")
    return body


def only(body: dict[str, Any], path: str, *names: str) -> None:
    """Refuses a field the route does not take (a misspelt "lable" would otherwise be ignored silently)."""
    extra = [k for k in body if k not in names]
    if extra:
        takes = " and ".join(f'"{n}"' for n in names) or "an empty object"
        raise ApiError(f'no field "{extra[0]}" in {path}; it takes {takes}')


def _kind(v: Any) -> str:
    """A JSON value as a person would name it, e.g. '"7" (a string)', 'true', 'null', 'a list'."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, str):
        return f"{json.dumps(v[:20])}{'...' if len(v) > 20 else ''} (a string)"
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "a list"
    return str(v) if isinstance(v, Unfit) else repr(v)


def _number(v: Any) -> bool:
    return type(v) in (int, float)  # a bool is an int to Python, not a number to the page


def _nest(v: Any, where: str) -> tuple[list[int], list[Any]]:
    """(shape, leaves in order) of nested lists whose lists at each level have the same length."""
    if not isinstance(v, list):
        return [], [v]
    shape: list[int] | None = None
    leaves: list[Any] = []
    for i, item in enumerate(v):
        s, flat = _nest(item, f"{where}[{i}]")
        if shape is None:
            shape = s
        elif s != shape:
            raise ApiError(
                f'"pixels" must be nested lists of numbers, each list as long as its siblings; {where}[{i}] '
                f"has shape {s}, {where}[0] {shape}"
            )
        leaves += flat
    return [len(v)] + (shape or []), leaves


def pixels(body: dict[str, Any], shape: tuple[int, ...], value_range: tuple[float, float]) -> np.ndarray:
    """The request's "pixels" as one float32 sample of `shape` (singleton axes may be left out), every value a
    JSON number (not a bool, string or null) in value_range."""
    lo, hi = value_range
    want = f"{list(shape)} numbers in [{lo:g}, {hi:g}]"
    if "pixels" not in body:
        raise ApiError(f'no "pixels": send the drawing as {want}')
    got, leaves = _nest(body["pixels"], "pixels")
    for i, v in enumerate(leaves):
        if not _number(v):
            at = "".join(f"[{k}]" for k in np.unravel_index(i, got)) if got else ""
            raise ApiError(f'"pixels" must be nested lists of numbers ({want}); pixels{at} is {_kind(v)}')
    if [d for d in got if d != 1] != [d for d in shape if d != 1]:
        raise ApiError(f'"pixels" of shape {got}; the model takes {want}')
    for i, v in enumerate(leaves):
        if not lo <= v <= hi:
            at = "".join(f"[{k}]" for k in np.unravel_index(i, got))
            raise ApiError(f'"pixels" must be {want}; pixels{at} is {v:g}')
    return np.asarray(leaves, np.float32).reshape(shape)


def _refuse_label(v: Any):
    raise ApiError(
        f'"label" must be a number (the value the model should predict, within float32: {FLOAT32_TINY:.3g} to '
        f"{FLOAT32_MAX:.3g} in size, or 0), not {_kind(v)}"
    )


def label(body: dict[str, Any], classes: int | None) -> int | float:
    """The request's "label": a class number written as an integer (3, not 3.0, "3" or true) from 0 to
    classes - 1; for a model without classes (regression), a finite number."""
    v = body.get("label")
    if classes is None:  # a float32 target: a number float32 holds, refused rather than made inf or 0
        try:
            return number(v, '"label"') if _number(v) else _refuse_label(v)
        except ConfigError:
            return _refuse_label(v)
    if type(v) is not int or not 0 <= v < classes:
        got = "missing" if "label" not in body else str(v) if type(v) is int else _kind(v)
        raise ApiError(
            f'"label" must be a class number from 0 to {classes - 1}, written as an integer such as 3; '
            f"it is {got}"
        )
    return v
