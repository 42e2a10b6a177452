"""The activations a recurrent node's attributes may name (the list the ONNX LSTM, GRU and RNN specs share), each
with its slope for the backward, and the resolution of a node's activations, alphas and betas per direction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgetrain.core.errors import UnsupportedError


def _f32(v: float) -> float:
    return float(np.float32(v))  # ONNX FLOAT attributes are 32-bit


# name (lower case) -> (needs alpha, needs beta, default alpha, default beta). The spec: "default values are the
# same as of corresponding ONNX operators" (LeakyRelu 0.01, ThresholdedRelu 1.0, HardSigmoid 0.2/0.5, Elu 1.0);
# Affine and ScaledTanh have no ONNX operator, so no default: they need their values given.
ACTIVATIONS: dict[str, tuple[bool, bool, float | None, float | None]] = {
    "relu": (False, False, None, None),
    "tanh": (False, False, None, None),
    "sigmoid": (False, False, None, None),
    "affine": (True, True, None, None),
    "leakyrelu": (True, False, 0.01, None),
    "thresholdedrelu": (True, False, 1.0, None),
    "scaledtanh": (True, True, None, None),
    "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, None),
    "softsign": (False, False, None, None),
    "softplus": (False, False, None, None),
}
SPELLING = {
    "relu": "Relu",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
    "affine": "Affine",
    "leakyrelu": "LeakyRelu",
    "thresholdedrelu": "ThresholdedRelu",
    "scaledtanh": "ScaledTanh",
    "hardsigmoid": "HardSigmoid",
    "elu": "Elu",
    "softsign": "Softsign",
    "softplus": "Softplus",
}


@dataclass(frozen=True)
class Act:
    """One activation with its alpha and beta (0.0 where it takes none)."""

    name: str  # lower case, a key of ACTIVATIONS
    alpha: float = 0.0
    beta: float = 0.0

    def __call__(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """act(x), written into out when given (the result either way)."""
        n = self.name
        if n == "sigmoid":
            return _sigmoid(x, out)
        if n == "tanh":
            return np.tanh(x, out=out)
        y = self._other(x)
        if out is None:
            return y
        out[...] = y
        return out

    def _other(self, x: np.ndarray) -> np.ndarray:
        n, a, b = self.name, self.alpha, self.beta
        if n == "relu":
            return np.maximum(x, 0)
        if n == "affine":
            return x * x.dtype.type(a) + x.dtype.type(b)
        if n == "leakyrelu":
            return np.where(x >= 0, x, x * x.dtype.type(a))
        if n == "thresholdedrelu":
            return np.where(x > a, x, x.dtype.type(0))
        if n == "scaledtanh":
            return np.tanh(x * x.dtype.type(b)) * x.dtype.type(a)
        if n == "hardsigmoid":
            return np.clip(x * x.dtype.type(a) + x.dtype.type(b), 0, 1)
        if n == "elu":
            return np.where(x >= 0, x, np.expm1(np.minimum(x, 0)) * x.dtype.type(a))
        if n == "softsign":
            return x / (np.abs(x) + 1)
        assert n == "softplus", n
        return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))

    def slope(self, x: np.ndarray | None, y: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """d act / dx at x, where y = act(x) (sigmoid and tanh read y alone: x may be None), written into out
        when given (the result either way)."""
        n = self.name
        if n == "sigmoid":  # y * (1 - y)
            out = np.subtract(1, y, out=out)
            out *= y
            return out
        if n == "tanh":  # 1 - y * y
            out = np.multiply(y, y, out=out)
            return np.subtract(1, out, out=out)
        s = self._other_slope(x, y)
        if out is None:
            return s
        out[...] = s
        return out

    def _other_slope(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        n, a, b = self.name, self.alpha, self.beta
        t = x.dtype.type
        if n == "relu":
            return (x > 0).astype(x.dtype)
        if n == "affine":
            return np.full_like(x, a)
        if n == "leakyrelu":
            return np.where(x >= 0, t(1), t(a))
        if n == "thresholdedrelu":
            return (x > a).astype(x.dtype)
        if n == "scaledtanh":
            u = np.tanh(x * t(b))
            return (1 - u * u) * t(a * b)
        if n == "hardsigmoid":
            z = x * t(a) + t(b)
            return ((z > 0) & (z < 1)) * t(a)
        if n == "elu":
            return np.where(x >= 0, t(1), y + t(a))
        if n == "softsign":
            d = np.abs(x) + 1
            return 1 / (d * d)
        assert n == "softplus", n
        with np.errstate(over="ignore"):
            return _sigmoid(x)


def _sigmoid(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """1 / (1 + exp(-x)); exp(-x) = inf for x < -88 (float32) gives 0, the right value: the callers' loops run
    under np.errstate(over="ignore") (entered once, not per step)."""
    e = np.negative(x, out=out)
    np.exp(e, out=e)
    e += 1
    return np.reciprocal(e, out=e)


def resolve_activations(
    op: str,
    per_direction: Sequence[str],
    directions: int,
    names: Sequence[str] | None,
    alpha: Sequence[float] | None,
    beta: Sequence[float] | None,
) -> list[list[Act]]:
    """The activations of each direction, from the node's attributes (or the spec's defaults); alpha and beta
    values are consumed in order by the activations that take them."""
    k = len(per_direction)
    if names is None:
        names = list(per_direction) * directions
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    if len(names) == k and directions == 2:
        names = names * 2  # one list for both directions
    if len(names) != k * directions:
        raise UnsupportedError(
            f"attribute activations has {len(names)} names; a {op} with {directions} direction(s) takes "
            f"{k * directions} ({', '.join(per_direction)} per direction)"
        )
    alphas, betas = list(alpha or ()), list(beta or ())
    out: list[Act] = []
    for name in names:
        key = name.lower()
        if key not in ACTIVATIONS:
            raise UnsupportedError(
                f"attribute activations: '{name}' is not an activation the {op} spec lists; use one of "
                f"{', '.join(SPELLING.values())}"
            )
        needs_a, needs_b, da, db = ACTIVATIONS[key]
        a = b = 0.0
        if needs_a:
            if alphas:
                a = alphas.pop(0)
            elif da is None:
                raise UnsupportedError(
                    f"attribute activation_alpha: activation {SPELLING[key]} needs an alpha value and none is left "
                    f"(it has no ONNX operator whose default could stand in); give one per {SPELLING[key]}"
                )
            else:
                a = da
        if needs_b:
            if betas:
                b = betas.pop(0)
            elif db is None:
                raise UnsupportedError(
                    f"attribute activation_beta: activation {SPELLING[key]} needs a beta value and none is left; "
                    f"give one per {SPELLING[key]}"
                )
            else:
                b = db
        out.append(Act(key, _f32(a), _f32(b)))
    return [out[d * k : (d + 1) * k] for d in range(directions)]
