"""Sessions over the interpreter (numpy only): InferenceSession runs a model with onnxruntime's calling convention."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgetrain.core.errors import ConfigError, FeedError
from edgetrain.core.interpreter import Interpreter, check_feeds
from edgetrain.core.ir import Graph
from edgetrain.graph.bounds import Bound
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


# How each caller's user turns integers into the model's values: (scale them, cast them as they are).
_WAYS = {
    "session": (
        "declare the model's input pipeline (convert with --scale 1/255, or session.preprocessing = "
        "{'scale': 1/255}: the session then scales integer batches itself) or scale them yourself "
        "(x.astype(np.float32) / 255)",
        "x.astype(np.float32), or TrainingSession(..., allow_cast=True)",
    ),
    "inference": (
        "scale them yourself (x.astype(np.float32) / 255 for 0-255 pixels), or export the model with its input "
        "pipeline (edgetrain convert --scale 1/255, then edgetrain export), which takes the raw integers",
        "x.astype(np.float32), or InferenceSession(..., allow_cast=True)",
    ),
    "command line": (
        "pass --scale 1/255 (8-bit pixels to [0, 1]) or --normalize MEAN,STD, or convert the model with --scale "
        "1/255 so that its input pipeline scales them wherever it is fed",
        "pass --cast to edgetrain train or eval (allow_cast=True from Python)",
    ),
}


def takes_integers(pipeline: Any) -> bool:
    """Whether a declared input pipeline (loaders.InputPipeline) says how integer data becomes the model's
    values: its raw dtype is an integer type, or (none given) it scales, normalizes, or expects raw values
    beyond [0, 1]."""
    if pipeline is None or not pipeline.declared:
        return False
    if pipeline.raw_dtype is not None:
        return np.dtype(pipeline.raw_dtype).kind in "iu"
    rng = pipeline.expected_range()
    arithmetic = pipeline.scale is not None or pipeline.mean is not None or pipeline.std is not None
    return arithmetic or (rng is not None and rng[1] > 1)


def input_cast(
    name: str,
    given: Any,
    want: Any,
    *,
    allow_cast: bool = False,
    pipeline: Any = None,
    exact: bool = False,
    values: Any = None,
    ways: str = "session",
) -> str:
    """The one rule for data of dtype `given` fed to the model input `name` of dtype `want`, which every path that
    feeds a model follows (TrainingSession's train_step, evaluate, run and preprocess, InferenceSession.run, the
    Trainer through them, and edgetrain.runtime.feeding for train, eval, the phone app and the fleet). Returns
    "keep" (the same dtype, or a mismatch left for check_feeds to refuse), "cast" or "pipeline" (integers that
    the model's declared input pipeline takes: it scales them); raises FeedError otherwise.

    - Integers and bools for a float input are refused: cast as they are, 0-255 pixels would be fed where [0, 1]
      is expected, and the loss explodes without a word. They are fed when the model's input pipeline takes
      integers (takes_integers: it scales them), or, cast as they are, when the user opted in (allow_cast). A
      pipeline never takes bools.
    - Another float dtype for a float input (float64, float16 -> float32) and other integers or bools for an
      integer input (int32 token ids -> int64) are cast: nothing a user would notice is lost. exact=True (the
      onnxruntime convention of InferenceSession) casts them only with allow_cast.
    - Floats for an integer input are never cast (fractional ids would be cut): "keep", and check_feeds refuses.

    values: the data (an array) or its (low, high), for the message; ways: whose ways out the message gives
    ("session", "inference", "command line")."""
    given, want = np.dtype(given), np.dtype(want)
    if given == want or given.kind not in "biuf":
        return "keep"
    if want.kind == "f" and given.kind in "biu":
        if given.kind in "iu" and takes_integers(pipeline):
            return "pipeline"
        if allow_cast:
            return "cast"
        raise _integer_refusal(name, given, want, pipeline, values, ways)
    if (want.kind == "f" and given.kind == "f") or (want.kind in "iu" and given.kind in "biu"):
        return "cast" if allow_cast or not exact else "keep"
    return "keep"


def _integer_refusal(name: str, given: np.dtype, want: np.dtype, pipeline, values, ways: str) -> FeedError:
    seen = ""
    if isinstance(values, np.ndarray) and values.size and given.kind != "b":
        values = (values.min(), values.max())
    if isinstance(values, tuple) and given.kind != "b" and all(np.isfinite(v) for v in values):
        lo, hi = (float(v) for v in values)
        seen = f" values {lo:g}..{hi:g}" + (" (8-bit pixels?)" if lo >= 0 and 1 < hi <= 255 else "")
    scale, cast = _WAYS[ways]
    head = f"input '{name}' takes {want.name}, got {given.name}{seen}"
    if given.kind == "b":
        err = FeedError(
            f"{head}: booleans are not cast to {want.name} silently (a mask? a thresholded image?); cast them "
            f"as they are: {cast}"
        )
    else:
        has = (
            f"the model's input pipeline ({pipeline.describe()}) takes float data, not integers"
            if pipeline is not None and pipeline.declared
            else "the model declares no input pipeline that takes integer data"
        )
        err = FeedError(
            f"{head}, and {has}: cast as they are, they would reach the model unscaled (0-255 pixels where "
            f"[0, 1] is expected). Scale them: {scale}; or cast them as they are: {cast}"
        )
    err.cast_refused = True  # the command line makes it a usage error (exit 2): an option is missing
    return err


# The most bytes one value of an InferenceSession may take (an input, a constant, any value a node computes, a
# kernel's working copy): a phone has a few GB. InferenceSession(max_value_bytes=) or this constant raises it.
MAX_VALUE_BYTES = 4 << 30


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

    Feeds must have the inputs' dtypes, as onnxruntime wants; integers or bools for a float input are refused
    with what to do (they would be fed unscaled: see input_cast). allow_cast=True casts every numeric feed to
    its input's dtype as it is (uint8 0-255 pixels become 0.0-255.0, float64 becomes float32, int32 ids int64);
    floats are never cast to an integer input.

    Every value the model asks for is sized from the shapes before it is allocated: one beyond max_value_bytes
    (MAX_VALUE_BYTES, 4 GiB, by default), a 40 GiB static input or ConstantOfShape say, is a ModelLimitError
    naming the node, its op, the shape and the bytes, at load (or at the first run of a shape that follows the
    feeds).
    """

    def __init__(
        self,
        model: str | os.PathLike | bytes | Any,
        batch_size: int | None = None,
        *,
        shapes: Mapping[str, Sequence[int]] | None = None,
        threads: int | None = None,
        allow_cast: bool = False,
        max_value_bytes: int | None = None,
    ):
        self.threads = apply_threads(threads)
        self.allow_cast = bool(allow_cast)
        self._bound = _value_bound(max_value_bytes)
        if isinstance(model, Graph):
            graph = model
        else:
            from edgetrain.onnx_io.reader import from_onnx  # needs onnx: an optional dependency

            graph = from_onnx(model)
        self._base = fold_constants(graph, fold_shapes=False, bound=self._bound)
        self._batch_size = batch_size
        self._programs: dict[tuple, Interpreter] = {}
        self._shape_inputs = shape_deciding_inputs(self._base)
        static = all(self._base.values[n].is_static for n in self._base.inputs)
        if not self._shape_inputs and (batch_size is not None or shapes or static):
            g = make_static(self._base, batch_size=batch_size, shapes=shapes, bound=self._bound)
            from edgetrain.graph.memory import planned_interpreter  # start-up: the planner loads on first use

            self._fixed: Interpreter | None = planned_interpreter(g, lean=False)
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
            g = make_static(
                self._base, batch_size=self._batch_size, shapes=shapes, constants=bound, bound=self._bound
            )
            from edgetrain.graph.memory import planned_interpreter  # start-up: the planner loads on first use

            prog = self._programs[key] = planned_interpreter(g, lean=False)
        return prog

    def _cast_feeds(self, input_feed: Mapping[str, Any]) -> Mapping[str, Any]:
        """The feeds with the dtypes input_cast decides (what it leaves, check_feeds refuses)."""
        if not isinstance(input_feed, Mapping):
            return input_feed
        out = dict(input_feed)
        for name, value in input_feed.items():
            info = self._base.values.get(name)
            if name not in self._base.inputs or info is None:
                continue
            try:
                x = np.asarray(value)
            except (TypeError, ValueError):  # ragged lists: check_feeds names them
                continue
            how = input_cast(
                name, x.dtype, info.dtype, allow_cast=self.allow_cast, exact=True, values=x, ways="inference"
            )
            if how == "cast":
                out[name] = x.astype(info.dtype)
        return out

    def run(
        self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], run_options: Any = None
    ) -> list[np.ndarray]:
        input_feed = self._cast_feeds(input_feed)
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


def _value_bound(max_value_bytes: int | None) -> Bound:
    """max_value_bytes= of an InferenceSession (MAX_VALUE_BYTES when None), as the shape-only passes take it."""
    limit = MAX_VALUE_BYTES if max_value_bytes is None else max_value_bytes
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
        raise ConfigError(f"max_value_bytes must be a whole number of bytes >= 1, not {max_value_bytes!r}")
    how = (
        "its max_value_bytes=" if max_value_bytes is not None else "edgetrain.runtime.session.MAX_VALUE_BYTES"
    )
    raise_it = "InferenceSession(..., max_value_bytes=N) raises it"
    return Bound(int(limit), f"an InferenceSession allows for one value ({how}; {raise_it})")
