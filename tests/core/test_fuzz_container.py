"""Fuzzing the readers of `.etrain` and `.etck` files (tests/harness/fuzzing.py runs each target in a child
process under
RLIMIT_AS with a per-input alarm; only a return or an EdgeTrainError may come out).

Targets:
- RAW: bytes through read_container and inspect_container: random bytes, and real files from the converter (an
  artifact, a checkpoint, the format-1 fixture) mutated by bit flips, overwrites, cuts, insertions and splices,
  anywhere or in the preamble and header, with the checksum left broken or recomputed, or with the header's JSON
  text itself mutated and compressed again (so the damage reaches the JSON parser).
- ARTIFACT: real artifacts (an MLP with SGD, a residual CNN with Adam, an LSTM + GRU) whose header is mutated
  structurally (any field replaced by a hostile value or removed, nodes duplicated, swapped or rewired, plan
  offsets moved onto each other, shapes and tensors changed) and encoded again with a valid checksum, through
  TrainingSession(path) (fused or not), one training step on a small valid batch, evaluate() and run().
- CHECKPOINT: a real checkpoint mutated the same way, through TrainingSession.load_checkpoint.

EDGETRAIN_FUZZ_EXAMPLES sets the inputs per target (150 in CI). Every input that escaped becomes a named regression
test at the end of tests/core/test_hostile_container.py's companion section below.
"""

from __future__ import annotations

import atexit
import copy
import functools
import json
import shutil
import tempfile
import zlib
from pathlib import Path
from typing import Any

import fuzzing
import numpy as np
from fuzzing import FuzzTarget
from hypothesis import strategies as st
from models import MODELS, batch_for
from test_hostile_container import container_bytes, decode, encode

import edgetrain as et
from edgetrain.core.container import read_container

FIXTURE = Path(__file__).parents[1] / "data" / "container_v1.etck"


# ---- the real files, made once per process ------------------------------------------------------------------
def _recurrent_graph():
    from edgetrain.core.ir import Graph, GraphBuilder, TensorInfo

    rng = np.random.default_rng(0)
    T, N, I, H = 4, 4, 3, 4
    g = Graph([], ["xs"], [], {}, {"xs": TensorInfo(np.dtype("float32"), (T, N, I))}, 18)
    gb = GraphBuilder(g)
    shapes = {
        "W": (1, 4 * H, I),
        "R": (1, 4 * H, H),
        "B": (1, 8 * H),
        "Wg": (1, 3 * H, H),
        "Rg": (1, 3 * H, H),
    }
    w = {k: gb.initializer(k, (0.5 * rng.standard_normal(s)).astype(np.float32)) for k, s in shapes.items()}
    fc = gb.initializer("fc", rng.standard_normal((H, 3)).astype(np.float32))
    ys, _, _ = gb.add("LSTM", ["xs", w["W"], w["R"], w["B"]], attrs={"hidden_size": H}, outputs=3)
    seq = gb.add1("Squeeze", ys, gb.initializer("axis1", np.array([1], np.int64)))
    _, hg = gb.add(
        "GRU", [seq, w["Wg"], w["Rg"]], attrs={"hidden_size": H, "linear_before_reset": 1}, outputs=2
    )
    last = gb.add1("Squeeze", hg, gb.initializer("axis0", np.array([0], np.int64)))
    return gb.finish(outputs=[gb.add1("MatMul", last, fc)])


BASES = ("mlp", "resnet_tiny", "recurrent")


@functools.cache
def base(name: str) -> dict[str, Any]:
    """{"artifact": path, "checkpoint": path, "x", "y", "header", "tensors", "ck_header", "ck_tensors"}."""
    folder = Path(tempfile.mkdtemp(prefix=f"edgetrain-fuzz-{name}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    if name == "recurrent":
        source, batch = _recurrent_graph(), None
        x = np.random.default_rng(1).standard_normal((4, 4, 3)).astype(np.float32)
        y = np.array([0, 2, 1, 0])
        opt = et.SGD(lr=0.1, momentum=0.9)
    else:
        source, batch = MODELS[name][0](), 4
        x, y = batch_for(name, 4)
        opt = et.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4) if name == "mlp" else et.Adam(lr=0.01)
    art = et.convert(source, loss=et.CrossEntropyLoss(), optimizer=opt, batch_size=batch)
    path = folder / f"{name}.etrain"
    art.save(path)
    sess = et.TrainingSession(path)
    sess.train_step(x, y)
    ck = folder / f"{name}.etck"
    sess.save_checkpoint(ck, {"epoch": 1, "seen": [1, 2]})
    header, tensors = decode(path)
    ck_header, ck_tensors = decode(ck)
    return dict(
        artifact=path,
        checkpoint=ck,
        x=x,
        y=y,
        header=header,
        tensors=tensors,
        ck_header=ck_header,
        ck_tensors=ck_tensors,
        bytes={"artifact": path.read_bytes(), "checkpoint": ck.read_bytes(), "fixture": FIXTURE.read_bytes()},
    )


# ---- RAW: bytes ---------------------------------------------------------------------------------------------
POS = st.integers(0, 2**31)
BYTE_MUTATION = st.one_of(
    st.tuples(st.just("flip"), POS, st.integers(0, 7)),
    st.tuples(st.just("set"), POS, st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("cut"), POS),
    st.tuples(st.just("insert"), POS, st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("splice"), POS, POS, st.integers(1, 4096)),
    st.tuples(
        st.just("int"), POS, st.sampled_from([0, 1, 63, 64, 2**31, 2**32 - 1, 2**40, 2**63, 2**64 - 1])
    ),
)


def mutate_bytes(data: bytes, mutations: list, region: int) -> bytes:
    """Applies byte mutations at positions taken modulo region (the preamble and header, or the whole file)."""
    out = bytearray(data)
    for m in mutations:
        if not out:
            break
        at = m[1] % max(1, min(region, len(out)))
        if m[0] == "flip":
            out[at] ^= 1 << m[2]
        elif m[0] == "set":
            out[at : at + len(m[2])] = m[2]
        elif m[0] == "cut":
            del out[at:]
        elif m[0] == "insert":
            out[at:at] = m[2]
        elif m[0] == "splice":
            src = m[2] % len(out)
            out[at : at + m[3]] = out[src : src + m[3]]
        elif m[0] == "int":  # a little-endian uint64 over whatever was there (the header length, say)
            out[at : at + 8] = (m[2] % 2**64).to_bytes(8, "little")
    return bytes(out)


def reseal(data: bytes) -> bytes:
    """The same bytes with the last 32 made the SHA-256 of the rest: the damage then reaches the parser."""
    import hashlib

    if len(data) < 32:
        return data
    return data[:-32] + hashlib.sha256(data[:-32]).digest()


def mutate_header_text(data: bytes, mutations: list) -> bytes:
    """The header's JSON text mutated, compressed again, the rest of the file kept, the checksum recomputed."""
    hlen = int.from_bytes(data[16:24], "little")
    text = zlib.decompress(data[24 : 24 + hlen])
    text = mutate_bytes(text, mutations, len(text))
    z = zlib.compress(text, 9)
    head = data[:16] + len(z).to_bytes(8, "little") + z
    old_start = -(-(24 + hlen) // 64) * 64
    body = head + bytes(-len(head) % 64) + data[old_start:-32]
    return reseal(body + bytes(32))


RAW_INPUT = st.one_of(
    st.tuples(st.just("random"), st.binary(max_size=2048)),
    st.tuples(
        st.just("mutated"),
        st.sampled_from(["artifact", "checkpoint", "fixture"]),
        st.lists(BYTE_MUTATION, min_size=1, max_size=4),
        st.sampled_from(["header", "anywhere"]),
        st.booleans(),  # recompute the checksum
    ),
    st.tuples(
        st.just("text"),
        st.sampled_from(["artifact", "checkpoint", "fixture"]),
        st.lists(BYTE_MUTATION, min_size=1, max_size=4),
    ),
)


def run_raw(example, workdir: Path) -> None:
    files = base("mlp")["bytes"]
    if example[0] == "random":
        data = example[1]
        if (
            data[:1] == b"\x89"
        ):  # random bytes that start like ours: make the rest of the magic right, sometimes
            data = b"\x89ETR\r\n\x1a\n" + data[8:]
    elif example[0] == "mutated":
        _, which, mutations, where, seal = example
        source = files[which]
        region = 24 + int.from_bytes(source[16:24], "little") if where == "header" else len(source)
        data = mutate_bytes(source, mutations, region)
        data = reseal(data) if seal else data
    else:
        _, which, mutations = example
        data = mutate_header_text(files[which], mutations)
    path = workdir / "f.etrain"
    path.write_bytes(data)
    from edgetrain.core.container import inspect_container

    for verify in (True, False):
        try:
            read_container(path, verify=verify)
        except et.EdgeTrainError:
            pass
    inspect_container(path)


RAW = FuzzTarget(RAW_INPUT, run_raw)


# ---- ARTIFACT and CHECKPOINT: structure ---------------------------------------------------------------------
def hostile_values() -> st.SearchStrategy:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from([-1, 0, 1, 3, 64, -64, 2**31, 2**32, 2**40, 2**62, 2**63, 2**64, -(2**63)]),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.sampled_from(
            ["", "x", "float32", "int64", "object", "Gemm", "Relu", "com.edgetrain", "nan", "ghost"]
        ),
        st.text(max_size=12),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(
                st.sampled_from(["tensor", "float", "x", "type", "lr", "dtype"]), inner, max_size=3
            ),
        ),
        max_leaves=8,
    )


IDX = st.integers(0, 2**16)
STRUCT_MUTATION = st.one_of(
    st.tuples(st.just("replace"), st.lists(IDX, min_size=1, max_size=7), hostile_values()),
    st.tuples(st.just("delete"), st.lists(IDX, min_size=1, max_size=7)),
    st.tuples(
        st.just("node"),
        st.sampled_from(["program", "base", "fused"]),
        IDX,
        st.integers(0, 5),
        hostile_values(),
    ),
    st.tuples(st.just("rewire"), st.sampled_from(["program", "fused"]), IDX, IDX, IDX, st.booleans()),
    st.tuples(
        st.just("nodes"),
        st.sampled_from(["program", "fused"]),
        st.sampled_from(["dup", "swap", "drop"]),
        IDX,
        IDX,
    ),
    st.tuples(
        st.just("plan"),
        st.sampled_from(["plan", "fused"]),
        IDX,
        st.one_of(st.sampled_from(["same", "zero", "next"]), st.integers(-(2**40), 2**40)),
    ),
    st.tuples(st.just("shape"), st.sampled_from(["program", "fused", "base"]), IDX, hostile_values()),
    st.tuples(st.just("attr"), st.sampled_from(["program", "fused"]), IDX, IDX, hostile_values()),
    st.tuples(
        st.just("io"),
        st.sampled_from(["loss", "target", "lr", "outputs", "data_inputs", "updates"]),
        IDX,
        IDX,
    ),
    st.tuples(
        st.just("tensor"),
        IDX,
        st.sampled_from(["float32", "float64", "int64", "uint8", "bool", "float16"]),
        st.lists(st.integers(0, 6), max_size=3),
    ),
)


def _walk(node: Any, indices: list[int]) -> tuple[Any, Any]:
    """(container, key) reached from node by taking, at each step, a dict's i-th key (sorted) or a list's i-th
    item; (None, None) when nothing was reached."""
    parent = key = None
    for i in indices:
        if isinstance(node, dict) and node:
            k = sorted(node, key=str)[i % len(node)]
        elif isinstance(node, list) and node:
            k = i % len(node)
        else:
            break
        parent, key, node = node, k, node[k]
    return parent, key


def _part(h: Any, *keys: str) -> dict | None:
    """h[keys[0]][keys[1]]... when each is an object (a mutation may have made any of them something else)."""
    for k in keys:
        h = h.get(k) if isinstance(h, dict) else None
    return h if isinstance(h, dict) else None


def _graph(h: dict, which: str) -> dict | None:
    return _part(h, "fused", "program") if which == "fused" else _part(h, which)


def _nodes(h: dict, which: str) -> list | None:
    g = _graph(h, which)
    nodes = g.get("nodes") if g else None
    return nodes if isinstance(nodes, list) and nodes else None


def mutate_structure(h: dict, t: dict[str, np.ndarray], mutations: list) -> None:
    for m in mutations:
        kind = m[0]
        if kind == "replace":
            parent, key = _walk(h, m[1])
            if parent is not None:
                parent[key] = copy.deepcopy(m[2])
        elif kind == "delete":
            parent, key = _walk(h, m[1])
            if isinstance(parent, dict):
                del parent[key]
            elif isinstance(parent, list):
                del parent[key]
        elif kind == "node":
            nodes = _nodes(h, m[1])
            if nodes and isinstance(nodes[m[2] % len(nodes)], list) and len(nodes[m[2] % len(nodes)]) > m[3]:
                nodes[m[2] % len(nodes)][m[3]] = copy.deepcopy(m[4])
        elif kind == "rewire":  # a node's input or output renamed to another value's name, or to a new one
            nodes, g = _nodes(h, m[1]), _graph(h, m[1])
            if not nodes or not isinstance(g.get("values"), dict):
                continue
            node = nodes[m[2] % len(nodes)]
            if not (
                isinstance(node, list)
                and len(node) == 6
                and isinstance(node[3 + m[5]], list)
                and node[3 + m[5]]
            ):
                continue
            names = sorted(g["values"]) + ["ghost"]
            ports = node[3 + m[5]]
            ports[m[3] % len(ports)] = names[m[4] % len(names)]
        elif kind == "nodes":
            nodes = _nodes(h, m[1])
            if not nodes:
                continue
            i, j = m[3] % len(nodes), m[4] % len(nodes)
            if m[2] == "dup":
                nodes.insert(j, copy.deepcopy(nodes[i]))
            elif m[2] == "swap":
                nodes[i], nodes[j] = nodes[j], nodes[i]
            else:
                del nodes[i]
        elif (
            kind == "plan"
        ):  # one planned value moved: onto another's offset, to 0, just past another, anywhere
            plan = _part(h, "plan") if m[1] == "plan" else _part(h, "fused", "plan")
            offsets = plan.get("offsets") if isinstance(plan, dict) else None
            if not isinstance(offsets, dict) or not offsets:
                continue
            names = sorted(offsets)
            v, w = names[m[2] % len(names)], names[(m[2] // 7) % len(names)]
            to = m[3]
            offsets[v] = (
                offsets[w] if to == "same" else 0 if to == "zero" else offsets[w] + 64 if to == "next" else to
            )
        elif kind == "shape":
            g = _graph(h, m[1])
            values = g.get("values") if g else None
            if isinstance(values, dict) and values:
                name = sorted(values)[m[2] % len(values)]
                if isinstance(values[name], list) and len(values[name]) == 2:
                    values[name][1] = copy.deepcopy(m[3])
        elif kind == "attr":  # an attribute a node has, given a hostile value (it then reaches the kernel)
            nodes = _nodes(h, m[1])
            node = nodes[m[2] % len(nodes)] if nodes else None
            if isinstance(node, list) and len(node) == 6 and isinstance(node[5], dict) and node[5]:
                node[5][sorted(node[5])[m[3] % len(node[5])]] = copy.deepcopy(m[4])
        elif kind == "io":  # an io name pointed at another value of the program (the loss at the output, say)
            io, g = _part(h, "io"), _graph(h, "program")
            if not isinstance(io, dict) or not g or not isinstance(g.get("values"), dict):
                continue
            names = sorted(g["values"])
            name = names[m[2] % len(names)]
            field = io.get(m[1])
            if isinstance(field, list) and field:
                field[m[3] % len(field)] = name
            elif isinstance(field, dict) and field:
                field[sorted(field)[m[3] % len(field)]] = name
            else:
                io[m[1]] = name
        elif kind == "tensor" and t:
            name = sorted(t)[m[1] % len(t)]
            t[name] = np.zeros(tuple(m[3]), m[2])


STRUCT_INPUT = st.tuples(
    st.sampled_from(BASES),
    st.lists(STRUCT_MUTATION, min_size=1, max_size=3),
    st.booleans(),  # fused
)


def run_artifact(example, workdir: Path) -> None:
    name, mutations, fused = example
    b = base(name)
    h, t = copy.deepcopy(b["header"]), {k: v.copy() for k, v in b["tensors"].items()}
    mutate_structure(h, t, mutations)
    path = workdir / "crafted.etrain"
    try:
        path.write_bytes(encode(h, t))
    except (TypeError, ValueError):  # a value JSON cannot write (a NaN float is written, and refused, as NaN)
        return
    sess = et.TrainingSession(path, fused=fused)
    refusals = []
    for call in (
        lambda: sess.train_step(b["x"], b["y"]),
        lambda: sess.evaluate(b["x"], b["y"]),
        lambda: sess.run(b["x"]),
    ):
        try:
            call()
        except et.EdgeTrainError as e:  # refused: the next use is tried all the same
            refusals.append(e)
    if refusals:
        raise refusals[0]


ARTIFACT = FuzzTarget(STRUCT_INPUT, run_artifact)


CK_MUTATION = st.one_of(
    st.tuples(st.just("replace"), st.lists(IDX, min_size=1, max_size=4), hostile_values()),
    st.tuples(st.just("delete"), st.lists(IDX, min_size=1, max_size=4)),
    st.tuples(
        st.just("tensor"),
        IDX,
        st.sampled_from(["float32", "float64", "int64", "uint8", "bool", "float16"]),
        st.lists(st.integers(0, 6), max_size=3),
    ),
    st.tuples(st.just("drop"), IDX),
    st.tuples(st.just("nan"), IDX, st.sampled_from([np.nan, np.inf, -np.inf, 1e38])),
)


def run_checkpoint(example, workdir: Path) -> None:
    name, mutations = example
    b = base(name)
    h, t = copy.deepcopy(b["ck_header"]), {k: v.copy() for k, v in b["ck_tensors"].items()}
    for m in mutations:
        if m[0] in ("replace", "delete", "tensor"):
            mutate_structure(h, t, [m])
        elif t and m[0] == "drop":
            del t[sorted(t)[m[1] % len(t)]]
        elif t and m[0] == "nan":
            a = t[sorted(t)[m[1] % len(t)]]
            if a.size and a.dtype.kind == "f":
                a.reshape(-1)[0] = m[2]
    path = workdir / "crafted.etck"
    try:
        path.write_bytes(encode(h, t, kind="checkpoint"))
    except (TypeError, ValueError):
        return
    sess = _session(name)
    before = {k: v.copy() for k, v in sess.parameters().items()}
    try:
        sess.load_checkpoint(path)
    except et.EdgeTrainError:
        after = sess.parameters()
        assert all(np.array_equal(before[k], after[k]) for k in before), (
            "a refused checkpoint changed the session"
        )
        raise
    sess.train_step(b["x"], b["y"])


@functools.cache
def _session(name: str) -> et.TrainingSession:
    return et.TrainingSession(base(name)["artifact"])


CHECKPOINT = FuzzTarget(
    st.tuples(st.sampled_from(BASES), st.lists(CK_MUTATION, min_size=1, max_size=3)), run_checkpoint
)


# ---- the fuzz tests -----------------------------------------------------------------------------------------
def test_fuzz_raw_container_bytes(report):
    result = fuzzing.run_target("test_fuzz_container:RAW")
    report("fuzzing", _line(result))


def test_fuzz_crafted_artifacts(report):
    result = fuzzing.run_target("test_fuzz_container:ARTIFACT")
    report("fuzzing", _line(result))


def test_fuzz_crafted_checkpoints(report):
    result = fuzzing.run_target("test_fuzz_container:CHECKPOINT")
    report("fuzzing", _line(result))


def _line(r: dict) -> str:
    errors = ", ".join(f"{k} {v}" for k, v in r["errors"].items())
    return (
        f"{r['target']}: {r['tried']} inputs ({r['refused']} refused, {r['accepted']} accepted) in {r['seconds']} s, "
        f"seed {r['seed']}; {errors}"
    )


def test_the_mutators_reach_the_parser():
    """The strategies are worth their inputs: a resealed mutation passes the checksum, a header text mutation
    keeps the file's layout, and a structural mutation changes what is encoded."""
    b = base("mlp")
    data = b["bytes"]["artifact"]
    assert read_container(b["artifact"])
    sealed = reseal(mutate_bytes(data, [("flip", 30, 0)], 100))
    assert sealed != data and reseal(sealed) == sealed
    same = mutate_header_text(data, [("set", 0, b"{")])  # the JSON already starts with "{": unchanged text
    assert read_container_bytes(same) == read_container_bytes(data)
    h = copy.deepcopy(b["header"])
    mutate_structure(h, {}, [("plan", "plan", 0, 64 * 1000)])
    assert h != b["header"]
    assert json.dumps(h)


def read_container_bytes(data: bytes) -> Any:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "f.etrain"
        p.write_bytes(data)
        header, tensors = read_container(p)
        return header, {k: v.tobytes() for k, v in tensors.items()}


_ = container_bytes  # the byte-level builder, for regression cases found by fuzzing
