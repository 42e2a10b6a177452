"""What a training artifact's header promises (numpy only): the io keys, the program id a checkpoint is bound to,
and the bound on optimizer state declared zero. Written by edgetrain.derive.artifact, read by
edgetrain.runtime.artifact."""

from __future__ import annotations

import hashlib
import json
from typing import Any

IO_KEYS = ("data_inputs", "target", "lr", "loss", "outputs", "parameters", "state", "updates")


# Optimizer state declared zero (not stored) may be at most this many bytes per byte of parameters (SGD keeps one
# momentum, Adam two moments), plus 1 MiB: a file that declares more is refused before anything is allocated.
ZERO_STATE_PER_PARAMETER_BYTE = 4


def program_id(program: dict[str, Any], io: dict[str, Any]) -> str:
    """What a checkpoint is bound to: a hash of the training program's structure and interface (not of the
    weights), so a checkpoint of one model is refused by a session of another."""
    blob = json.dumps({"program": program, "io": io}, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()
