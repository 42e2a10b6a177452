"""Hostile `.etrain` and `.etck` files (issue 14): every case the issue lists, as a named test on a real file.

Files are built here byte by byte as container.py's docstring lays them out (`container_bytes`, `encode`), past the
validating writer, and most carry a valid, recomputed SHA-256: anyone can recompute one, so the checksum stops
damage, not an attacker. Each case asserts the exception class, that the message names the file and the fault,
and for bombs that memory stays bounded: the bomb is read in a child process under RLIMIT_AS and its peak RSS is
reported. Also here: file-system failures on write and read (StorageError naming the user's file), stale
temporary files of killed writers, out-of-range labels, and that every plan the real converter makes validates.
"""

from __future__ import annotations

import functools
import json
import os
import re
import resource
import signal
import struct
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from crafting import container_bytes, encode
from models import MODELS, batch_for

import edgetrain as et
from edgetrain.core.atomic import remove_stale_temporaries
from edgetrain.core.container import (
    MAX_HEADER_BYTES,
    read_container,
    write_container,
)
from edgetrain.core.errors import (
    ArtifactError,
    ArtifactLimitError,
    EdgeTrainError,
    FeedError,
    LimitError,
    MissingFileError,
    StorageError,
)
from edgetrain.core.ir import Graph, GraphBuilder, TensorInfo
from edgetrain.core.plan import MAX_ARENA_BYTES, MemoryPlan, check_plan
from edgetrain.graph.memory import plan_memory
from edgetrain.graph.passes import make_static
from edgetrain.runtime.artifact import load_artifact

ROOT = Path(__file__).resolve().parents[2]
BOUNDED_MEMORY = 768 << 20  # the address space a bomb is read in (the unbounded reader needed 4 GB)


# ---- containers made byte by byte ------------------------------------------------------------------------------
def zlib_zeros(inflated: int, chunk: int = 1 << 20) -> bytes:
    """A zlib stream of `inflated` zero bytes, made without inflating it: one compressed MiB of zeros repeated
    (full flushes make each block independent of the ones before), a final empty block, and the Adler-32 of n
    zeros ((n mod 65521) << 16 | 1). 2 GiB costs 2 MB."""
    assert inflated % chunk == 0
    c = zlib.compressobj(9)
    zeros = bytes(chunk)
    first = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    return (
        first
        + block * (inflated // chunk - 1)
        + b"\x03\x00"
        + struct.pack(">I", (inflated % 65521) << 16 | 1)
    )


def decode(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """A real file's header and tensors (writable copies), to be edited and encoded again."""
    header, tensors = read_container(path)
    return json.loads(json.dumps(header)), {k: np.array(v) for k, v in tensors.items()}


def crafted(
    tmp_path: Path, source: Path, edit: Callable[[dict, dict], Any], name: str = "crafted.etrain"
) -> Path:
    """source re-encoded after edit(header, tensors) (edits in place), with a valid checksum."""
    header, tensors = decode(source)
    edit(header, tensors)
    path = tmp_path / name
    path.write_bytes(encode(header, tensors, kind="checkpoint" if source.suffix == ".etck" else "artifact"))
    return path


def refused(cls: type[Exception], match: str, call: Callable[[], Any], path: Path) -> EdgeTrainError:
    """call() raises cls whose message matches and names path; returns the error."""
    with pytest.raises(cls, match=match) as e:
        call()
    assert isinstance(e.value, EdgeTrainError)
    assert str(path) in str(e.value), str(e.value)
    return e.value


# ---- real files from the converter --------------------------------------------------------------------------
@functools.cache
def _real(directory: str, model: str, optimizer: str) -> tuple[Path, Path]:
    opt = et.SGD(lr=0.05, momentum=0.9) if optimizer == "sgd" else et.Adam(lr=0.01)
    art = et.convert(MODELS[model][0](), loss=et.CrossEntropyLoss(), optimizer=opt, batch_size=4)
    path = Path(directory) / f"{model}-{optimizer}.etrain"
    art.save(path)
    sess = et.TrainingSession(path)
    sess.train_step(*batch_for(model, 4))
    ck = path.with_suffix(".etck")
    sess.save_checkpoint(ck, {"epoch": 1})
    return path, ck


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Callable[..., tuple[Path, Path]]:
    """real(model="mlp", optimizer="sgd") -> (artifact, checkpoint), made once per module."""
    directory = str(tmp_path_factory.mktemp("real"))
    return lambda model="mlp", optimizer="sgd": _real(directory, model, optimizer)


# ---- bombs, in a child process under a memory ceiling --------------------------------------------------------
CHILD = textwrap.dedent("""
    import json, resource, sys
    import edgetrain as et
    from edgetrain.core.container import read_container
    what, path = sys.argv[1], sys.argv[2]
    try:
        if what == "session":
            et.TrainingSession(path)
        else:
            read_container(path, verify=what == "read")
        outcome = ["accepted", ""]
    except BaseException as e:
        outcome = [type(e).__name__, str(e)]
    # this process's own peak: VmHWM is per address space, fresh at exec (ru_maxrss keeps the forking parent's)
    try:
        status = open("/proc/self/status").read()
        peak = int(status.split("VmHWM:")[1].split()[0]) * 1024
    except (OSError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("CHILD " + json.dumps({"error": outcome[0], "message": outcome[1], "peak": peak}))
""")


def bounded(what: str, path: Path, memory: int = BOUNDED_MEMORY) -> dict:
    """Reads path (what: "read", "read-unverified" or "session") in a child whose address space is capped at
    memory bytes; its outcome and peak RSS."""

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, what, str(path)],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=cap,
        timeout=300,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("CHILD ")), None)
    assert line, proc.stdout + proc.stderr
    return json.loads(line[len("CHILD ") :])


@pytest.fixture(scope="module")
def bomb_stream() -> bytes:
    return zlib_zeros(2 << 30)  # 2 GiB of zeros in 2 MB


def _bomb_case(tmp_path, bomb_stream, report, *, checksum: str, what: str, name: str, cls: str, match: str):
    path = tmp_path / f"{name}.etrain"
    path.write_bytes(container_bytes(zheader=bomb_stream, checksum=checksum))
    got = bounded(what, path)
    assert got["error"] == cls, got
    assert str(path) in got["message"] and match in got["message"], got
    report(
        "hostile containers: bombs (child capped at 768 MiB of address space)",
        f"{name:34s} {path.stat().st_size / 2**20:4.1f} MB file -> {cls}; peak RSS {got['peak'] / 2**20:6.1f} MiB",
    )
    return got


def test_zlib_bomb_with_a_wrong_checksum_costs_nothing(tmp_path, bomb_stream, report):
    # a 2 MB file whose header inflates to 2 GiB: the unbounded reader took 16 s and 4 GB before it looked at the
    # checksum; now the checksum fails first and the header is only tried within its bound, for the message
    got = _bomb_case(
        tmp_path,
        bomb_stream,
        report,
        checksum="wrong",
        what="read",
        name="bomb, wrong checksum",
        cls="ArtifactError",
        match="SHA-256 checksum does not match",
    )
    assert got["peak"] < 256 << 20


@pytest.mark.parametrize("what", ["read", "read-unverified", "session"])
def test_zlib_bomb_with_a_valid_checksum_stops_at_the_bound(tmp_path, bomb_stream, report, what):
    got = _bomb_case(
        tmp_path,
        bomb_stream,
        report,
        checksum="valid",
        what=what,
        name=f"bomb, valid checksum ({what})",
        cls="ArtifactLimitError",
        match=f"inflates to more than {MAX_HEADER_BYTES} bytes",
    )
    assert got["peak"] < 256 << 20


def test_json_item_bomb_is_refused_before_parsing(tmp_path, report):
    # 60 MiB of "[[],[],...]" compresses to 60 KB and would be ~2.3 GB of Python lists
    text = b"[" + b"[]," * (20 << 20) + b"[]]"
    path = tmp_path / "items.etrain"
    path.write_bytes(container_bytes(text=text))
    got = bounded("read", path)
    assert got["error"] == "ArtifactLimitError" and "JSON items" in got["message"], got
    assert str(path) in got["message"]
    report(
        "hostile containers: bombs (child capped at 768 MiB of address space)",
        f"{'JSON items 60 MiB of [[],[],..]':34s} {path.stat().st_size / 2**20:4.1f} MB file -> ArtifactLimitError; "
        f"peak RSS {got['peak'] / 2**20:6.1f} MiB",
    )
    assert got["peak"] < 512 << 20


def test_arena_of_16_gib_is_a_limit_error_before_allocating(tmp_path, real, report):
    def edit(h, t):
        h["plan"]["arena_size"] = 16 << 30

    path = crafted(tmp_path, real()[0], edit)
    e = refused(
        ArtifactLimitError,
        r"arena of 17179869184 bytes, more than the 4294967296",
        lambda: load_artifact(path),
        path,
    )
    assert isinstance(e, MemoryError) and e.limit == MAX_ARENA_BYTES and e.needed == 16 << 30
    got = bounded("session", path)
    assert got["error"] == "ArtifactLimitError", got
    report(
        "hostile containers: bombs (child capped at 768 MiB of address space)",
        f"{'plan arena 16 GiB':34s} {path.stat().st_size / 2**20:4.1f} MB file -> ArtifactLimitError; "
        f"peak RSS {got['peak'] / 2**20:6.1f} MiB",
    )
    # a caller may allow more: then the plan's arena must still be no more than its values need
    refused(
        ArtifactError,
        "more than all its values need",
        lambda: load_artifact(path, max_arena_bytes=32 << 30),
        path,
    )


def test_headers_of_many_strings_or_escaped_quotes_are_bounded(tmp_path):
    """Found in review: the string scan was quadratic in the quotes of an unterminated string (each later quote
    began a new attempt over the rest): 40,000 escaped quotes took 50 s. Now one pass; and a header of more
    strings than its items allow is refused before the scan. Run in a child that must finish (a hang guard)."""
    quotes = tmp_path / "quotes.etrain"
    quotes.write_bytes(container_bytes(text=b'{"header":{"x":"' + b'\\"' * 400_000 + b"}}"))
    many = tmp_path / "strings.etrain"
    many.write_bytes(container_bytes(text=b"[" + b'"",' * (3 << 20) + b'""]'))
    for path, cls, match in [
        (quotes, "ArtifactError", "does not decode"),
        (many, "ArtifactLimitError", "JSON strings, more than the 2097152 edgetrain reads"),
    ]:
        got = bounded("read", path)
        assert got["error"] == cls and match in got["message"] and str(path) in got["message"], got


def test_header_length_beyond_the_bound(tmp_path):
    path = tmp_path / "long.etrain"
    data = bytearray(container_bytes({"header": {}, "tensors": {}}))
    data[16:24] = struct.pack("<Q", 1 << 40)
    path.write_bytes(bytes(data))
    e = refused(
        ArtifactLimitError,
        r"declares a 1099511627776-byte header, more than the",
        lambda: read_container(path),
        path,
    )
    assert e.limit == MAX_HEADER_BYTES and e.needed == 1 << 40
    # the bound is the caller's to raise; past it the file is then simply truncated
    refused(
        ArtifactError,
        "truncated: its header should be",
        lambda: read_container(path, max_header_bytes=1 << 41),
        path,
    )


# ---- crafted containers with a valid checksum -------------------------------------------------------------
def test_json_nested_1000_deep_is_corrupt_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.etrain"
    path.write_bytes(
        container_bytes(text=b'{"header":{"x":' + b"[" * 1000 + b"]" * 1000 + b'},"tensors":{}}')
    )
    refused(
        ArtifactError,
        "nests 1002 levels deep; edgetrain files nest at most 64",
        lambda: read_container(path),
        path,
    )
    refused(ArtifactError, "nests 1002 levels deep", lambda: read_container(path, verify=False), path)
    # brackets inside strings are text, not nesting
    ok = tmp_path / "strings.etrain"
    ok.write_bytes(container_bytes({"header": {"x": "[" * 1000 + '"\\"{'}, "tensors": {}}))
    assert read_container(ok)[0] == {"x": "[" * 1000 + '"\\"{'}


TABLE_FAULTS = {
    # the int64 overflows: a shape whose byte count no array can hold
    "shape_overflows_int64": (
        lambda t: t["w"].update(shape=[2**40, 2**40], nbytes=2**82),
        r"tensor table entry for 'w' is wrong: its shape \[1099511627776, 1099511627776\] makes more than 2\*\*63",
    ),
    "zero_dim_overflow": (
        lambda t: t["w"].update(shape=[0, 2**62, 4]),
        "makes more than 2\\*\\*63 bytes",
    ),
    "shape_negative": (lambda t: t["w"].update(shape=[-3, 5]), "has the dimension -3, not an int >= 0"),
    "shape_not_a_list": (lambda t: t["w"].update(shape="5x3"), "its shape '5x3' is not a list of ints"),
    "shape_bool": (lambda t: t["w"].update(shape=[True, 15]), "has the dimension True"),
    "too_many_dims": (lambda t: t["w"].update(shape=[1] * 40), "40 dimensions, more than 32"),
    "dtype_object": (lambda t: t["w"].update(dtype="object"), "has the dtype 'object'"),
    "dtype_list": (lambda t: t["w"].update(dtype=["float32"]), "has the dtype"),
    "nbytes_lies": (lambda t: t["w"].update(nbytes=8), "says 8 bytes, but its shape"),
    "offset_negative": (lambda t: t["w"].update(offset=-64), "has the offset -64"),
    "offset_unaligned": (
        lambda t: t["b"].update(offset=t["b"]["offset"] + 1),
        "not an int >= 0 and a multiple of 64",
    ),
    "offset_float": (lambda t: t["b"].update(offset=64.0), "has the offset 64.0"),
    "entry_not_object": (lambda t: t.update(w=[1, 2]), "is \\[1, 2\\], not an object"),
    "entry_lacks_dtype": (lambda t: t["w"].pop("dtype"), "lacks 'dtype'"),
    "tensors_overlap": (lambda t: t["b"].update(offset=t["w"]["offset"]), "places '.*' inconsistently"),
    "tensor_beyond_the_file": (
        lambda t: t["b"].update(shape=[1 << 20], nbytes=8 << 20),
        "is truncated: tensor 'b' needs bytes",
    ),
}


@pytest.mark.parametrize("fault", list(TABLE_FAULTS))
@pytest.mark.parametrize("verify", [True, False])
def test_tensor_table_faults(tmp_path, fault, verify):
    edit, match = TABLE_FAULTS[fault]
    path = tmp_path / f"{fault}.etrain"
    tensors = {"w": np.ones((5, 3), np.float32), "b": np.arange(4, dtype=np.int64)}
    path.write_bytes(encode({"name": fault}, tensors, table=edit))
    refused(ArtifactError, match, lambda: read_container(path, verify=verify), path)


def test_header_structure_faults(tmp_path):
    cases = {
        "not_utf8.etrain": (b'{"header":{"x":"\xff\xfe"},"tensors":{}}', "does not decode"),
        "list.etrain": (b"[1,2]", "lacks the 'header' and 'tensors' entries"),
        "tensors_list.etrain": (b'{"header":{},"tensors":[]}', "lacks the 'header' and 'tensors' entries"),
        "truncated_json.etrain": (b'{"header":{"x":[1,2', "does not decode"),
    }
    for name, (text, match) in cases.items():
        path = tmp_path / name
        path.write_bytes(container_bytes(text=text))
        refused(ArtifactError, match, lambda p=path: read_container(p), path)
    # bytes after the zlib stream, and a stream cut short (both with valid checksums)
    z = zlib.compress(b'{"header":{},"tensors":{}}')
    for name, zheader, match in [
        ("after.etrain", z + b"junk", "has bytes after its compressed stream"),
        ("cut.etrain", z[:-6], "ends before its compressed stream does"),
    ]:
        path = tmp_path / name
        path.write_bytes(container_bytes(zheader=zheader))
        refused(ArtifactError, match, lambda p=path: read_container(p), path)


def test_verify_false_skips_only_the_checksum(tmp_path, bomb_stream):
    path = tmp_path / "bomb.etrain"
    path.write_bytes(container_bytes(zheader=bomb_stream[: 8 << 10], checksum="wrong"))
    # unverified, the header is still inflated within its bound and its table checked
    refused(ArtifactError, "does not decode", lambda: read_container(path, verify=False), path)
    good = tmp_path / "good.etrain"
    good.write_bytes(encode({"x": 1}, {"w": np.ones(3, np.float32)}))
    data = bytearray(good.read_bytes())
    data[-1] ^= 1
    good.write_bytes(bytes(data))
    refused(ArtifactError, "checksum does not match", lambda: read_container(good), good)
    assert read_container(good, verify=False)[0] == {"x": 1}


# ---- crafted artifacts: valid container, hostile program ---------------------------------------------------
def _node(h, k: int) -> list:
    return h["program"]["nodes"][k]


def _first_with_inputs(h) -> int:
    return next(k for k, n in enumerate(h["program"]["nodes"]) if n[3])


def _plan_all_zero(h, t):
    for plan in (h["plan"], h["fused"]["plan"]):
        plan["offsets"] = {k: 0 for k in plan["offsets"]}


def _int_parameter(h, t):
    """fc2.bias made int32 everywhere it is declared, consistently: a parameter must still be a float."""
    t["fc2.bias"] = t["fc2.bias"].astype(np.int32)
    for g in (h["program"], h["fused"]["program"], h["base"]):
        if "fc2.bias" in g["values"]:
            g["values"]["fc2.bias"][0] = "int32"


def _huge_zero_state(h, t):
    name = next(iter(h["zeros"]))
    h["zeros"][name] = ["float32", [2**30, 8]]
    for g in (h["program"], h["fused"]["program"]):
        g["values"][name] = ["float32", [2**30, 8]]


ARTIFACT_FAULTS = {
    # the KeyError: a node reading a name nothing defines
    "undefined_input": (
        lambda h, t: _node(h, _first_with_inputs(h))[3].__setitem__(0, "missing_bias"),
        ArtifactError,
        r"its program, node \d+ '.*' \(.*\) reads 'missing_bias', which no graph input, initializer or node before",
    ),
    "read_before_defined": (
        lambda h, t: h["program"]["nodes"].reverse(),
        ArtifactError,
        "which no graph input, initializer or node before it defines",
    ),
    "duplicate_output": (
        lambda h, t: _node(h, 1)[4].__setitem__(0, _node(h, 0)[4][0]),
        ArtifactError,
        r"node 1 .* writes '.*', which is already defined",
    ),
    "output_over_a_parameter": (
        lambda h, t: _node(h, 0)[4].__setitem__(0, h["io"]["parameters"][0]),
        ArtifactError,
        "which is already defined",
    ),
    # the AttributeError: attrs and values of the wrong JSON type
    "attrs_a_list": (
        lambda h, t: _node(h, 0).__setitem__(5, []),
        ArtifactError,
        r"node 0 .*: its attributes must be an object, not \[\]",
    ),
    "values_a_list": (
        lambda h, t: h["program"].__setitem__("values", []),
        ArtifactError,
        "its program: 'values' must be an object",
    ),
    "value_not_a_pair": (
        lambda h, t: h["program"]["values"].__setitem__(h["io"]["target"], "int64"),
        ArtifactError,
        r"value 'target' is 'int64', not \[dtype name, shape\]",
    ),
    "value_shape_negative": (
        lambda h, t: h["program"]["values"].__setitem__(h["io"]["target"], ["int64", [-4]]),
        ArtifactError,
        "value 'target' has the shape",
    ),
    "value_dtype_unknown": (
        lambda h, t: h["program"]["values"].__setitem__(h["io"]["target"], ["int128", [4]]),
        ArtifactError,
        "has the dtype 'int128'",
    ),
    "value_of_2_62": (
        lambda h, t: h["program"]["values"].__setitem__(h["io"]["target"], ["int64", [2**62, 4]]),
        ArtifactLimitError,
        "more than 2\\*\\*63 bytes.*more than the 4294967296 bytes edgetrain allows one value",
    ),
    "unknown_op": (
        lambda h, t: _node(h, 0).__setitem__(0, "Frobnicate"),
        ArtifactError,
        "op 'Frobnicate' in domain '' is not one this edgetrain runs",
    ),
    "op_in_another_domain": (
        lambda h, t: _node(h, 0).__setitem__(1, "com.example"),
        ArtifactError,
        "in domain 'com.example' is not one this edgetrain runs",
    ),
    "op_not_a_string": (
        lambda h, t: _node(h, 0).__setitem__(0, 5),
        ArtifactError,
        "node 0: its op_type must be a string, not 5",
    ),
    "inputs_a_string": (
        lambda h, t: _node(h, 0).__setitem__(3, "input"),
        ArtifactError,
        "'inputs' must be a list of names",
    ),
    "node_short": (
        lambda h, t: h["program"]["nodes"].__setitem__(0, ["Gemm"]),
        ArtifactError,
        r"node 0 is \['Gemm'\], not \[op_type",
    ),
    "unknown_attribute": (
        lambda h, t: _node(h, 0)[5].__setitem__("frob", 1),
        ArtifactError,
        "attribute 'frob' is not supported",
    ),
    "attribute_value_null": (
        lambda h, t: _node(h, 0)[5].__setitem__("alpha", None),
        ArtifactError,
        "attribute 'alpha' has an attribute value edgetrain does not know: None",
    ),
    "attribute_tensor_missing": (
        lambda h, t: _node(h, 0)[5].__setitem__("alpha", {"tensor": "ghost"}),
        ArtifactError,
        "needs tensor 'ghost', which the file does not hold",
    ),
    "graph_output_undefined": (
        lambda h, t: h["program"]["outputs"].append("ghost"),
        ArtifactError,
        "graph output 'ghost' is produced by no node",
    ),
    "program_lacks_nodes": (
        lambda h, t: h["program"].pop("nodes"),
        ArtifactError,
        "its program lacks 'nodes'",
    ),
    "opset_a_string": (
        lambda h, t: h["program"].__setitem__("opset", "17"),
        ArtifactError,
        "'opset' must be an int",
    ),
    # the memory plan
    "plan_alignment_0": (
        lambda h, t: h["plan"].__setitem__("alignment", 0),
        ArtifactError,
        "its memory plan: its alignment 0 is not a power of two",
    ),
    "plan_negative_offset": (
        lambda h, t: h["plan"]["offsets"].__setitem__(next(iter(h["plan"]["offsets"])), -64),
        ArtifactError,
        r"its memory plan places '.*' \(\d+ bytes\) at -64: not an aligned offset >= 0",
    ),
    "plan_offset_past_the_arena": (
        lambda h, t: h["plan"]["offsets"].__setitem__(
            next(iter(h["plan"]["offsets"])), h["plan"]["arena_size"]
        ),
        ArtifactError,
        "with all its bytes inside the",
    ),
    "plan_offset_a_string": (
        lambda h, t: h["plan"]["offsets"].__setitem__(next(iter(h["plan"]["offsets"])), "0"),
        ArtifactError,
        "its memory plan is malformed: the plan's 'offsets'",
    ),
    # the plan whose offsets all overlap (it trained, reporting a cross-entropy loss of -1.0)
    "plan_all_offsets_overlap": (
        _plan_all_zero,
        ArtifactError,
        "puts '.*' \\(made by node \\d+ .*\\) on bytes of '.*', which is still live then",
    ),
    "plan_places_a_graph_input": (
        lambda h, t: h["plan"]["offsets"].__setitem__(h["io"]["data_inputs"][0], 0),
        ArtifactError,
        "places 'input', which is not a value a node computes into the arena",
    ),
    "plan_other_order": (
        lambda h, t: h["plan"].__setitem__("order_digest", "0" * 16),
        ArtifactError,
        "was made for another node order",
    ),
    "plan_missing": (lambda h, t: h.pop("plan"), ArtifactError, "its header lacks 'plan'"),
    # io, initial values, optimizer, fused step
    "io_target_unknown": (
        lambda h, t: h["io"].__setitem__("target", "nope"),
        ArtifactError,
        "its io names 'nope' a data input, but the program has no such input",
    ),
    # the loss pointed at the model's output: a session would call float() on a [batch, classes] array
    "io_loss_at_the_output": (
        lambda h, t: h["io"].__setitem__("loss", h["io"]["outputs"][0]),
        ArtifactError,
        r"its loss 'output' is declared float32\[4x10\], not one floating-point number",
    ),
    "io_a_list": (
        lambda h, t: h.__setitem__("io", []),
        ArtifactError,
        r"its io settings are \[\], not an object",
    ),
    "io_parameters_a_string": (
        lambda h, t: h["io"].__setitem__("parameters", "w"),
        ArtifactError,
        "its io 'parameters' is 'w', not a list of names",
    ),
    "io_update_unknown": (
        lambda h, t: h["io"]["updates"].__setitem__("ghost", h["io"]["loss"]),
        ArtifactError,
        "its io updates 'ghost', which is no parameter or state",
    ),
    "initial_missing": (
        lambda h, t: h.__setitem__("initial", []),
        ArtifactError,
        "it holds no initial value for",
    ),
    "initial_wrong_shape": (
        lambda h, t: t.__setitem__(h["initial"][0], np.zeros(3, np.float32)),
        ArtifactError,
        r"its inference graph: initializer 'fc1.weight' holds float32\[3\], but the graph declares float32\[128x784\]",
    ),
    "initial_state_wrong_shape": (
        lambda h, t: (
            h["initial"].append(s := h["io"]["state"][0]),
            h["zeros"].pop(s),
            t.__setitem__(s, np.zeros(3, np.float32)),
        ),
        ArtifactError,
        r"the initial value of '.*momentum' is float32\[3\], but the program declares float32",
    ),
    "parameter_of_ints": (
        lambda h, t: _int_parameter(h, t),
        ArtifactError,
        "its parameter 'fc2.bias' is int32, not floating point",
    ),
    "zero_state_not_state": (
        lambda h, t: h["zeros"].__setitem__(h["io"]["parameters"][0], ["float32", [2**40]]),
        ArtifactError,
        "declares a zero initial value for '.*', which is no optimizer state",
    ),
    "zero_state_other_shape": (
        lambda h, t: h["zeros"].__setitem__(next(iter(h["zeros"])), ["float32", [2**40]]),
        ArtifactError,
        r"its declared zero state '.*' is \['float32', \[1099511627776\]\], but the program declares",
    ),
    "zero_state_of_32_gib": (
        _huge_zero_state,
        ArtifactLimitError,
        "more than the 4294967296 bytes edgetrain allows one value",
    ),
    "optimizer_momentum_a_string": (
        lambda h, t: h["optimizer"].__setitem__("momentum", "0.9"),
        ArtifactError,
        "its SGD setting 'momentum' is '0.9', not a valid number",
    ),
    "optimizer_lr_nan": (
        lambda h, t: h["optimizer"].__setitem__("lr", float("nan")),
        ArtifactError,
        "its learning rate nan is not a finite number >= 0",
    ),
    "optimizer_lr_negative": (
        lambda h, t: h["optimizer"].__setitem__("lr", -1),
        ArtifactError,
        "its learning rate -1 is not a finite number >= 0",
    ),
    "loss_ignore_index_a_string": (
        lambda h, t: h["loss"].__setitem__("ignore_index", "-100"),
        ArtifactError,
        "ignore_index '-100' is not an int",
    ),
    "program_id_a_number": (
        lambda h, t: h.__setitem__("program_id", 5),
        ArtifactError,
        "its program_id is 5, not a string",
    ),
    "fused_gradients_a_list": (
        lambda h, t: h["fused"].__setitem__("gradients", []),
        ArtifactError,
        "its fused step's gradients are \\[\\]",
    ),
    "fused_role_of_another_shape": (
        lambda h, t: h["fused"]["state_roles"].__setitem__(
            h["io"]["state"][0], ["momentum", next(p for p in h["io"]["parameters"] if p.endswith("bias"))]
        ),
        ArtifactError,
        "is not of the shape and dtype of",
    ),
    "fused_gradient_of_another_shape": (
        lambda h, t: h["fused"]["gradients"].__setitem__("fc2.bias", h["fused"]["gradients"]["fc1.weight"]),
        ArtifactError,
        r"the gradient '.*' of 'fc2.bias' is declared float32\[128x784\], not float32\[10\] like its parameter",
    ),
    "fused_program_overlaps": (
        lambda h, t: h["fused"]["plan"].__setitem__("offsets", {k: 0 for k in h["fused"]["plan"]["offsets"]}),
        ArtifactError,
        "its fused step's memory plan puts",
    ),
    # found by fuzzing evaluate() and run(): a state the fused step gives no role (a KeyError feeding evaluate),
    # an inference graph without outputs (an IndexError in run)
    "fused_state_without_role": (
        lambda h, t: h["fused"]["state_roles"].pop(h["io"]["state"][0]),
        ArtifactError,
        "its fused step gives the state '.*' no role",
    ),
    "inference_graph_without_output": (
        lambda h, t: h["base"].__setitem__("outputs", []),
        ArtifactError,
        "its inference graph has no output, or an input that is no data input",
    ),
    "inference_graph_unfed_input": (
        lambda h, t: (
            h["base"]["inputs"].append(h["io"]["target"])
            or h["base"]["values"].update({h["io"]["target"]: ["int64", [4]]})
        ),
        ArtifactError,
        "its inference graph has no output, or an input that is no data input",
    ),
    "batch_plan_a_string": (
        lambda h, t: h.__setitem__("batch_plan", "x"),
        ArtifactError,
        "its 'batch_plan' is 'x', not an object",
    ),
}


@pytest.mark.parametrize("fault", list(ARTIFACT_FAULTS))
def test_crafted_artifact_faults(tmp_path, real, fault):
    edit, cls, match = ARTIFACT_FAULTS[fault]
    path = crafted(tmp_path, real()[0], edit, name=f"{fault}.etrain")
    refused(cls, match, lambda: et.TrainingSession(path), path)


def test_the_all_overlapping_plan_no_longer_trains(tmp_path, real):
    # before: it trained and reported a cross-entropy loss of -1.0; the untouched file trains normally
    source = real()[0]
    x, y = batch_for("mlp", 4)
    loss = et.TrainingSession(source).train_step(x, y)
    assert 0 < loss < 10
    path = crafted(tmp_path, source, _plan_all_zero)
    for fused in (True, False):
        refused(
            ArtifactError, "which is still live then", lambda f=fused: et.TrainingSession(path, fused=f), path
        )


def test_check_plan_accepts_in_place_and_refuses_a_shifted_or_unsafe_overlap():
    """The one legal sharing, an elementwise op writing over its dying input, and its near misses."""
    f32 = np.dtype("float32")
    g = Graph([], ["x"], [], {}, {"x": TensorInfo(f32, (8, 8))}, 17)
    gb = GraphBuilder(g)
    a = gb.add1("Relu", "x")  # a dies at b
    b = gb.add1("Neg", a)  # b may be written over a (Neg is in place)
    c = gb.add1("MatMul", b, b)  # c may not be written over b (MatMul reads b again)
    d = gb.add1("Neg", c)
    graph = make_static(gb.finish(outputs=[d]))
    program, plan = plan_memory(graph, reorder=False)
    check_plan(program, plan)
    assert (b, a) in plan.in_place and plan.offsets[a] == plan.offsets[b]

    def variant(**offsets) -> MemoryPlan:
        p = MemoryPlan.from_dict(plan.to_dict())
        p.offsets.update(offsets)
        p.arena_size = max(p.arena_size, max(o + 256 for o in p.offsets.values()))
        return p

    with pytest.raises(et.ModelError, match=f"puts {re.escape(repr(c))}.*on bytes of {re.escape(repr(b))}"):
        check_plan(program, variant(**{c: plan.offsets[b]}))
    with pytest.raises(et.ModelError, match=f"puts {re.escape(repr(b))}.*on bytes of {re.escape(repr(a))}"):
        check_plan(program, variant(**{b: plan.offsets[a] + 64}))  # in place, but shifted: corrupts
    # reached through an Interpreter too, before any arena is allocated
    from edgetrain.core.interpreter import Interpreter

    with pytest.raises(et.ModelError, match="on bytes of"):
        Interpreter(program, plan=variant(**{c: plan.offsets[b]}))


# ---- every plan the converter makes validates -------------------------------------------------------------
def _recurrent_graph() -> Graph:
    """LSTM -> GRU -> MatMul (as tests/runtime/test_numpy_only.py builds it)."""
    rng = np.random.default_rng(0)
    T, N, I, H = 5, 4, 3, 4
    g = Graph([], ["xs"], [], {}, {"xs": TensorInfo(np.dtype("float32"), (T, N, I))}, 18)
    gb = GraphBuilder(g)
    w = {
        k: gb.initializer(k, (0.5 * rng.standard_normal(s)).astype(np.float32))
        for k, s in [
            ("W", (1, 4 * H, I)),
            ("R", (1, 4 * H, H)),
            ("B", (1, 8 * H)),
            ("Wg", (1, 3 * H, H)),
            ("Rg", (1, 3 * H, H)),
            ("fc", (H, 3)),
        ]
    }
    ys, _, _ = gb.add("LSTM", ["xs", w["W"], w["R"], w["B"]], attrs={"hidden_size": H}, outputs=3)
    seq = gb.add1("Squeeze", ys, gb.initializer("axis1", np.array([1], np.int64)))
    _, hg = gb.add(
        "GRU", [seq, w["Wg"], w["Rg"]], attrs={"hidden_size": H, "linear_before_reset": 1}, outputs=2
    )
    last = gb.add1("Squeeze", hg, gb.initializer("axis0", np.array([0], np.int64)))
    logits = gb.add1("MatMul", last, w["fc"])
    return gb.finish(outputs=[logits])


CONVERTED = [
    ("mlp", "sgd"),
    ("lenet", "adam"),
    ("resnet_tiny", "sgd"),
    ("resnet_tiny", "adam"),
    ("depthwise_separable", "sgd"),
    ("resnet_tiny", "head-only"),
    ("recurrent", "sgd"),
    ("squeezenet", "sgd"),
]


@pytest.mark.parametrize("model,how", CONVERTED)
def test_every_artifact_the_converter_makes_validates(tmp_path, model, how):
    kw: dict[str, Any] = {"loss": et.CrossEntropyLoss()}
    kw["optimizer"] = et.Adam(lr=0.01) if how == "adam" else et.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4)
    if how == "head-only":
        kw["trainable"] = ["fc.*"]
    if model == "recurrent":
        source, batch = _recurrent_graph(), None
        x, y = np.random.default_rng(1).standard_normal((5, 4, 3)).astype(np.float32), np.array([0, 2, 1, 0])
    elif model == "squeezenet":
        from zoo import load

        source, batch = load("squeezenet"), 1
        x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
        y = np.array([[[7]]])  # its output is [1, 1000, 1, 1]: classes per position
    else:
        source, batch = MODELS[model][0](), 4
        x, y = batch_for(model, 4)
    art = et.convert(source, batch_size=batch, **kw)
    path = tmp_path / f"{model}.etrain"
    art.save(path)
    loaded = load_artifact(path)  # checks every graph and both plans
    check_plan(loaded.program, loaded.plan)
    if loaded.fused is not None:
        check_plan(loaded.fused.program, loaded.fused.plan)
    for fused in (True, False):
        assert np.isfinite(et.TrainingSession(path, fused=fused).train_step(x, y))
    # the given order's plan too (the planner keeps it when no reordering does better)
    check_plan(*plan_memory(art.graph, reorder=False))


# ---- checkpoints --------------------------------------------------------------------------------------------
CHECKPOINT_FAULTS = {
    "step_a_string": (
        lambda h, t: h.__setitem__("step", "abc"),
        "its step count 'abc' is not an integer >= 0",
    ),
    "step_negative": (lambda h, t: h.__setitem__("step", -1), "its step count -1"),
    "step_a_bool": (lambda h, t: h.__setitem__("step", True), "its step count True"),
    "step_a_float": (lambda h, t: h.__setitem__("step", 3.0), "its step count 3.0"),
    "user_state_a_list": (lambda h, t: h.__setitem__("user_state", []), "its user_state is a list"),
    "lr_a_string": (
        lambda h, t: h.__setitem__("lr", "0.1"),
        "its learning rate '0.1' is not a finite number",
    ),
    "lr_infinite": (
        lambda h, t: h.__setitem__("lr", "__1e400__"),
        "its learning rate inf is not a finite number",
    ),
    "lr_negative": (lambda h, t: h.__setitem__("lr", -0.5), "its learning rate -0.5"),
    "lr_nan": (
        lambda h, t: h.__setitem__("lr", float("nan")),
        "its learning rate nan is not a finite number",
    ),
    "program_id_a_number": (lambda h, t: h.__setitem__("program_id", 7), "its program_id 7 is not a string"),
    "program_id_missing": (lambda h, t: h.pop("program_id"), "its program_id None is not a string"),
    "artifact_a_list": (lambda h, t: h.__setitem__("artifact", ["a"]), "its artifact name"),
    "program_id_other": (lambda h, t: h.__setitem__("program_id", "0" * 64), "belongs to another model"),
    "tensor_missing": (lambda h, t: t.pop(next(iter(t))), "lacks '.*'; it is damaged or incomplete"),
    "tensor_wrong_shape": (
        lambda h, t: t.__setitem__(next(iter(t)), np.zeros(3, np.float32)),
        r"is float32\[3\], expected float32",
    ),
    "tensor_wrong_dtype": (
        lambda h, t: t.__setitem__(k := next(iter(t)), t[k].astype(np.float64)),
        "is float64.*expected float32",
    ),
    "tensor_nan": (lambda h, t: t[next(iter(t))].fill(np.nan), "holds non-finite values"),
}


@pytest.mark.parametrize("fault", list(CHECKPOINT_FAULTS))
def test_crafted_checkpoint_faults(tmp_path, real, fault):
    artifact, ck = real()
    edit, match = CHECKPOINT_FAULTS[fault]
    path = crafted(tmp_path, ck, edit, name=f"{fault}.etck")
    sess = et.TrainingSession(artifact)
    before = sess.snapshot()
    refused(ArtifactError, match, lambda: sess.load_checkpoint(path), path)
    assert sess.step == before["step"] and sess.lr == before["lr"]  # nothing was restored
    for k, v in sess.parameters().items():
        np.testing.assert_array_equal(v, before["values"][k])
    assert sess.load_checkpoint(ck) == {"epoch": 1}  # the real one loads


# ---- file-system failures name the user's file ------------------------------------------------------------
def _assert_names(e: StorageError, path: Path) -> None:
    assert e.filename == str(path) and str(path) in str(e), str(e)
    assert ".tmp" not in str(e), f"the message names the temporary file: {e}"


def test_writing_into_a_missing_folder_or_under_a_file(tmp_path, real):
    sess = et.TrainingSession(real()[0])
    missing = tmp_path / "no" / "such" / "ck.etck"
    with pytest.raises(MissingFileError, match="cannot write the checkpoint") as e:
        sess.save_checkpoint(missing)
    assert isinstance(e.value, FileNotFoundError) and not isinstance(e.value, ArtifactError)
    _assert_names(e.value, missing)
    (tmp_path / "plain").write_text("a file, not a folder")
    under = tmp_path / "plain" / "ck.etck"
    with pytest.raises(StorageError, match="cannot write the checkpoint.*Not a directory") as e:
        sess.save_checkpoint(under)
    _assert_names(e.value, under)
    with pytest.raises(StorageError) as e:
        write_container(under, kind="artifact", header={}, tensors={})
    assert "cannot write the artifact" in str(e.value)
    _assert_names(e.value, under)
    # reading: a missing file is a MissingFileError, a folder a StorageError, both OSErrors naming the path
    with pytest.raises(MissingFileError):
        sess.load_checkpoint(missing)
    with pytest.raises(StorageError, match="is a directory"):
        sess.load_checkpoint(tmp_path)
    with pytest.raises(MissingFileError):
        et.TrainingSession(tmp_path / "nope.etrain")


PERMISSION_CHILD = textwrap.dedent("""
    import os, sys
    from edgetrain.core.container import read_container, write_container
    from edgetrain.core.errors import StorageError
    folder, secret = sys.argv[1], sys.argv[2]
    target = os.path.join(folder, "ck.etck")
    try:
        write_container(target, kind="checkpoint", header={}, tensors={})
        print("WROTE")
    except StorageError as e:
        assert e.filename == target and ".tmp" not in str(e), str(e)
        print("WRITE", type(e).__name__, e.errno, e)
    try:
        read_container(secret)
        print("READ")
    except StorageError as e:
        assert e.filename == secret, str(e)
        print("READ-REFUSED", type(e).__name__, e.errno, e)
""")


def _without_dac_override() -> None:
    """In a child about to run as root: drops the capabilities that let root ignore file modes
    (CAP_DAC_OVERRIDE 1, CAP_DAC_READ_SEARCH 2) from its bounding set, so that after exec chmod binds it too."""
    if os.geteuid() != 0:
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def test_read_only_and_forbidden_files(tmp_path):
    """A folder that cannot be written and a file that cannot be read, for real: chmod, in a child process that,
    when it runs as root (whom modes do not stop), first gives up the capabilities to override them."""
    folder = tmp_path / "ro"
    folder.mkdir()
    secret = tmp_path / "secret.etck"
    write_container(secret, kind="checkpoint", header={}, tensors={})
    folder.chmod(0o555)
    secret.chmod(0o000)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", PERMISSION_CHILD, str(folder), str(secret)],
            capture_output=True,
            text=True,
            env=env,
            preexec_fn=_without_dac_override,
            timeout=120,
        )
    except subprocess.SubprocessError as e:  # the capability could not be dropped here (no CAP_SETPCAP)
        pytest.skip(f"running as root and cannot give up CAP_DAC_OVERRIDE: {e}")
    finally:
        folder.chmod(0o755)
        secret.chmod(0o644)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WRITE StorageError 13" in proc.stdout and "cannot write the checkpoint" in proc.stdout, (
        proc.stdout
    )
    assert "READ-REFUSED StorageError 13" in proc.stdout and "cannot read" in proc.stdout, proc.stdout
    assert os.listdir(folder) == []


FULL_CHILD = textwrap.dedent("""
    import resource, signal, sys
    import numpy as np
    from edgetrain.core.container import write_container
    from edgetrain.core.errors import StorageError
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    path = sys.argv[1]
    try:
        write_container(path, kind="checkpoint", header={"new": 1}, tensors={"big": np.ones(1 << 20, np.float32)})
        print("WROTE")
    except StorageError as e:
        print("REFUSED", e.errno, e.filename, "|", e)
""")


def test_a_write_that_runs_out_of_room_names_the_checkpoint(tmp_path):
    """A real write failure midway (the file-size limit of the process: EFBIG, as a full disk gives ENOSPC):
    a StorageError naming the checkpoint, the old file intact, no temporary file left."""
    path = tmp_path / "ck.etck"
    write_container(path, kind="checkpoint", header={"old": 1}, tensors={"w": np.zeros(4, np.float32)})
    before = path.read_bytes()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", FULL_CHILD, str(path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"REFUSED 27 {path} |"), proc.stdout  # 27: EFBIG, File too large
    assert f"cannot write the checkpoint '{path}': File too large" in proc.stdout
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["ck.etck"]


# ---- stale temporary files ----------------------------------------------------------------------------------
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: its pid now names no process
    return proc.pid


WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from edgetrain.core.container import write_container
    big = np.ones(8 << 20, np.float32)  # 32 MB: each write takes a while
    i = 0
    while True:
        i += 1
        write_container(sys.argv[1], kind="checkpoint", header={"i": i}, tensors={"big": big})
""")


def _killed_midway(path: Path) -> Path:
    """Runs a writer of path and SIGKILLs it while its temporary file exists; returns that file."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    for _ in range(20):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], env=env)
        try:
            deadline = time.monotonic() + 60
            temps: list[Path] = []
            while not temps and time.monotonic() < deadline and proc.poll() is None:
                temps = [p for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.{proc.pid}.")]
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        left = [p for p in temps if p.exists()]
        if left:
            return left[0]
    pytest.fail("no write was caught midway in 20 tries")


def test_stale_temporaries_of_killed_writers_are_removed_on_the_next_write_and_load(tmp_path, real):
    artifact, _ = real()
    sess = et.TrainingSession(artifact)
    ck = tmp_path / "ck.etck"
    sess.save_checkpoint(ck)
    # a real writer SIGKILLed midway leaves its temporary file; the next save removes it
    stale = _killed_midway(ck)
    assert stale.exists()
    sess.save_checkpoint(ck)
    assert not stale.exists()
    # ... and so does the next load (a temporary file named for a pid that is gone)
    dead = tmp_path / f".ck.etck.{_dead_pid()}.0123abcd.tmp"
    dead.write_bytes(b"half a checkpoint")
    sess.load_checkpoint(ck)
    assert not dead.exists()
    # a live writer's temporary file stays: ours, and another live process's
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = [tmp_path / f".ck.etck.{pid}.0123abcd.tmp" for pid in (os.getpid(), sleeper.pid)]
        for p in live:
            p.write_bytes(b"being written")
        sess.save_checkpoint(ck)
        sess.load_checkpoint(ck)
        assert all(p.exists() for p in live)
    finally:
        sleeper.kill()
        sleeper.wait()
    # only this file's temporaries: another file's, and look-alikes, are not touched
    other = tmp_path / f".other.etck.{_dead_pid()}.0123abcd.tmp"
    alike = tmp_path / f".ck.etck.{_dead_pid()}.notahex.tmp"
    for p in (other, alike):
        p.write_bytes(b"x")
    assert remove_stale_temporaries(ck) == [str(live[1])]  # the sleeper is gone now
    assert other.exists() and alike.exists()


# ---- labels -----------------------------------------------------------------------------------------------------
def test_out_of_range_labels_name_the_value_the_sample_and_the_classes(tmp_path, real):
    sess = et.TrainingSession(real()[0])
    x, y = batch_for("mlp", 4)
    n = sess.num_classes
    cases = {
        "high": (
            np.array([0, 1, n, 2]),
            f"label {n} is out of range: the model has {n} classes \\(0 to {n - 1}\\); it is sample 2",
        ),
        "negative": (np.array([0, -1, 1, 2]), "label -1 is out of range.*sample 1 of the batch"),
        "huge_float": (np.array([0, 1, 2, 1e30]), "label 1e\\+30 is out of range.*sample 3"),
        "uint64": (np.array([0, 1, 2**64 - 1, 0], np.uint64), "label 18446744073709551615 is out of range"),
        "fraction": (np.array([0, 1.5, 2, 0]), "labels must be integer class indices, got float64"),
        "nan": (np.array([0, np.nan, 2, 0]), "labels must be integer class indices"),
    }
    for labels, match in cases.values():
        with pytest.raises(FeedError, match=match):
            sess.train_step(x, labels)
        with pytest.raises(FeedError, match=match):
            sess.evaluate(x, labels)
    assert sess.step == 0
    assert np.isfinite(sess.train_step(x, np.array([0, 1, n - 1, 2.0])))  # integral floats are labels


def test_ignore_index_labels_are_accepted(tmp_path):
    art = et.convert(
        MODELS["mlp"][0](),
        loss=et.CrossEntropyLoss(ignore_index=-100),
        optimizer=et.SGD(lr=0.05),
        batch_size=4,
    )
    path = tmp_path / "ignore.etrain"
    art.save(path)
    sess = et.TrainingSession(path)
    x, _ = batch_for("mlp", 4)
    assert np.isfinite(sess.train_step(x, np.array([0, -100, 1, -100])))
    with pytest.raises(
        FeedError, match="label -5 is out of range.*or -100 to ignore a sample\\); it is sample 1"
    ):
        sess.train_step(x, np.array([0, -5, 1, -100]))


def test_limit_errors_are_memory_errors_naming_the_file(tmp_path, real):
    path = crafted(tmp_path, real()[0], lambda h, t: h["plan"].__setitem__("arena_size", 16 << 30))
    with pytest.raises(MemoryError) as e:  # `except MemoryError` code keeps working
        et.TrainingSession(path)
    assert isinstance(e.value, LimitError) and isinstance(e.value, ValueError) and str(path) in str(e.value)
