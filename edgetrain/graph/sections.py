"""The sections of a training artifact that the rewrites of its model own (numpy only; both sides).

A rewrite changes the imported model on its way to a training step (edgetrain.derive.rewrites has the build side:
what it does at convert). What it leaves for the device is one Section of the artifact's record, under its own key
of the header: it reads and checks itself there (Section.read, the record's reader calls it), writes itself
(to_json), and supplies what the device side needs of it at run time and at export, through hooks that do nothing
unless the section overrides them:

- export(view, options): the exported model, undone or written back (LoRA merged, layers whole again, int8 again);
- run_model(view, record): the model run() runs (an int8 model's integer graph);
- at_batch(graph, batch): the inference graph at another batch (a fixed-batch export, re-batched);
- describe(): lines for `edgetrain inspect`.

A session, the artifact reader and the export loop over the record's sections and never ask which kinds they are,
so a new rewrite is one class here (or in a module of its own, registered with @register) plus its build side.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from edgetrain.core.declared import short
from edgetrain.core.errors import ConfigError
from edgetrain.core.ir import Graph
from edgetrain.core.serialize import graph_to_dict

from .fields import Count, Items, Obj, Reader, Text, read_fields, spec
from .rebatch import BatchPlan, apply_batch_plan

if TYPE_CHECKING:  # the sections of LoRA, split layers and int8 load them when an artifact has one
    from .adapters import LoraModule
    from .channels import ChannelSplit
    from .quantized import QuantWeight

SECTIONS: dict[str, type[Section]] = {}  # header key -> the Section class that reads it


def register(cls: type[Section]) -> type[Section]:
    """Makes a Section class known to the record's reader under its KEY (a class decorator)."""
    if cls.KEY in SECTIONS and SECTIONS[cls.KEY] is not cls:
        raise ValueError(f"two sections claim the header key '{cls.KEY}': {SECTIONS[cls.KEY]} and {cls}")
    SECTIONS[cls.KEY] = cls
    return cls


@dataclass
class ExportView:
    """The inference model on its way to an ONNX file: its graph, the initializers training gives it, the
    metadata_props it carries, and the inputs that keep their initializers as defaults."""

    graph: Graph
    params: dict[str, np.ndarray]
    props: dict[str, str] = field(default_factory=dict)
    defaults: tuple[str, ...] = ()


@dataclass
class RunView:
    """The model run() runs: its graph and the trained tensors it is fed."""

    graph: Graph
    values: dict[str, np.ndarray]


class Section:
    """One rewrite's part of an artifact's record (see the module docstring)."""

    KEY: ClassVar[str]  # its key in the header
    ORDER: ClassVar[int] = 50  # the order of the export and run hooks (an int8 model's graph is picked first)
    ALWAYS_WRITTEN: ClassVar[bool] = False  # written as null when absent (a key every artifact has had)
    OPTIONS: ClassVar[dict[str, Any]] = {}  # the export options it reads, with their defaults
    ABSENT: ClassVar[str] = ""  # why its options do not apply to an artifact without it

    @classmethod
    def read(cls, value: Any, r: Reader) -> Section:
        """The section of its header value, checked against what the reader has read (r.context)."""
        raise NotImplementedError

    def to_json(self) -> tuple[Any, dict[str, np.ndarray]]:
        """(its header value, the tensors it stores beside the artifact's own)."""
        raise NotImplementedError

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        """Refuses values of its export options that no artifact takes (ConfigError)."""

    def export(self, view: ExportView, options: dict[str, Any]) -> ExportView:
        return view

    def run_model(self, view: RunView, sections: dict[str, Section]) -> RunView:
        return view

    def at_batch(self, graph: Graph, batch: int) -> Graph | None:
        return None

    def describe(self) -> list[str]:
        return []

    @classmethod
    def breaking(cls, value: Any) -> list[tuple[tuple, Any]]:
        """Edits (a path into its header value, the value put there) the reader must refuse, for the tests:
        by default the section as a list and as a string."""
        return [((), [1, 2]), ((), "x")]


def read_sections(header: dict[str, Any], r: Reader, own: set[str]) -> dict[str, Section]:
    """The sections a header holds (its keys that are not the record's own), in hook order; a key no Section
    claims is refused: an artifact of a newer edgetrain, whose rewrite this one would silently leave out."""
    out = {}
    for key, value in header.items():
        if key in own:
            continue
        cls = SECTIONS.get(key)
        if cls is None:
            with r.field(key):
                raise r.bad(
                    f"its header holds '{key}', a part of the training program this edgetrain does not know (made "
                    "by a newer edgetrain?)"
                )
        if value is None:
            continue
        with r.field(key):
            out[key] = cls.read(value, r)
    return dict(sorted(out.items(), key=lambda kv: (type(kv[1]).ORDER, kv[0])))


def _lora():
    from edgetrain.graph import adapters  # start-up: only an artifact with LoRA adapters needs it

    return adapters


def _split():
    from edgetrain.graph import channels  # start-up: only an artifact with split layers needs it

    return channels


def _int8():
    from edgetrain.graph import quantized  # start-up: only an int8 artifact needs it

    return quantized


def _module_breaking(value: Any, list_key: str | None, fields: tuple[str, ...]) -> list[tuple[tuple, Any]]:
    """Edits that break each named field of the first record of a section's list (under list_key, or the value
    itself when it is the list): a field of another type, and one deleted."""
    edits: list[tuple[tuple, Any]] = [((), [1, 2]), ((), "x")]
    items = value.get(list_key) if list_key else value
    if isinstance(items, list) and items:
        at = (list_key, 0) if list_key else (0,)
        edits += [((*at, f), [1, 2]) for f in fields] + [((*at, f), None) for f in fields]
    return edits


@register
class BatchPlanSection(Section):
    """A model exported with a fixed batch, re-batched at convert (edgetrain.graph.rebatch): how run() moves its
    inference graph to another batch (the export keeps the batch it was exported with)."""

    KEY = "batch_plan"
    ORDER = 40
    ALWAYS_WRITTEN = True

    def __init__(self, plan: BatchPlan):
        self.plan = plan

    @classmethod
    def read(cls, value: Any, r: Reader) -> BatchPlanSection:
        if not isinstance(value, dict):
            raise r.bad(f"its 'batch_plan' is {short(value)}, not an object")
        try:
            plan = BatchPlan.from_dict(value)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise r.bad(f"its batch plan is malformed ({type(e).__name__}: {e})") from None
        base: Graph = r.context["base"]
        nodes = {n.name: n for n in base.nodes}
        if plan.batch < 1 or any(i not in base.inputs for i in plan.inputs):
            raise r.bad(
                f"its batch plan names inputs {short(plan.inputs)} of batch {plan.batch}, not the model's"
            )
        for e in plan.edits:
            n = nodes.get(e.node)
            if (
                n is None
                or not 0 <= e.position < len(n.inputs)
                or n.inputs[e.position] not in base.initializers
            ):
                raise r.bad(f"its batch plan edits node {short(e.node)}, which reads no shape constant there")
        return cls(plan)

    def to_json(self):
        return self.plan.to_dict(), {}

    def at_batch(self, graph: Graph, batch: int) -> Graph | None:
        return apply_batch_plan(graph, self.plan, batch)

    @classmethod
    def breaking(cls, value):
        return [
            ((), "x"),
            (("batch",), "two"),
            (("inputs",), ["no-such-input"]),
            (("edits",), [["ghost", 1, 0, 1]]),
        ]


@register
class PreprocessingSection(Section):
    """The input pipeline declared at convert (loaders.InputPipeline): how raw data becomes the model's input.
    The session applies it to raw data and writes it into the export (edgetrain.graph.preprocessing)."""

    KEY = "preprocessing"

    def __init__(self, spec: dict[str, Any], pipeline: Any = None):
        self.spec = spec
        self.pipeline = pipeline

    @classmethod
    def read(cls, value: Any, r: Reader) -> PreprocessingSection:
        from loaders import ConfigError as LoadersConfigError  # start-up: only an artifact that declares one
        from loaders import InputPipeline  # start-up: as above

        try:
            pipeline = InputPipeline.from_json(value, source=f"artifact '{r.path}'")
        except LoadersConfigError as e:
            raise r.bad(f"its input pipeline cannot be read ({e})") from None
        io, program = r.context["io"], r.context["program"]
        names = io.data_inputs
        dtype = np.dtype(program.values[names[0]].dtype).name if len(names) == 1 else "float32"
        if pipeline.dtype != dtype:
            raise r.bad(
                f"its input pipeline makes {pipeline.dtype} values, but the model's input takes {dtype}"
            )
        return cls(dict(value), pipeline)

    def to_json(self):
        return self.spec, {}

    def describe(self) -> list[str]:
        return [f"input      pipeline {self.pipeline.describe()}"] if self.pipeline is not None else []

    @classmethod
    def breaking(cls, value):
        return [((), [1, 2]), ((), "x"), (("dtype",), "int128"), (("scale",), "x")]


@register
class AdaptersSection(Section):
    """LoRA adapters inserted at convert (edgetrain.derive.adapters): which layers, their A and B, how each merges
    into its base weight. The export merges them (adapters="merged") or serves them (adapters="serving")."""

    KEY = "adapters"
    ORDER = 20
    OPTIONS = {"adapters": "merged"}

    def __init__(self, config: dict[str, Any], modules: list[LoraModule]):
        self.config = config
        self.modules = modules

    @property
    def tensors(self) -> list[str]:
        """Every A and B, layer by layer."""
        return [p for m in self.modules for p in (m.A, m.B)]

    @classmethod
    def read(cls, value: Any, r: Reader) -> AdaptersSection:
        if not isinstance(value, dict) or not isinstance(value.get("config"), dict):
            raise r.bad("its adapters lack 'config' or 'modules'")
        if not isinstance(value.get("modules"), list):
            raise r.bad("its adapters lack 'config' or 'modules'")
        base, params = r.context["base"], set(r.context["io"].parameters)
        names = {n.name for n in base.nodes}
        modules = []
        for d in value["modules"]:
            try:
                m = _lora().LoraModule.from_dict(d)
                ok = (
                    {m.A, m.B} <= params
                    and m.weight in base.initializers
                    and set(m.nodes) <= names
                    and m.merge in ("same", "transposed")
                    and float(m.scale) > 0
                )
            except (TypeError, KeyError, AttributeError, ValueError) as e:
                raise r.bad(f"its adapters list a malformed layer ({type(e).__name__}: {e})") from None
            if not ok:
                raise r.bad(
                    f"its adapter of '{d.get('weight')}' names a tensor or node that is not in the artifact"
                )
            modules.append(m)
        return cls(value["config"], modules)

    def to_json(self):
        return {"config": self.config, "modules": [m.to_dict() for m in self.modules]}, {}

    @classmethod
    def check_options(cls, options):
        if options.get("adapters", "merged") not in ("merged", "serving"):
            raise ConfigError(f"adapters='{options['adapters']}': give 'merged' or 'serving'")

    def export(self, view: ExportView, options: dict[str, Any]) -> ExportView:
        if options.get("adapters", "merged") == "serving":
            return replace(view, defaults=(*view.defaults, *self.tensors))
        lora = _lora()
        merged = lora.merged_weights(self.modules, view.graph.initializers, view.params)
        rest = {k: v for k, v in view.params.items() if k not in set(self.tensors)}
        return replace(view, graph=lora.unadapted(view.graph, self.modules), params={**rest, **merged})

    @classmethod
    def breaking(cls, value):
        return _module_breaking(value, "modules", ("A", "B", "weight", "nodes", "merge", "scale"))


@register
class ChannelsSection(Section):
    """Layers that train on their first input channels alone (edgetrain.derive.channels): the export puts each
    weight back whole (edgetrain.graph.channels)."""

    KEY = "channels"
    ORDER = 30

    def __init__(self, splits: list[ChannelSplit]):
        self.splits = splits

    @classmethod
    def read(cls, value: Any, r: Reader) -> ChannelsSection:
        if not isinstance(value, list):
            raise r.bad("its 'channels' is not a list of split layers")
        base = r.context["base"]
        names = {n.name for n in base.nodes}
        out = []
        for d in value:
            try:
                s = _split().ChannelSplit.from_dict(d)
                ok = {s.trained, s.frozen} <= set(base.initializers) and set(s.nodes) <= names and s.nodes
            except (TypeError, KeyError, AttributeError, ValueError) as e:
                raise r.bad(
                    f"its 'channels' lists a malformed split layer ({type(e).__name__}: {e})"
                ) from None
            if not ok:
                raise r.bad(f"its split of '{s.weight}' names a tensor or node that is not in the artifact")
            _split_fits(r, s, base)
            out.append(s)
        return cls(out)

    def to_json(self):
        return [s.to_dict() for s in self.splits], {}

    def export(self, view: ExportView, options: dict[str, Any]) -> ExportView:
        split = _split()
        whole = split.whole_weights(self.splits, view.graph.initializers, view.params)
        parts = {p for s in self.splits for p in (s.trained, s.frozen)}
        params = {**{k: v for k, v in view.params.items() if k not in parts}, **whole}
        return replace(view, graph=split.unsplit(view.graph, self.splits), params=params)

    @classmethod
    def breaking(cls, value):
        edits = _module_breaking(value, None, ("trained", "frozen", "nodes", "count", "axis", "op_type"))
        if isinstance(value, list) and value and isinstance(value[0], dict):
            count, total = value[0].get("count"), value[0].get("total")
            if type(count) is int and type(total) is int and count + 1 < total:
                edits.append(((0, "count"), count + 1))  # a count the halves' shapes do not have
            edits.append(((0, "axis"), 7))
        return edits


def _split_fits(r: Reader, s: ChannelSplit, base: Graph) -> None:
    """A split layer's two halves are the weight cut on its input-channel axis: `count` channels and the others,
    alike on every other axis, so that the export's concatenation gives the weight whole."""
    a, b = np.shape(base.initializers[s.trained]), np.shape(base.initializers[s.frozen])
    ok = len(a) == len(b) and 0 <= s.axis < len(a) and a[s.axis] == s.count and b[s.axis] == s.total - s.count
    if not ok or any(x != y for k, (x, y) in enumerate(zip(a, b)) if k != s.axis):
        raise r.bad(
            f"its split of '{s.weight}' says {s.count} of {s.total} channels on axis {s.axis}, but its halves are "
            f"{list(a)} and {list(b)}"
        )


@register
class QuantizedSection(Section):
    """An int8 model (edgetrain.graph.quantized): its form, the trained float masters and where their integer
    forms live, the scales and zero points they are requantized with, and the model as imported, which run() runs
    and the export writes again with the trained weights requantized (export --float: the float model instead)."""

    KEY = "quantized"
    ORDER = 10
    OPTIONS = {"requantize": False, "float_model": False}
    ABSENT = "was converted from a float model: requantize and float_model apply to an int8 model's export"

    def __init__(self, form: str, weights: list[QuantWeight], constants: dict[str, np.ndarray], model: Any):
        self.form = form
        self.weights = weights
        self.constants = constants
        self._model = model  # the int8 Graph, or its stored dict until first asked for

    def model(self, r: Reader | None = None) -> Graph:
        """The int8 model, read and checked when first asked for (export, run): a phone that trains and never
        exports keeps no second graph."""
        if not isinstance(self._model, Graph):
            self._model = self._reader.graph(self._model, "int8 model")
        return self._model

    @classmethod
    def read(cls, value: Any, r: Reader) -> QuantizedSection:
        if not isinstance(value, dict) or any(
            k not in value for k in ("form", "weights", "model", "constants")
        ):
            raise r.bad("its int8 export lacks 'form', 'weights', 'constants' or 'model'")
        model_dict = value["model"]
        inits = model_dict.get("initializers") if isinstance(model_dict, dict) else None
        if not isinstance(inits, list):
            raise r.bad("its int8 model lists no initializers")
        names = value["constants"] if isinstance(value["constants"], list) else [None]
        if any(not isinstance(n, str) or n not in r.tensors for n in names):
            raise r.bad("its int8 export names a scale or zero point that is not in the file")
        consts = {n: r.tensors[n] for n in names}
        params = set(r.context["io"].parameters)
        weights = []
        for d in value["weights"] if isinstance(value["weights"], list) else [None]:
            try:
                w = _int8().QuantWeight.from_dict(d)
            except (TypeError, AttributeError) as e:
                raise r.bad(f"its int8 export lists a malformed weight ({e})") from None
            if not _quant_weight_typed(w):
                raise r.bad(f"its int8 export lists a malformed weight ({short(d)})")
            needed = [w.scale] + ([w.zero_point] if w.kind == "weight" else []) + list(w.scale_from)
            if w.name not in params or w.source not in inits or any(c not in consts for c in needed):
                raise r.bad(f"its int8 export's weight '{w.name}' names a tensor that is not in the artifact")
            weights.append(w)
        section = cls(str(value["form"]), weights, consts, model_dict)
        section._reader = r
        return section

    def to_json(self):
        qdict, tensors = graph_to_dict(self.model())
        value = {
            "form": self.form,
            "weights": [w.to_dict() for w in self.weights],
            "constants": sorted(self.constants),
            "model": qdict,
        }
        return value, {**tensors, **{k: v for k, v in self.constants.items() if k not in tensors}}

    def requantized(self, params: dict[str, np.ndarray], *, rederive: bool = False) -> dict[str, np.ndarray]:
        from edgetrain.graph import quantized as qat  # the requantization: only an int8 model's run or export

        return qat.requantize(self.weights, params, self.constants, rederive=rederive)

    def run_model(self, view: RunView, sections: dict[str, Section]) -> RunView:
        # a section that moves the float graph to another batch (a batch plan): the int8 graph has none of its own
        if any(type(s).at_batch is not Section.at_batch for s in sections.values()):
            return view
        return RunView(self.model(), self.requantized(view.values))

    def export(self, view: ExportView, options: dict[str, Any]) -> ExportView:
        if options.get("float_model"):
            from edgetrain.graph import quantized as qat  # the float model: only int8 exports need it

            return replace(view, graph=qat.dequantized(view.graph))
        ints = self.requantized(view.params, rederive=bool(options.get("requantize")))
        return replace(view, graph=self.model(), params=ints)

    @classmethod
    def breaking(cls, value):
        edits = _module_breaking(value, "weights", ("name", "source", "scale"))
        return edits + [
            (("constants",), ["no-such-name"]),
            (("model",), None),
            (("model", "initializers"), None),
        ]


def _quant_weight_typed(w: QuantWeight) -> bool:
    """Each field of an int8 weight's record of its type (names, an axis, a kind, a dtype, a range)."""
    names = (w.name, w.source, w.scale, w.zero_point, w.dtype)
    ok = all(isinstance(n, str) for n in names) and type(w.axis) is int and w.kind in ("weight", "bias")
    ok = ok and isinstance(w.scale_from, list) and all(isinstance(n, str) for n in w.scale_from)
    ok = ok and isinstance(w.transposed, bool) and all(q is None or type(q) is int for q in (w.qmin, w.qmax))
    return ok and w.dtype in ("int8", "uint8", "int32", "int16", "uint16", "int4", "uint4")


@dataclass(frozen=True)
class BudgetOption:
    """One option the budget weighed, as far as `edgetrain inspect` reads it."""

    name: str = spec(Text(), label="option's name")
    recompute: str = spec(Text(), label="option's recompute")
    budgeted_bytes: int = spec(Count(0), label="option's budgeted_bytes")


@dataclass(frozen=True)
class BudgetRecord:
    """What `convert --memory-budget` chose (edgetrain.derive.budget): the budget, the option chosen and every
    option weighed, each with its planned peak."""

    budget_bytes: int = spec(Count(1), label="memory budget's budget_bytes")
    chosen: dict = spec(Obj(), label="memory budget's chosen option")
    weighed: list = spec(Items(), label="memory budget's options weighed", default=[])

    def check(self, r: Reader) -> None:
        with r.field("chosen"):
            read_fields(
                BudgetOption, self.chosen, r, where="memory budget's chosen option", prefix="chosen option"
            )


@register
class MemoryBudgetSection(Section):
    """What the memory budget chose and weighed: `edgetrain inspect` shows it."""

    KEY = "memory_budget"
    ORDER = 90

    def __init__(self, value: dict[str, Any]):
        self.value = value

    @property
    def chosen(self) -> dict[str, Any]:
        """The option chosen (edgetrain.derive.budget.Option.to_dict)."""
        return self.value["chosen"]

    @property
    def weighed(self) -> list[dict[str, Any]]:
        """Every option weighed on the way, in order."""
        return self.value.get("weighed", [])

    @classmethod
    def read(cls, value: Any, r: Reader) -> MemoryBudgetSection:
        read_fields(BudgetRecord, value, r, where="memory budget", prefix="memory budget")
        return cls(value)

    def to_json(self):
        return self.value, {}

    def describe(self) -> list[str]:
        b, c = self.value, self.value["chosen"]
        fits = sum(1 for o in b.get("weighed", []) if o.get("fits"))
        return [
            "",
            f"memory budget {_size(b['budget_bytes'])}: trains {c['name']} (recompute {c['recompute']}), "
            f"{_size(c['budgeted_bytes'])} counted; {len(b.get('weighed', []))} option(s) weighed, {fits} fit",
        ]

    @classmethod
    def breaking(cls, value):
        return [
            ((), "x"),
            (("budget_bytes",), -1),
            (("chosen",), "x"),
            (("chosen", "name"), 5),
            (("weighed",), "x"),
        ]


def _size(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def section_json(sections: dict[str, Section]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The header entries of the sections (those always written: null when absent) and the tensors they store."""
    header: dict[str, Any] = {k: None for k, cls in SECTIONS.items() if cls.ALWAYS_WRITTEN}
    tensors: dict[str, np.ndarray] = {}
    for key, s in sections.items():
        header[key], own = s.to_json()
        tensors.update(own)
    return header, tensors


register_section = register  # the public name (et.register_section)
