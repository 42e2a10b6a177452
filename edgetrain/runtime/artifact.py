"""One `.etrain` file -> LoadedArtifact (numpy only): the planned training program, the inference graph for run()
and export, the initial parameters and optimizer state, the io and optimizer settings, provenance
(edgetrain.derive.artifact writes it).

Loading trusts nothing a file says (anyone can recompute its checksum): every field's type, every graph (names
defined before use, ops the runtime has), the memory plan against its program (plan.check_plan), the io names
against the program, declared shapes against bounds. A bad artifact is an ArtifactError (ArtifactLimitError when it
asks for more than a bound) naming the file and the first fault."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edgetrain.core import container
from edgetrain.core import plan as plans
from edgetrain.core.artifact_format import IO_KEYS, ZERO_STATE_PER_PARAMETER_BYTE
from edgetrain.core.container import read_container
from edgetrain.core.declared import DTYPES, declared_nbytes
from edgetrain.core.declared import short as _short
from edgetrain.core.errors import ArtifactError, ArtifactLimitError, ConfigError
from edgetrain.core.ir import Graph
from edgetrain.core.plan import MemoryPlan, check_plan
from edgetrain.core.serialize import check_graph, graph_from_dict
from edgetrain.graph.rebatch import BatchPlan

if TYPE_CHECKING:
    from edgetrain.core.plan import MemoryPlan


@dataclass
class LoadedArtifact:
    """What a device needs from an artifact file, read with numpy alone (tensors are read-only memory maps)."""

    path: str
    header: dict[str, Any]
    program: Graph
    base: Graph
    plan: MemoryPlan
    initial: dict[str, np.ndarray]
    tensors: dict[str, np.ndarray]
    batch_plan: BatchPlan | None = None
    fused: dict[str, Any] | None = None  # {"program": Graph, "plan": MemoryPlan, "gradients", "state_roles"}
    # an int8 model's: {"form": str, "weights": [QuantWeight], "constants": {name: array}, "model": () -> the int8
    # Graph the export writes again (read on first use)}
    quantized: dict[str, Any] | None = None
    # LoRA adapters inserted at convert: {"config": dict, "modules": [edgetrain.graph.adapters.LoraModule]}
    adapters: dict[str, Any] | None = None
    # layers that train on a subset of their input channels: [edgetrain.graph.channels.ChannelSplit]
    channels: list[Any] | None = None

    @property
    def io(self) -> dict[str, Any]:
        return self.header["io"]

    @property
    def program_id(self) -> str:
        return self.header["program_id"]


def load_artifact(
    path: str | os.PathLike,
    *,
    verify: bool = True,
    max_header_bytes: int | None = None,
    max_arena_bytes: int | None = None,
) -> LoadedArtifact:
    """Reads and checks an artifact (see the module docstring). max_header_bytes bounds its header
    (container.MAX_HEADER_BYTES), max_arena_bytes its memory plans' arenas and every value it declares
    (plan.MAX_ARENA_BYTES)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(
            "an artifact is read from its file: give the path (str or os.PathLike) of an .etrain file, not a value "
            f"of type {type(path).__name__}"
        )
    path = os.fspath(path)
    max_header = container.MAX_HEADER_BYTES if max_header_bytes is None else max_header_bytes
    max_arena = plans.MAX_ARENA_BYTES if max_arena_bytes is None else max_arena_bytes
    header, tensors = read_container(path, kind="artifact", verify=verify, max_header_bytes=max_header)
    at = f"'{path}'"

    def graph(d: Any, what: str) -> Graph:
        g = graph_from_dict(d, tensors, where=f"{at}: its {what}")
        check_graph(g, f"{at}: its {what}", max_value_bytes=max_arena)
        return g

    def plan_of(d: Any, program: Graph, what: str) -> MemoryPlan:
        try:
            plan = MemoryPlan.from_dict(d)
        except ValueError as e:
            raise _bad(path, f"its {what} is malformed: {e}") from None
        check_plan(
            program,
            plan,
            where=f"{at}: its {what}",
            error=ArtifactError,
            limit_error=ArtifactLimitError,
            max_arena_bytes=max_arena,
        )
        return plan

    _fields(path, header)
    program = graph(header["program"], "program")
    base = graph(header["base"], "inference graph")
    plan = plan_of(header["plan"], program, "memory plan")
    io = _io(path, header["io"], program)
    if not base.outputs or any(
        i not in io["data_inputs"] and i not in base.initializers for i in base.inputs
    ):
        raise _bad(path, "its inference graph has no output, or an input that is no data input of the model")
    initial = _initial(path, header, tensors, program, io)
    batch_plan = _batch_plan(path, header)
    fused = None
    if header.get("fused") is not None:
        f = header["fused"]
        if not isinstance(f, dict) or any(
            k not in f for k in ("program", "plan", "gradients", "state_roles")
        ):
            raise _bad(path, "its fused step lacks 'program', 'plan', 'gradients' or 'state_roles'")
        fprogram = graph(f["program"], "fused step program")
        fused = {
            "program": fprogram,
            "plan": plan_of(f["plan"], fprogram, "fused step's memory plan"),
            "gradients": _gradients(path, f["gradients"], io, fprogram, initial),
            "state_roles": _state_roles(path, f["state_roles"], io, initial),
        }
        _fed(path, fprogram, io, "fused step program")
        if io["loss"] not in fprogram.outputs:
            raise _bad(path, f"its fused step program does not output the loss '{io['loss']}'")
    quantized = (
        None if header.get("quantized") is None else _quantized(path, header["quantized"], graph, io, tensors)
    )
    adapters = None if header.get("adapters") is None else _adapters(path, header["adapters"], io, base)
    channels = None if header.get("channels") is None else _channels(path, header["channels"], base)
    return LoadedArtifact(
        path, header, program, base, plan, initial, tensors, batch_plan, fused, quantized, adapters, channels
    )


def _channels(path: str, records: Any, base: Graph) -> list[Any]:
    """The split layers, checked against the inference graph: both halves of each weight initializers, each
    inserted node there."""
    from edgetrain.graph.channels import ChannelSplit  # only an artifact with split layers needs it

    if not isinstance(records, list):
        raise _bad(path, "its 'channels' is not a list of split layers")
    names = {n.name for n in base.nodes}
    out = []
    for d in records:
        try:
            s = ChannelSplit.from_dict(d)
            ok = {s.trained, s.frozen} <= set(base.initializers) and set(s.nodes) <= names and s.nodes
        except (TypeError, KeyError, AttributeError, ValueError) as e:
            raise _bad(
                path, f"its 'channels' lists a malformed split layer ({type(e).__name__}: {e})"
            ) from None
        if not ok:
            raise _bad(path, f"its split of '{s.weight}' names a tensor or node that is not in the artifact")
        out.append(s)
    return out


def _adapters(path: str, a: Any, io: dict, base: Graph) -> dict[str, Any]:
    """The adapted layers, checked against the inference graph: each adapter a trained parameter, each base
    weight an initializer, each inserted node there."""
    from edgetrain.graph.adapters import LoraModule  # only an artifact with adapters needs it

    if (
        not isinstance(a, dict)
        or not isinstance(a.get("config"), dict)
        or not isinstance(a.get("modules"), list)
    ):
        raise _bad(path, "its adapters lack 'config' or 'modules'")
    names = {n.name for n in base.nodes}
    modules = []
    for d in a["modules"]:
        try:
            m = LoraModule.from_dict(d)
            ok = (
                {m.A, m.B} <= set(io["parameters"])
                and m.weight in base.initializers
                and set(m.nodes) <= names
                and m.merge in ("same", "transposed")
                and float(m.scale) > 0
            )
        except (TypeError, KeyError, AttributeError, ValueError) as e:
            raise _bad(path, f"its adapters list a malformed layer ({type(e).__name__}: {e})") from None
        if not ok:
            raise _bad(
                path, f"its adapter of '{d.get('weight')}' names a tensor or node that is not in the artifact"
            )
        modules.append(m)
    return {"config": a["config"], "modules": modules}


def _batch_plan(path: str, header: dict) -> BatchPlan | None:
    if header.get("batch_plan") is None:
        return None
    try:
        return BatchPlan.from_dict(header["batch_plan"])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise _bad(path, f"its batch plan is malformed ({type(e).__name__}: {e})") from None


def _quantized(path: str, q: Any, graph, io: dict, tensors: dict[str, np.ndarray]) -> dict[str, Any]:
    """An int8 model's export: its form, the trained masters (each a parameter, its integer tensor in the int8
    model, its scale and zero point constants of the inference graph) and the int8 model itself, checked."""
    from edgetrain.graph.quantized import QuantWeight  # only an int8 model's artifact needs it

    if not isinstance(q, dict) or any(k not in q for k in ("form", "weights", "model", "constants")):
        raise _bad(path, "its int8 export lacks 'form', 'weights', 'constants' or 'model'")
    model_dict = q["model"]
    inits = model_dict.get("initializers") if isinstance(model_dict, dict) else None
    if not isinstance(inits, list):
        raise _bad(path, "its int8 model lists no initializers")
    names = q["constants"] if isinstance(q["constants"], list) else [None]
    if any(not isinstance(n, str) or n not in tensors for n in names):
        raise _bad(path, "its int8 export names a scale or zero point that is not in the file")
    consts = {n: tensors[n] for n in names}
    weights = []
    for d in q["weights"] if isinstance(q["weights"], list) else [None]:
        try:
            w = QuantWeight.from_dict(d)
        except (TypeError, AttributeError) as e:
            raise _bad(path, f"its int8 export lists a malformed weight ({e})") from None
        needed = [w.scale] + ([w.zero_point] if w.kind == "weight" else []) + list(w.scale_from)
        if w.name not in io["parameters"] or w.source not in inits or any(c not in consts for c in needed):
            raise _bad(
                path, f"its int8 export's weight '{w.name}' names a tensor that is not in the artifact"
            )
        weights.append(w)
    built: list[Graph] = []

    def model() -> Graph:
        """The int8 model, read and checked when first asked for (export, run): a phone that trains and never
        exports keeps no second graph."""
        if not built:
            built.append(graph(model_dict, "int8 model"))
        return built[0]

    return {"form": str(q["form"]), "weights": weights, "model": model, "constants": consts}


def _bad(path: str, what: str) -> ArtifactError:
    return ArtifactError(
        f"'{path}' is an edgetrain artifact, but {what}; it is damaged or was not made by edgetrain: rebuild it "
        "with `edgetrain convert`"
    )


def _number(v: Any) -> bool:
    """A finite JSON number >= 0 (not a bool)."""
    return type(v) in (int, float) and math.isfinite(v) and v >= 0


# What the fused optimizers read from their config, and what each must be.
_OPTIMIZER_FIELDS = {
    "SGD": {"momentum": "number", "weight_decay": "number", "dampening": "number", "nesterov": "bool"},
    "Adam": {"betas": "betas", "eps": "number", "weight_decay": "number"},
    "AdamW": {"betas": "betas", "eps": "number", "weight_decay": "number"},
}


def _fields(path: str, header: dict[str, Any]) -> None:
    """The header's own fields: present, of their types."""
    need = ("program", "base", "plan", "io", "initial", "program_id", "optimizer", "loss")
    missing = [k for k in need if k not in header]
    if missing:
        raise _bad(path, f"its header lacks '{missing[0]}'")
    if not isinstance(header["program_id"], str):
        raise _bad(path, f"its program_id is {_short(header['program_id'])}, not a string")
    opt, loss = header["optimizer"], header["loss"]
    if not isinstance(opt, dict) or not isinstance(opt.get("type"), str):
        raise _bad(path, f"its optimizer settings {_short(opt)} are not an object with a 'type'")
    if not _number(opt.get("lr", 0.0)):
        raise _bad(path, f"its learning rate {_short(opt.get('lr'))} is not a finite number >= 0")
    if opt.get("clip_grad_norm") is not None and not _number(opt["clip_grad_norm"]):
        raise _bad(path, f"its clip_grad_norm {_short(opt['clip_grad_norm'])} is not a finite number >= 0")
    for key, kind in _OPTIMIZER_FIELDS.get(opt["type"], {}).items():
        v = opt.get(key)
        ok = {
            "number": _number(v),
            "bool": isinstance(v, bool),
            "betas": isinstance(v, list) and len(v) == 2 and all(_number(b) and b < 1 for b in v),
        }[kind]
        if not ok:
            raise _bad(path, f"its {opt['type']} setting '{key}' is {_short(v)}, not a valid {kind}")
    if not isinstance(loss, dict) or not isinstance(loss.get("type"), str):
        raise _bad(path, f"its loss settings {_short(loss)} are not an object with a 'type'")
    ignore = loss.get("ignore_index")
    if ignore is not None and type(ignore) is not int:
        raise _bad(path, f"its loss's ignore_index {_short(ignore)} is not an int")
    for key in ("zeros", "batch_plan", "fused"):
        want = dict if key == "zeros" else (dict, type(None))
        if key in header and not isinstance(header[key], want):
            raise _bad(path, f"its '{key}' is {_short(header[key])}, not an object")


def _names(path: str, io: dict[str, Any], key: str) -> list[str]:
    v = io.get(key)
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _bad(path, f"its io '{key}' is {_short(v)}, not a list of names")
    return v


def _io(path: str, io: Any, program: Graph) -> dict[str, Any]:
    """The io settings, checked against the program: every name it feeds is an input, every result an output."""
    if not isinstance(io, dict):
        raise _bad(path, f"its io settings are {_short(io)}, not an object")
    for key in IO_KEYS:
        if key not in io:
            raise _bad(path, f"its io settings lack '{key}'")
    for key in ("target", "lr", "loss"):
        if not isinstance(io[key], str):
            raise _bad(path, f"its io '{key}' is {_short(io[key])}, not a name")
    for key in ("data_inputs", "outputs", "parameters", "state"):
        _names(path, io, key)
    if not io["data_inputs"] or not io["outputs"]:
        raise _bad(path, "its io names no data input or no output")
    updates = io["updates"]
    if not isinstance(updates, dict) or not all(isinstance(v, str) for v in updates.values()):
        raise _bad(path, f"its io 'updates' is {_short(updates)}, not an object of name -> name")
    owned = set(io["parameters"]) | set(io["state"])
    for name in io["data_inputs"] + [io["target"]]:
        if name not in program.inputs:
            raise _bad(path, f"its io names {_short(name)} a data input, but the program has no such input")
    for name in [io["loss"], *io["outputs"], *updates.values()]:
        if name not in program.outputs:
            raise _bad(path, f"its io names {_short(name)} a result, but the program does not output it")
    loss = program.values.get(io["loss"])
    if (
        loss is None
        or not loss.is_static
        or int(np.prod(loss.shape)) != 1
        or np.dtype(loss.dtype).kind != "f"
    ):
        raise _bad(path, f"its loss {_short(io['loss'])} is declared {loss}, not one floating-point number")
    stray = [k for k in updates if k not in owned]
    if stray:
        raise _bad(path, f"its io updates {_short(stray[0])}, which is no parameter or state")
    _fed(path, program, io, "program")
    return io


def _fed(path: str, program: Graph, io: dict[str, Any], what: str) -> None:
    """Every input of the program is something a session feeds: data, target, lr, a parameter or state."""
    fed = set(io["data_inputs"]) | {io["target"], io["lr"]} | set(io["parameters"]) | set(io["state"])
    unfed = [i for i in program.inputs if i not in fed]
    if unfed:
        raise _bad(
            path, f"its {what} has the input {_short(unfed[0])}, which no data, parameter or state feeds"
        )


def _initial(
    path: str, header: dict[str, Any], tensors: dict[str, np.ndarray], program: Graph, io: dict[str, Any]
) -> dict[str, np.ndarray]:
    """Initial parameters and state: stored tensors, or declared zeros of exactly the shape and dtype the program
    declares for them (so nothing is allocated that the program's bounded values do not declare)."""
    stored = header["initial"]
    if not isinstance(stored, list) or not all(isinstance(x, str) for x in stored):
        raise _bad(path, f"its 'initial' is {_short(stored)}, not a list of names")
    initial = {}
    for name in stored:
        if name not in tensors:
            raise _bad(path, f"its initial value {_short(name)} is not among its tensors")
        initial[name] = tensors[name]
    zeros = header.get("zeros", {})
    zero_bytes = 0
    for name, spec in zeros.items():
        if name not in io["state"]:
            raise _bad(
                path, f"it declares a zero initial value for {_short(name)}, which is no optimizer state"
            )
        info = program.values.get(name)
        want = None if info is None or not info.is_static else [np.dtype(info.dtype).name, list(info.shape)]
        if spec != want:
            raise _bad(
                path,
                f"its declared zero state {_short(name)} is {_short(spec)}, but the program declares "
                f"{_short(want)} for it",
            )
        zero_bytes += _zeros_bytes(path, name, *spec)
    param_bytes = sum(initial[p].nbytes for p in io["parameters"] if p in initial)
    # Optimizer state is a few tensors per parameter (SGD's momentum, Adam's two moments, a step count).
    budget = ZERO_STATE_PER_PARAMETER_BYTE * param_bytes + (1 << 20)
    if zero_bytes > budget:
        raise ArtifactLimitError(
            f"'{path}' declares {zero_bytes} bytes of zero optimizer state, more than "
            f"{ZERO_STATE_PER_PARAMETER_BYTE}x its {param_bytes} bytes of parameters (+1 MiB) that any optimizer "
            "of edgetrain keeps; it is damaged or hostile",
            limit=budget,
            needed=zero_bytes,
            path=path,
        )
    for name, (dtype, shape) in zeros.items():
        initial[name] = _zeros(dtype, shape)
    out = {}
    for name in io["parameters"] + io["state"]:
        if name not in initial:
            raise _bad(
                path,
                f"it holds no initial value for {_short(name)} (none among its 'initial' tensors, none declared in "
                "its 'zeros')",
            )
        info = program.values.get(name)
        a = initial[name]
        if (
            info is None
            or np.dtype(info.dtype) != a.dtype
            or (info.is_static and tuple(info.shape) != a.shape)
        ):
            raise _bad(
                path,
                f"the initial value of {_short(name)} is {a.dtype}{list(a.shape)}, but the program declares "
                f"{info if info is not None else 'nothing'} for it",
            )
        if name in io["parameters"] and a.dtype.kind != "f":
            raise _bad(path, f"its parameter {_short(name)} is {a.dtype}, not floating point")
        out[name] = a
    return out


def _zeros_bytes(path: str, name: str, dtype: str, shape: list[int]) -> int:
    try:
        return declared_nbytes(shape, np.dtype(dtype).itemsize)
    except (TypeError, ValueError) as e:
        raise _bad(path, f"its declared zero state {_short(name)} is impossible: {e}") from None


def _gradients(
    path: str, grads: Any, io: dict[str, Any], fprogram: Graph, initial: dict[str, np.ndarray]
) -> dict[str, str]:
    """parameter -> the fused step's output holding its gradient, declared of the parameter's shape and dtype
    (the session's flat gradient buffers are made of the parameters' shapes)."""
    if not isinstance(grads, dict) or not all(isinstance(v, str) for v in grads.values()):
        raise _bad(path, f"its fused step's gradients are {_short(grads)}, not an object of name -> name")
    for p in io["parameters"]:
        if p not in grads:
            raise _bad(path, f"its fused step names no gradient for the parameter {_short(p)}")
        info, w = fprogram.values.get(grads[p]), initial[p]
        const = fprogram.initializers.get(grads[p])
        if const is not None and (const.shape != w.shape or const.dtype != w.dtype):
            raise _bad(path, f"the gradient {_short(grads[p])} of {_short(p)} is a constant not of its shape")
        if grads[p] in fprogram.outputs and (
            info is None
            or not info.is_static
            or tuple(info.shape) != w.shape
            or np.dtype(info.dtype) != w.dtype
        ):
            raise _bad(
                path,
                f"the gradient {_short(grads[p])} of {_short(p)} is declared {info}, not {w.dtype}{list(w.shape)} "
                "like its parameter",
            )
    return dict(grads)


_ROLES = ("momentum", "exp_avg", "exp_avg_sq", "step")


def _state_roles(
    path: str, roles: Any, io: dict[str, Any], initial: dict[str, np.ndarray]
) -> dict[str, tuple[str, str]]:
    """state name -> (kind, parameter): a known kind of an optimizer state of a parameter's shape and dtype."""
    if not isinstance(roles, dict):
        raise _bad(path, f"its fused step's state roles are {_short(roles)}, not an object")
    out = {}
    for name, role in roles.items():
        if not (isinstance(role, list) and len(role) == 2 and all(isinstance(x, str) for x in role)):
            raise _bad(path, f"the fused role of {_short(name)} is {_short(role)}, not [kind, parameter]")
        kind, weight = role
        if name not in io["state"] or kind not in _ROLES:
            raise _bad(
                path, f"the fused role of {_short(name)} is {_short(role)}: no state, or no kind of {_ROLES}"
            )
        if kind != "step":
            if weight not in io["parameters"]:
                raise _bad(
                    path, f"the fused role of {_short(name)} names {_short(weight)}, which is no parameter"
                )
            a, w = initial[name], initial[weight]
            if a.shape != w.shape or a.dtype != w.dtype:
                raise _bad(
                    path, f"the state {_short(name)} is not of the shape and dtype of {_short(weight)}"
                )
        elif initial[name].size != 1:
            raise _bad(path, f"the step count {_short(name)} is not a single number")
        out[name] = (kind, weight)
    unroled = [n for n in io["state"] if n not in out]
    if unroled:  # the fused optimizer owns every state tensor: one without a role would never be fed
        raise _bad(path, f"its fused step gives the state {_short(unroled[0])} no role")
    return out


def _zeros(dtype: str, shape: list[int]) -> np.ndarray:
    """A declared zero state tensor, of a dtype and shape already checked (declared_nbytes) and bounded;
    np.zeros of a large shape costs no memory until it is written."""
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ArtifactError(
            f"a declared zero tensor needs a dtype of {', '.join(sorted(DTYPES))}, not {dtype!r}"
        )
    declared_nbytes(shape, np.dtype(dtype).itemsize)  # ValueError for a shape numpy cannot make
    return np.zeros(shape, np.dtype(dtype))
