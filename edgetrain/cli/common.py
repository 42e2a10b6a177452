"""What the command line's commands share (standard library only): the usage error, number formatting, default
file names, and opening an artifact with or without its trained weights."""

from __future__ import annotations

import os

from edgetrain.runtime.progress import mb  # noqa: F401  (the command line's number formatting lives with the progress lines)


class UsageError(Exception):
    """Arguments that cannot work together: exit code 2, like argparse's own errors."""


def plural(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def default_checkpoint(artifact: str) -> str:
    root, ext = os.path.splitext(artifact)
    return (root if ext == ".etrain" else artifact) + ".etck"


def open_session(artifact: str):
    import edgetrain as et

    return et.TrainingSession(artifact)


# Options of `train` that a checkpoint records and --resume restores: dest -> default when neither given nor recorded.


def load_weights(sess, checkpoint: str | None, artifact: str) -> str:
    if checkpoint is not None:
        sess.load_checkpoint(checkpoint)
        return f"checkpoint {checkpoint} (step {sess.step})"
    note = "initial parameters of the artifact"
    if os.path.exists(default_checkpoint(artifact)):
        note += f"; pass --checkpoint {default_checkpoint(artifact)} for the trained ones"
    return note
