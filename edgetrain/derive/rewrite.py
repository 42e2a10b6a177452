"""The one shape of everything that changes the imported model on its way to a training step (build side), beside
ILoss, IOptimizer and the adapter modules (IAdapter is one).

A Rewrite is applied at convert, stage by stage: each of its hooks runs at one stage of the conversion
(edgetrain.derive.pipeline), on the model as the stages before left it (a Conversion), in the order the rewrites
are given; a hook it does not override does nothing. What it leaves for the device is one section of the
artifact's record (section(): edgetrain.graph.sections), which supplies what the device needs of it at run time
and undoes or writes back the rewrite at export. The built-in rewrites are in edgetrain.derive.rewrites (int8 fake
quantization, what exporters did to tensors undone, the channel split, re-batching, recomputation, the frozen part
in chunks, the input pipeline); LoRA adapters are edgetrain.derive.adapters'. A new one is one class (a Rewrite and
its Section) plus its tests: `et.convert(..., rewrites=[MyRewrite()])`.

The stages, in order:

1. imported(c): the graph as imported, before any role is decided (an int8 model lowered to float masters; tensors
   the exporter merged, batch-fixed or folded undone);
2. roles_found(c): every initializer has a role (c.roles); a rewrite may rewrite the graph and its roles again;
3. choose(c): what trains is decided: a rewrite may split or adapt layers, rewrite c.trainable (what the user
   asked to train, by name or pattern), or set c.chosen itself (adapters: they train);
4. chosen(c): c.chosen is known (an int8 model's frozen weights go back to int8);
5. static(c): the base graph is folded (c.base, symbolic batch kept); c.static_source is what is made static at
   the training batch (a fixed-batch export, re-batched);
6. step(c, graph, notes): the training step as a pure function, which a rewrite may rewrite again (recomputed
   activations, the frozen part in chunks), or None when it cannot be made so (an option of a memory budget);
7. section(c, art): the rewrite's section of the artifact's record (art, the TrainingArtifact just made), or None
   when it leaves nothing;
8. finished(art): once, on the artifact convert returns (of a memory budget's options, the one chosen): a last
   section, or None (the input pipeline, declared on the artifact's base graph).

A memory budget converts one model several ways (edgetrain.derive.budget): stages 1 to 5 run again for each set of
tensors that trains when a rewrite's chosen() depends on it (rebuilds_per_choice), and stages 6 and 7 for each option.
Hooks keep what they find in c.found[KEY], never on the rewrite itself, so that one rewrite serves every option.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from edgetrain.core.ir import Graph
from edgetrain.graph.sections import Section

from .params import Roles


@dataclass
class Conversion:
    """The model under conversion, as the stages leave it (see the module docstring)."""

    graph: Graph  # the model as imported, rewritten stage by stage until it is folded into `base`
    trainable: Any  # what the user asked to train (names or glob patterns, None: every parameter)
    batch_size: int | None
    rule: Any  # onnx's shape inference where onnx is installed (None: edgetrain's own shape functions)
    roles: Roles | None = None
    chosen: list[str] | None = None  # the parameters asked to train, once decided
    notes: list[str] = field(default_factory=list)
    base: Graph | None = None  # folded, symbolic batch kept: for run() and export
    static_source: Graph | None = None  # the base at the training batch, before it is made static
    inference: Graph | None = None  # static (at the training batch), folded, parameters still initializers
    found: dict[str, Any] = field(default_factory=dict)  # what each rewrite found, by its KEY


class Rewrite:
    """One change to the imported model on its way to a training step (see the module docstring)."""

    KEY: ClassVar[
        str
    ]  # its name: where its hooks keep what they find (Conversion.found) and its notes' origin

    def imported(self, c: Conversion) -> None:
        pass

    def roles_found(self, c: Conversion) -> None:
        pass

    def choose(self, c: Conversion) -> None:
        pass

    def chosen(self, c: Conversion) -> None:
        pass

    def static(self, c: Conversion) -> None:
        pass

    def step(self, c: Conversion, graph: Graph, notes: list[str]) -> Graph | None:
        return graph

    def section(self, c: Conversion, art: Any) -> Section | None:
        return None

    def finished(self, art: Any) -> Section | None:
        return None

    def rebuilds_per_choice(self, c: Conversion) -> bool:
        """Whether its chosen() hook makes this model depend on what trains (then a memory budget's options each
        make the static model anew)."""
        return type(self).chosen is not Rewrite.chosen
