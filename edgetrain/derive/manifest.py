"""A parameter manifest: the model's author says which tensors train (numpy only). JSON, in the ONNX model's
metadata_props under MANIFEST_KEY (edgetrain.torch_export writes it) or in a file given to convert (parameters=,
--parameters FILE):

    {"version": 1,
     "parameters": {"<ONNX initializer>": "<the author's name>", ...},   the tensors that train
     "frozen": {"<ONNX initializer>": "<the author's name>", ...}}       parameters the author froze (optional)

Two initializers given one name are one tensor (an exporter's copy, as of a tied head): they train as one. With a
manifest, it alone decides what trains; the roles read from the graph still name what each tensor is.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from edgetrain.core.errors import ConfigError, ModelError, StorageError
from edgetrain.core.ir import Graph

MANIFEST_KEY = "edgetrain.parameters"
MAX_MANIFEST_BYTES = 16 << 20


@dataclass(frozen=True)
class Manifest:
    parameters: dict[str, str]  # ONNX initializer -> the author's name, for the tensors that train
    frozen: dict[str, str]  # ONNX initializer -> the author's name, for the parameters the author froze
    source: str  # where it came from, for messages

    def author(self, name: str) -> str:
        return self.parameters.get(name) or self.frozen.get(name, "")

    def ties(self) -> dict[str, str]:
        """copy -> the initializer that trains for it: initializers given one author's name, the first kept."""
        first: dict[str, str] = {}
        out = {}
        for init, who in self.parameters.items():
            if who in first:
                out[init] = first[who]
            else:
                first[who] = init
        return out


def read_manifest(graph: Graph, given: str | os.PathLike | dict | None) -> Manifest | None:
    """The manifest given (a dict or a JSON file), else the model's own (metadata_props), else None. A manifest
    that is malformed, or names a tensor the model does not hold, is a ConfigError that says which."""
    if given is None:
        text = graph.metadata.get(MANIFEST_KEY)
        if text is None:
            return None
        return _parse(
            _json(text, f"the model's metadata '{MANIFEST_KEY}'"), graph, f"the model's '{MANIFEST_KEY}'"
        )
    if isinstance(given, dict):
        return _parse(given, graph, "parameters=")
    path = os.fspath(given)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as e:
        raise StorageError.of(e, path, "cannot read the parameter manifest") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise ConfigError(f"'{path}' is larger than a parameter manifest may be ({MAX_MANIFEST_BYTES} bytes)")
    return _parse(_json(data, f"'{path}'"), graph, f"'{path}'")


def _json(text: str | bytes, where: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"{where} is not a parameter manifest: not JSON ({e})") from None


def _parse(data: Any, graph: Graph, where: str) -> Manifest:
    def names(key: str) -> dict[str, str]:
        v = data.get(key, {})
        if not isinstance(v, dict) or not all(
            isinstance(k, str) and isinstance(x, str) for k, x in v.items()
        ):
            raise ConfigError(f"{where}: '{key}' must map ONNX initializer names to the author's names")
        return dict(v)

    if not isinstance(data, dict) or data.get("version", 1) != 1 or "parameters" not in data:
        raise ConfigError(
            f'{where} is not a parameter manifest: expected {{"version": 1, "parameters": {{ONNX name: name}}}}'
        )
    params, frozen = names("parameters"), names("frozen")
    missing = [n for n in [*params, *frozen] if n not in graph.initializers]
    if missing:
        raise ModelError(
            f"{where} names '{missing[0]}'{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}, which "
            "the model holds no initializer of: the manifest belongs to another export of the model"
        )
    both = sorted(set(params) & set(frozen))
    if both:
        raise ConfigError(f"{where} lists '{both[0]}' both as a parameter and as frozen")
    return Manifest(params, frozen, where)
