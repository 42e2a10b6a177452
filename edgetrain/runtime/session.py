"""Sessions over the interpreter (numpy only): InferenceSession runs a model with onnxruntime's calling convention."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgetrain.core.errors import FeedError
from edgetrain.core.interpreter import Interpreter, check_feeds
from edgetrain.core.ir import Graph
from edgetrain.graph.passes import fold_constants, make_static, shape_deciding_inputs

from .threads import apply_threads

_ONNX_TYPE = {
    "float32": "float",
    "float64": "double",
    "float16": "float16",
    "int64": "int64",
    "int32": "int32",
    "int8": "int8",
    "uint8": "uint8",
    "bool": "bool",
    "int16": "int16",
    "uint16": "uint16",
}


@dataclass(frozen=True)
class NodeArg:
    """An input or output as onnxruntime describes it: name, shape (str for symbolic dims), type string."""

    name: str
    shape: list[Any]
    type: str


class InferenceSession:
    """Runs an ONNX model (path, bytes, onnx.ModelProto, or an edgetrain Graph) like onnxruntime does:
    `sess.run(None, {"input": x})` returns the list of outputs.

    A symbolic batch dimension is fixed by batch_size=; without it, the session specialises itself to the
    shapes of each new feed (and caches the result), so a model exported with a dynamic batch just works.
    Likewise, inputs whose values decide shapes (a `shape` input of a Reshape, say) are bound to the values fed.
    Paths, bytes and ModelProtos need the onnx package; a Graph needs numpy alone. threads= sets the BLAS
    threads (of the process: every session shares them).
    """

    def __init__(
        self,
        model: str | os.PathLike | bytes | Any,
        batch_size: int | None = None,
        *,
        shapes: Mapping[str, Sequence[int]] | None = None,
        threads: int | None = None,
    ):
        self.threads = apply_threads(threads)
        if isinstance(model, Graph):
            graph = model
        else:
            from edgetrain.onnx_io.reader import from_onnx  # needs onnx: an optional dependency

            graph = from_onnx(model)
        self._base = fold_constants(graph, fold_shapes=False)
        self._batch_size = batch_size
        self._programs: dict[tuple, Interpreter] = {}
        self._shape_inputs = shape_deciding_inputs(self._base)
        static = all(self._base.values[n].is_static for n in self._base.inputs)
        if not self._shape_inputs and (batch_size is not None or shapes or static):
            g = make_static(self._base, batch_size=batch_size, shapes=shapes)
            self._fixed: Interpreter | None = Interpreter(g)
        else:
            self._fixed = None

    @property
    def graph(self) -> Graph:
        """The static graph the session runs (the first specialised one when shapes follow the feeds)."""
        prog = self._fixed or next(iter(self._programs.values()), None)
        return prog.graph if prog is not None else self._base

    def get_inputs(self) -> list[NodeArg]:
        return [self._arg(self.graph, n) for n in self.graph.inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [self._arg(self.graph, n) for n in self.graph.outputs]

    @staticmethod
    def _arg(graph: Graph, name: str) -> NodeArg:
        info = graph.values.get(name)
        if info is None:
            return NodeArg(name, [], "tensor(unknown)")
        shape = [] if info.shape is None else list(info.shape)
        return NodeArg(
            name, shape, f"tensor({_ONNX_TYPE.get(np.dtype(info.dtype).name, np.dtype(info.dtype).name)})"
        )

    def _program(self, feeds: Mapping[str, Any]) -> Interpreter:
        if self._fixed is not None:
            return self._fixed
        feeds = check_feeds(self._base, feeds)  # names, dtypes, ranks and the static dims
        bound = {n: feeds[n] for n in self._shape_inputs}
        key = tuple(np.shape(feeds[n]) for n in self._base.inputs) + tuple(
            v.tobytes() for v in bound.values()
        )
        prog = self._programs.get(key)
        if prog is None:
            shapes = {n: np.shape(feeds[n]) for n in self._base.inputs}
            g = make_static(self._base, batch_size=self._batch_size, shapes=shapes, constants=bound)
            prog = self._programs[key] = Interpreter(g)
        return prog

    def run(
        self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], run_options: Any = None
    ) -> list[np.ndarray]:
        prog = self._program(input_feed)
        feeds = check_feeds(prog.graph, {k: v for k, v in input_feed.items() if k not in self._shape_inputs})
        if output_names is not None:
            if isinstance(output_names, str):
                raise FeedError(f"output_names must be a list of names, e.g. ['{output_names}'], or None")
            bad = [n for n in output_names if n not in prog.graph.outputs]
            if bad:
                raise FeedError(
                    f"'{bad[0]}' is not an output of the model; its outputs are: "
                    f"{', '.join(repr(o) for o in prog.graph.outputs)}"
                )
        return prog.run(feeds, output_names)
