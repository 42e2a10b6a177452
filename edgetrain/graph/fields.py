"""How a record of a file's header declares its fields, and the one reader that checks them (numpy only).

A record (edgetrain.graph.record: the training artifact's; edgetrain.graph.sections: each rewrite's section of it)
is a frozen dataclass whose fields carry their check in their definition: `spec(Text())`, `spec(Real(), ...)`. The
reader (read_fields) follows those definitions, so that every field of every record is checked in one way and
refused naming itself: an ArtifactError whose message names the file, says what the field holds and what it should
hold, and ends with the field's path in the header (`[header field io.target]`). The tests break every field a
record defines, generated from these definitions (Spec.breaking), not from a hand-made list.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from edgetrain.core.declared import short
from edgetrain.core.errors import ArtifactError, ArtifactLimitError
from edgetrain.core.ir import Graph
from edgetrain.core.plan import MemoryPlan, check_plan
from edgetrain.core.serialize import check_graph, graph_from_dict

GHOST = "no-such-name"  # a name the breaking values use: no graph of edgetrain's defines it


class Spec:
    """What a field's value must be: `accepts` says whether a JSON value is one, `convert` makes the field's value
    of it, `what` says it in words, `breaking` lists values that are not (for the tests). A spec that reads more
    than a value (a nested record, a graph, a plan) overrides `read`."""

    what = "a value"

    def accepts(self, v: Any) -> bool:
        return True

    def convert(self, v: Any) -> Any:
        return v

    def read(self, v: Any, r: Reader, values: dict[str, Any], refuse: Callable[[Any], ArtifactError]) -> Any:
        """The field's value of v; refuse(v) is the error that names the field (values: the fields read so far)."""
        if not self.accepts(v):
            raise refuse(v)
        return self.convert(v)

    def breaking(self) -> list[Any]:
        return []


class Text(Spec):
    what = "a string"

    def accepts(self, v):
        return isinstance(v, str)

    def breaking(self):
        return [5, None, ["x"]]


class Name(Text):
    """A name of a value (the checks that it exists where the record says are the record's own)."""

    what = "a name"

    def breaking(self):
        return [5, None, ["x"], GHOST]


class Flag(Spec):
    what = "a bool"

    def accepts(self, v):
        return isinstance(v, bool)

    def breaking(self):
        return ["true", 1, None]


class Count(Spec):
    """An integer (not a bool) >= lo."""

    def __init__(self, lo: int = 0):
        self.lo = lo
        self.what = f"an integer >= {lo}"

    def accepts(self, v):
        return type(v) is int and v >= self.lo

    def breaking(self):
        return ["1", 1.5, True, self.lo - 1]


class Real(Spec):
    """A finite JSON number (not a bool) >= lo, and < below when given."""

    def __init__(self, lo: float = 0.0, below: float | None = None, what: str | None = None):
        self.lo, self.below = lo, below
        self.what = what or f"a finite number >= {lo:g}" + (f" and < {below:g}" if below is not None else "")

    def accepts(self, v):
        ok = type(v) in (int, float) and math.isfinite(v) and v >= self.lo
        return ok and (self.below is None or v < self.below)

    def convert(self, v):
        return float(v)

    def breaking(self):
        return ["0.5", float("nan"), float("inf"), True, self.lo - 1] + ([self.below] if self.below else [])


class Pair(Spec):
    """Two values of one spec (Adam's betas)."""

    def __init__(self, of: Spec):
        self.of = of
        self.what = f"a pair of {of.what}s"

    def accepts(self, v):
        return isinstance(v, list) and len(v) == 2 and all(self.of.accepts(x) for x in v)

    def convert(self, v):
        return tuple(self.of.convert(x) for x in v)

    def breaking(self):
        return [0.9, [0.9], [self.of.breaking()[0], 0.5]]


class Names(Spec):
    what = "a list of names"

    def accepts(self, v):
        return isinstance(v, list) and all(isinstance(x, str) for x in v)

    def convert(self, v):
        return tuple(v)

    def breaking(self):
        return ["w", [5], None, [GHOST]]


class NameMap(Spec):
    what = "an object of name -> name"

    def accepts(self, v):
        return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())

    def convert(self, v):
        return dict(v)

    def breaking(self):
        return [[], {GHOST: 5}, None, {GHOST: GHOST}]


class Obj(Spec):
    """A JSON object, kept as it is (settings the record reads only in part)."""

    what = "an object"

    def accepts(self, v):
        return isinstance(v, dict)

    def convert(self, v):
        return dict(v)

    def breaking(self):
        return [[1, 2], "x", None]


class Items(Spec):
    """A list of JSON objects."""

    what = "a list of objects"

    def accepts(self, v):
        return isinstance(v, list) and all(isinstance(x, dict) for x in v)

    def convert(self, v):
        return list(v)

    def breaking(self):
        return ["x", [1], None]


class Optional(Spec):
    """null, or a value of `of`."""

    def __init__(self, of: Spec):
        self.of = of
        self.what = f"{of.what} or null"

    def accepts(self, v):
        return v is None or self.of.accepts(v)

    def read(self, v, r, values, refuse):
        return None if v is None else self.of.read(v, r, values, refuse)

    def breaking(self):
        return [b for b in self.of.breaking() if b is not None]


class Integer(Spec):
    """Any integer, not a bool."""

    what = "an int"

    def accepts(self, v):
        return type(v) is int

    def breaking(self):
        return ["-100", 1.5, True]


class Choice(Spec):
    def __init__(self, *choices: str):
        self.choices = choices
        self.what = "one of " + ", ".join(repr(c) for c in choices)

    def accepts(self, v):
        return v in self.choices and isinstance(v, str)

    def breaking(self):
        return ["none", 5]


class Part(Spec):
    """A nested record of class `cls`, read field by field (where/prefix: how its messages name it)."""

    def __init__(self, cls: type, where: str, prefix: str, *, keep_config: bool = False):
        self.cls, self.where, self.prefix, self.keep_config = cls, where, prefix, keep_config
        self.what = "an object"

    def read(self, v: Any, r: Reader, values: dict[str, Any], refuse) -> Any:
        if not isinstance(v, dict):
            raise refuse(v)
        config = {"config": v} if self.keep_config else {}
        return read_fields(self.cls, v, r, where=self.where, prefix=self.prefix, **config)

    def breaking(self):
        return [[1, 2], "x"]


class GraphPart(Spec):
    """A stored graph (edgetrain.core.serialize), checked as a program the runtime can run."""

    what = "a graph"

    def __init__(self, words: str):
        self.words = words

    def read(self, v: Any, r: Reader, values: dict[str, Any], refuse) -> Graph:
        return r.graph(v, self.words)

    def breaking(self):
        return [None, [1, 2], {"nodes": {"k": 1}}]


class PlanPart(Spec):
    """A memory plan of the graph the record read under `of`, checked against it (core.plan.check_plan)."""

    what = "a memory plan"

    def __init__(self, of: str, words: str):
        self.of, self.words = of, words

    def read(self, v: Any, r: Reader, values: dict[str, Any], refuse) -> MemoryPlan:
        return r.plan(v, values[self.of], self.words)

    def breaking(self):
        return [None, {"alignment": 0}, "x"]


SAYS = "its {label} is {value}, not {what}"  # how a field that is not what its spec says is refused
SAYS_NUMBER = "its {label} {value} is not {what}"  # ... for a number whose words come first ("learning rate")


def spec(
    s: Spec,
    *,
    label: str | None = None,
    says: str = SAYS,
    key: str | None = None,
    default: Any = dataclasses.MISSING,
    when: Callable[[Mapping[str, Any]], bool] | None = None,
    absent: Any = None,
    required: bool = True,
) -> Any:
    """A record's field checked by `s`. label: how messages name it (default: its key, quoted); says: the refusal's
    words; key: its key in the header (default: the field's name); default: its value when absent (no default:
    required); when(value): whether the field applies to this value at all (an SGD setting of an Adam config is
    neither read nor checked); required=False with no default: an absent field reads as `absent`, and is checked
    as that value (a checkpoint's step, absent, is "its step count None")."""
    meta = {
        "spec": s,
        "label": label,
        "says": says,
        "key": key,
        "when": when,
        "required": required,
        "absent": absent,
    }
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=meta)
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def spec_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of a record that its header holds (those declared with spec)."""
    return [f for f in dataclasses.fields(cls) if "spec" in f.metadata]


def header_key(f: dataclasses.Field) -> str:
    return f.metadata["key"] or f.name


# How a reader's refusals read, by the kind of file (the field's tag goes before "; it is damaged").
ARTIFACT_FAULT = (
    "'{path}' is an edgetrain artifact, but {what}; it is damaged or was not made by edgetrain: rebuild it with "
    "`edgetrain convert`"
)
CHECKPOINT_FAULT = "checkpoint '{path}': {what}; it is damaged or was not written by edgetrain"
ADAPTERS_FAULT = (
    "'{path}' is an edgetrain adapters file, but {what}; it is damaged or was not made by edgetrain: export the "
    "adapters again"
)


class Reader:
    """Reads one file's header into records: every refusal an ArtifactError naming the file and the field.
    context holds what the records read so far (the program, the io names, the initial values) for the checks of
    the fields after them; tensors are the file's, max_arena bounds every value a graph declares."""

    def __init__(
        self,
        path: str,
        *,
        tensors: Mapping[str, Any] | None = None,
        max_arena: int | None = None,
        form: str = ARTIFACT_FAULT,
    ):
        self.path = path
        self.tensors = tensors if tensors is not None else {}
        self.max_arena = max_arena
        self.form = form
        self.context: dict[str, Any] = {}
        self._at: list[str] = []

    def bad(self, what: str) -> ArtifactError:
        return ArtifactError(self.form.format(path=self.path, what=what))

    @contextmanager
    def field(self, name: str, *, root: bool = False) -> Iterator[None]:
        """Refusals raised while the field `name` is read name it (the innermost field only). root: `name` is a
        path from the header's top (a check of one field that another field's reading runs)."""
        outer = self._at
        if root:
            self._at = name.split(".")
        else:
            self._at.append(name)
        try:
            yield
        except ArtifactError as e:
            if getattr(e, "field", None) is None and e.args and isinstance(e.args[0], str):
                e.field = ".".join(self._at)
                text = e.args[0]
                tag = f" [header field {e.field}]"
                cut = text.find("; it is damaged")
                e.args = (text + tag if cut < 0 else text[:cut] + tag + text[cut:], *e.args[1:])
            raise
        finally:
            if root:
                self._at = outer
            else:
                self._at.pop()

    def refusal(self, f: dataclasses.Field, label: str) -> Callable[[Any], ArtifactError]:
        """The error that refuses value v of field f, in the field's words."""
        s: Spec = f.metadata["spec"]
        return lambda v: self.bad(f.metadata["says"].format(label=label, value=short(v), what=s.what))

    def graph(self, d: Any, what: str) -> Graph:
        """A stored graph, read with the file's tensors and checked as a program the runtime can run."""
        where = f"'{self.path}': its {what}"
        g = graph_from_dict(d, self.tensors, where=where)
        check_graph(g, where, max_value_bytes=self.max_arena)
        return g

    def plan(self, d: Any, program: Graph, what: str) -> MemoryPlan:
        """A stored memory plan, checked against its program (core.plan.check_plan)."""
        try:
            plan = MemoryPlan.from_dict(d)
        except ValueError as e:
            raise self.bad(f"its {what} is malformed: {e}") from None
        check_plan(
            program,
            plan,
            where=f"'{self.path}': its {what}",
            error=ArtifactError,
            limit_error=ArtifactLimitError,
            max_arena_bytes=self.max_arena,
        )
        return plan


NOTHING = object()  # read_field's answer for an absent field that has a default


def read_field(f: dataclasses.Field, d: dict, r: Reader, *, prefix: str, values: dict[str, Any]) -> Any:
    """One field of a record from its JSON object d (NOTHING when it is absent and has a default), read by its
    spec (Spec.read)."""
    key = header_key(f)
    label = f.metadata["label"] or f"{prefix} '{key}'"
    with r.field(key):
        if key not in d:
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                return NOTHING
            if f.metadata["required"]:
                raise r.bad(f"its {prefix} lacks '{key}'")
        v = d.get(key, f.metadata["absent"])
        return f.metadata["spec"].read(v, r, values, r.refusal(f, label))


def read_fields(cls: type, d: Any, r: Reader, *, where: str, prefix: str, **extra: Any) -> Any:
    """A record of class `cls` from the JSON object d: each field checked by its spec (absent ones take their
    default; a required one absent is refused), then the record's own checks (cls.check(record, reader), the names
    it gives against what defines them). where: the object in words ("io settings"); prefix: how a field's default
    label starts ("io": "io 'target'"); extra: fields the header does not hold (set by the caller)."""
    if not isinstance(d, dict):
        raise r.bad(f"its {where} are {short(d)}, not an object")
    values = dict(extra)
    for f in spec_fields(cls):
        when = f.metadata["when"]
        if when is not None and not when(d):
            continue
        v = read_field(f, d, r, prefix=prefix, values=values)
        if v is not NOTHING:
            values[f.name] = v
    record = cls(**values)
    check = getattr(record, "check", None)
    if check is not None:
        check(r)
    return record


def to_json(record: Any, *, skip_defaults: bool = False) -> dict[str, Any]:
    """A record's header object: each spec field under its key (tuples as lists); skip_defaults leaves out fields
    that hold their default (what a writer that never wrote them gave)."""
    out = {}
    for f in spec_fields(type(record)):
        v = getattr(record, f.name)
        if skip_defaults and f.default is not dataclasses.MISSING and v == f.default:
            continue
        out[header_key(f)] = list(v) if isinstance(v, tuple) else v
    return out
