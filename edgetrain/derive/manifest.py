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

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgetrain.core.errors import ConfigError, ModelError, StorageError
from edgetrain.core.ir import Graph
from loaders.values import bounded_json, shown

MANIFEST_KEY = "edgetrain.parameters"
MAX_MANIFEST_BYTES = 16 << 20
FIELDS = ("version", "parameters", "frozen")


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


def read_manifest(graph: Graph, given: str | os.PathLike | Mapping | None) -> Manifest | None:
    """The manifest given (a dict or a JSON file), else the model's own (metadata_props), else None. A manifest
    that is malformed, names a tensor the model does not hold or one that cannot train, or gives one name to
    tensors of different sizes, is a ConfigError (ModelError for a name the model lacks) that says which."""
    if given is None:
        text = graph.metadata.get(MANIFEST_KEY)
        if text is None:
            return None
        return _parse(
            _json(text, f"the model's metadata '{MANIFEST_KEY}'"), graph, f"the model's '{MANIFEST_KEY}'"
        )
    if isinstance(given, Mapping):
        return _parse(dict(given), graph, "parameters=")
    if not isinstance(given, (str, bytes, os.PathLike)):
        raise ConfigError(
            f"parameters={shown(given)}: give a parameter manifest as a dict or the path of its JSON file"
        )
    path = os.fsdecode(given)
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            # read(n) allocates n bytes first: a regular file is read to its size, and refused unread when larger
            # than the bound (a pipe's size is known only once read)
            regular = stat.S_ISREG(info.st_mode)
            large = regular and info.st_size > MAX_MANIFEST_BYTES
            data = b"" if large else f.read(info.st_size + 1 if regular else MAX_MANIFEST_BYTES + 1)
    except OSError as e:
        raise StorageError.of(e, path, "cannot read the parameter manifest") from None
    if large or len(data) > MAX_MANIFEST_BYTES:
        raise ConfigError(f"'{path}' is larger than a parameter manifest may be ({MAX_MANIFEST_BYTES} bytes)")
    return _parse(_json(data, f"'{path}'"), graph, f"'{path}'")


def _json(text: str | bytes, where: str) -> Any:
    try:
        return bounded_json(text, where, max_bytes=MAX_MANIFEST_BYTES)
    except ConfigError as e:
        raise ConfigError(f"{where} is not a parameter manifest: not JSON as one is read ({e})") from None


def _names(data: dict, key: str, where: str) -> dict[str, str]:
    """The manifest's object `key` ({} when absent): ONNX initializer names to the author's, both non-empty."""
    v = data.get(key, {})
    if not isinstance(v, dict):
        raise ConfigError(
            f"{where}: '{key}' is {shown(v)}; it must map ONNX initializer names to the author's names, e.g. "
            '{"fc.weight": "fc.weight"}'
        )
    bad = next(((k, x) for k, x in v.items() if not (isinstance(x, str) and x and k)), None)
    if bad is not None:
        raise ConfigError(
            f"{where}: '{key}' must map ONNX initializer names to the author's names (non-empty strings); "
            f"{shown(bad[0])} maps to {shown(bad[1])}"
        )
    return dict(v)


def _parse(data: Any, graph: Graph, where: str) -> Manifest:
    if not isinstance(data, dict) or "parameters" not in data:
        raise ConfigError(
            f'{where} is not a parameter manifest: expected {{"version": 1, "parameters": {{ONNX name: name}}}}'
        )
    version = data.get("version", 1)
    if type(version) is not int or version != 1:
        raise ConfigError(
            f"{where}: 'version' is {shown(version)}; this edgetrain reads parameter manifests of version 1"
        )
    unknown = sorted(k for k in data if k not in FIELDS)
    if unknown:
        raise ConfigError(
            f"{where}: {shown(unknown[0])} is not a field of a parameter manifest; its fields are "
            f"{', '.join(FIELDS)}"
        )
    params, frozen = _names(data, "parameters", where), _names(data, "frozen", where)
    missing = [n for n in [*params, *frozen] if n not in graph.initializers]
    if missing:
        raise ModelError(
            f"{where} names {shown(missing[0])}{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}, "
            "which the model holds no initializer of: the manifest belongs to another export of the model"
        )
    both = sorted(set(params) & set(frozen))
    if both:
        raise ConfigError(f"{where} lists {shown(both[0])} both as a parameter and as frozen")
    _trainable(params, graph, where)
    return Manifest(params, frozen, where)


def _trainable(params: dict[str, str], graph: Graph, where: str) -> None:
    """Each parameter is a float tensor (an integer one is a shape, an index or a count: it never trains), and
    tensors given one name are one tensor written twice: as many values of one dtype."""
    for name in params:
        arr = graph.initializers[name]
        if arr.dtype.kind != "f":
            raise ConfigError(
                f"{where} lists {shown(name)} as a parameter, but it holds {arr.dtype} values "
                f"{list(arr.shape)} (a shape, an index or a count): such a value never trains; leave it out of "
                "'parameters'"
            )
    first: dict[str, str] = {}
    for name, who in params.items():
        other = first.setdefault(who, name)
        a, b = graph.initializers[other], graph.initializers[name]
        if a.size != b.size or a.dtype != b.dtype:
            raise ConfigError(
                f"{where} gives {shown(other)} ({a.dtype}{list(a.shape)}) and {shown(name)} ({b.dtype}"
                f"{list(b.shape)}) one name {shown(who)}, but tensors of different sizes or dtypes cannot be one "
                "tensor (a tie is a copy, a transpose or a reshape): give each its own name"
            )
