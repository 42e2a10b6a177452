"""Trainer progress events -> a one-line progress bar (steps, loss, throughput, ETA) on a terminal, or plain
epoch lines in a log; and number formatting shared by the command line and the demo. Standard library only."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def duration(seconds: float) -> str:
    """0.4 s, 12 s, 3:05, 1:02:03."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


class TrainProgress:
    """A Trainer `progress=` callback.

    On a terminal it redraws one line at most `refresh` times a second:
        label  epoch 3/20 [#########-----------]  45/100 steps  loss 0.4123  2,130 samples/s  ETA 2.1 s
    and, with `epoch_lines=True`, prints a line per epoch (train loss, validation loss and accuracy) above it.
    Elsewhere (a log file, CI) it prints only the epoch lines, or nothing per step. `total_steps` is the
    number of steps of the whole run, `done_steps` those done before it started (a resumed run)."""

    def __init__(
        self,
        total_steps: int,
        batch_size: int,
        *,
        label: str = "",
        stream: TextIO | None = None,
        epoch_lines: bool = True,
        done_steps: int = 0,
        width: int = 24,
        refresh: float = 10.0,
    ):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.total, self.batch, self.label = int(total_steps), int(batch_size), label
        self.epoch_lines, self.width, self.interval = epoch_lines, width, 1.0 / refresh
        self.start_step = int(done_steps)
        self.t0 = time.perf_counter()
        self._paused = 0.0  # seconds of validation since t0: not training, so not in the samples/s
        self._last_draw = 0.0
        self._line = ""
        self.last: dict[str, Any] = {}

    # ---- the line -----------------------------------------------------------------------------------------
    def _bar(self, info: dict[str, Any]) -> str:
        step = int(info["step"])
        frac = min(step / self.total, 1.0) if self.total else 1.0
        filled = int(round(frac * self.width))
        elapsed = time.perf_counter() - self.t0
        done_here = step - self.start_step
        training = elapsed - self._paused
        rate = done_here * self.batch / training if training > 0 and done_here > 0 else 0.0
        eta = (self.total - step) * elapsed / done_here if done_here > 0 else None
        parts = [
            f"{self.label}  " if self.label else "",
            f"epoch {info['epoch']}/{info['epochs']} ",
            f"[{'#' * filled}{'-' * (self.width - filled)}] ",
            f"{step:>{len(str(self.total))}}/{self.total} steps  ",
            f"loss {info['loss']:.4f}  ",
            f"{rate:,.0f} samples/s  " if rate else "",
            f"ETA {duration(eta)}" if eta is not None else "",
        ]
        return "".join(parts).rstrip()

    def _draw(self, text: str) -> None:
        pad = max(len(self._line) - len(text), 0)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._line = text

    def _clear(self) -> None:
        if self._line:
            self.stream.write("\r" + " " * len(self._line) + "\r")
            self._line = ""

    def _print(self, text: str) -> None:
        if self.tty:
            self._clear()
        self.stream.write(text + "\n")
        self.stream.flush()

    # ---- the callback ---------------------------------------------------------------------------------------
    def __call__(self, info: dict[str, Any]) -> None:
        event = info.get("event")
        if event == "step":
            self.last = info
            now = time.perf_counter()
            if self.tty and (now - self._last_draw >= self.interval or info["step"] >= self.total):
                self._last_draw = now
                self._draw(self._bar(info))
        elif event == "epoch":
            self._paused += info.get("val_seconds") or 0.0
            if self.epoch_lines:
                self._print(epoch_line(info, label=self.label))
            elif self.tty and self.last:
                self._draw(self._bar(self.last))
        elif event == "stop":
            self._print(f"{self.label + ': ' if self.label else ''}stopped: {info['reason']}")
        elif event == "feature_cache":
            self._print(f"{self.label + ': ' if self.label else ''}{feature_cache_line(info)}")

    def close(self) -> None:
        """Ends the bar's line (keeping the final bar on screen when there were no epoch lines)."""
        if self.tty and self._line:
            if self.epoch_lines:
                self._clear()
            else:
                self.stream.write("\n")
            self._line = ""
            self.stream.flush()


def epoch_line(info: dict[str, Any], *, label: str = "") -> str:
    """epoch   3  train loss 0.4123  val loss 0.5012  val accuracy 81.2%  lr 0.0095  train 1.2 s, validation 0.3 s
    (a record without the split times, "seconds" alone: ... lr 0.0095  1.5 s)"""
    parts = [f"{label}  " if label else "", f"epoch {info['epoch']:>3}"]
    if info.get("train_loss") is not None:
        parts.append(f"  train loss {info['train_loss']:.4f}")
    if info.get("val_loss") is not None:
        parts.append(f"  val loss {info['val_loss']:.4f}")
    if info.get("val_accuracy") is not None:
        parts.append(f"  val accuracy {percent(info['val_accuracy'])}")
    parts.append(f"  lr {info['lr']:.3g}  {_epoch_time(info)}")
    if info.get("feature_cache_hits"):
        parts.append(f"  ({info['feature_cache_hits']:,} samples' frozen features from the cache)")
    return "".join(parts)


def _epoch_time(info: dict[str, Any]) -> str:
    """Training and validation time of an epoch record, apart: validation can take far longer than the steps."""
    if info.get("train_seconds") is None:
        return duration(info["seconds"])
    if info.get("val_loss") is None:
        return f"train {duration(info['train_seconds'])}"
    return f"train {duration(info['train_seconds'])}, validation {duration(info['val_seconds'])}"


def mb(n: float) -> str:
    """2.50 MiB, 336.0 KiB."""
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def feature_cache_line(info: dict[str, Any]) -> str:
    """What a TrainingSession.feature_cache_info() means, in a sentence."""
    if not info.get("enabled"):
        return f"feature cache off: {info.get('reason') or 'not enabled'}"
    return (
        f"feature cache on: the frozen part ({info['prefix_nodes']} of {info['total_nodes']} nodes of the step) "
        f"runs once per sample; later epochs reuse its results ({mb(info['row_bytes'])} a sample, room for "
        f"{info['capacity']:,} samples)"
    )
