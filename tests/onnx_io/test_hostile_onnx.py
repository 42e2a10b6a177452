"""Hostile ONNX models (issue 14), through the real entry points: edgetrain.import_model, edgetrain.convert,
edgetrain.derive.check.check, and the `edgetrain check` and `edgetrain convert` commands in a subprocess. Each is
refused with a ModelError (a ModelLimitError, also a MemoryError, for sizes beyond a bound) whose message names the
model file and the node or tensor at fault; the commands print one `error:` line. The size cases run in a child process
under RLIMIT_AS: they are refused, or converted, without allocating what the model declares, and report the peak
memory they cost. The fuzzers are in tests/onnx_io/test_fuzz_onnx.py; the inputs they found are the regression tests at
the end."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, external_data_helper, helper, numpy_helper

import edgetrain as et
from edgetrain.derive.check import check
from edgetrain.graph import passes

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CHILD_MEMORY = 1536 << 20  # the address space a size case may use: far below what the models declare


# ---- helpers ---------------------------------------------------------------------------------------------------


def mlp(
    *, nodes=None, inits=None, inputs=None, outputs=None, opset: int | None = 17, x_shape=("N", 4)
) -> onnx.ModelProto:
    """x [N, 4] -> Gemm (w [4, 3], b [3]) -> Relu -> y [N, 3], with any part replaced."""
    rng = np.random.default_rng(0)
    if nodes is None:
        nodes = [
            helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc"),
            helper.make_node("Relu", ["h"], ["y"], name="act"),
        ]
    if inits is None:
        inits = [
            numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(np.zeros(3, np.float32), "b"),
        ]
    if inputs is None:
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    if outputs is None:
        outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x_shape[0], 3])]
    g = helper.make_graph(nodes, "hostile", inputs, outputs, inits)
    opsets = [] if opset is None else [helper.make_opsetid("", opset)]
    return helper.make_model(g, opset_imports=opsets)


def save(tmp_path: Path, model: onnx.ModelProto | bytes, name: str = "model.onnx") -> Path:
    path = tmp_path / name
    path.write_bytes(model if isinstance(model, bytes) else model.SerializeToString())
    return path


ENTRIES = {
    "import_model": lambda p: et.import_model(p, batch_size=2),
    "convert": lambda p: et.convert(p, loss=et.MSELoss(), optimizer=et.SGD(lr=0.1), batch_size=2),
    "check": lambda p: check(p),
}


def refused(path: Path, cls: type, *fragments: str) -> list[str]:
    """Each entry point refuses the model at path with exactly cls, naming the file and each fragment; the
    messages."""
    messages = []
    for entry, load in ENTRIES.items():
        with pytest.raises(et.EdgeTrainError) as e:
            load(path)
        msg = str(e.value)
        assert type(e.value) is cls, f"{entry}: {type(e.value).__name__}: {msg}"
        assert str(path) in msg, f"{entry} does not name the file: {msg}"
        for f in fragments:
            assert f in msg, f"{entry}: {f!r} not in {msg!r}"
        messages.append(msg)
    return messages


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "edgetrain.cli", *args], capture_output=True, text=True, timeout=300, env=env
    )


def cli_refuses(path: Path, *fragments: str) -> None:
    """`edgetrain check` and `edgetrain convert` each print one line `edgetrain CMD: error: PATH: ...` naming the
    fragments, exit 1, and write no artifact."""
    out = path.with_suffix(".etrain")
    for args in (["check", str(path)], ["convert", str(path), "-o", str(out)]):
        proc = cli(*args)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr and "KeyError" not in proc.stderr, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(f"edgetrain {args[0]}: error: ") and str(path) in line, line
        for f in fragments:
            assert f in line, line
        assert not out.exists()


def in_child(code: str, *, memory: int = CHILD_MEMORY) -> dict:
    """Runs code (which sets `result`, a dict) in a fresh interpreter whose address space is capped at memory;
    returns result with the child's peak resident memory in MiB (`peak_mib`: VmHWM, its own high-water mark;
    ru_maxrss would keep the forking parent's)."""
    script = textwrap.dedent(code) + textwrap.dedent(
        """
        import json
        with open("/proc/self/status") as f:
            hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        result["peak_mib"] = hwm / 1024
        print("RESULT " + json.dumps(result))
        """
    )

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    path = os.pathsep.join(map(str, [ROOT, ROOT / "tests" / "harness", HERE]))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONPATH=path)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env, preexec_fn=cap
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


# ---- undefined names, empty graphs -----------------------------------------------------------------------------


def test_a_node_input_that_nothing_defines(tmp_path):
    path = save(
        tmp_path,
        mlp(nodes=[helper.make_node("Gemm", ["x", "w", "missing_bias"], ["y"], name="fc")]),
    )
    refused(
        path, et.ModelError, "node 'fc' (Gemm) reads 'missing_bias'", "no node, graph input or initializer"
    )
    cli_refuses(path, "'missing_bias'")


def test_an_undefined_graph_output(tmp_path):
    path = save(tmp_path, mlp(outputs=[helper.make_tensor_value_info("nope", TensorProto.FLOAT, ["N", 3])]))
    refused(path, et.ModelError, "graph output 'nope' is defined by no node", "write are: h, y")
    cli_refuses(path, "graph output 'nope'")


@pytest.mark.parametrize(
    "nodes, outputs, fault",
    [
        ([], [], "holds no graph"),
        (None, [], "declares no outputs"),
        ([], None, "graph output 'y' is defined by no node"),
    ],
    ids=["nothing", "no-outputs", "no-nodes"],
)
def test_an_empty_graph(tmp_path, nodes, outputs, fault):
    path = save(tmp_path, mlp(nodes=nodes, outputs=outputs))
    refused(path, et.ModelError, fault)


# ---- text that is not UTF-8 ------------------------------------------------------------------------------------


def test_a_string_attribute_that_is_not_utf8(tmp_path):
    pads = numpy_helper.from_array(np.array([0, 1, 0, 1], np.int64), "pads")
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["p"], name="pad", mode="constant"),
        helper.make_node("Gemm", ["p", "w6", "b"], ["y"], name="fc"),
    ]
    nodes[0].attribute[0].s = b"\xffconstant"
    w6 = numpy_helper.from_array(np.ones((6, 3), np.float32), "w6")
    path = save(
        tmp_path, mlp(nodes=nodes, inits=[w6, pads, numpy_helper.from_array(np.zeros(3, np.float32), "b")])
    )
    refused(path, et.ModelError, "node 'pad' (Pad): attribute 'mode'", "not UTF-8", r"b'\xffconstant'")
    cli_refuses(path, "attribute 'mode'")


@pytest.mark.parametrize(
    "name, what",
    [
        ("fc", "the name of node 0"),
        ("x", "an input name of node 'fc' (Gemm)"),
        ("w", "the name of initializer 0"),
    ],
)
def test_names_that_are_not_utf8(tmp_path, name, what):
    """Protobuf hands a string field that is not UTF-8 over as bytes: each name is checked before use."""
    model = mlp()
    model.graph.node[0].name = "fc"
    data = model.SerializeToString()
    marker = {"fc": b"\x02fc", "x": b"\n\x01x", "w": b"B\x01w"}[name]  # field tag, length, the name
    assert data.count(marker) >= 1
    data = data.replace(marker, marker[:-1] + b"\xff", 1)
    path = save(tmp_path, data)
    refused(path, et.ModelError, what, "not UTF-8 text")


# ---- shapes beyond a bound: refused (or converted) without allocating -------------------------------------------


def test_a_dimension_of_2_to_the_62(tmp_path):
    path = save(tmp_path, mlp(x_shape=(2**62, 4)))
    messages = refused(path, et.ModelLimitError, str(2**62), "MAX_TENSOR_BYTES")
    assert all("graph input 'x' (float32[4611686018427387904x4])" in m for m in messages), messages
    with pytest.raises(MemoryError) as e:  # a LimitError is a MemoryError that says what bound it hit
        et.import_model(path)
    assert e.value.limit == passes.MAX_TENSOR_BYTES and e.value.needed == 2**62 * 4 * 4
    assert e.value.path == str(path)
    cli_refuses(path, str(2**62))


def test_negative_dimensions(tmp_path):
    path = save(tmp_path, mlp(x_shape=(-3, 4)))
    refused(path, et.ModelError, "graph input 'x' declares dimension 0 as -3")
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    w.dims[:] = [4, -3]
    path = save(tmp_path, mlp(inits=[w, numpy_helper.from_array(np.zeros(3, np.float32), "b")]), "init.onnx")
    refused(path, et.ModelError, "initializer 'w' declares shape [4, -3]")


@pytest.mark.parametrize("dims", [(2**40, 2**40), (0, 2**62), (2**31, 2**31, 4)], ids=str)
def test_dimensions_whose_product_overflows_int64(tmp_path, dims):
    """A zero among the dimensions does not make the rest harmless: numpy bounds them all."""
    path = save(tmp_path, mlp(x_shape=dims, outputs=[helper.make_tensor_value_info("y", 1, None)]))
    refused(path, et.ModelLimitError, "MAX_TENSOR_BYTES")


def test_declared_dimensions_beyond_the_bound_cost_nothing(tmp_path, report):
    """The dimension cases in a child whose address space is capped at 1.5 GiB: refused with ModelLimitError
    (not a MemoryError from numpy), at the cost of reading the file."""
    paths = {
        "2**62": save(tmp_path, mlp(x_shape=(2**62, 4)), "a.onnx"),
        "2**40 x 2**40": save(tmp_path, mlp(x_shape=(2**40, 2**40), outputs=[_y()]), "b.onnx"),
        "2**31 x 2**31 x 4 weight": save(tmp_path, mlp(inits=[_huge_weight()]), "c.onnx"),
    }
    result = in_child(
        f"""
        import edgetrain as et
        from edgetrain.derive.check import check
        result = {{}}
        for case, path in {json.dumps({k: str(v) for k, v in paths.items()})}.items():
            for entry, load in (
                ("import_model", lambda: et.import_model(path, batch_size=1)),
                ("convert", lambda: et.convert(path, loss=et.MSELoss(), optimizer=et.SGD(lr=0.1), batch_size=1)),
                ("check", lambda: check(path)),
            ):
                try:
                    load()
                    result[case + " " + entry] = "accepted"
                except Exception as e:
                    result[case + " " + entry] = type(e).__name__ + ": " + str(e)
        """
    )
    peak = result.pop("peak_mib")
    assert len(result) == 9
    for case, outcome in result.items():
        assert outcome.startswith("ModelLimitError: ") and "MAX_TENSOR_BYTES" in outcome, (case, outcome)
    report(
        "hostile ONNX: peak memory",
        f"dimensions of 2**62, 2**40 x 2**40, a 2**33-value weight: {peak:.0f} MiB",
    )


def _huge_weight() -> onnx.TensorProto:
    w = numpy_helper.from_array(np.zeros(3, np.float32), "w")
    w.dims[:] = [2**31, 2**31, 4]
    return w


def test_a_40_gb_static_input_converts_without_allocating_it(tmp_path, report):
    """Shapes are inferred from shapes where a value is large (onnx's shape inference, no stand-in data): the
    40 GB model converts and checks in a process that may not allocate 1.5 GiB, and its artifact is small."""
    path = save(tmp_path, mlp(x_shape=(10_000_000, 1000), inits=_mlp_weights(1000)))
    result = in_child(
        f"""
        import edgetrain as et
        from edgetrain.derive.check import check
        art = et.convert({str(path)!r}, loss=et.MSELoss(), optimizer=et.SGD(lr=0.1))
        size = art.save({str(tmp_path / "big.etrain")!r})
        result = dict(
            input=list(art.graph.values[art.data_inputs[0]].shape),
            output=list(art.graph.values[art.outputs[0]].shape),
            artifact=size,
            derivable=check({str(path)!r}).derivable,
        )
        """
    )
    assert result["input"] == [10_000_000, 1000] and result["output"] == [10_000_000, 3]
    assert result["derivable"] and result["artifact"] < 1 << 20
    report("hostile ONNX: peak memory", f"40 GB static input, convert + check: {result['peak_mib']:.0f} MiB")


def _mlp_weights(k: int) -> list[onnx.TensorProto]:
    rng = np.random.default_rng(0)
    return [
        numpy_helper.from_array(rng.standard_normal((k, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(np.zeros(3, np.float32), "b"),
    ]


def test_a_weight_fill_beyond_the_parameter_ceiling_is_refused_before_it_runs(tmp_path, report):
    """A ConstantOfShape that makes a 16 GiB weight (as old exporters write weight fills) is refused by convert
    and check from its shape, before it runs: ModelLimitError naming the node and the ceiling. import_model, which
    trains nothing, keeps the fill as a node (a constant that large is not folded) and allocates none of it."""
    shape = numpy_helper.from_array(np.array([65536, 65536], np.int64), "wshape")
    nodes = [
        helper.make_node("ConstantOfShape", ["wshape"], ["w"], name="fill"),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
    ]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 65536])]
    path = save(tmp_path, mlp(nodes=nodes, inits=[shape], x_shape=("N", 65536), outputs=out))
    result = in_child(
        f"""
        import edgetrain as et
        from edgetrain.derive.check import check
        result = {{}}
        for entry, load in (
            ("import_model", lambda: et.import_model({str(path)!r}, batch_size=1)),
            ("convert", lambda: et.convert({str(path)!r}, loss=et.MSELoss(), optimizer=et.SGD(lr=0.1), batch_size=1)),
            ("check", lambda: check({str(path)!r})),
        ):
            try:
                graph = load()
                result[entry] = [n.op_type for n in graph.nodes]
            except Exception as e:
                result[entry] = [type(e).__name__, str(e), e.limit, e.needed]
        """
    )
    assert result.pop("import_model") == ["ConstantOfShape", "MatMul"]
    for entry in ("convert", "check"):
        cls, msg, limit, needed = result[entry]
        assert cls == "ModelLimitError", result[entry]
        assert str(path) in msg and "node 'fill' (ConstantOfShape)" in msg and "MAX_PARAMETER_BYTES" in msg
        assert limit == passes.MAX_PARAMETER_BYTES and needed >= 16 << 30
    report(
        "hostile ONNX: peak memory", f"16 GiB ConstantOfShape weight, refused: {result['peak_mib']:.0f} MiB"
    )


def test_initializers_beyond_a_given_ceiling(tmp_path):
    """The ceiling is a keyword (and edgetrain.graph.passes.MAX_PARAMETER_BYTES for every entry point)."""
    path = save(tmp_path, mlp())
    from edgetrain.onnx_io.reader import import_model

    with pytest.raises(et.ModelLimitError) as e:
        import_model(path, batch_size=2, max_bytes=40)
    assert str(path) in str(e.value) and "initializer 'w'" in str(e.value) and e.value.limit == 40
    import_model(path, batch_size=2, max_bytes=60)


def test_external_data_beyond_the_ceiling_is_refused_before_it_is_read(tmp_path, report):
    """An initializer whose 5 GiB of external data sit next to the model (a sparse file) is refused from its
    declared size; nothing of the file is read."""
    w = numpy_helper.from_array(np.zeros((1, 3), np.float32), "w")
    model = mlp(inits=[w, numpy_helper.from_array(np.zeros(3, np.float32), "b")])
    rows = (5 << 30) // 12
    with open(tmp_path / "weights.bin", "wb") as f:
        f.truncate(rows * 12)
    t = model.graph.initializer[0]
    external_data_helper.set_external_data(t, "weights.bin", offset=0, length=rows * 12)
    t.ClearField("raw_data")
    t.dims[:] = [rows, 3]
    t.data_location = TensorProto.EXTERNAL
    path = save(tmp_path, model)
    result = in_child(
        f"""
        import edgetrain as et
        try:
            et.import_model({str(path)!r}, batch_size=1)
            result = dict(cls="accepted")
        except Exception as e:
            result = dict(cls=type(e).__name__, msg=str(e))
        """
    )
    assert result["cls"] == "ModelLimitError", result
    assert (
        str(path) in result["msg"]
        and "tensor 'w'" in result["msg"]
        and "MAX_PARAMETER_BYTES" in result["msg"]
    )
    report("hostile ONNX: peak memory", f"5 GiB external initializer, refused: {result['peak_mib']:.0f} MiB")


# ---- names defined twice ---------------------------------------------------------------------------------------


def test_duplicate_initializer_names(tmp_path):
    """Silently accepted before (the last one won): which weight the model means is not ours to guess."""
    a = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    b = numpy_helper.from_array(np.zeros((4, 3), np.float32), "w")
    path = save(tmp_path, mlp(inits=[a, b, numpy_helper.from_array(np.zeros(3, np.float32), "b")]))
    refused(path, et.ModelError, "initializer 'w' is defined twice (initializer 0 and initializer 1)")
    cli_refuses(path, "initializer 'w' is defined twice")


@pytest.mark.parametrize(
    "output, what",
    [("w", "(initializer 0)"), ("x", "(a graph input)"), ("h", "(written by node 'fc' (Gemm))")],
    ids=["initializer", "input", "node-output"],
)
def test_a_node_output_that_redefines_a_value(tmp_path, output, what):
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc"),
        helper.make_node("Relu", ["h"], [output], name="again"),
        helper.make_node("Relu", ["h"], ["y"], name="act"),
    ]
    path = save(tmp_path, mlp(nodes=nodes))
    refused(path, et.ModelError, f"node 'again' (Relu) writes '{output}', which is already defined {what}")


def test_a_graph_input_declared_twice(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    path = save(tmp_path, mlp(inputs=[x, x]))
    refused(path, et.ModelError, "graph input 'x' is declared twice")


# ---- tensors whose data does not fit their declaration ----------------------------------------------------------


def test_raw_data_shorter_than_its_dims(tmp_path):
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    w.raw_data = w.raw_data[:-4]
    path = save(tmp_path, mlp(inits=[w, numpy_helper.from_array(np.zeros(3, np.float32), "b")]))
    refused(path, et.ModelError, "initializer 'w' declares FLOAT[4, 3] (48 bytes) but holds 44 bytes")


def test_typed_data_of_the_wrong_count(tmp_path):
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3], [1.0] * 12)
    del w.float_data[5:]
    path = save(tmp_path, mlp(inits=[w, numpy_helper.from_array(np.zeros(3, np.float32), "b")]))
    refused(path, et.ModelError, "initializer 'w' declares FLOAT[4, 3] (12 values) but holds 5 in float_data")


def test_a_constant_node_whose_value_does_not_fit(tmp_path):
    value = numpy_helper.from_array(np.zeros(3, np.float32))
    value.dims[:] = [2**20]
    nodes = [
        helper.make_node("Constant", [], ["b"], name="bias", value=value),
        helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc"),
    ]
    path = save(tmp_path, mlp(nodes=nodes, inits=_mlp_weights(4)[:1]))
    refused(path, et.ModelError, "node 'bias' (Constant): attribute 'value' declares FLOAT[1048576]")


@pytest.mark.parametrize("where", ["initializer", "input"])
def test_an_unknown_element_type(tmp_path, where):
    if where == "initializer":
        w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
        w.data_type = 99
        model = mlp(inits=[w, numpy_helper.from_array(np.zeros(3, np.float32), "b")])
        fault = "initializer 'w' has element type 99, which is no ONNX type"
    else:
        model = mlp(inputs=[helper.make_tensor_value_info("x", 99, ["N", 4])])
        fault = "graph input 'x' has element type 99, which is no ONNX type"
    refused(save(tmp_path, model), et.ModelError, fault)


def _external(tmp_path: Path, location: str, *, data: bytes = b"\0" * 48, offset=0, length=48) -> Path:
    model = mlp()
    t = model.graph.initializer[0]
    external_data_helper.set_external_data(t, location, offset=offset, length=length)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (tmp_path / "outside.bin").write_bytes(data)
    (folder / "weights.bin").write_bytes(data)
    return save(folder, model)


def test_external_data_next_to_the_model_loads(tmp_path):
    graph = et.import_model(_external(tmp_path, "weights.bin"), batch_size=2)
    assert not graph.initializers["w"].any()


@pytest.mark.parametrize(
    "location, kw, fault",
    [
        ("../outside.bin", {}, "which is not a file inside the model's folder"),
        (None, {}, "which is not a file inside the model's folder"),  # an absolute path
        ("weights\0.bin", {}, "which is not a file inside the model's folder"),
        ("x" * 5000, {}, "which is not a file inside the model's folder"),
        ("missing.bin", {}, "which does not exist next to the model"),
        ("weights.bin", {"offset": 40}, "reads bytes 40 to 88 of 'weights.bin', which has 48 bytes"),
        ("weights.bin", {"length": 44}, "declares FLOAT[4, 3] (48 bytes) but its external data is 44 bytes"),
    ],
    ids=["parent", "absolute", "nul", "too-long", "missing", "beyond-the-end", "short"],
)
def test_external_data_that_is_refused(tmp_path, location, kw, fault):
    location = str(tmp_path / "outside.bin") if location is None else location
    path = _external(tmp_path, location, **kw)
    refused(path, et.ModelError, "tensor 'w'", fault)


# ---- structure ---------------------------------------------------------------------------------------------------


def test_a_graph_with_a_cycle(tmp_path):
    nodes = [
        helper.make_node("Relu", ["z"], ["h"], name="first"),
        helper.make_node("Add", ["h", "x"], ["z"], name="second"),
        helper.make_node("Gemm", ["z", "w", "b"], ["y"], name="fc"),
    ]
    refused(
        save(tmp_path, mlp(nodes=nodes)), et.ModelError, "the graph has a cycle through node 'first' (Relu)"
    )


def test_nodes_out_of_order_are_sorted(tmp_path):
    """ONNX lists nodes in topological order; a graph that does not, without a cycle, is sorted, not refused."""
    nodes = [
        helper.make_node("Relu", ["h"], ["y"], name="act"),
        helper.make_node("Gemm", ["x", "w", "b"], ["h"]),
    ]
    graph = et.import_model(save(tmp_path, mlp(nodes=nodes)), batch_size=2)
    assert [n.op_type for n in graph.nodes] == ["Gemm", "Relu"]


@pytest.mark.parametrize(
    "content",
    [b"not a model at all\n", b"", b"\x08\x07\x12\x00\xff\xff\xff\xff\xff\xff", os.urandom(64)],
    ids=["text", "empty", "garbage", "random"],
)
def test_a_file_that_is_not_onnx(tmp_path, content):
    path = save(tmp_path, content)
    messages = refused(path, et.ModelError)
    assert all("is not an ONNX model" in m for m in messages), messages


@pytest.mark.parametrize("keep", [0.25, 0.5, 0.9, 0.99])
def test_a_truncated_model(tmp_path, keep):
    from models import lenet

    data = lenet().SerializeToString()
    path = save(tmp_path, data[: int(len(data) * keep)])
    refused(path, et.ModelError)
    cli_refuses(path)


def test_bytes_that_are_not_onnx():
    for load in (et.import_model, lambda b: check(b)):
        with pytest.raises(et.ModelError, match="the bytes given are not an ONNX model"):
            load(b"\xff" * 20)


def test_a_model_without_an_opset_import(tmp_path):
    refused(save(tmp_path, mlp(opset=None)), et.ModelError, "the model imports no opset", "make_opsetid")


def test_an_attribute_of_the_wrong_type(tmp_path):
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc"),
        helper.make_node("Softmax", ["h"], ["y"]),
    ]
    nodes[1].attribute.append(helper.make_attribute("axis", "one"))
    path = save(tmp_path, mlp(nodes=nodes))
    refused(path, et.ModelError, "attribute 'axis' is of type STRING, but Softmax's 'axis' is INT")


def test_inputs_of_different_precisions(tmp_path):
    """Gemm's A, B and C are one type: a float64 input times float32 weights is refused by name (numpy would
    promote it, and the gradients would not fit the parameters)."""
    path = save(tmp_path, mlp(inputs=[helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 4])]))
    refused(path, et.ModelError, "node 'fc' (Gemm): input 'w' is float32 and input 'x' is float64")


# ---- found by the fuzzers (tests/onnx_io/test_fuzz_onnx.py)
# --------------------------------------------------------------


def test_fuzz_a_zero_dimension_beside_a_huge_one(tmp_path):
    """[0, 1, 2**62, 8] holds 0 bytes, and numpy still refuses to make it ('array is too big')."""
    path = save(
        tmp_path, mlp(x_shape=(0, 1, 2**62, 8), outputs=[helper.make_tensor_value_info("y", 1, None)])
    )
    refused(path, et.ModelLimitError, "MAX_TENSOR_BYTES")


def test_fuzz_a_fixed_batch_of_zero(tmp_path):
    path = save(tmp_path, mlp(x_shape=(0, 4)))
    with pytest.raises(et.ShapeError, match="has a fixed batch of 0"):
        et.convert(path, loss=et.MSELoss(), optimizer=et.SGD(lr=0.1), batch_size=2)


def test_fuzz_a_required_input_left_empty(tmp_path):
    """Identity(''): the kernel ran on None and nothing was recorded for its output (a KeyError further on)."""
    nodes = [
        helper.make_node("Identity", [""], ["h"], name="copy"),
        helper.make_node("Gemm", ["h", "w", "b"], ["y"], name="fc"),
    ]
    refused(
        save(tmp_path, mlp(nodes=nodes)),
        et.ModelError,
        "node 'copy' (Identity) gives no value for its input 0 ('input')",
    )


def test_fuzz_a_long_sequence_gets_its_shapes_without_running(tmp_path, monkeypatch):
    """An LSTM over 100,000 steps: shape inference ran it step by step on stand-ins (a million steps took
    minutes); its shapes now come from onnx's shape inference (edgetrain.graph.passes.MAX_STANDIN_STEPS)."""
    import dataclasses

    from edgetrain.core.kernels import KERNELS
    from edgetrain.core.ops import record

    def refuse(*args, **kw):
        raise AssertionError(f"the LSTM kernel ran on {args[0].shape} to infer shapes")

    monkeypatch.setattr(record("LSTM"), "kernel", dataclasses.replace(KERNELS["LSTM"], fn=refuse))
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((1, 8, 3)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal((1, 8, 2)).astype(np.float32), "R"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(rng.standard_normal((2, 3)).astype(np.float32), "fc"),
    ]
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R"], ["", "h"], hidden_size=2, name="lstm"),
        helper.make_node("Squeeze", ["h", "zero"], ["last"]),
        helper.make_node("MatMul", ["last", "fc"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [100_000, 2, 3])
    path = save(tmp_path, mlp(nodes=nodes, inits=inits, inputs=[x]))
    art = et.convert(path, loss=et.MSELoss(), optimizer=et.SGD(lr=0.1))
    assert art.graph.values[art.outputs[0]].shape == (2, 3)
    grads = [n for n in art.graph.nodes if n.op_type == "LSTMGrad"]
    assert grads and art.graph.values[grads[0].outputs[1]].shape == (1, 8, 3)  # dW


def test_fuzz_a_computed_reshape_target_in_a_fixed_batch_model(tmp_path):
    """Re-batching took the value of a Reshape target computed from Shape for a constant to rewrite (a KeyError);
    such a target follows the batch by itself."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Concat", ["n", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Reshape", ["flat", "fixed"], ["again"]),
        helper.make_node("Gemm", ["again", "w", "b"], ["y"], name="fc"),
    ]
    inits = _mlp_weights(8) + [
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
        numpy_helper.from_array(np.array([1, -1], np.int64), "fixed"),
    ]
    path = save(tmp_path, mlp(nodes=nodes, inits=inits, x_shape=(1, 2, 4)))
    art = et.convert(path, loss=et.MSELoss(), optimizer=et.SGD(lr=0.1), batch_size=2)
    assert art.graph.values[art.data_inputs[0]].shape == (2, 2, 4)
    assert any("rewrote" in n and "[1, -1] -> [2, -1]" in n for n in art.notes), art.notes


# ---- shapes from shapes agree with shapes from running -----------------------------------------------------------


def _models():
    import models

    out = {name: getattr(models, name) for name in ("mlp", "lenet", "resnet_tiny", "depthwise_separable")}
    for name in ("digits_lstm", "digits_gru"):
        out[name] = lambda name=name: onnx.load(ROOT / "edgetrain" / "data" / f"{name}.onnx")
    out["dynamic_reshape"] = _dynamic_reshape
    return out


def _dynamic_reshape() -> onnx.ModelProto:
    """x [N, 2, 40] -> Reshape to [Shape(x)[0], -1] (the target computed from the data's shape, as exporters
    write x.view(x.size(0), -1)) -> Gemm -> 3 classes."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Concat", ["n", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Gemm", ["flat", "w", "b"], ["y"], name="fc"),
    ]
    inits = _mlp_weights(80) + [
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
    ]
    return mlp(nodes=nodes, inits=inits, x_shape=("N", 2, 40))


@pytest.mark.parametrize("name", list(_models()))
def test_shapes_without_stand_ins_match_shapes_by_running(name, monkeypatch):
    """With STANDIN_BYTES at 256 bytes, every value of the data path gets its shape from onnx's shape inference
    (and the fused ops' rules) instead of running the node: the training graph's every shape and dtype is the
    same."""
    make = _models()[name]
    run = et.convert(make(), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.1, momentum=0.9), batch_size=4)
    monkeypatch.setattr(passes, "STANDIN_BYTES", 256)
    ruled = et.convert(
        make(), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.1, momentum=0.9), batch_size=4
    )
    assert len(run.graph.values) > 20
    assert {k: run.graph.values[k] for k in ruled.graph.values} == ruled.graph.values
    assert set(run.graph.values) == set(ruled.graph.values)


def test_fuzz_the_shape_of_a_folded_constant(tmp_path):
    """Shape of a value folded from constants read its shape from the graph's declared values, which do not hold
    it (a KeyError from convert and check); it reads the folded constant."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Add", ["a", "c"], ["sum"], name="sum"),
        helper.make_node("Shape", ["sum"], ["s"], name="shape"),
        helper.make_node("Reshape", ["x", "s"], ["r"], name="reshape"),
        helper.make_node("Gemm", ["r", "w", "b"], ["y"], name="fc"),
    ]
    inits = _mlp_weights(4) + [
        numpy_helper.from_array(rng.standard_normal((2, 4)).astype(np.float32), "a"),
        numpy_helper.from_array(rng.standard_normal((2, 4)).astype(np.float32), "c"),
    ]
    path = save(tmp_path, mlp(nodes=nodes, inits=inits, x_shape=(2, 2, 2)))
    for load in ENTRIES.values():
        load(path)


def test_fuzz_an_input_of_an_element_type_numpy_lacks(tmp_path):
    """An int4 input converted, through onnx's ml_dtypes, into an artifact the device cannot load (an
    ArtifactError at the first training step); convert refuses it by name."""
    model = mlp(inputs=[helper.make_tensor_value_info("x", TensorProto.INT4, ["N", 4])])
    model.graph.node.insert(0, helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT))
    model.graph.node[1].input[0] = "xf"
    path = save(tmp_path, model)
    with pytest.raises(et.UnsupportedError) as e:
        et.convert(path, loss=et.MSELoss(), optimizer=et.SGD(lr=0.1), batch_size=2)
    assert str(path) in str(e.value) and "the model declares 'x' as int4" in str(e.value)


def test_fuzz_rebatching_a_model_that_makes_nan(tmp_path):
    """Re-batching is checked on random samples; a model whose outputs are NaN there (Log of a negative) was
    refused ('values differ by up to nan'): NaN where both batches have it is agreement."""
    nodes = [
        helper.make_node("Log", ["x"], ["l"], name="log"),
        helper.make_node("Gemm", ["l", "w", "b"], ["y"], name="fc"),
    ]
    path = save(tmp_path, mlp(nodes=nodes, x_shape=(1, 4)))
    art = et.convert(path, loss=et.MSELoss(), optimizer=et.SGD(lr=0.1), batch_size=2)
    assert art.graph.values[art.data_inputs[0]].shape == (2, 4) and art.notes[0].startswith("re-batched")


def _y() -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info("y", TensorProto.FLOAT, None)


def test_fuzz_a_tensor_too_large_for_a_float(tmp_path):
    """An initializer of 200 dimensions of 2**40: its size overflowed the float that said it in GiB."""
    w = numpy_helper.from_array(np.zeros(3, np.float32), "w")
    w.dims[:] = [2**40] * 200
    path = save(tmp_path, mlp(inits=[w, numpy_helper.from_array(np.zeros(3, np.float32), "b")]))
    messages = refused(path, et.ModelLimitError, "about 2**8002 bytes", "FLOAT[1099511627776, ")
    assert all(len(m) < 600 for m in messages), messages


def test_fuzz_rebatching_a_slice_whose_starts_are_a_scalar(tmp_path):
    """Re-batching read a Slice's starts as a list ('iteration over a 0-d array'); ONNX asks for a 1-D tensor,
    and a scalar one is read as one."""
    nodes = [
        helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"], name="cut"),
        helper.make_node("Gemm", ["s", "w", "b"], ["y"], name="fc"),
    ]
    inits = _mlp_weights(4) + [
        numpy_helper.from_array(np.array(1, np.int64), "starts"),
        numpy_helper.from_array(np.array([99], np.int64), "ends"),
        numpy_helper.from_array(np.array([1], np.int64), "axes"),
    ]
    path = save(tmp_path, mlp(nodes=nodes, inits=inits, x_shape=(1, 5)))
    art = et.convert(path, loss=et.MSELoss(), optimizer=et.SGD(lr=0.1), batch_size=2)
    assert art.graph.values[art.data_inputs[0]].shape == (2, 5)


def _with_function(body_op: str) -> onnx.ModelProto:
    """mlp whose Relu is a call of the model-local function local::Act, whose body is one body_op node."""
    body = helper.make_node(body_op, ["a"], ["b"], domain="local" if body_op == "Act" else "")
    act = helper.make_function("local", "Act", ["a"], ["b"], [body], [helper.make_opsetid("", 17)])
    model = mlp()
    model.graph.node[1].op_type, model.graph.node[1].domain = "Act", "local"
    model.opset_import.append(helper.make_opsetid("local", 1))
    model.functions.append(act)
    return model


def test_a_model_local_function_is_inlined(tmp_path):
    """onnx.inliner was never imported: a model with local functions met an AttributeError (found while
    checking that a recursive one is refused)."""
    graph = et.import_model(save(tmp_path, _with_function("Relu")), batch_size=2)
    assert [n.op_type for n in graph.nodes] == ["Gemm", "Relu"]


def test_a_recursive_model_local_function(tmp_path):
    refused(
        save(tmp_path, _with_function("Act")), et.ModelError, "local functions cannot be inlined", "recursive"
    )


def test_a_fixed_leading_dimension_beside_a_symbolic_one(tmp_path):
    """A time-major input [100, N, 3]: its leading 100 is taken for a fixed batch, and re-batching ran on zeros
    of a shape holding 'N' (a TypeError); it is a RebatchError, which `edgetrain convert` answers by keeping the
    model's batch when --batch-size is not given."""
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=0, name="mean"),
        helper.make_node("Gemm", ["m", "w", "b"], ["y"], name="fc"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [100, "N", 4])
    path = save(tmp_path, mlp(nodes=nodes, inputs=[x]))
    with pytest.raises(et.RebatchError) as e:
        et.convert(path, loss=et.MSELoss(), optimizer=et.SGD(lr=0.1), batch_size=2)
    assert str(path) in str(e.value) and "input 'x' (float32[100xNx4])" in str(e.value)
