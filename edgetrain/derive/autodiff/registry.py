"""The gradient rules and the fused ops' standard-op bodies, registered by decorator into the op records
(edgetrain.core.ops: `rule`, `body`); RULES and BODIES read them back. Importing edgetrain.derive.autodiff (any of
its modules) registers every rule: the package imports its rules."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from edgetrain.core.ir import Node
from edgetrain.core.ops import OPS, register

# rule(ctx, node, dys, needs) -> one gradient (or None) per node input.
#   dys:   the gradient of each node output (None where no gradient flows back into that output)
#   needs: per input, whether its gradient is wanted; a rule should not build what nobody wants
# A rule may return a gradient with the broadcast shape of the output: the driver sums it down.
GradRule = Callable[[Any, Node, list[str | None], list[bool]], list[str | None]]
# body(ctx, node) -> the names of values equal to node's outputs, built from standard ops
Body = Callable[[Any, Node], list[str]]


def _registers(slot: str) -> Callable[..., Callable[[Callable], Callable]]:
    """A decorator that registers the function it decorates into `slot` of the record of each op type given."""

    def decorator(*op_types: str) -> Callable[[Callable], Callable]:
        def add(fn: Callable) -> Callable:
            for op in op_types:
                register(op, slot, fn)
            return fn

        return add

    return decorator


grad = _registers("rule")  # @grad("Conv", ...): a GradRule for each op given
body = _registers("body")  # @body("ConvGradWeight", ...): the standard-op Body of each of edgetrain's own ops


class _Slot(Mapping):
    """op type -> what the records hold in one registered slot (the ops that have it)."""

    def __init__(self, slot: str):
        self._slot = slot

    def __getitem__(self, op: str) -> Any:
        rec = OPS.get(op)
        value = None if rec is None else getattr(rec, self._slot)
        if value is None:
            raise KeyError(op)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter([op for op, rec in OPS.items() if getattr(rec, self._slot) is not None])

    def __len__(self) -> int:
        return sum(1 for _ in self)


RULES: Mapping[str, GradRule] = _Slot("rule")
BODIES: Mapping[str, Body] = _Slot("body")
