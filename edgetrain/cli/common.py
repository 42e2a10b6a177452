"""What the command line's commands share: counts in words, default file names, and opening an artifact with or
without its trained weights. (The usage error is edgetrain.core.errors.UsageError; the number formatting lives
with the progress lines, edgetrain.runtime.progress.)"""

from __future__ import annotations

import os

from edgetrain.runtime import TrainingSession


def plural(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def default_checkpoint(artifact: str) -> str:
    root, ext = os.path.splitext(artifact)
    return (root if ext == ".etrain" else artifact) + ".etck"


def open_session(artifact: str) -> TrainingSession:
    return TrainingSession(artifact)


def load_weights(sess, checkpoint: str | None, artifact: str) -> str:
    if checkpoint is not None:
        sess.load_checkpoint(checkpoint)
        return f"checkpoint {checkpoint} (step {sess.step})"
    note = "initial parameters of the artifact"
    if os.path.exists(default_checkpoint(artifact)):
        note += f"; pass --checkpoint {default_checkpoint(artifact)} for the trained ones"
    return note
