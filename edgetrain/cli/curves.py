"""A run's history (the Trainer's epoch records) -> its training curves as a PNG: the loss per epoch, training and
validation, and a classifier's validation accuracy. matplotlib is optional: without it there is no plot, and the
caller says so."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from edgetrain.core.errors import StorageError


def plot_history(path: str, history: list[dict[str, Any]], *, title: str) -> bool:
    """Draws the curves of `history` into the PNG file `path` (written whole or not at all); False when matplotlib
    is not installed."""
    try:
        import matplotlib  # optional: a run plots only when matplotlib is installed

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # optional, as above
        from matplotlib.ticker import MaxNLocator  # optional, as above
    except ImportError:
        return False
    epochs = [r["epoch"] for r in history]

    def curve(key: str, scale: float = 1.0) -> list[float] | None:
        values = [r.get(key) for r in history]
        if all(v is None for v in values):
            return None
        return [float("nan") if v is None else scale * v for v in values]

    accuracy = curve("val_accuracy", 100.0)
    fig, axes = plt.subplots(1, 2 if accuracy else 1, figsize=(10 if accuracy else 5.5, 3.8), squeeze=False)
    loss_ax = axes[0][0]
    for key, label in (("train_loss", "training"), ("val_loss", "validation")):
        values = curve(key)
        if values is not None:
            loss_ax.plot(epochs, values, marker="o", markersize=3, label=label)
    loss_ax.set(xlabel="epoch", ylabel="loss (mean per sample)", title="loss")
    if all(v > 0 for r in history for v in (r.get("train_loss"), r.get("val_loss")) if v is not None):
        loss_ax.set_yscale("log")
    loss_ax.legend()
    if accuracy:
        acc_ax = axes[0][1]
        acc_ax.plot(epochs, accuracy, marker="o", markersize=3, color="tab:orange", label="validation")
        acc_ax.set(xlabel="epoch", ylabel="accuracy (%)", title="accuracy", ylim=(0, 100))
        acc_ax.legend(loc="lower right")
    for ax in axes[0]:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
    fig.suptitle(title)
    fig.tight_layout()
    tmp = path + ".tmp.png"
    try:
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise StorageError.of(e, path, "cannot write the plot") from e
    finally:
        plt.close(fig)
    return True
