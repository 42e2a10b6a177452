"""The training artifact's record (numpy only; both sides): the typed form of an `.etrain` file's header.

The build side (edgetrain.derive.artifact) makes an ArtifactRecord and writes it (to_header); the device side
(edgetrain.runtime.artifact) reads one back with ArtifactRecord.read, the one place a header is checked: each
field's type, range and finiteness by its definition (edgetrain.graph.fields), the names it gives against the graphs
that hold them, the memory plans against their programs, the initial values against the program's declarations.
No other module reads the header by key: they read the record's fields. The rewrites of the model (re-batching,
int8, LoRA adapters, the channel split, the input pipeline, the memory budget, and any new one) each own a section
of it (edgetrain.graph.sections).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from edgetrain.core.declared import DTYPES, declared_nbytes, short
from edgetrain.core.errors import ArtifactError, ArtifactLimitError
from edgetrain.core.ir import Graph
from edgetrain.core.plan import MemoryPlan
from edgetrain.core.serialize import graph_to_dict

from .fields import (
    NOTHING,
    SAYS_NUMBER,
    Choice,
    Flag,
    GraphPart,
    Integer,
    Name,
    NameMap,
    Names,
    Obj,
    Optional,
    Pair,
    Part,
    PlanPart,
    Reader,
    Real,
    Spec,
    Text,
    header_key,
    read_field,
    read_fields,
    spec,
    spec_fields,
    to_json,
)
from .sections import Section, read_sections, section_json

S = TypeVar("S", bound=Section)

FLOAT32_MAX = float(np.finfo(np.float32).max)  # the largest learning rate a float32 step holds

# Optimizer state declared zero (not stored) may be at most this many bytes per byte of parameters (SGD keeps one
# momentum, Adam two moments), plus 1 MiB: a file that declares more is refused before anything is allocated.
ZERO_STATE_PER_PARAMETER_BYTE = 4
CLASS_LOSSES = ("CrossEntropyLoss", "NextTokenLoss")  # losses whose targets are class labels
STATE_KINDS = ("momentum", "exp_avg", "exp_avg_sq", "step")  # the fused optimizers' state tensors


# ---- the parts of the record ------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class IORecord:
    """What a session feeds the step and reads from it, by name."""

    data_inputs: tuple[str, ...] = spec(Names())
    target: str = spec(Name())
    lr: str = spec(Name())
    loss: str = spec(Name())
    outputs: tuple[str, ...] = spec(Names())
    parameters: tuple[str, ...] = spec(Names())
    state: tuple[str, ...] = spec(Names())
    updates: dict[str, str] = spec(NameMap())

    @property
    def fed(self) -> set[str]:
        """Every name a session feeds the step."""
        return set(self.data_inputs) | {self.target, self.lr} | set(self.parameters) | set(self.state)

    def check(self, r: Reader) -> None:
        """Every name against the program: data and target its inputs, results its outputs, the loss one float."""
        program: Graph = r.context["program"]
        if not self.data_inputs or not self.outputs:
            raise r.bad("its io names no data input or no output")
        for key, names in (("data_inputs", self.data_inputs), ("target", [self.target])):
            with r.field(key):
                for name in names:
                    if name not in program.inputs:
                        raise r.bad(
                            f"its io names {short(name)} a data input, but the program has no such input"
                        )
        for key, names in (
            ("loss", [self.loss]),
            ("outputs", self.outputs),
            ("updates", self.updates.values()),
        ):
            with r.field(key):
                for name in names:
                    if name not in program.outputs:
                        raise r.bad(
                            f"its io names {short(name)} a result, but the program does not output it"
                        )
        with r.field("loss"):
            info = program.values.get(self.loss)
            if info is None or not info.is_static or int(np.prod(info.shape)) != 1 or info.dtype.kind != "f":
                raise r.bad(f"its loss {short(self.loss)} is declared {info}, not one floating-point number")
        # checks that tie two fields together name the io settings as a whole
        stray = [k for k in self.updates if k not in set(self.parameters) | set(self.state)]
        if stray:
            raise r.bad(f"its io updates {short(stray[0])}, which is no parameter or state")
        fed_by_nothing(r, program, self, "program")


def fed_by_nothing(r: Reader, program: Graph, io: IORecord, what: str) -> None:
    """Every input of the program is something a session feeds: data, target, lr, a parameter or state."""
    unfed = [i for i in program.inputs if i not in io.fed]
    if unfed:
        raise r.bad(f"its {what} has the input {short(unfed[0])}, which no data, parameter or state feeds")


def _is(*kinds: str):
    return lambda d: d.get("type") in kinds


@dataclass(frozen=True, kw_only=True)
class LossRecord:
    """The loss's settings (its whole config as `config`): what the device reads of them, typed."""

    config: dict[str, Any]
    type: str = spec(Text(), label="loss's type")
    reduction: str = spec(Choice("mean", "sum"), label="loss's reduction", default="mean")
    ignore_index: int | None = spec(
        Optional(Integer()), label="loss's ignore_index", says=SAYS_NUMBER, default=None
    )
    class_axis: int = spec(Integer(), label="loss's class_axis", default=1)

    @property
    def classes(self) -> bool:
        """Whether its targets are class labels."""
        return self.type in CLASS_LOSSES

    def check(self, r: Reader) -> None:
        """A class loss's class axis is an axis of the model's output past the batch, of a known size."""
        program: Graph | None = r.context.get("program")
        io: IORecord | None = r.context.get("io")
        if not self.classes or program is None or io is None:
            return
        out = program.values.get(io.outputs[0])
        shape = None if out is None else out.shape
        axis, rank = self.class_axis, len(shape) if shape else 0
        ok = rank >= 2 and -rank <= axis < rank and axis % rank != 0
        if not ok or type(shape[axis]) is not int or shape[axis] < 1:
            with r.field("class_axis"):
                raise r.bad(
                    f"it trains with {self.type}, but its output '{io.outputs[0]}' declares "
                    f"{out if out is not None else 'no shape'}, with no known number of classes along its class "
                    f"axis {axis!r}"
                )

    def class_count(self, program: Graph, output: str) -> int | None:
        """The number of classes along the class axis of the model's output (None: not a class loss)."""
        return int(program.values[output].shape[self.class_axis]) if self.classes else None


def _number(what: str = "a valid number") -> Real:
    return Real(what=what)


@dataclass(frozen=True, kw_only=True)
class OptimizerRecord:
    """The optimizer's settings (its whole config as `config`): what the device reads of them, typed. The fused
    optimizers' settings (SGD, Adam, AdamW) are checked for those types alone."""

    config: dict[str, Any]
    type: str = spec(Text(), label="optimizer's type")
    lr: float = spec(Real(below=FLOAT32_MAX), label="learning rate", says=SAYS_NUMBER, default=0.0)
    clip_grad_norm: float | None = spec(
        Optional(Real()), label="clip_grad_norm", says=SAYS_NUMBER, default=None
    )
    weight_decay: float = spec(_number(), default=0.0, when=_is("SGD", "Adam", "AdamW"))
    momentum: float = spec(_number(), default=0.0, when=_is("SGD"))
    dampening: float = spec(_number(), default=0.0, when=_is("SGD"))
    nesterov: bool = spec(Flag(), default=False, when=_is("SGD"))
    betas: tuple[float, float] = spec(Pair(Real(below=1.0)), default=(0.9, 0.999), when=_is("Adam", "AdamW"))
    eps: float = spec(_number(), default=1e-8, when=_is("Adam", "AdamW"))


# the fused optimizers' settings that must be present (an SGD config always writes them)
_REQUIRED_SETTINGS = {"SGD": ("momentum", "weight_decay", "dampening", "nesterov")}
_REQUIRED_SETTINGS.update({t: ("betas", "eps", "weight_decay") for t in ("Adam", "AdamW")})


def _optimizer(d: Any, r: Reader) -> OptimizerRecord:
    kind = d.get("type") if isinstance(d, dict) else None
    for key in _REQUIRED_SETTINGS.get(kind, ()) if isinstance(kind, str) else ():
        if key not in d:
            with r.field(key):
                raise r.bad(f"its {kind} setting '{key}' is missing, not a valid setting")
    return read_fields(OptimizerRecord, d, r, where="optimizer settings", prefix=f"{kind} setting", config=d)


@dataclass(frozen=True, kw_only=True)
class FusedRecord:
    """The step without its update nodes, for the runtime's fused optimizer: its program and plan, each parameter's
    gradient output, and each state tensor's role (kind, parameter)."""

    program: Graph = spec(GraphPart("fused step program"))
    plan: MemoryPlan = spec(PlanPart("program", "fused step's memory plan"))
    gradients: dict[str, str] = spec(
        NameMap(), label="fused step's gradients", says="its {label} are {value}, not {what}"
    )
    state_roles: dict[str, tuple[str, str]] = spec(
        Obj(), label="fused step's state roles", says="its {label} are {value}, not {what}"
    )

    def check(self, r: Reader) -> None:
        io: IORecord = r.context["io"]
        initial: dict[str, np.ndarray] = r.context["initial_values"]
        with r.field("gradients"):
            _gradients(r, self.gradients, io, self.program, initial)
        with r.field("state_roles"):
            roles = _state_roles(r, self.state_roles, io, initial)
        object.__setattr__(self, "state_roles", roles)
        with r.field("program"):
            fed_by_nothing(r, self.program, io, "fused step program")
            if io.loss not in self.program.outputs:
                raise r.bad(f"its fused step program does not output the loss '{io.loss}'")

    def to_json(self, prog: dict, plan: dict) -> dict[str, Any]:
        roles = {name: list(role) for name, role in self.state_roles.items()}
        return {"program": prog, "plan": plan, "gradients": self.gradients, "state_roles": roles}


def _gradients(r: Reader, grads: dict, io: IORecord, fprogram: Graph, initial: dict) -> None:
    """parameter -> the fused step's output holding its gradient, declared of the parameter's shape and dtype
    (the session's flat gradient buffers are made of the parameters' shapes)."""
    for p in io.parameters:
        if p not in grads:
            raise r.bad(f"its fused step names no gradient for the parameter {short(p)}")
        info, w = fprogram.values.get(grads[p]), initial[p]
        const = fprogram.initializers.get(grads[p])
        if const is not None and (const.shape != w.shape or const.dtype != w.dtype):
            raise r.bad(f"the gradient {short(grads[p])} of {short(p)} is a constant not of its shape")
        if grads[p] in fprogram.outputs and (
            info is None
            or not info.is_static
            or tuple(info.shape) != w.shape
            or np.dtype(info.dtype) != w.dtype
        ):
            raise r.bad(
                f"the gradient {short(grads[p])} of {short(p)} is declared {info}, not {w.dtype}{list(w.shape)} "
                "like its parameter"
            )


def _state_roles(r: Reader, roles: dict, io: IORecord, initial: dict) -> dict[str, tuple[str, str]]:
    """state name -> (kind, parameter): a known kind of an optimizer state of a parameter's shape and dtype."""
    out = {}
    for name, role in roles.items():
        if not (isinstance(role, list) and len(role) == 2 and all(isinstance(x, str) for x in role)):
            raise r.bad(f"the fused role of {short(name)} is {short(role)}, not [kind, parameter]")
        kind, weight = role
        if name not in io.state or kind not in STATE_KINDS:
            raise r.bad(
                f"the fused role of {short(name)} is {short(role)}: no state, or no kind of {STATE_KINDS}"
            )
        if kind != "step":
            if weight not in io.parameters:
                raise r.bad(f"the fused role of {short(name)} names {short(weight)}, which is no parameter")
            a, w = initial[name], initial[weight]
            if a.shape != w.shape or a.dtype != w.dtype:
                raise r.bad(f"the state {short(name)} is not of the shape and dtype of {short(weight)}")
        elif initial[name].size != 1:
            raise r.bad(f"the step count {short(name)} is not a single number")
        out[name] = (kind, weight)
    unroled = [n for n in io.state if n not in out]
    if unroled:  # the fused optimizer owns every state tensor: one without a role would never be fed
        raise r.bad(f"its fused step gives the state {short(unroled[0])} no role")
    return out


@dataclass(frozen=True, kw_only=True)
class ProvenanceRecord:
    """Where the model came from: the ONNX model's digest and file name (none for a graph given in Python)."""

    source_sha256: str = spec(Text(), label="provenance's source_sha256", default="")
    source: str | None = spec(Optional(Text()), label="provenance's source", default=None)


class OptimizerPart(Part):
    """The optimizer's settings: the fused optimizers' own settings checked for their types alone."""

    def __init__(self):
        super().__init__(OptimizerRecord, "optimizer settings", "optimizer", keep_config=True)

    def read(self, v: Any, r: Reader, values: dict[str, Any], refuse) -> OptimizerRecord:
        if not isinstance(v, dict):
            raise refuse(v)
        return _optimizer(v, r)


class ZeroPart(Spec):
    """Optimizer state that starts at zero, declared (dtype, shape), not stored: {name: [dtype, shape]}, each of
    exactly the dtype and shape the program declares for that state tensor, their bytes bounded."""

    what = "an object"

    def accepts(self, v):
        return isinstance(v, dict)

    def read(self, v, r, values, refuse):
        if not self.accepts(v):
            raise refuse(v)
        program, io = values["program"], values["io"]
        zero_bytes = 0
        for name, spec_ in v.items():
            if name not in io.state:
                raise r.bad(
                    f"it declares a zero initial value for {short(name)}, which is no optimizer state"
                )
            info = program.values.get(name)
            want = (
                None if info is None or not info.is_static else [np.dtype(info.dtype).name, list(info.shape)]
            )
            if spec_ != want:
                raise r.bad(
                    f"its declared zero state {short(name)} is {short(spec_)}, but the program declares "
                    f"{short(want)} for it"
                )
            try:
                zero_bytes += declared_nbytes(spec_[1], np.dtype(spec_[0]).itemsize)
            except (TypeError, ValueError) as e:
                raise r.bad(f"its declared zero state {short(name)} is impossible: {e}") from None
        r.context["zero_bytes"] = zero_bytes
        return dict(v)

    def breaking(self):
        return [[1, 2], "x", {GHOST_STATE: ["float32", [2]]}]


GHOST_STATE = "no-such-state"


class InitialPart(Names):
    """The names of the stored initial values; reading them makes every parameter's and state tensor's initial
    value (stored, or a declared zero of exactly what the program declares), into the reader's context."""

    def read(self, v: Any, r: Reader, values: dict[str, Any], refuse) -> tuple[str, ...]:
        if not self.accepts(v):
            raise refuse(v)
        r.context["initial_values"] = initial_values(
            r, v, values.get("zeros", {}), values["program"], values["io"]
        )
        return tuple(v)


def initial_values(
    r: Reader, stored: list, zeros: dict, program: Graph, io: IORecord
) -> dict[str, np.ndarray]:
    """Initial parameters and state: stored tensors, or declared zeros of exactly the shape and dtype the program
    declares for them (so nothing is allocated that the program's bounded values do not declare)."""
    initial = {}
    for name in stored:
        if name not in r.tensors:
            raise r.bad(f"its initial value {short(name)} is not among its tensors")
        initial[name] = r.tensors[name]
    zero_bytes = r.context.get("zero_bytes", 0)
    param_bytes = sum(initial[p].nbytes for p in io.parameters if p in initial)
    # Optimizer state is a few tensors per parameter (SGD's momentum, Adam's two moments, a step count).
    budget = ZERO_STATE_PER_PARAMETER_BYTE * param_bytes + (1 << 20)
    if zero_bytes > budget:
        raise ArtifactLimitError(
            f"'{r.path}' declares {zero_bytes} bytes of zero optimizer state, more than "
            f"{ZERO_STATE_PER_PARAMETER_BYTE}x its {param_bytes} bytes of parameters (+1 MiB) that any optimizer "
            "of edgetrain keeps; it is damaged or hostile",
            limit=budget,
            needed=zero_bytes,
            path=r.path,
        )
    for name, (dtype, shape) in zeros.items():
        initial[name] = _zeros(dtype, shape)
    return _owned(r, initial, program, io)


def _owned(r: Reader, initial: dict, program: Graph, io: IORecord) -> dict[str, np.ndarray]:
    """The initial value of each parameter and state tensor, of the dtype and shape the program declares."""
    out = {}
    for name in io.parameters + io.state:
        if name not in initial:
            with r.field("io.parameters" if name in io.parameters else "io.state", root=True):
                raise r.bad(
                    f"it holds no initial value for {short(name)} (none among its 'initial' tensors, none declared "
                    "in its 'zeros')"
                )
        info = program.values.get(name)
        a = initial[name]
        if (
            info is None
            or np.dtype(info.dtype) != a.dtype
            or (info.is_static and tuple(info.shape) != a.shape)
        ):
            raise r.bad(
                f"the initial value of {short(name)} is {a.dtype}{list(a.shape)}, but the program declares "
                f"{info if info is not None else 'nothing'} for it"
            )
        if name in io.parameters and a.dtype.kind != "f":
            raise r.bad(f"its parameter {short(name)} is {a.dtype}, not floating point")
        out[name] = a
    return out


def _zeros(dtype: str, shape: list[int]) -> np.ndarray:
    """A declared zero state tensor, of a dtype and shape already checked (declared_nbytes) and bounded; np.zeros of a
    large shape costs no memory until it is written."""
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ArtifactError(
            f"a declared zero tensor needs a dtype of {', '.join(sorted(DTYPES))}, not {dtype!r}"
        )
    declared_nbytes(shape, np.dtype(dtype).itemsize)  # ValueError for a shape numpy cannot make
    return np.zeros(shape, np.dtype(dtype))


_ARE = "its {label} are {value}, not {what}"


@dataclass(frozen=True, kw_only=True)
class ArtifactRecord:
    """A training artifact's header, typed: the step's program and memory plan, the inference graph, the io names,
    the optimizer's and loss's settings, the fused step, provenance, and the rewrites' sections; `values` holds the
    initial value of every parameter and state tensor (stored or declared zero), read with it."""

    values: dict[str, np.ndarray]
    sections: dict[str, Section]
    program_id: str = spec(Text(), label="program_id")
    optimizer: OptimizerRecord = spec(OptimizerPart(), label="optimizer settings", says=_ARE)
    loss: LossRecord = spec(
        Part(LossRecord, "loss settings", "loss", keep_config=True), label="loss settings", says=_ARE
    )
    program: Graph = spec(GraphPart("program"))
    base: Graph = spec(GraphPart("inference graph"))
    plan: MemoryPlan = spec(PlanPart("program", "memory plan"))
    io: IORecord = spec(Part(IORecord, "io settings", "io"), label="io settings", says=_ARE)
    zeros: dict[str, list] = spec(ZeroPart(), label="'zeros'", default={})
    initial: tuple[str, ...] = spec(InitialPart(), label="'initial'")
    fused: FusedRecord | None = spec(
        Optional(Part(FusedRecord, "fused step", "fused step")), label="'fused'", default=None
    )
    provenance: ProvenanceRecord = spec(
        Part(ProvenanceRecord, "provenance", "provenance"), label="provenance", default=ProvenanceRecord()
    )
    edgetrain_version: str = spec(Text(), label="edgetrain_version", default="")

    @classmethod
    def read(
        cls, header: Any, tensors: dict[str, np.ndarray], *, path: str, max_arena_bytes: int | None = None
    ) -> ArtifactRecord:
        """The record of a header (and the file's tensors), every field checked (see the module docstring)."""
        r = Reader(path, tensors=tensors, max_arena=max_arena_bytes)
        if not isinstance(header, dict):
            raise r.bad(f"its header is {short(header)}, not an object")
        values: dict[str, Any] = {}
        for f in spec_fields(cls):
            v = read_field(f, header, r, prefix="header", values=values)
            if v is not NOTHING:
                values[f.name] = r.context[f.name] = v
        own = {header_key(f) for f in spec_fields(cls)}
        record = cls(values=r.context["initial_values"], sections=read_sections(header, r, own), **values)
        record.check(r)
        return record

    def check(self, r: Reader) -> None:
        """What ties the parts together: the inference graph's inputs are data inputs; a class loss's classes."""
        if not self.base.outputs or any(
            i not in self.io.data_inputs and i not in self.base.initializers for i in self.base.inputs
        ):
            with r.field("base"):
                raise r.bad(
                    "its inference graph has no output, or an input that is no data input of the model"
                )
        with r.field("loss"):
            self.loss.check(r)

    def section(self, cls: type[S]) -> S | None:
        """The section of that kind, if the artifact has one."""
        s = self.sections.get(cls.KEY)
        return s if isinstance(s, cls) else None

    @property
    def n_classes(self) -> int | None:
        """The model's classes when it trains with a class loss (labels lie in [0, n_classes)), else None."""
        return self.loss.class_count(self.program, self.io.outputs[0])

    @property
    def batch(self) -> int | None:
        """The batch size the training program was built for (None when it is symbolic)."""
        shape = self.program.values[self.io.data_inputs[0]].shape
        return int(shape[0]) if shape and isinstance(shape[0], (int, np.integer)) else None

    def write(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The header and tensors of the artifact file: the graphs serialized (edgetrain.core.serialize), the
        initial values stored but for optimizer state that starts at zero (declared, not stored: for Adam two
        thirds of the file; the record's own `initial` and `zeros` are ignored, they are decided here), the
        program's id, and the sections with their tensors. Deterministic: the same record, the same bytes."""
        prog_dict, tensors = graph_to_dict(self.program)
        fused = None
        if self.fused is not None:  # the step without its update nodes, planned on its own
            fdict, ftensors = graph_to_dict(self.fused.program)
            _merge(tensors, ftensors, "the fused step")
            fused = self.fused.to_json(fdict, self.fused.plan.to_dict())
        base_dict, base_tensors = graph_to_dict(self.base)
        _merge(tensors, base_tensors, "the base graph")
        state = set(self.io.state)
        zeros = {
            name: [arr.dtype.name, [int(d) for d in arr.shape]]
            for name, arr in self.values.items()
            if name in state and name not in tensors and not np.any(arr)
        }
        for name, arr in self.values.items():
            if name not in zeros:
                _merge(tensors, {name: arr}, "the initial values")
        io = to_json(self.io)
        header = {
            "edgetrain_version": self.edgetrain_version,
            "program": prog_dict,
            "program_id": program_id(prog_dict, io),
            "plan": self.plan.to_dict(),
            "base": base_dict,
            "io": io,
            "initial": [n for n in self.values if n not in zeros],
            "zeros": zeros,
            "fused": fused,
            "loss": self.loss.config,
            "optimizer": self.optimizer.config,
            "provenance": to_json(self.provenance, skip_defaults=True),
        }
        own, stored = section_json(self.sections)
        header.update(own)
        _merge(tensors, stored, "a section")
        return header, tensors


def _merge(tensors: dict[str, np.ndarray], more: dict[str, np.ndarray], what: str) -> None:
    """Adds `more` to the file's tensors; a name both hold must hold the same array."""
    for name, arr in more.items():
        if name in tensors:
            assert tensors[name] is arr or np.array_equal(tensors[name], arr), (
                f"tensor '{name}' differs in {what}"
            )
        tensors.setdefault(name, arr)


def program_id(program: dict[str, Any], io: dict[str, Any]) -> str:
    """What a checkpoint is bound to: a hash of the training program's structure and interface (not of the
    weights), so a checkpoint of one model is refused by a session of another."""
    blob = json.dumps({"program": program, "io": io}, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def loss_record(config: dict[str, Any]) -> LossRecord:
    """The build side's record of a loss's config (the ILoss's own: trusted, not checked)."""
    return LossRecord(config=config, **_known(LossRecord, config))


def optimizer_record(config: dict[str, Any]) -> OptimizerRecord:
    """The build side's record of an optimizer's config (the IOptimizer's own: trusted, not checked)."""
    rec = OptimizerRecord(config=config, **_known(OptimizerRecord, config))
    return rec


def _known(cls: type, config: dict[str, Any]) -> dict[str, Any]:
    """The fields of a settings record that config holds (None where it leaves a setting out)."""
    names = {header_key(f): f.name for f in spec_fields(cls)}
    out = {names[k]: v for k, v in config.items() if k in names and v is not None}
    if "betas" in out:
        out["betas"] = tuple(out["betas"])
    return out
