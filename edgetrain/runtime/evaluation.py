"""Evaluation of a TrainingSession over a DataLoader (inference semantics): the mean loss per sample and the
accuracy over one pass, a short last batch padded to the batch the artifact was built for and the padding's share
taken off. The Trainer validates with it; the command line, the phone app and the federated client call it directly.

Device side: numpy, loaders and edgetrain.runtime only (never onnx).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from loaders import DataLoader

from . import TrainingSession


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
