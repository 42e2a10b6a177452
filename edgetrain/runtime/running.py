"""A TrainingSession's model run with inference semantics (numpy only): run() at any batch and evaluate() at the
training batch, each on a memory-planned program of its own, made once per batch shape and kept.

What the rewrites left in the artifact decides what runs: each section of the record may swap the model (an int8
model runs its integer graph, the trained weights requantized) or move it to another batch (a fixed-batch export,
re-batched); the runner asks every section and never which kind it is."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from edgetrain.core.errors import FeedError
from edgetrain.core.interpreter import Interpreter
from edgetrain.core.ir import Graph
from edgetrain.graph.passes import make_static, prune
from edgetrain.graph.rebatch import fixed_batch
from edgetrain.graph.record import ArtifactRecord
from edgetrain.graph.sections import RunView


class ModelRunner:
    """run() and evaluate() of one artifact's model (see the module docstring)."""

    def __init__(self, record: ArtifactRecord):
        self.record = record
        self._eval: Interpreter | None = None
        self._programs: dict[tuple, Interpreter] = {}

    def evaluate(self, feeds: dict[str, np.ndarray]) -> tuple[float, np.ndarray]:
        """(loss, model output) of the step's feeds, through the step program pruned to its loss and outputs."""
        if self._eval is None:
            keep = [self.record.io.loss] + list(self.record.io.outputs)
            from edgetrain.graph.memory import planned_interpreter  # start-up: the planner loads on first use

            self._eval = planned_interpreter(prune(self.record.program.copy(outputs=keep)), lean=False)
        feeds = {k: v for k, v in feeds.items() if k in self._eval.graph.inputs}
        loss, output, *_ = self._eval.run(feeds)
        return float(loss), output

    def run(self, data: dict[str, np.ndarray], params: dict[str, np.ndarray]) -> np.ndarray:
        """The model's first output on `data` with the trained parameters `params`."""
        key = tuple(np.shape(v) for v in data.values())
        view = RunView(self.record.base, params)
        for s in self.record.sections.values():
            view = s.run_model(view, self.record.sections)
        values = view.values
        prog = self._programs.get(key)
        if prog is None:
            base = self._at_batch(view.graph, data)
            # Trainable parameters become inputs, so folding cannot bake the initial values in.
            g = base.copy(
                inputs=list(base.inputs) + sorted(values),
                initializers={k: v for k, v in base.initializers.items() if k not in values},
            )
            shapes = {**{k: np.shape(v) for k, v in data.items()}, **{p: v.shape for p, v in values.items()}}
            g = make_static(g, shapes=shapes)
            from edgetrain.graph.memory import planned_interpreter  # start-up: the planner loads on first use

            prog = self._programs[key] = planned_interpreter(g, lean=False)
        feeds = {**data, **{p: values[p] for p in prog.graph.inputs if p in values}}
        return prog.run(feeds)[0]

    def _at_batch(self, base: Graph, data: Mapping[str, np.ndarray]) -> Graph:
        """The inference graph at the batch of `data`: a model exported with a fixed batch is moved to it by a
        section that can (the batch plan conversion found and checked); without one, it runs at its own batch."""
        found = fixed_batch(base)
        if found is None:
            return base
        names, b0 = found
        batch = int(np.shape(data[names[0]])[0]) if np.ndim(data[names[0]]) else b0
        if batch == b0:
            return base
        for s in self.record.sections.values():
            moved = s.at_batch(base, batch)
            if moved is not None:
                return moved
        raise FeedError(
            f"the model was exported with a fixed batch of {b0} (input '{names[0]}' {base.values[names[0]]}); "
            f"run it on batches of {b0}, or convert it with --batch-size N to train and run at another batch"
        )
