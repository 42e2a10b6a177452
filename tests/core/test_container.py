"""The container format (edgetrain.core.container) and graph serialization (edgetrain.core.serialize): round trips
of every dtype, byte-identical re-writes, 64-byte alignment, zero-copy reads, one distinct error per kind of damage, the
frozen format-1 fixture, atomic writes (failures midway and real SIGKILLs), and graphs of real models that read
back equal and compute identical outputs.

`python tests/core/test_container.py` writes the fixture of the current format version when it does not exist
yet: after a
format change, add container_v2.etck beside container_v1.etck, which stays as it is."""

from __future__ import annotations

import errno
import json
import math
import mmap
import os
import signal
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from device import PYTHONS, run_on_device
from models import MODELS, batch_for

import edgetrain as et
from edgetrain.core import container
from edgetrain.core.container import (
    CURRENT_VERSION,
    MAGIC,
    SUPPORTED_VERSIONS,
    inspect_container,
    read_container,
    write_container,
)
from edgetrain.core.errors import ArtifactError, MissingFileError, StorageError, UnsupportedError
from edgetrain.core.interpreter import Interpreter
from edgetrain.core.ir import Graph, Node, TensorInfo
from edgetrain.core.serialize import graph_from_dict, graph_to_dict

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parents[1] / "data" / "container_v1.etck"
DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]
SHAPES = [(), (0,), (3, 0, 2), (7,), (2, 3, 5)]


def random_array(dtype: str, shape, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal(shape) * 100).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def sample_tensors() -> dict[str, np.ndarray]:
    return {
        "w": random_array("float32", (5, 3), 1),
        "steps": np.arange(9, dtype=np.int64),
        "mask": random_array("bool", (4, 4), 2),
        "half": random_array("float16", (33,), 3),
    }


@pytest.fixture
def sample(tmp_path) -> Path:
    path = tmp_path / "model.etrain"
    write_container(path, kind="artifact", header={"name": "sample", "lr": 0.1}, tensors=sample_tensors())
    return path


def raises(path, match: str, **kw) -> str:
    """read_container(path) fails with an ArtifactError that names the file and matches `match`."""
    with pytest.raises(ArtifactError, match=match) as e:
        read_container(path, **kw)
    assert str(path) in str(e.value), str(e.value)
    return str(e.value)


def patched(path: Path, at: int, new: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[at : at + len(new)] = new
    path.write_bytes(bytes(data))


# ---- round trips -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_dtype_and_shape(tmp_path, dtype):
    tensors = {f"t{k}": random_array(dtype, s, k) for k, s in enumerate(SHAPES)}
    path = tmp_path / "x.etck"
    n = write_container(path, kind="checkpoint", header={"dtype": dtype}, tensors=tensors)
    assert n == path.stat().st_size
    header, got = read_container(path, kind="checkpoint")
    assert header == {"dtype": dtype}
    assert list(got) == list(tensors)
    for name, a in tensors.items():
        b = got[name]
        assert b.dtype == a.dtype and b.shape == a.shape, name
        assert b.tobytes() == a.tobytes(), name  # bit-exact, NaN payloads and -0.0 included
        assert not b.flags.writeable


def test_large_strided_and_big_endian_inputs(tmp_path):
    big = np.random.default_rng(0).standard_normal((1000, 1000)).astype(np.float32)
    tensors = {
        "big": big,
        "transposed": big[:300, :200].T,  # not contiguous: stored in C order
        "big_endian": np.arange(10, dtype=">i4"),  # stored little-endian
    }
    path = tmp_path / "big.etck"
    write_container(path, kind="checkpoint", header={}, tensors=tensors)
    _, got = read_container(path)
    np.testing.assert_array_equal(got["big"], big)
    np.testing.assert_array_equal(got["transposed"], big[:300, :200].T)
    np.testing.assert_array_equal(got["big_endian"], np.arange(10))
    assert got["big_endian"].dtype == np.dtype("<i4")
    assert path.stat().st_size < 4_000_000 + 240_000 + 4096


def test_header_round_trip_is_exact(tmp_path):
    header = {
        "floats": [0.1, 1 / 3, 1e-300, 5e-324, -0.0, 2.0**60, 123456789.123456789],
        "text": "naïve ∑ 🙂",
        "nested": {"b": [1, [2, {"c": None}]], "a": True},
        "big": 2**63 + 11,
    }
    path = tmp_path / "h.etrain"
    write_container(path, kind="artifact", header=header, tensors={})
    got, tensors = read_container(path, kind="artifact")
    assert got == header and tensors == {}
    assert [math.copysign(1, f) for f in got["floats"]] == [math.copysign(1, f) for f in header["floats"]]


def test_rewrites_are_byte_identical(tmp_path, sample):
    again = tmp_path / "again.etrain"
    write_container(again, kind="artifact", header={"lr": 0.1, "name": "sample"}, tensors=sample_tensors())
    assert again.read_bytes() == sample.read_bytes()  # header key order does not matter: keys are sorted
    reordered = dict(reversed(list(sample_tensors().items())))
    write_container(again, kind="artifact", header={"lr": 0.1, "name": "sample"}, tensors=reordered)
    assert again.read_bytes() != sample.read_bytes()  # tensor order is kept as given
    assert list(read_container(again)[1]) == list(reordered)


def test_layout_alignment_and_checksum(sample):
    data = sample.read_bytes()
    info = inspect_container(sample)
    assert data[:8] == MAGIC and int.from_bytes(data[8:12], "little") == CURRENT_VERSION
    assert int.from_bytes(data[12:16], "little") == container.KINDS["artifact"]
    hlen = int.from_bytes(data[16:24], "little")
    header = json.loads(zlib.decompress(data[24 : 24 + hlen]))
    assert hlen == info["header_bytes"] and header["header"]["name"] == "sample"
    assert info["data_start"] % 64 == 0 and set(data[24 + hlen : info["data_start"]]) <= {0}
    _, got = read_container(sample)
    for name, entry in info["tensors"].items():
        assert entry["offset"] % 64 == 0, (name, entry)
        assert data[entry["offset"] : entry["offset"] + entry["nbytes"]] == sample_tensors()[name].tobytes()
        # the mapping is page-aligned, so the arrays are 64-byte aligned in memory too
        assert got[name].ctypes.data % 64 == 0
    import hashlib

    assert hashlib.sha256(data[:-32]).digest() == data[-32:]
    assert info["size"] == 24 + hlen + info["padding_bytes"] + info["tensor_bytes"] + 32


def test_reads_are_zero_copy_and_read_only(sample):
    _, got = read_container(sample)
    for name, a in got.items():
        assert not a.flags.owndata and not a.flags.writeable, name
        root = a
        while isinstance(root.base, np.ndarray):
            root = root.base
        owner = root.base.obj if isinstance(root.base, memoryview) else root.base
        assert isinstance(owner, mmap.mmap), (name, type(owner))
    with pytest.raises(ValueError):
        got["w"][0, 0] = 1.0


# ---- errors ----------------------------------------------------------------------------------------------------
def test_missing_file_and_directory(tmp_path):
    # a file-system failure is a StorageError (an OSError) naming the file, not an ArtifactError (a bad file)
    with pytest.raises(MissingFileError, match="no such file") as e:
        read_container(tmp_path / "nope.etrain")
    assert isinstance(e.value, FileNotFoundError) and e.value.filename == str(tmp_path / "nope.etrain")
    assert str(tmp_path / "nope.etrain") in str(e.value)
    with pytest.raises(StorageError, match="is a directory") as e:
        read_container(tmp_path)
    assert str(tmp_path) in str(e.value) and not isinstance(e.value, ArtifactError)


def test_not_an_edgetrain_file(tmp_path):
    cases = {
        "garbage.bin": (bytes(range(7, 200)), r"not an edgetrain artifact or checkpoint.*first bytes are"),
        "notes.txt": (
            b"hello, this is text\n" * 5,
            "not an edgetrain artifact or checkpoint.*looks like text",
        ),
        "model.onnx": (MODELS["mlp"][0]().SerializeToString(), "looks like an ONNX model.*edgetrain convert"),
        "weights.npz": (b"PK\x03\x04" + bytes(60), "zip archive"),
    }
    for name, (data, match) in cases.items():
        (tmp_path / name).write_bytes(data)
        raises(tmp_path / name, match)


def test_text_mode_damage_is_named(tmp_path, sample):
    damaged = tmp_path / "crlf.etrain"
    damaged.write_bytes(sample.read_bytes().replace(b"\r\n", b"\n"))
    raises(damaged, "text mode.*binary mode")


def test_newer_and_impossible_versions(sample):
    patched(sample, 8, (2).to_bytes(4, "little"))
    raises(sample, r"format 2, which is newer than this edgetrain reads \(1\); upgrade edgetrain")
    patched(sample, 8, (0).to_bytes(4, "little"))
    raises(sample, "corrupt: its format version field says 0")


def test_truncated_at_many_points(tmp_path, sample):
    data = sample.read_bytes()
    info = inspect_container(sample)
    t = info["tensors"]
    end = len(data)
    cuts = {
        0: "empty",
        5: "truncated: it ends after 5 bytes, inside the 24-byte preamble",
        23: "truncated.*preamble",
        30: "truncated: its header should be",
        info["data_start"] + 10: "truncated: tensor 'w' needs bytes",
        t["mask"]["offset"] + 3: f"truncated: tensor 'mask' needs bytes {t['mask']['offset']}",
        t["half"]["offset"] + t["half"]["nbytes"]: "truncated: its 32-byte checksum should end",
        end - 1: f"truncated.*checksum.*ends at byte {end - 1}.*complete file is {end} bytes",
    }
    for cut, match in cuts.items():
        part = tmp_path / f"cut{cut}.etrain"
        part.write_bytes(data[:cut])
        raises(part, match)
        raises(part, match, verify=False)  # truncation is found without the checksum too


def test_damaged_bytes_are_corrupt(tmp_path, sample):
    data = sample.read_bytes()
    info = inspect_container(sample)
    damage = {
        "header_start": (24, b"]", "corrupt: its header does not decode"),
        "header_middle": (24 + info["header_bytes"] // 2, b"\xff", "corrupt"),
        "tensor": (info["tensors"]["steps"]["offset"] + 5, b"\x01", "corrupt: its SHA-256 checksum"),
        "checksum": (len(data) - 7, bytes([data[-7] ^ 0xFF]), "corrupt: its SHA-256 checksum"),
    }
    for what, (at, new, match) in damage.items():
        bad = tmp_path / f"{what}.etrain"
        bad.write_bytes(data)
        patched(bad, at, new)
        raises(bad, match)
    # verify=False skips the checksum: damage inside a tensor then goes unnoticed (the reason verify is the default)
    _, got = read_container(tmp_path / "tensor.etrain", verify=False)
    assert not np.array_equal(got["steps"], sample_tensors()["steps"])
    extra = tmp_path / "extra.etrain"
    extra.write_bytes(data + b"\0")
    raises(extra, "corrupt: it has 1 bytes after its end")
    # a tensor table that places a tensor elsewhere than the writer would (re-encoded, so it decodes fine)
    hlen = info["header_bytes"]
    top = json.loads(zlib.decompress(data[24 : 24 + hlen]))
    top["tensors"]["steps"]["offset"] += 64
    text = zlib.compress(json.dumps(top, sort_keys=True, separators=(",", ":")).encode(), 9)
    moved = tmp_path / "table_offset.etrain"
    moved.write_bytes(data[:16] + len(text).to_bytes(8, "little") + text + data[24 + hlen :])
    raises(moved, "corrupt")


def test_wrong_and_unknown_kind(tmp_path, sample):
    raises(sample, r"is an artifact \(\.etrain\), not a checkpoint \(\.etck\)", kind="checkpoint")
    ck = tmp_path / "c.etck"
    write_container(ck, kind="checkpoint", header={}, tensors={})
    raises(
        ck, r"is a checkpoint \(\.etck\), not an artifact \(\.etrain\).*edgetrain convert", kind="artifact"
    )
    patched(ck, 12, (9).to_bytes(4, "little"))
    raises(ck, "corrupt")  # the checksum covers the kind code
    raises(ck, "kind code 9, which this edgetrain does not know", verify=False)
    with pytest.raises(ArtifactError, match="unknown kind 'model'"):
        read_container(sample, kind="model")


def test_write_errors(tmp_path):
    path = tmp_path / "w.etrain"
    bad = [
        ({"kind": "model"}, "unknown kind 'model'"),
        ({"header": [1]}, "header must be a dict"),
        ({"header": {"x": {1, 2}}}, "header is not JSON-able"),
        ({"header": {"x": float("nan")}}, "header is not JSON-able"),
        ({"tensors": {"o": np.array([object()])}}, "tensor 'o' has dtype object"),
        ({"tensors": {"s": np.array(["a"])}}, "tensor 's' has dtype <U1"),
        ({"tensors": {1: np.zeros(1)}}, "tensor names must be strings"),
    ]
    for change, match in bad:
        kw = {"kind": "artifact", "header": {}, "tensors": {}, **change}
        with pytest.raises(ArtifactError, match=match):
            write_container(path, **kw)
    assert os.listdir(tmp_path) == []


# ---- the frozen format-1 file ----------------------------------------------------------------------------------
def fixture_content() -> tuple[dict, dict[str, np.ndarray]]:
    header = {
        "model": "fixture",
        "step": 7,
        "lr": 0.1,
        "names": ["α", "b"],
        "nested": {"x": None, "ok": True},
    }
    tensors = {
        "weights": (np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5) / 8,
        "half": np.array([-1.5, 0.0, 65504.0, np.inf, -np.inf], np.float16),
        "counts": np.array([-(2**62), 0, 2**62 + 1], np.int64),
        "mask": np.array([[True, False], [False, True]]),
        "pixels": np.arange(5, dtype=np.uint8) * 51,
        "i8": np.array([-128, 0, 127], np.int8),
        "i16": np.array([-32768, 12345], np.int16),
        "i32": np.array([[-(2**31)], [2**31 - 1]], np.int32),
        "pi": np.array(np.pi),
        "empty": np.zeros((0, 3), np.int32),
    }
    return header, tensors


def test_reads_the_format_1_fixture_exactly(tmp_path):
    header, tensors = fixture_content()
    got_header, got = read_container(FIXTURE, kind="checkpoint")
    assert got_header == header
    assert list(got) == list(tensors)
    for name, a in tensors.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape, name
        assert got[name].tobytes() == a.tobytes(), name
    assert inspect_container(FIXTURE)["version"] == 1 and 1 in SUPPORTED_VERSIONS
    if CURRENT_VERSION == 1:  # while format 1 is current, the writer must still produce exactly this file
        out = tmp_path / "again.etck"
        write_container(out, kind="checkpoint", header=header, tensors=tensors)
        assert out.read_bytes() == FIXTURE.read_bytes(), (
            "format 1 changed: bump CURRENT_VERSION and add a reader"
        )


# ---- atomic writes ---------------------------------------------------------------------------------------------
def assert_untouched(directory: Path, path: Path, before: bytes) -> None:
    assert path.read_bytes() == before
    assert sorted(os.listdir(directory)) == [path.name], "a temporary file was left behind"


def test_a_tensor_that_fails_to_convert_leaves_the_old_file(tmp_path, sample):
    before = sample.read_bytes()

    class Broken:
        def __array__(self, *a, **k):
            raise RuntimeError("sensor unplugged")

    with pytest.raises(ArtifactError, match="tensor 'bad' cannot be made an array.*sensor unplugged"):
        write_container(sample, kind="artifact", header={}, tensors={"ok": np.zeros(3), "bad": Broken()})
    assert_untouched(tmp_path, sample, before)


@pytest.mark.parametrize("failure", ["disk_full_midway", "interrupt_midway", "fsync", "replace"])
def test_a_write_failing_midway_leaves_the_old_file(tmp_path, sample, monkeypatch, failure):
    before = sample.read_bytes()
    written = []
    real_bytes = container._tensor_bytes

    def failing_bytes(array, dtype):
        written.append(array.shape)
        if len(written) == 2:  # the first tensor is already in the temp file
            if failure == "interrupt_midway":
                raise KeyboardInterrupt
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_bytes(array, dtype)

    def fail(*a, **k):
        raise OSError(errno.EIO, "Input/output error")

    if failure.endswith("midway"):
        monkeypatch.setattr(container, "_tensor_bytes", failing_bytes)
    else:
        monkeypatch.setattr(container.os, failure, fail)
    expected = KeyboardInterrupt if failure == "interrupt_midway" else StorageError
    with pytest.raises(expected) as e:
        write_container(
            sample, kind="artifact", header={"new": 1}, tensors={"a": np.ones(100), "b": np.ones(5)}
        )
    if expected is StorageError:  # it names the file asked for, not the temporary file
        assert f"cannot write the artifact '{sample}'" in str(e.value) and ".tmp" not in str(e.value)
        assert e.value.filename == str(sample) and e.value.errno in (errno.ENOSPC, errno.EIO)
    monkeypatch.undo()
    assert_untouched(tmp_path, sample, before)
    # a first write that fails leaves no file at all
    if failure == "replace":
        monkeypatch.setattr(container.os, "replace", fail)
        with pytest.raises(StorageError):
            write_container(tmp_path / "new.etrain", kind="artifact", header={}, tensors={})
        assert not (tmp_path / "new.etrain").exists()
        assert_untouched(tmp_path, sample, before)


def test_written_files_get_the_usual_permissions(tmp_path):
    path = tmp_path / "p.etck"
    write_container(path, kind="checkpoint", header={}, tensors={})
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


KILL_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from edgetrain.core.container import write_container
    path = sys.argv[1]
    big = np.empty(3_000_000, np.float32)
    i = 0
    while True:
        i += 1
        big.fill(i)
        write_container(path, kind="checkpoint", header={"i": i}, tensors={"big": big, "i": np.array([i] * 5)})
        print(i, flush=True)
""")


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkill_at_random_moments_leaves_old_or_new_file(tmp_path, report):
    path = tmp_path / "ckpt.etck"
    write_container(
        path, kind="checkpoint", header={"i": 0}, tensors={"big": np.zeros(3), "i": np.zeros(5, int)}
    )
    rng = np.random.default_rng(7)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    seen, midway = [], 0
    for _ in range(4):
        proc = subprocess.Popen(
            [sys.executable, "-c", KILL_SCRIPT, str(path)], stdout=subprocess.PIPE, text=True, env=env
        )
        try:
            first = int(proc.stdout.readline())  # the loop is running: one write has completed
            time.sleep(rng.uniform(0.0, 0.4))
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            rest = proc.communicate()[0].split()
        last = int(rest[-1]) if rest else first
        # a killed writer cannot clean up after itself; the next read of the file does (its writer is gone)
        midway += any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
        header, tensors = read_container(path, kind="checkpoint", verify=True)
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "a stale temporary file stayed"
        i = header["i"]
        assert i in (last, last + 1), (i, last)  # the last completed write, or one whose rename had happened
        assert np.all(tensors["i"] == i) and np.all(tensors["big"] == i)
        seen.append(i)
    report(
        "container", f"SIGKILL test: 4 kills, file intact each time at writes {seen}; {midway} landed midway"
    )


# ---- graphs ----------------------------------------------------------------------------------------------------
def same_value(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, (list, tuple)):
        return isinstance(b, list) and len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, np.generic):
        a = a.item()
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return (
        type(a) is type(b)
        and a == b
        and (not isinstance(a, float) or math.copysign(1, a) == math.copysign(1, b))
    )


def assert_same_graph(g: Graph, h: Graph) -> None:
    assert (g.name, g.opset, g.opsets, g.inputs, g.outputs) == (
        h.name,
        h.opset,
        h.opsets,
        h.inputs,
        h.outputs,
    )
    assert list(g.initializers) == list(h.initializers)
    for name in g.initializers:
        assert same_value(np.asarray(g.initializers[name]), h.initializers[name]), name
    assert g.values == h.values
    assert len(g.nodes) == len(h.nodes)
    for m, n in zip(g.nodes, h.nodes):
        assert (m.op_type, m.domain, m.name, m.inputs, m.outputs) == (
            n.op_type,
            n.domain,
            n.name,
            n.inputs,
            n.outputs,
        )
        assert set(m.attrs) == set(n.attrs), m.label
        for k in m.attrs:
            assert same_value(m.attrs[k], n.attrs[k]), (m.label, k, m.attrs[k], n.attrs[k])


def store_and_load(tmp_path: Path, graphs: dict[str, Graph], extra: dict[str, np.ndarray] | None = None):
    """Writes graphs (by prefix) into one container, reads it back: ({prefix: Graph}, tensors, file bytes)."""
    header, tensors = {}, dict(extra or {})
    for prefix, g in graphs.items():
        d, t = graph_to_dict(g, prefix=prefix)
        assert not set(t) & set(tensors)
        header[prefix] = d
        tensors.update(t)
    path = tmp_path / "g.etrain"
    write_container(path, kind="artifact", header=header, tensors=tensors)
    back, got = read_container(path, kind="artifact")
    return {p: graph_from_dict(back[p], got) for p in graphs}, got, path.read_bytes()


@pytest.mark.parametrize("model", list(MODELS))
def test_imported_model_graphs_round_trip(tmp_path, model):
    build = MODELS[model][0]
    g = et.import_model(build(), batch_size=4)
    loaded, _, data = store_and_load(tmp_path, {"": g})
    assert_same_graph(g, loaded[""])
    loaded[""].verify(static=True)
    x, _ = batch_for(model, 4)
    ours = Interpreter(g).run({"input": x})
    theirs = Interpreter(loaded[""]).run({"input": x})
    assert all(a.tobytes() == b.tobytes() for a, b in zip(ours, theirs))
    # deterministic: the same model imported again gives the same dict and the same file
    again = et.import_model(build(), batch_size=4)
    assert json.dumps(graph_to_dict(again)[0]) == json.dumps(graph_to_dict(g)[0])
    assert store_and_load(tmp_path, {"": again})[2] == data


def test_training_step_graph_round_trips_and_trains_identically(tmp_path, report):
    art = et.convert(
        MODELS["lenet"][0](),
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.05, momentum=0.9),
        batch_size=8,
    )
    initial = {"initial/" + k: v for k, v in art.initial.items()}
    loaded, got, data = store_and_load(tmp_path, {"step/": art.graph, "inference/": art.inference}, initial)
    assert_same_graph(art.graph, loaded["step/"])
    assert_same_graph(art.inference, loaded["inference/"])
    x, y = batch_for("lenet", 8)
    a_step, b_step = Interpreter(art.graph), Interpreter(loaded["step/"])
    a_vals = dict(art.initial)
    b_vals = {k: got["initial/" + k] for k in art.initial}
    for _ in range(3):
        a = dict(zip(art.graph.outputs, a_step.run(art.feeds(x, y, None, a_vals))))
        b = dict(zip(art.graph.outputs, b_step.run(art.feeds(x, y, None, b_vals))))
        assert all(a[k].tobytes() == b[k].tobytes() for k in a)
        a_vals = {k: a[v] for k, v in art.updates.items()}
        b_vals = {k: b[v] for k, v in art.updates.items()}
    # what the format costs for the step graph alone (reported, and kept small)
    path = tmp_path / "step.etrain"
    d, t = graph_to_dict(art.graph)
    write_container(path, kind="artifact", header={"graph": d}, tensors=t)
    info = inspect_container(path)
    overhead = info["size"] - info["tensor_bytes"]
    report(
        "container",
        f"LeNet training step graph ({len(art.graph.nodes)} nodes, {len(t)} tensors): header "
        f"{info['header_bytes']} B + preamble 24 B + padding {info['padding_bytes']} B + checksum 32 B = "
        f"{overhead} B overhead on {info['tensor_bytes']} B of tensors",
    )
    assert overhead < 64 * 1024


def odd_graph() -> Graph:
    """Attributes of every storable kind, nodes without names or with repeated names, symbolic and unknown
    shapes; the Constant nodes run."""
    f32 = np.dtype("float32")
    nodes = [
        Node("Constant", (), ("c",), {"value": np.arange(6, dtype=np.float32).reshape(2, 3)}, ""),
        Node("Constant", (), ("d",), {"value": np.array([[1.5, -2.0, 0.0]], np.float16)}, "k"),
        Node("Cast", ("d",), ("d32",), {"to": 1}, "k"),
        Node("Add", ("c", "d32"), ("s",), {}, "add"),
        Node(
            "Weird",
            ("s",),
            ("w",),
            {
                "floats": [0.1, -0.0, 1e-300, float("nan"), float("inf"), float("-inf")],
                "ints": (1, -2, 2**40),
                "flag": True,
                "np_scalar": np.float32(0.1),
                "np_int": np.int64(3),
                "text": "ünïcode",
                "empty": [],
                "arrays": [np.zeros(2, np.int8), np.ones((), bool)],
                "mixed": [np.array([1, 2]), 4],
            },
            "weird",
            "com.example",
        ),
    ]
    values = {
        "x": TensorInfo(f32, ("N", 3)),
        "c": TensorInfo(f32, (2, 3)),
        "d": TensorInfo(np.dtype("float16"), (1, 3)),
        "d32": TensorInfo(f32, (1, 3)),
        "s": TensorInfo(f32, (2, 3)),
        "w": TensorInfo(f32, None),
        "u": TensorInfo(np.dtype("int64"), (None, 2)),
    }
    # an initializer named like a node attribute: the attribute's tensor takes another name
    inits = {"bias": np.float32([1, 2, 3]), "k.value": np.zeros(1)}
    return Graph(nodes, ["x"], ["s", "w"], inits, values, 17, "odd", {"com.example": 3})


def test_every_attribute_kind_round_trips(tmp_path):
    g = odd_graph()
    d, tensors = graph_to_dict(g, prefix="p/")
    json.dumps(d, allow_nan=False)  # strict JSON
    assert d["nodes"][4][5]["floats"][3:] == [{"float": "nan"}, {"float": "inf"}, {"float": "-inf"}]
    assert sorted(tensors) == sorted(
        [
            "p/bias",
            "p/k.value",
            "p/node0.value",
            "p/node1.value",
            "p/weird.arrays[0]",
            "p/weird.arrays[1]",
            "p/weird.mixed[0]",
        ]
    )
    loaded, _, _ = store_and_load(tmp_path, {"p/": g})
    h = loaded["p/"]
    assert_same_graph(g, h)
    w = h.nodes[4].attrs
    assert type(w["np_scalar"]) is float and w["np_scalar"] == float(np.float32(0.1))
    assert w["ints"] == [1, -2, 2**40] and w["flag"] is True and w["empty"] == []
    sub = g.copy(nodes=g.nodes[:4], outputs=["s"])
    got = Interpreter(h.copy(nodes=h.nodes[:4], outputs=["s"])).run({"x": np.zeros((2, 3), np.float32)})
    assert got[0].tobytes() == Interpreter(sub).run({"x": np.zeros((2, 3), np.float32)})[0].tobytes()


def test_unstorable_attributes_and_missing_tensors():
    g = odd_graph()
    bad = g.copy(nodes=[Node("Foo", (), ("y",), {"blob": b"\x00"}, "foo")])
    with pytest.raises(UnsupportedError, match="node 'foo' \\(Foo\\): attribute 'blob' holds a bytes"):
        graph_to_dict(bad)
    d, tensors = graph_to_dict(g)
    with pytest.raises(ArtifactError, match="needs tensor 'bias'"):
        graph_from_dict(d, {k: v for k, v in tensors.items() if k != "bias"})
    with pytest.raises(ArtifactError, match="needs tensor 'node0.value'"):
        graph_from_dict(d, {k: v for k, v in tensors.items() if k != "node0.value"})
    with pytest.raises(ArtifactError, match="lacks 'nodes'"):
        graph_from_dict({k: v for k, v in d.items() if k != "nodes"}, tensors)


# ---- numpy only --------------------------------------------------------------------------------------------------
NUMPY_ONLY = """
    import numpy as np
    from edgetrain.core.container import read_container, write_container
    from edgetrain.core.serialize import graph_from_dict, graph_to_dict
    header, tensors = read_container(sys.argv[1], kind="checkpoint")
    write_container(sys.argv[2], kind="checkpoint", header=header, tensors=tensors)
    assert open(sys.argv[1], "rb").read() == open(sys.argv[2], "rb").read()
    print("container numpy-only OK", np.__version__)
"""


@pytest.mark.parametrize("python", PYTHONS)
def test_modules_need_numpy_alone(tmp_path, python):
    proc = run_on_device(python, NUMPY_ONLY, str(FIXTURE), str(tmp_path / "copy.etck"), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "container numpy-only OK" in proc.stdout


# Writes the current version's fixture once; fixtures of older versions are never rewritten.
if __name__ == "__main__":
    target = FIXTURE.with_name(f"container_v{CURRENT_VERSION}.etck")
    if target.exists():
        sys.exit(f"{target} exists; fixtures of released format versions are never rewritten")
    target.parent.mkdir(exist_ok=True)
    h, t = fixture_content()
    print(write_container(target, kind="checkpoint", header=h, tensors=t), "bytes ->", target)
