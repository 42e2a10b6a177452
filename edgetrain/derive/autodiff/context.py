"""The building context gradient rules, losses and optimizers write nodes through: a GraphBuilder that knows the
static dtype and shape of every value it creates (by running each new node once on stand-in inputs)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgetrain.core.errors import EdgeTrainError, ShapeError
from edgetrain.core.interpreter import compile_step
from edgetrain.core.ir import DEFAULT_DOMAIN, Graph, GraphBuilder, Node, TensorInfo
from edgetrain.core.kernels import KERNELS
from edgetrain.core.ops import PRIVATE_DOMAIN
from edgetrain.graph.passes import ShapeRule, shape_step

_DEFAULT = object()  # ShapedBuilder's rule: onnx's shape inference when onnx is installed


def default_shape_rule() -> ShapeRule | None:
    """onnx's per-node shape inference (edgetrain.onnx_io.shapes.node_shapes) where onnx is installed, else None
    (a graph converted with numpy alone: shapes come from running nodes on stand-ins)."""
    try:
        from edgetrain.onnx_io.shapes import node_shapes  # needs onnx: an optional dependency
    except ImportError:
        return None
    return node_shapes


class ShapedBuilder(GraphBuilder):
    """A GraphBuilder whose add() records the TensorInfo of every output it creates.

    Shapes come from executing the new node's kernel once, on the real values of constant inputs and zeros (or
    ones, if zeros fail: an integer division, say) of the right shape for the others: exact for every op the
    interpreter runs, with no shape function to keep in sync with the kernels. A value larger than
    edgetrain.graph.passes.STANDIN_BYTES is not allocated: its node's shapes come from onnx's shape inference (and
    the fused ops' own rules), where onnx is installed (see edgetrain.graph.passes.shape_step).
    """

    def __init__(self, graph: Graph, *, rule: Any = _DEFAULT):
        super().__init__(graph)
        self._rule = default_shape_rule() if rule is _DEFAULT else rule

    def add(
        self,
        op_type: str,
        inputs: Sequence[str],
        *,
        attrs: dict[str, Any] | None = None,
        outputs: int | Sequence[str] = 1,
        name: str | None = None,
        domain: str = DEFAULT_DOMAIN,
        infos: Sequence[TensorInfo] | None = None,
    ) -> list[str]:
        outs = super().add(
            op_type, inputs, attrs=attrs, outputs=outputs, name=name, domain=domain, infos=infos
        )
        if infos is None:
            node = self.graph.nodes[-1]
            for o, info in zip(node.outputs, self._infer(node)):
                if o:
                    self.graph.values[o] = info
        return outs

    def _infer(self, node: Node) -> list[TensorInfo]:

        fn, kwargs = compile_step(node)
        g = self.graph
        args: list[Any] = []
        for i in node.inputs:
            if not i:
                args.append(None)
            elif i in g.initializers:
                args.append(g.initializers[i])
            else:
                info = g.values.get(i)
                assert info is not None and info.is_static, f"{node.label}: input '{i}' has no static shape"
                args.append(info)
        error: Exception | None = None
        for fill in (np.zeros, np.ones):
            try:
                with np.errstate(all="ignore"):
                    res = shape_step(node, fn, kwargs, args, fill=fill, rule=self._rule, opset=g.opset)
                break
            except EdgeTrainError:
                raise
            except Exception as e:  # stand-in values can fail where real ones would not
                error = e
        else:
            raise ShapeError(f"{node.label}: cannot infer output shapes ({type(error).__name__}: {error})")
        return [
            TensorInfo(np.dtype(r.dtype), tuple(int(d) for d in r.shape)) if r is not None else None
            for r in res
        ]


class GradContext:
    """What gradient rules, losses and optimizers build with: ops by keyword, constants, shapes, attributes."""

    def __init__(self, builder: ShapedBuilder):
        self.b = builder

    @property
    def graph(self) -> Graph:
        return self.b.graph

    # ---- queries ----------------------------------------------------------------------------------------------
    def info(self, name: str) -> TensorInfo:
        return self.b.graph.info(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.info(name).shape)  # type: ignore[arg-type]

    def dtype(self, name: str) -> np.dtype:
        return np.dtype(self.info(name).dtype)

    def const_value(self, name: str) -> np.ndarray | None:
        """The value of a constant (initializer) input, or None when it is computed at run time."""
        return self.b.graph.initializers.get(name)

    @staticmethod
    def attr(node: Node, key: str) -> Any:
        """A node's attribute, or the spec's default (the kernel's keyword default) when absent."""
        if key in node.attrs:
            return node.attrs[key]
        default = KERNELS[node.op_type].attrs[key]
        return None if default is inspect.Parameter.empty else default

    # ---- building ---------------------------------------------------------------------------------------------
    def op(self, op_type: str, *inputs: str | None, name: str | None = None, **attrs: Any) -> str:
        """One standard ONNX node with one output; None inputs are omitted optional inputs."""
        return self.b.add(op_type, [i or "" for i in inputs], attrs=attrs, name=name)[0]

    def ops(
        self, op_type: str, *inputs: str | None, n: int, name: str | None = None, **attrs: Any
    ) -> list[str]:
        """One standard ONNX node with n outputs."""
        return self.b.add(op_type, [i or "" for i in inputs], attrs=attrs, outputs=n, name=name)

    def private(self, op_type: str, *inputs: str | None, n: int = 1, name: str | None = None, **attrs: Any):
        """One of edgetrain's fused ops (domain com.edgetrain); returns its output names (a list when n > 1)."""
        outs = self.b.add(
            op_type, [i or "" for i in inputs], attrs=attrs, outputs=n, name=name, domain=PRIVATE_DOMAIN
        )
        return outs if n > 1 else outs[0]

    def const(self, value: Any, dtype: Any = None, *, hint: str = "const") -> str:
        """A constant initializer (np.asarray(value, dtype))."""
        return self.b.initializer(hint, np.asarray(value, dtype=dtype))

    def ints(self, values: Sequence[int], *, hint: str = "axes") -> str:
        """An int64 1-D constant, for axes, shapes, starts, ... inputs."""
        return self.const(np.asarray(list(values), dtype=np.int64), hint=hint)

    def scalar_like(self, value: float, like: str, *, hint: str = "scalar") -> str:
        """A 0-d constant of like's dtype."""
        return self.const(np.asarray(value, dtype=self.dtype(like)), hint=hint)

    def reshape(self, x: str, shape: Sequence[int]) -> str:
        if self.shape(x) == tuple(shape):
            return x
        return self.op("Reshape", x, self.ints(shape, hint="shape"))

    def sum_to(self, x: str, shape: Sequence[int]) -> str:
        """Sums x down to `shape` by the broadcasting rules (leading dims dropped, 1-dims kept): the gradient of a
        broadcast."""
        xs, shape = self.shape(x), tuple(shape)
        if xs == shape:
            return x
        lead = len(xs) - len(shape)
        axes = list(range(lead)) + [lead + k for k, d in enumerate(shape) if d == 1 and xs[lead + k] != 1]
        if axes and tuple(d for k, d in enumerate(xs) if k not in axes) == shape:  # one node: a bias gradient
            return self.op("ReduceSum", x, self.ints(axes), keepdims=0)
        y = self.op("ReduceSum", x, self.ints(axes), keepdims=1) if axes else x
        return self.reshape(y, shape)
