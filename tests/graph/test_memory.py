"""The memory plan, checked by a walk over the schedule written here from the schedule and the offsets alone (not
the planner's bookkeeping): no two values live at once share a byte of the arena, except an in-place output and
the input that dies at its node; views keep their base alive; the numbers bound each other. The interpreter under
the plan gives bit-identical results to the one without it, step after step, and nothing survives from one run
to the next. The report shows what planning and reordering buy."""

from __future__ import annotations

import functools
import json
from collections import Counter

import numpy as np
import pytest
from models import MODELS, batch_for
from zoo import load, randomize_weights

import edgetrain as et
from edgetrain.core.errors import ModelError
from edgetrain.core.interpreter import Interpreter
from edgetrain.core.ir import Graph
from edgetrain.core.kernels import KERNELS
from edgetrain.core.plan import MemoryPlan
from edgetrain.graph.memory import plan_memory

BATCH = 8
ZOO = ["squeezenet", "shufflenet"]


@functools.cache
def training(name: str, batch: int = BATCH) -> et.TrainingArtifact:
    return et.convert(
        MODELS[name][0](),
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4),
        batch_size=batch,
    )


@functools.cache
def inference(name: str) -> Graph:
    return et.import_model(randomize_weights(load(name), seed=sum(map(ord, name))), batch_size=1)


@functools.cache
def planned(kind: str, name: str, batch: int = BATCH) -> tuple[Graph, MemoryPlan]:
    return plan_memory(training(name, batch).graph if kind == "training" else inference(name))


def _bytes_of(g: Graph, v: str) -> int:
    info = g.values[v]
    return int(np.prod(info.shape, dtype=np.int64)) * np.dtype(info.dtype).itemsize


CASES = [("training", m) for m in MODELS] + [("inference", z) for z in ZOO]


def check_plan(g: Graph, plan: MemoryPlan) -> int:
    """Asserts the plan is sound for the schedule g.nodes; returns the most bytes live at once."""
    g.verify(static=True)  # the schedule is a topological order
    step = {o: t for t, n in enumerate(g.nodes) for o in n.outputs if o}
    node = {o: n for n in g.nodes for o in n.outputs if o}
    for v in step:  # every value a node makes has one home
        assert (v in plan.offsets) + (v in plan.aliases) + (v in plan.outside) == 1, v
    assert not set(plan.offsets) & set(g.outputs), "graph outputs are the caller's, not the arena's"
    for v, base in plan.aliases.items():  # a view is what its kernel says it is: of the node's first input
        assert KERNELS[node[v].op_type].aliases_input and node[v].inputs[0] == base, v

    def root(v: str) -> str:
        while v in plan.aliases:
            v = plan.aliases[v]
        return v

    # Liveness from scratch: from the producer to the last reader of the value or of any view of it; a value a
    # graph output views lives to the end (it is copied out then).
    end = len(g.nodes)
    first = {v: step[v] for v in plan.offsets}
    last = dict(first)
    for t, n in enumerate(g.nodes):
        for i in n.inputs:
            if i and root(i) in last:
                last[root(i)] = max(last[root(i)], t)
    for o in g.outputs:
        if root(o) in last:
            last[root(o)] = end
    size = {v: _bytes_of(g, v) for v in plan.offsets}
    for v, off in plan.offsets.items():
        assert off % plan.alignment == 0 and off + size[v] <= plan.arena_size, v
    in_place = {}
    for o, x in plan.in_place:
        n, r = node[o], root(x)
        assert x in n.inputs and n.inputs.index(x) in KERNELS[n.op_type].inplace, (o, x)
        assert last[r] == step[o], f"{o} is written over {x}, which is read again later"
        assert plan.offsets[o] == plan.offsets[r] and size[o] == size[r], (o, x)
        in_place[o] = r
    # The walk: at each step, values live then share no byte, but for an in-place output and its input there.
    most = 0
    for t in range(end + 1):
        live = sorted((plan.offsets[v], v) for v in plan.offsets if first[v] <= t <= last[v] and size[v])
        most = max(most, sum(size[v] for _, v in live if not (in_place.get(v) and step[v] == t)))
        for k, (off, v) in enumerate(live):
            for off2, w in live[k + 1 :]:
                if off2 >= off + size[v]:
                    break
                pair = in_place.get(v) == w or in_place.get(w) == v
                assert pair and t == max(first[v], first[w]), f"step {t}: '{v}' and '{w}' share arena bytes"
    assert plan.lower_bound == most
    assert plan.no_plan == sum(size.values())
    assert plan.lower_bound <= plan.peak <= plan.no_plan
    return most


@pytest.mark.parametrize("kind,name", CASES)
def test_plan_is_sound(kind, name):
    program, plan = planned(kind, name)
    check_plan(program, plan)
    assert plan.peak <= plan.unreordered_peak
    # also for the given order, which the plan reports
    given = training(name, BATCH).graph if kind == "training" else inference(name)
    check_plan(*plan_memory(given, reorder=False))
    # deterministic, and JSON round trip
    again_program, again = plan_memory(given)
    assert again.to_dict() == plan.to_dict()
    assert [n.outputs for n in again_program.nodes] == [n.outputs for n in program.nodes]
    assert MemoryPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def test_the_checker_catches_a_bad_plan():
    program, plan = planned("training", "lenet")
    check_plan(program, plan)
    # two values live at once moved onto the same bytes
    step = {o: t for t, n in enumerate(program.nodes) for o in n.outputs if o}
    last = {i: t for t, n in enumerate(program.nodes) for i in n.inputs}
    a, b = next(
        (a, b)
        for a in plan.offsets
        for b in plan.offsets
        if step[a] < step[b] < last.get(a, -1)
        and plan.offsets[a] != plan.offsets[b]
        and _bytes_of(program, b)
    )
    bad = MemoryPlan.from_dict(plan.to_dict())
    bad.offsets[b] = bad.offsets[a]
    with pytest.raises(AssertionError, match="share arena bytes"):
        check_plan(program, bad)
    # an in-place claim over an input that is read again later (resnet_tiny's residual branch has one)
    program, plan = planned("training", "resnet_tiny")
    step = {o: t for t, n in enumerate(program.nodes) for o in n.outputs if o}
    last = {i: t for t, n in enumerate(program.nodes) for i in n.inputs}
    o, x = next(
        (n.outputs[0], n.inputs[j])
        for n in program.nodes
        for j in KERNELS[n.op_type].inplace
        if n.outputs[0] in plan.offsets
        and n.inputs[j] in plan.offsets
        and last[n.inputs[j]] > step[n.outputs[0]]
        and _bytes_of(program, n.inputs[j]) == _bytes_of(program, n.outputs[0])
    )
    bad = MemoryPlan.from_dict(plan.to_dict())
    bad.in_place = [pair for pair in bad.in_place if o not in pair] + [(o, x)]  # o's own claims replaced
    bad.offsets[o] = bad.offsets[x]
    with pytest.raises(AssertionError, match="read again later"):
        check_plan(program, bad)


@pytest.mark.parametrize("name", list(MODELS))
def test_training_under_the_plan_is_bit_identical(name):
    art = training(name, BATCH)
    program, plan = planned("training", name)
    plain = Interpreter(art.graph)
    ours = Interpreter(program, plan=plan)
    x, y = batch_for(name, BATCH)
    values_a = values_b = dict(art.initial)
    for step in range(3):  # new parameters and state bound back each step
        a = dict(zip(art.graph.outputs, plain.run(art.feeds(x, y, None, values_a))))
        b = dict(zip(program.outputs, ours.run(art.feeds(x, y, None, values_b))))
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), f"step {step}: {k}"
            assert not np.shares_memory(b[k], ours.arena), f"output {k} is a view of the arena"
        values_a = {p: a[u] for p, u in art.updates.items()}
        values_b = {p: b[u] for p, u in art.updates.items()}
    # No stale state: scribble over the arena, run the last step again, get the same bytes; the previous run's
    # outputs (owned by the caller) are untouched.
    kept = {k: v.copy() for k, v in b.items()}
    ours.arena[:] = 0xFF  # NaN in every float
    feeds = art.feeds(x, y, None, {p: kept[u] for p, u in art.updates.items()})
    again = dict(zip(program.outputs, ours.run(feeds)))
    redo = dict(zip(art.graph.outputs, plain.run(feeds)))
    for k in kept:
        assert again[k].tobytes() == redo[k].tobytes(), k
        assert b[k].tobytes() == kept[k].tobytes(), f"{k} changed under the caller"


@pytest.mark.parametrize("name", ZOO)
def test_zoo_inference_under_the_plan_is_bit_identical(name):
    g = inference(name)
    program, plan = planned("inference", name)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    (ref,) = Interpreter(g).run({g.inputs[0]: x})
    ours = Interpreter(program, plan=plan)
    (first,) = ours.run({g.inputs[0]: x})
    ours.arena[:] = 0xFF
    (second,) = ours.run({g.inputs[0]: x})
    assert ref.tobytes() == first.tobytes() == second.tobytes()
    assert plan.in_place and plan.aliases  # Relu over its Conv, Reshape/Transpose (shufflenet) or Dropout


def test_updates_run_early_and_gradients_die_early():
    """LeNet: reordering runs each optimizer update soon after its gradient, not after the whole backward pass,
    which cuts the arena; gradients (the value each update chain reads from the backward pass) die early."""
    art = training("lenet", BATCH)
    program, plan = planned("training", "lenet")
    assert plan.peak < 0.8 * plan.unreordered_peak

    def gradient_lifetimes(g: Graph) -> list[int]:
        step = {o: t for t, n in enumerate(g.nodes) for o in n.outputs if o}
        last = {i: t for t, n in enumerate(g.nodes) for i in n.inputs}
        node = {o: n for n in g.nodes for o in n.outputs if o}
        lifetimes = []
        for p in art.parameters:
            state = {p, f"{p}.momentum"}
            todo, grads = [f"{p}.momentum.updated"], []
            while todo:  # back through the update's Adds, past the products of parameter and state
                for i in node[todo.pop()].inputs:
                    n = node.get(i)
                    if n is None or n.op_type == "Mul" and state & set(n.inputs):
                        continue
                    (todo if n.op_type == "Add" else grads).append(i)
            (grad,) = grads
            lifetimes.append(last[grad] - step[grad])
        return lifetimes

    ours, given = gradient_lifetimes(program), gradient_lifetimes(art.graph)
    assert sum(ours) < 0.5 * sum(given), (ours, given)
    assert plan.order_digest != plan_memory(art.graph, reorder=False)[1].order_digest
    with pytest.raises(ModelError, match="node order"):
        Interpreter(art.graph, plan=plan)  # offsets are only valid for the schedule they were made for


def test_report(report):
    mb = 1 / 2**20
    for name in ("mlp", "lenet"):
        _, plan = planned("training", name, 32)
        report(
            "memory plan (training step, batch 32, SGD momentum 0.9 + weight decay; MB)",
            f"{name:6s} peak {plan.peak * mb:7.3f}  lower bound {plan.lower_bound * mb:7.3f}  "
            f"no plan {plan.no_plan * mb:7.3f}  unreordered {plan.unreordered_peak * mb:7.3f}",
        )
    copies: Counter[str] = Counter()
    copied_bytes: Counter[str] = Counter()
    for name in MODELS:
        program, plan = planned("training", name)
        op = {o: n.op_type for n in program.nodes for o in n.outputs if o}
        for v in plan.copies:
            copies[op[v]] += 1
            copied_bytes[op[v]] += _bytes_of(program, v)
    report(
        "memory plan: kernels without out= whose results are copied into the arena (4 training graphs, batch 8)",
        ", ".join(f"{op} x{c} ({copied_bytes[op] / 1024:.1f} KiB)" for op, c in copies.most_common()),
    )
