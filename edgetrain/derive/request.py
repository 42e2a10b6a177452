"""What `convert` is asked (build side): one typed request, checked when it is made, and the rewrites it applies.

Options that cannot go together are refused here, naming both, before the model is read: a memory budget chooses
which layers train on part of their input channels itself, so `channels` and `memory_budget` exclude each other;
adapters train whole low-rank updates, so `channels` and `adapters` do too."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgetrain.core.errors import UnsupportedError
from edgetrain.graph.recompute import LEVELS
from loaders.values import shown

from .adapters import IAdapter
from .budget import parse_bytes
from .losses import ILoss
from .optimizers import IOptimizer
from .rewrite import Rewrite
from .rewrites import ChunkPrefix, DeclaredPipeline, Int8, Rebatch, Recompute, SplitChannels, Ties


@dataclass(frozen=True)
class ConvertRequest:
    """convert's arguments, typed and checked (see edgetrain.derive.pipeline.convert for what each one does)."""

    loss: ILoss
    optimizer: IOptimizer
    trainable: str | tuple[str, ...] | None = None
    batch_size: int | None = None
    output: str | None = None
    untie: bool | tuple[str, ...] = False
    parameters: Any = None
    preprocessing: Any = None
    adapters: IAdapter | None = None
    recompute: str = "none"
    memory_budget: int | None = None  # bytes
    channels: Mapping[str, int] = field(default_factory=dict)
    rewrites: tuple[Rewrite, ...] = ()  # the caller's own, applied after the built-in ones at each stage
    progress: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.loss, ILoss):
            raise UnsupportedError(
                f"loss must be an ILoss (e.g. et.CrossEntropyLoss()), not {type(self.loss).__name__}"
            )
        if self.adapters is not None and not isinstance(self.adapters, IAdapter):
            raise UnsupportedError(
                f"adapters must be an adapter module (e.g. et.LoRA(rank=8)), not {type(self.adapters).__name__}"
            )
        if not isinstance(self.optimizer, IOptimizer):
            raise UnsupportedError(
                f"optimizer must be an IOptimizer (e.g. et.SGD(lr=0.01)), not {type(self.optimizer).__name__}"
            )
        bad = [r for r in self.rewrites if not isinstance(r, Rewrite)]
        if bad:
            raise UnsupportedError(
                f"rewrites must be Rewrite objects (edgetrain.derive.rewrite), not {type(bad[0]).__name__}"
            )
        if self.recompute not in LEVELS:
            raise UnsupportedError(f"recomputation level '{self.recompute}': use one of {', '.join(LEVELS)}")
        if self.memory_budget is not None:  # bytes, however given (convert reads '24MB' with make)
            object.__setattr__(self, "memory_budget", parse_bytes(self.memory_budget))
        _check_channels(self.channels)
        self._exclusive()

    def _exclusive(self) -> None:
        if self.channels and self.memory_budget is not None:
            raise UnsupportedError(
                "give channels or memory_budget, not both: the budget chooses which layers train on part of their "
                "input channels itself (`edgetrain check --memory-budget` lists its options)"
            )
        if self.channels and self.adapters is not None:
            raise UnsupportedError(
                "channels cannot be combined with adapters: train whole weights there (trainable=...), or convert "
                "the float model without adapters"
            )

    @classmethod
    def make(
        cls,
        *,
        memory_budget: int | str | None = None,
        channels: Any = None,
        trainable: str | Sequence[str] | None = None,
        untie: bool | Sequence[str] = False,
        rewrites: Sequence[Rewrite] | None = None,
        **rest: Any,
    ) -> ConvertRequest:
        """The request of convert's keyword arguments, as users give them (a budget as text, lists for tuples)."""
        if channels is not None:
            _check_channels(channels)
        return cls(
            memory_budget=None if memory_budget is None else parse_bytes(memory_budget),
            channels=dict(channels or {}),
            trainable=trainable if trainable is None or isinstance(trainable, str) else tuple(trainable),
            untie=untie if isinstance(untie, bool) else tuple(untie),
            rewrites=tuple(rewrites or ()),
            **rest,
        )

    def applied(
        self, *, channels: Mapping[str, int] | None = None, recompute: str | None = None, chunks: int = 1
    ) -> list[Rewrite]:
        """The rewrites a conversion applies, in order: the built-in ones, the caller's, then the step's own.
        channels, recompute and chunks: a memory budget's option instead of the request's."""
        trainable_by = [self.adapters] if self.adapters is not None else []
        return [
            Int8(),
            Ties(
                untie=self.untie if isinstance(self.untie, bool) else list(self.untie),
                parameters=self.parameters,
            ),
            SplitChannels(self.channels if channels is None else channels),
            *trainable_by,
            Rebatch(),
            *self.rewrites,
            Recompute(self.recompute if recompute is None else recompute),
            ChunkPrefix(chunks),
            DeclaredPipeline(self.preprocessing),
        ]


def _check_channels(channels: Any) -> None:
    """channels maps weight names (strings) to counts; each count is checked against its weight's input channels
    where the graph is known (edgetrain.derive.channels.split)."""
    if not isinstance(channels, Mapping):
        raise UnsupportedError(
            f"channels must map weight names to counts, e.g. {{'fc.weight': 32}}, not {type(channels).__name__}"
        )
    bad = [w for w in channels if not isinstance(w, str) or not w]
    if bad:
        raise UnsupportedError(
            f"channels: {shown(bad[0])} is not a weight's name; channels maps weight names to counts, e.g. "
            "{'fc.weight': 32}"
        )
