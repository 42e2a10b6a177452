"""What the command line's commands share: counts in words, default file names, opening an artifact with or
without its trained weights, and the files a federation writes in its --out folder, kept apart from its inputs.
(The usage error is edgetrain.core.errors.UsageError; the rule on where a command may write is
edgetrain.core.paths; the number formatting lives with the progress lines, edgetrain.runtime.progress.)"""

from __future__ import annotations

import os

from edgetrain.core.paths import outputs_apart, replaceable
from edgetrain.runtime import TrainingSession

# What `edgetrain federate` writes in its --out folder: the server's results (edgetrain.federated.server) and
# progress, the plot (edgetrain.cli.federate), and two folders it fills: the clients' homes and Flower's files.
FEDERATION_FILES = (
    "summary.json",
    "global.etck",
    "global.onnx",
    "global.etad",
    "progress.jsonl",
    "accuracy.png",
)
FEDERATION_FOLDERS = ("clients", "flower")


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


def federation_apart(artifact: str, data: str, val_data: str | None, out: str) -> None:
    """Refuses a federation whose --out folder is a file, or is one of its inputs, or would write over one: an
    input that is one of the results' files, or lies in the folders it fills."""
    outputs_apart(
        inputs=[("the artifact", artifact), ("--data", data), ("--val-data", val_data)],
        outputs=[("--out", out)],
        places=[("--out", os.path.join(out, name)) for name in (*FEDERATION_FILES, *FEDERATION_FOLDERS)],
        command="federate",
    )
    replaceable(out, "folder", option="--out", command="federate")
