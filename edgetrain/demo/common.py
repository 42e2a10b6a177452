"""What the three demos share: where their embedded assets are, accuracy, onnxruntime (or the error saying how to
get it), numpy's BLAS threads for the length of a story, timing a session's steps, the JSON summaries, and the
teller a story's scenes print through (its lines, its table layout, its summary.json)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import asdict
from typing import TextIO

import numpy as np

from ..core.atomic import atomic_write
from ..core.errors import StorageError, UnsupportedError
from ..runtime import TrainingSession
from ..runtime.threads import blas_threads

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")  # edgetrain/data


class Summary:
    """A demo's result (a dataclass) as the JSON of summary.json and --json."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def write_json(path: str, result: Summary) -> None:
    """The result's JSON into path (--json), atomically."""
    try:
        atomic_write(path, (result.to_json() + "\n").encode("utf-8"))
    except OSError as e:
        raise StorageError.of(e, path, "cannot write the demo's summary") from e


def _accuracy(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(probs, axis=1) == labels))


# what each demo does with onnxruntime, for the error when it is missing
NEEDS_ONNXRUNTIME = {
    "int8": "`edgetrain demo --quantized` makes the int8 model with onnxruntime's quantizer and measures every "
    "model with onnxruntime",
    "keyboard": "`edgetrain demo --model keyboard` checks its exports and serves LoRA's adapter file with "
    "onnxruntime",
}


def _onnxruntime(demo: str = "int8"):
    """onnxruntime and its quantizer, or an UnsupportedError saying what the demo (a key of NEEDS_ONNXRUNTIME)
    needs it for and how to get it."""
    try:
        import onnxruntime  # build side: the int8 demo quantizes and measures with it, the keyboard's checks
        import onnxruntime.quantization  # noqa: F401  (as above)
    except ImportError as e:
        raise UnsupportedError(
            f"{NEEDS_ONNXRUNTIME[demo]}, which is not installed here: pip install onnxruntime (or pip install -e "
            "'.[demo]')"
        ) from e
    return onnxruntime


@contextlib.contextmanager
def _blas_threads(n: int | None):
    """numpy's BLAS at n threads (None: as it is) inside the block, as before after it (when it can be told)."""
    if n is None:
        yield
        return
    before, _ = blas_threads()
    blas_threads(n)
    try:
        yield
    finally:
        if before is not None:
            blas_threads(before)


def _timed(sess: TrainingSession) -> list[float]:
    """The session's train_step timed from now on: the list its steps' seconds are appended to."""
    seconds: list[float] = []
    step = sess.train_step

    def train_step(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return step(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - t0)

    sess.train_step = train_step
    return seconds


class _Teller:
    """A story's voice: its lines on `stream` (stdout), progress bars on `progress_stream`, the folder it writes to
    (made if missing), its epochs and seed."""

    def __init__(
        self,
        out_dir: str,
        *,
        epochs: int,
        seed: int,
        stream: TextIO | None,
        progress_stream: TextIO | None,
    ):
        self.out = stream if stream is not None else sys.stdout
        self.out_dir, self.epochs, self.seed, self.progress_stream = out_dir, epochs, seed, progress_stream
        os.makedirs(out_dir, exist_ok=True)

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def say_table(self, rows: list[tuple[str, ...]]) -> None:
        """rows, the first two the heading, as every demo lays out its table: the first column to the left, the
        others to the right, three spaces apart, a rule under the heading, a blank line before and after."""
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        self.say("")
        for k, r in enumerate(rows):
            self.say(
                "  " + r[0].ljust(widths[0]) + "".join("   " + c.rjust(w) for c, w in zip(r[1:], widths[1:]))
            )
            if k == 1:
                self.say("  " + "-" * (sum(widths) + 3 * (len(widths) - 1)))
        self.say("")

    def write_summary(self, result: Summary) -> str:
        """out_dir/summary.json, the result's JSON -> its path."""
        path = os.path.join(self.out_dir, "summary.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(result.to_json() + "\n")
        return path
