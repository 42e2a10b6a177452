"""Training within a memory budget (`convert --memory-budget 24MB`, `et.convert(..., memory_budget=...)`).

The idea of the on-device training papers (TinyTL, "On-Device Training Under 256KB Memory", PockEngine), which no
ONNX runtime offers: choose what to train and what to recompute so that the memory a training step writes fits the
budget. That is the planned peak `edgetrain inspect` reports (arena, trainable parameters, optimizer state,
buffers, outputs) without the frozen weights, which the session reads from the file's read-only pages: the OS
drops and reads them again as it needs, as the papers' microcontrollers keep weights in flash. Both numbers are
reported.
The options, from the most the model can learn to the least, each with the three recomputation levels
(edgetrain.graph.recompute: none, cheap, segments):

1. every parameter (or those `trainable` names: the budget never trains more than asked);
2. every bias, and the weights of the last k layers (the sparse update of "On-Device Training Under 256KB":
   biases need no stored activations for their own gradient), the largest k that fits; and the same with each
   Conv/Gemm/MatMul weight of those layers training on the first quarter of its input channels alone (that paper's
   sparse tensor update, edgetrain.derive.channels: the step keeps a quarter of the layer's input for the weight's
   gradient, and the gradient and optimizer state are a quarter of the weight's), whose largest k is larger: the
   one that reaches more layers is taken;
3. the last k layers alone, the largest k that fits;
4. the head (the last layer) alone.

The first option whose planned peak fits is built; the others weighed on the way are kept in the artifact's header
with their planned peaks, and `edgetrain check --memory-budget` prints them all.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edgetrain.core.errors import ConfigError, ModelError, UnsupportedError
from edgetrain.graph.footprint import FUSED_CHUNK, step_footprint
from edgetrain.graph.recompute import LEVELS
from edgetrain.graph.sections import MemoryBudgetSection, QuantizedSection
from loaders.values import count, number, shown

from .artifact import TrainingArtifact, artifact_record
from .channels import splittable

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
_UNITS.update({"K": 2**10, "M": 2**20, "G": 2**30})


# A budget is only compared with planned peaks (nothing of its size is allocated), but it is written into the
# artifact's header, whose integers are bounded: 1 PiB is beyond any device's memory.
MAX_BUDGET = 1 << 50
BUDGET_FIX = "write a positive size such as 24MB, 24MiB, 512KB or a number of bytes, up to 1 PiB"


def parse_bytes(value: int | float | str) -> int:
    """A budget as bytes: an int, or text such as '24MB' (10^6), '24MiB' or '24M' (2^20), '512KB'; from 1 byte to
    MAX_BUDGET. Anything else is an UnsupportedError naming the budget and saying what works."""
    try:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return count(value, "memory budget", lo=1, hi=MAX_BUDGET, fix=BUDGET_FIX)
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return _whole_bytes(
                number(value, "memory budget", positive=True, float32=False, fix=BUDGET_FIX), value
            )
    except ConfigError as e:  # one error for every bad budget, as for the text ones below
        raise UnsupportedError(str(e)) from None
    text = value if isinstance(value, str) and len(value) <= 64 else ""  # no budget is written longer
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS or float(m.group(1)) <= 0:
        raise UnsupportedError(f"memory budget {shown(value)}: {BUDGET_FIX}")
    return _whole_bytes(float(m.group(1)) * _UNITS[unit], value)


def _whole_bytes(n: float, given) -> int:
    """n bytes, a positive finite number, as a whole number from 1 to MAX_BUDGET (its fraction dropped)."""
    if not n < MAX_BUDGET + 1 or int(n) < 1:
        raise UnsupportedError(
            f"memory budget {shown(given)} is {'less than a byte' if n < 1 else 'too large'}; {BUDGET_FIX}"
        )
    return int(n)


def size_text(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


@dataclass
class Option:
    """One way to train: which tensors and which recomputation, with its planned peak."""

    name: str  # "every parameter", "every bias + the last 3 of 53 layers", ...
    trainable: list[str]
    recompute: str
    chunks: int = 1  # the frozen prefix runs in this many chunks of the batch
    # weights that train on their first input channels: {weight: count}
    channels: dict[str, int] | None = None
    peak: int = 0  # what the budget counts: the planned peak without the frozen weights mapped from the file
    values: int = 0  # trainable elements
    parts: dict | None = None

    def to_dict(self, budget: int) -> dict:
        return {
            "name": self.name,
            "recompute": self.recompute,
            "chunks": self.chunks,
            "budgeted_bytes": self.peak,
            "planned_peak_bytes": int(self.parts["peak_bytes"]) if self.parts else self.peak,
            "trainable_tensors": len(self.trainable),
            "trainable_values": self.values,
            "channels": dict(self.channels or {}),
            "fits": self.peak <= budget,
        }


def planned_peak(art: TrainingArtifact) -> dict:
    """The planned peak of an artifact's training step, part by part, as `edgetrain inspect` will report it."""
    record = artifact_record(art, fused_only=True)
    dtypes = {np.dtype(record.values[p].dtype) for p in art.parameters}
    clipped = record.optimizer.clip_grad_norm is not None and len(dtypes) > 1
    return step_footprint(record, fused=art.fused is not None and not clipped, chunk=FUSED_CHUNK)


# (trainable, recompute level, chunks, channels) -> artifact or None
Build = Callable[..., TrainingArtifact | None]
CHANNEL_SHARE = 4  # the sparse options train the first 1/CHANNEL_SHARE of a split weight's input channels


class Search:
    """The options weighed for one budget, in order; build(trainable, recompute) converts the model."""

    def __init__(self, build: Build, budget: int, *, trainable, progress: Callable[[str], None] | None):
        self.build, self.budget, self.progress = build, budget, progress
        self.trainable = trainable
        self.weighed: list[Option] = []
        self._built: dict[tuple, TrainingArtifact] = {}
        self._options: dict[tuple, Option] = {}

    def weigh(self, name: str, trainable: list[str] | None, level: str, chunks: int = 1, channels=None):
        """(the option, its artifact), or None when its frozen part cannot run in `chunks` chunks."""
        channels = dict(channels or {})
        key = (
            tuple(trainable) if trainable is not None else ("*",),
            level,
            chunks,
            tuple(sorted(channels.items())),
        )
        if key in self._built:  # the same option under another name (the head, say)
            return self._options[key], self._built[key]
        art = self.build(trainable, level, chunks, channels)
        if art is None:
            return None
        self._built = {key: art}  # the last one only: artifacts are large
        mem = planned_peak(art)
        opt = Option(
            name,
            list(art.parameters),
            level,
            chunks=chunks,
            channels=channels or None,
            peak=int(mem["budgeted_bytes"]),
            values=_values(art),
            parts=mem,
        )
        self.weighed.append(opt)
        self._options[key] = opt
        if self.progress is not None:
            verdict = "fits" if opt.peak <= self.budget else "too large"
            how = f"recompute {level}" + (f", frozen part in {chunks} chunks" if chunks > 1 else "")
            self.progress(f"  {opt.name}, {how}: {size_text(opt.peak)} ({verdict})")
        return opt, art

    def first_fit(
        self, name: str, trainable: list[str] | None, channels=None
    ) -> tuple[Option, TrainingArtifact] | None:
        """The least memory-saving with which these tensors fit, or None: each recomputation level, then the
        frozen part in 2, 4, 8, ... chunks of the batch at the level that needed least."""
        best: tuple[Option, TrainingArtifact] | None = None
        for level in LEVELS:
            found = self.weigh(name, trainable, level, 1, channels)
            assert found is not None
            if found[0].peak <= self.budget:
                return found
            best = found if best is None or found[0].peak < best[0].peak else best
        assert best is not None
        batch = _batch(best[1])
        chunks = 2
        while chunks <= batch and batch % chunks == 0:
            found = self.weigh(name, trainable, best[0].recompute, chunks, channels)
            if found is None:
                return None
            if found[0].peak <= self.budget:
                return found
            chunks *= 2
        return None

    def largest_k(self, name: Callable[[int], str], pick: Callable[[int], list[str]], n: int, channels=None):
        """(the largest k in 1..n that fits at some recomputation level, that option with the least recomputation
        that does) (binary search: the step's memory grows with k); None when even k = 1 does not fit. channels(k):
        the weights of the k layers that train on their first input channels alone."""
        lo, hi, best = 1, n, None
        while lo <= hi:
            k = (lo + hi) // 2
            found = self.first_fit(name(k), pick(k), None if channels is None else channels(k))
            if found is not None:
                best, lo = (k, found), k + 1
            else:
                hi = k - 1
        return best


def _batch(art: TrainingArtifact) -> int:
    shape = art.graph.values[art.data_inputs[0]].shape
    return int(shape[0]) if shape else 1


def _values(art: TrainingArtifact) -> int:
    return int(sum(np.asarray(art.initial[p]).size for p in art.parameters))


def layers(art: TrainingArtifact) -> list[list[str]]:
    """The trainable parameters grouped by layer, in the forward's order: a layer is the node that first reads a
    weight (through rearranging ops), with the biases read right after it."""
    roles = art.roles.entries if art.roles is not None else {}
    position = {n.name: k for k, n in enumerate(art.inference.nodes)}
    readers = {
        n: min((position[r] for r in roles[n].nodes if r in position), default=len(position))
        if n in roles
        else len(position)
        for n in art.parameters
    }
    out: list[list[str]] = []
    last_reader = None
    for p in sorted(art.parameters, key=lambda q: (readers[q], art.parameters.index(q))):
        is_bias = p in roles and roles[p].role.startswith("bias")
        if out and (is_bias or readers[p] == last_reader):
            out[-1].append(p)
        else:
            out.append([p])
        last_reader = readers[p] if not is_bias else last_reader
    return out


def biases(art: TrainingArtifact) -> list[str]:
    roles = art.roles.entries if art.roles is not None else {}
    return [p for p in art.parameters if p in roles and roles[p].role.startswith("bias")]


def _everything(s: Search) -> tuple[tuple[Option, TrainingArtifact] | None, TrainingArtifact]:
    """Every parameter asked for, with the least memory-saving that fits (or None), and its artifact (for the
    layers the other options choose among)."""
    name = "every parameter asked" if s.trainable is not None else "every parameter"
    found = s.first_fit(name, s.trainable)
    if found is not None:
        return found, found[1]
    art = s.build(s.trainable, LEVELS[0], 1)
    assert art is not None
    return None, art


def _partial(s: Search, full: TrainingArtifact, *, every_level: bool):
    """The layer options, from the most trained to the least: every bias + the last k layers, then the last k
    layers, each family in full or on a quarter of the layers' input channels (the variant that reaches more
    layers); the first family's best fit (every_level: the last family is searched too, for check)."""
    groups, bias = layers(full), biases(full)
    n = len(groups)
    if n < 2:
        return None
    found = _family(s, full, groups, bias, every_level=every_level)
    if found is None or every_level:
        alone = _family(s, full, groups, [], every_level=every_level)
        found = found or alone
    return None if found is None else found[1]


def _family(
    s: Search, full: TrainingArtifact, groups: list[list[str]], bias: list[str], *, every_level: bool
):
    """(k, option) for the largest k such that `bias` + the last k layers fit, in full or with each splittable
    weight among them on its first 1/CHANNEL_SHARE input channels (edgetrain.derive.channels): the variant with
    the larger k, the full one on a tie; None when neither fits. The split variant is searched when the full one
    stops short of every layer but the first (every_level: always)."""
    n = len(groups)
    head = "every bias + " if bias else ""

    def pick(k: int) -> list[str]:
        return list(dict.fromkeys(bias + [p for g in groups[n - k :] for p in g]))

    found = s.largest_k(lambda k: f"{head}the last {k} of {n} layers", pick, n - 1)
    sites = _sites(full)
    if not sites or (found is not None and found[0] >= n - 1 and not every_level):
        return found

    def channels(k: int) -> dict[str, int]:
        return {p: sites[p] // CHANNEL_SHARE for g in groups[n - k :] for p in g if p in sites}

    sparse = s.largest_k(
        lambda k: f"{head}the last {k} of {n} layers, on 1/{CHANNEL_SHARE} of their input channels",
        pick,
        n - 1,
        channels=channels,
    )
    return sparse if sparse is not None and (found is None or sparse[0] > found[0]) else found


def _sites(full: TrainingArtifact) -> dict[str, int]:
    """{weight: input channels} of the weights that can train on part of their input channels (at least
    CHANNEL_SHARE of them); none for an int8 model, whose weights stay whole."""
    if full.section(QuantizedSection) is not None or full.roles is None:
        return {}
    found = splittable(full.inference, full.roles)
    return {w: total for w, (_, _, total) in found.items() if total >= CHANNEL_SHARE}


def fit(build: Build, budget: int, *, trainable, adapters: bool, progress=None) -> TrainingArtifact:
    """The artifact of the first option that fits the budget (see the module's docstring), with the options
    weighed and the choice explained in its notes and header; ModelError when none fits."""
    s = Search(build, budget, trainable=trainable, progress=progress)
    chosen, full = _everything(s)
    if chosen is None and not adapters:
        chosen = _partial(s, full, every_level=False)
    if chosen is None:
        smallest = min(s.weighed, key=lambda o: o.peak)
        raise ModelError(
            f"no way to train this model fits a memory budget of {size_text(budget)}: the smallest planned peak "
            f"is {size_text(smallest.peak)} ({smallest.name}, recompute {smallest.recompute}); give a budget of "
            "at least that, or train at a smaller batch size (`edgetrain check --memory-budget` lists the options)"
        )
    opt, art = chosen
    record = {
        "budget_bytes": budget,
        "chosen": opt.to_dict(budget),
        "weighed": [o.to_dict(budget) for o in s.weighed],
    }
    art.sections[MemoryBudgetSection.KEY] = MemoryBudgetSection(record)
    chunked = f", frozen part in {opt.chunks} chunks" if opt.chunks > 1 else ""
    art.notes.append(
        f"memory budget {size_text(budget)}: trains {opt.name} ({len(opt.trainable)} tensors, {opt.values:,} "
        f"values), recompute {opt.recompute}{chunked}: {size_text(opt.peak)} counted; {len(s.weighed)} option(s) "
        "weighed (`edgetrain check --memory-budget` lists them)"
    )
    return art


def options(build: Build, budget: int, *, trainable, adapters: bool, progress=None):
    """(the options `check --memory-budget` shows, the one `fit` picks or None): every parameter at each
    recomputation level, each layer family's search for its largest k, and the head at each level."""
    s = Search(build, budget, trainable=trainable, progress=progress)
    pick, full = _everything(s)
    weighed = {o.recompute for o in s.weighed}
    for level in LEVELS:  # _everything stops at the first fit: weigh the rest too (once each)
        if level not in weighed:
            s.weigh(s.weighed[0].name, trainable, level)
    groups = layers(full)
    if not adapters and len(groups) >= 2:
        partial = _partial(s, full, every_level=True)
        pick = pick or partial
        s.first_fit(f"the head (1 of {len(groups)} layers)", groups[-1])
    return s.weighed, (None if pick is None else pick[0])
