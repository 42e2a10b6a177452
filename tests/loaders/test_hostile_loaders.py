"""Hostile user data, case by case (issue 14): decompression bombs built at run time and read in a child process
under RLIMIT_AS, CSV values that overflowed silently, NaN and inf features, hostile sample-store files, bad
arguments, and the inputs the fuzzers (tests/loaders/test_fuzz_loaders.py) found, each a named regression test.

Every refusal is a loaders.DataError (an edgetrain.EdgeTrainError and a ValueError) or DataLimitError (also a
MemoryError) whose message names the file and the fault.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import resource
import sqlite3
import struct
import subprocess
import sys
import textwrap
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from device import BUILD_SIDE, PYTHONS, run_on_device

import loaders
from loaders import (
    ArrayDataView,
    ConfigError,
    CsvDataView,
    DataError,
    DataLimitError,
    DataLoader,
    IDataView,
    MnistDataView,
    NpzDataView,
    Preprocess,
    SampleIndexError,
    SampleStore,
    SubsetView,
    open_data,
    read_idx,
    split,
)

ROOT = Path(__file__).resolve().parents[2]
GiB = 1 << 30
CHUNK = 1 << 24


# ---- bombs, built at run time without writing gigabytes ------------------------------------------------------
def deflate_repeated(head: bytes, block: bytes, count: int, tail: bytes = b"") -> tuple[bytes, int, int]:
    """(raw deflate stream, crc32, length) of head + block * count + tail, in about a second for 2 GiB: after a
    full flush the compressor starts afresh, so every copy of the block compresses to the same bytes, which are
    repeated instead of compressed again (the stream is the one zlib writes with those flushes)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    parts = [c.compress(head) + c.flush(zlib.Z_FULL_FLUSH)]
    if count:
        parts.append((c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)) * count)
    parts.append(c.compress(tail) + c.flush())
    crc = zlib.crc32(head)
    for _ in range(count):
        crc = zlib.crc32(block, crc)
    return b"".join(parts), zlib.crc32(tail, crc), len(head) + len(block) * count + len(tail)


def deflate_of_zeros(head: bytes, zeros: int, tail: bytes = b"") -> tuple[bytes, int, int]:
    """deflate_repeated of head + `zeros` zero bytes + tail."""
    n, rest = divmod(zeros, CHUNK)
    return deflate_repeated(head, bytes(CHUNK), n, bytes(rest) + tail)


def gzip_of(deflated: tuple[bytes, int, int], *, isize: int | None = None) -> bytes:
    """A gzip file around a raw deflate stream (isize= writes a trailer that lies about the length)."""
    body, crc, length = deflated
    size = length if isize is None else isize
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + body + struct.pack("<II", crc, size % 2**32)


def gzip_of_zeros(head: bytes, zeros: int, tail: bytes = b"", *, isize: int | None = None) -> bytes:
    """A valid gzip file of head + zeros + tail."""
    return gzip_of(deflate_of_zeros(head, zeros, tail), isize=isize)


def idx_head(dims: tuple[int, ...], code: int = 0x08) -> bytes:
    return bytes([0, 0, code, len(dims)]) + struct.pack(f">{len(dims)}I", *dims)


def zip_one_member(name: str, body: bytes, crc: int, size: int, compressed: bool = True) -> bytes:
    """A zip archive of one member whose (deflated) bytes are `body`: local header, data, directory, end."""
    method = 8 if compressed else 0
    fname = name.encode()
    local = struct.pack(
        "<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, method, 0, 0, crc, len(body), size, len(fname), 0
    )
    central = struct.pack(
        "<4sHHHHHHIIIHHHHHII",
        b"PK\x01\x02",
        20,
        20,
        0,
        method,
        0,
        0,
        crc,
        len(body),
        size,
        len(fname),
        0,
        0,
        0,
        0,
        0,
        0,
    )
    head = local + fname + body
    directory = central + fname
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, len(directory), len(head), 0)
    return head + directory + end


def add_member(archive: bytes, name: str, data: bytes) -> bytes:
    """The one-member archive of zip_one_member with a second, stored member (zip_one_member's layout)."""
    head, rest = archive.split(b"PK\x01\x02", 1)
    first_directory = b"PK\x01\x02" + rest[: rest.index(b"PK\x05\x06")]
    fname = name.encode()
    crc = zlib.crc32(data)
    local = struct.pack(
        "<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0, crc, len(data), len(data), len(fname), 0
    )
    central = struct.pack(
        "<4sHHHHHHIIIHHHHHII",
        b"PK\x01\x02",
        20,
        20,
        0,
        0,
        0,
        0,
        crc,
        len(data),
        len(data),
        len(fname),
        0,
        0,
        0,
        0,
        0,
        len(head),
    )
    body = head + local + fname + data
    directory = first_directory + central + fname
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 2, 2, len(directory), len(body), 0)
    return body + directory + end


def npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


CHILD = textwrap.dedent(
    """
    import json, resource, sys
    import loaders
    kind, args = sys.argv[1], json.loads(sys.argv[2])
    try:
        if kind == "idx":
            loaders.read_idx(args["path"], **args.get("kw", {}))
        elif kind == "mnist":
            loaders.open_data(args["path"])
        elif kind == "csv":
            loaders.CsvDataView(args["path"], **args.get("kw", {}))
        elif kind == "npz":
            loaders.NpzDataView(args["path"], **args.get("kw", {}))
        outcome = {"class": None}
    except BaseException as e:
        outcome = {"class": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "message": str(e),
                   "limit": getattr(e, "limit", None), "needed": getattr(e, "needed", None)}
    # the child's own high-water mark: VmHWM (ru_maxrss carries over the parent's from before the exec)
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    outcome["maxrss_mib"] = hwm / 1024
    print("RESULT " + json.dumps(outcome))
    """
)


def in_child(kind: str, memory: int = GiB, **args) -> dict:
    """Runs one reader in a fresh interpreter whose address space is capped at `memory`; its outcome and peak RSS."""

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, kind, json.dumps(args)],
        cwd=ROOT,
        env=env,
        preexec_fn=cap,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout + proc.stderr
    return json.loads(lines[-1][len("RESULT ") :])


def refused_within(outcome: dict, path, *words: str) -> None:
    assert outcome["class"] == "DataLimitError", outcome
    assert {"DataError", "MemoryError", "ValueError", "EdgeTrainError"} <= set(outcome["mro"]), outcome["mro"]
    assert str(path) in outcome["message"], outcome["message"]
    for w in words:
        assert w in outcome["message"], (w, outcome["message"])


def test_idx_gz_bomb_of_2_gib_is_refused_before_inflating(tmp_path, report):
    """A 2 MB train-images-idx3-ubyte.gz whose header declares, and whose stream holds, 2 GiB of pixels."""
    n = 2 * GiB // 784 + 1
    images = tmp_path / "train-images-idx3-ubyte.gz"
    images.write_bytes(gzip_of_zeros(idx_head((n, 28, 28)), n * 784))
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_head((n,))))
    assert images.stat().st_size < 3 << 20
    out = in_child("mnist", path=str(tmp_path))
    refused_within(out, images, f"{n} x 28 x 28", "1073741824 bytes", "max_bytes=")
    assert out["limit"] == loaders.IDX_GZ_MAX_BYTES and out["needed"] == n * 784
    report(
        "bombs",
        f"idx .gz 2 GiB declared: DataLimitError at the 1 GiB ceiling, peak RSS {out['maxrss_mib']:.0f} MiB",
    )


def test_idx_gz_that_inflates_past_its_header_stops_at_the_declared_size(tmp_path, report):
    """The header says 12 images (9,408 bytes), the stream holds 2 GiB: refused one byte past what was declared."""
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip_of_zeros(idx_head((12, 28, 28)), 2 * GiB))
    out = in_child("idx", path=str(path))
    refused_within(out, path, "inflates to more than its idx header declares", "9424 bytes")
    assert out["limit"] == 9424
    report(
        "bombs",
        f"idx .gz 2 GiB behind a 12-image header: stopped at 9,424 bytes, peak RSS {out['maxrss_mib']:.0f} MiB",
    )


def test_idx_gz_ceiling_is_a_keyword(tmp_path):
    path = tmp_path / "images.gz"
    path.write_bytes(gzip_of_zeros(idx_head((100, 28, 28)), 100 * 784))
    with pytest.raises(DataLimitError, match=r"images\.gz: the idx header declares 100 x 28 x 28 uint8") as e:
        read_idx(path, max_bytes=50_000)
    assert e.value.limit == 50_000 and e.value.needed == 78_400 and isinstance(e.value, MemoryError)
    assert read_idx(path, max_bytes=78_400).shape == (100, 28, 28)  # exactly the declared size fits
    with pytest.raises(ConfigError, match="max_bytes must be a number of bytes"):
        read_idx(path, max_bytes=-1)


def test_csv_gz_bomb_of_1_gib_is_refused_by_its_trailer(tmp_path, report):
    """A 1 MB CSV .gz of 1 GiB of rows: its gzip trailer declares the size, refused without inflating."""
    rows = b"0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,1\n" * (CHUNK // 32)  # 16 MiB of rows
    path = tmp_path / "bomb.csv.gz"
    head = b"a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,label\n"
    path.write_bytes(gzip_of(deflate_repeated(head, rows, 64)))
    assert path.stat().st_size < 3 << 20
    out = in_child("csv", path=str(path))
    size = len(head) + 64 * CHUNK
    refused_within(out, path, f"declares {size} bytes", "268435456 bytes", "max_bytes=")
    report(
        "bombs",
        f"csv .gz 1 GiB (honest trailer): refused from the trailer, peak RSS {out['maxrss_mib']:.0f} MiB",
    )


def test_csv_gz_bomb_whose_trailer_lies_is_refused_at_the_ceiling(tmp_path, report):
    """The same 1 GiB of rows with a gzip trailer claiming 10 bytes: streamed, refused at 256 MiB inflated."""
    rows = b"0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,1\n" * (CHUNK // 32)
    path = tmp_path / "bomb.csv.gz"
    path.write_bytes(gzip_of(deflate_repeated(b"", rows, 64), isize=10))
    out = in_child("csv", path=str(path))
    refused_within(out, path, "inflates to more than 268435456 bytes")
    report(
        "bombs",
        f"csv .gz 1 GiB (lying trailer): streamed to the 256 MiB ceiling, peak RSS {out['maxrss_mib']:.0f} MiB",
    )


def test_csv_ceiling_is_a_keyword_and_applies_to_raw_files(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("1,2,0\n" * 1000)
    with pytest.raises(
        DataLimitError, match=r"t\.csv: a text file of 6000 bytes .*; a CSV file may hold at most 5000 bytes"
    ):
        CsvDataView(path, max_bytes=5000)
    assert len(CsvDataView(path, max_bytes=6000)) == 1000
    gz = tmp_path / "t.csv.gz"  # a valid two-member gzip whose trailer (the last member's) says 6 bytes
    gz.write_bytes(gzip.compress(b"1,2,0\n" * 999) + gzip.compress(b"1,2,0\n"))
    with pytest.raises(DataLimitError, match=r"t\.csv\.gz: a \.gz that inflates to more than 5000 bytes"):
        CsvDataView(gz, max_bytes=5000)
    assert len(CsvDataView(gz)) == 1000


def test_npz_member_claiming_shape_10e12_is_refused_before_allocating(tmp_path, report):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }"
    header += " " * (63 - (len(header) + 10) % 64) + "\n"
    member = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + bytes(64)
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", member)
        z.writestr("y.npy", npy_bytes(np.arange(4)))
    out = in_child("npz", path=str(path))
    refused_within(out, path, "member 'x.npy'", "shape [1000000000000] float32", "4000000000000 bytes")
    report(
        "bombs", f"npz shape (10**12,): refused from the .npy header, peak RSS {out['maxrss_mib']:.0f} MiB"
    )


def test_npz_member_that_inflates_to_2_gib_is_refused_by_the_ceiling(tmp_path, report):
    """A 2 MB .npz whose x.npy truthfully holds 2 GiB of zeros (directory, header and data agree)."""
    n = 2 * GiB // 4
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({n},), }}"
    header += " " * (63 - (len(header) + 10) % 64) + "\n"
    head = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode()
    body, crc, size = deflate_of_zeros(head, n * 4)
    path = tmp_path / "bomb.npz"
    path.write_bytes(add_member(zip_one_member("x.npy", body, crc, size), "y.npy", npy_bytes(np.arange(4))))
    assert path.stat().st_size < 3 << 20
    out = in_child("npz", path=str(path))
    refused_within(out, path, "member 'x.npy'", f"shape [{n}] float32", "1073741824 bytes")
    # with the ceiling raised it is read; the child's 1 GiB address space then refuses the 2 GiB buffer cleanly
    raised = in_child("npz", path=str(path), kw={"max_bytes": 4 * GiB})
    refused_within(raised, path, "not enough memory for member 'x.npy'")
    report(
        "bombs",
        f"npz x.npy 2 GiB deflated: DataLimitError at the 1 GiB ceiling, peak RSS {out['maxrss_mib']:.0f} MiB",
    )


def test_npz_member_whose_directory_size_lies_never_inflates_past_it(tmp_path):
    """The zip directory says x.npy holds 200 bytes; its deflate stream holds 2 GiB: zipfile inflates one block,
    keeps the first 200 bytes, and their crc32 is not the one recorded (the crc of the whole 2 GiB)."""
    n = 2 * GiB // 4
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({n},), }}"
    header += " " * (63 - (len(header) + 10) % 64) + "\n"
    head = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode()
    body, crc, _ = deflate_of_zeros(head, n * 4)
    path = tmp_path / "liar.npz"
    path.write_bytes(add_member(zip_one_member("x.npy", body, crc, 200), "y.npy", npy_bytes(np.arange(4))))
    out = in_child("npz", path=str(path), kw={"max_bytes": 4 * GiB})
    assert out["class"] == "DataError" and str(path) in out["message"], out
    assert "Bad CRC-32 for file 'x.npy'" in out["message"] and out["maxrss_mib"] < 200


# ---- CSV values ----------------------------------------------------------------------------------------------
def test_csv_label_1e30_is_refused_not_wrapped_to_int64_min(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,b,label\n1,2,0\n3,4,1e30\n")
    with pytest.raises(
        DataError,
        match=r"t\.csv: row 2 \(line 3\), column 3 \('label'\): the label 1e\+30 is not an integer class within int64",
    ):
        CsvDataView(path)
    path.write_text("a,b,label\n1,2,0\n3,4,9223372036854775808\n")  # 2**63: one past int64
    with pytest.raises(DataError, match=r"line 3.*label 9\.22337e\+18 is not an integer class within int64"):
        CsvDataView(path)
    path.write_text("a,b,label\n1,2,0\n3,4,7\n")
    with pytest.raises(DataError, match=r"line 3.*label 7 of sample 1 is out of range for num_classes=5"):
        CsvDataView(path, num_classes=5)
    path.write_text("a,b,label\n1,2,0.5\n3,4,1e30\n")  # fractional labels: float targets, 1e30 fits float32
    assert CsvDataView(path).y.dtype == np.float32


def test_csv_value_1e39_is_refused_not_made_inf(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,b,label\n1,2,0\n3,1e39,1\n")
    with pytest.raises(
        DataError,
        match=r"t\.csv: row 2 \(line 3\), column 2 \('b'\): '1e39' is beyond float32 .*dtype=np\.float64",
    ):
        CsvDataView(path)
    assert CsvDataView(path, dtype=np.float64).x[1, 1] == 1e39
    path.write_text("a,b,label\n1,2,0\n3,4,1e39\n")  # a float target beyond float32
    with pytest.raises(
        DataError, match=r"line 3\), column 3 \('label'\): the label 1e\+39 is beyond float32"
    ):
        CsvDataView(path, label_dtype=np.float32)
    path.write_text("1,70000,0\n2,3,1\n")
    with pytest.raises(DataError, match=r"line 1\), column 2: '70000' is beyond float16"):
        CsvDataView(path, dtype=np.float16)
    with pytest.raises(DataError, match=r"line 1\), column 2: '70000' is not a whole number within int16"):
        CsvDataView(path, dtype=np.int16)


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "Infinity", "1e400"])
def test_csv_nan_and_inf_text_is_refused_naming_the_cell(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text(f"a,b,label\n1,2,0\n3,{text},1\n")
    with pytest.raises(
        DataError, match=rf"t\.csv: row 2 \(line 3\), column 2 \('b'\): '{text}' is not a finite number"
    ):
        open_data(path)


# ---- non-finite features: every reader names the sample -------------------------------------------------------
def test_array_view_refuses_nan_naming_the_sample_and_position():
    x = np.zeros((10, 3, 4), np.float32)
    x[7, 2, 1] = np.nan
    x[9, 0, 0] = np.inf
    with pytest.raises(
        DataError,
        match=r"<arrays>: sample 7 holds a non-finite feature \(nan at position \[2, 1\]\); 2 of 10 samples do",
    ):
        ArrayDataView(x, np.zeros(10, np.int64))
    with pytest.raises(DataError, match=r"mine: sample 3 holds a non-finite label \(inf\)"):
        ArrayDataView(np.zeros((4, 2)), np.array([0.0, 1.0, 2.0, np.inf]), source="mine")


def test_npz_nan_features_are_refused_with_the_sample_index(tmp_path):
    x = np.ones((6, 5), np.float64)
    x[4, 3] = -np.inf
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(6))
    with pytest.raises(
        DataError, match=r"d\.npz: sample 4 holds a non-finite feature \(-inf at position \[3\]\)"
    ):
        open_data(tmp_path / "d.npz")
    x[4, 3] = 1e39  # finite in float64, inf once cast to float32 (dtype="auto")
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(6))
    with pytest.raises(DataError, match=r"d\.npz: array 'x' holds 1e\+39 \(sample 4\), beyond float32"):
        NpzDataView(tmp_path / "d.npz")
    assert NpzDataView(tmp_path / "d.npz", dtype=None).x.dtype == np.float64


def test_float_idx_nan_is_refused_with_the_sample_index(tmp_path):
    x = np.zeros((5, 2, 2), ">f4")
    x[3, 1, 0] = np.nan
    path = tmp_path / "f-idx3"
    path.write_bytes(idx_head((5, 2, 2), 0x0D) + x.tobytes())
    with pytest.raises(
        DataError, match=r"f-idx3: sample 3 holds a non-finite value \(nan at position \[1, 0\]\)"
    ):
        read_idx(path)
    (tmp_path / "f-idx3.gz").write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(DataError, match=r"f-idx3\.gz: sample 3 holds a non-finite value"):
        read_idx(tmp_path / "f-idx3.gz")


def test_store_nan_sample_is_refused_by_batches_naming_its_id(tmp_path):
    path = tmp_path / "s.db"
    with SampleStore(path) as store:
        ids = store.add_many(
            [np.ones((2, 2), np.float32)] * 3 + [np.array([[0, np.nan], [1, 1]], np.float32)], [0, 1, 2, 1]
        )
        store.refresh()
        x, _ = store.get(ids[3])  # get() returns what was stored, exactly
        assert np.isnan(x[0, 1])
        with pytest.raises(
            DataError, match=rf"s\.db: sample id {ids[3]} holds a non-finite x \(nan at position \[0, 1\]\)"
        ):
            DataLoader(store, 4).next()
        train = StoreViewOf(store, ids[:3])
        assert DataLoader(train, 3).next()[0].shape == (3, 2, 2)  # the other samples train


def StoreViewOf(store, ids):
    return loaders.StoreView(store, ids)


class OwnView(IDataView):
    """A view of the user's own, which checks nothing: the DataLoader checks its batches."""

    def __init__(self, x, y):
        self.x, self.y = x, y
        self.source = "own-view"

    def get_item(self, idx):
        return self.x[idx], self.y[idx]

    def size(self):
        return len(self.x)


def test_loader_checks_the_batches_of_a_view_that_does_not():
    x = np.zeros((20, 3), np.float32)
    x[13, 2] = np.inf
    loader = DataLoader(OwnView(x, np.zeros(20, np.int64)), 8)
    loader.next()  # samples 0..7
    with pytest.raises(
        DataError,
        match=r"own-view: sample 13 holds a non-finite feature \(inf at position \[2\]\); 1 of the 8",
    ):
        loader.next()


def test_finite_check_costs_one_pass_over_mnist_sized_data(report):
    import time

    x = np.random.default_rng(0).random((60_000, 784), dtype=np.float32)
    y = np.zeros(60_000, np.int64)
    t = time.perf_counter()
    ArrayDataView(x, y)
    checked = time.perf_counter() - t
    t = time.perf_counter()
    assert loaders.views.first_nonfinite(x) is None
    x[59_999, 783] = np.inf  # the last value of the last sample: the chunks reach the end
    x[41_000, 5] = np.nan
    assert loaders.views.first_nonfinite(x) == (41_000, (5,), pytest.approx(np.nan, nan_ok=True), 2)
    report(
        "loaders",
        f"finite check of 60,000 x 784 float32: ArrayDataView {checked * 1e3:.0f} ms in all "
        f"(the check alone {(time.perf_counter() - t) * 1e3:.0f} ms; 4 MiB of mask at a time)",
    )


# ---- bad arguments are ConfigError; an index out of range a SampleIndexError ----------------------------------
def test_bad_arguments_are_config_errors_and_still_value_errors(tmp_path):
    view = ArrayDataView(np.zeros((10, 2), np.float32), np.arange(10))
    (tmp_path / "t.csv").write_text("1,2,0\n")
    cases = [
        lambda: DataLoader(view, 0),
        lambda: DataLoader(view, "8"),
        lambda: DataLoader(view, 2, seed=-1),
        lambda: DataLoader(object(), 2),
        lambda: split(view, (0.5, 0.6)),
        lambda: split(view, ("a", "b")),
        lambda: split(view, (0.5, 0.5), seed="x"),
        lambda: Preprocess(scale=float("nan")),
        lambda: Preprocess(std=0),
        lambda: loaders.parse_scale("1/0"),
        lambda: CsvDataView(tmp_path / "t.csv", header="yes"),
        lambda: CsvDataView(tmp_path / "t.csv", dtype=object),
        lambda: CsvDataView(tmp_path / "t.csv", delimiter=",,"),
        lambda: NpzDataView(tmp_path / "t.npz", dtype="U3"),
        lambda: MnistDataView("a", "b", normalize=(0.1, 0.0)),
        lambda: MnistDataView("a", "b", normalize=(0.1, 1e-45)),  # 255 / 1e-45 is inf in float32
        lambda: MnistDataView("a", "b", normalize="yes"),
        lambda: loaders.check_labels(view, 0),
        lambda: SubsetView(view, [0.5]),
        lambda: SampleStore(tmp_path / "s.db", timeout=-1),
    ]
    for make in cases:
        with pytest.raises(ConfigError) as e:
            make()
        assert isinstance(e.value, ValueError) and isinstance(e.value, loaders.errors.EdgeTrainError)


@pytest.mark.parametrize(
    "state, says",
    [
        (
            {"epoch": "abc", "position": 0, "seed": 1, "shuffle": False, "size": 10},
            "epoch 'abc', not an integer",
        ),
        (
            {"epoch": 0, "position": None, "seed": 1, "shuffle": False, "size": 10},
            "position None, not an integer",
        ),
        (
            {"epoch": 0, "position": 0, "seed": 1, "shuffle": "no", "size": 10},
            "shuffle 'no', not true or false",
        ),
        ({"epoch": 0, "position": 0, "seed": -5, "shuffle": False, "size": 10}, "seed -5"),
        ({"epoch": 2**70, "position": 0, "seed": 1, "shuffle": False, "size": 10}, "out of range"),
        ([], "must be a dict"),
    ],
)
def test_loader_state_of_the_wrong_types_is_a_config_error(state, says):
    loader = DataLoader(ArrayDataView(np.zeros((10, 2), np.float32), np.arange(10)), 4)
    with pytest.raises(ConfigError, match=says):
        loader.restore(state)


def test_index_out_of_range_is_an_index_error_and_a_data_error():
    view = ArrayDataView(np.arange(10, dtype=np.float32).reshape(5, 2), np.arange(5), source="five")
    with pytest.raises(SampleIndexError, match="index 5 out of range for five of 5 samples") as e:
        view[5]
    assert isinstance(e.value, IndexError) and isinstance(e.value, DataError)
    assert [int(y) for _, y in view] == [0, 1, 2, 3, 4]  # iteration by __getitem__ stops at the IndexError
    with pytest.raises(SampleIndexError, match="SubsetView index 7 out of range for five"):
        SubsetView(view, [0, 7])


# ---- hostile sample-store files --------------------------------------------------------------------------------
def good_store(path: Path, n: int = 6) -> bytes:
    with SampleStore(path) as store:
        store.add_many([np.full((3, 3), k, np.float32) for k in range(n)], list(range(n)))
    return path.read_bytes()


def edit(path: Path, *sql: str, args=()) -> bytes:
    con = sqlite3.connect(path, isolation_level=None)
    for statement in sql:
        con.execute(statement, args) if args else con.executescript(statement)
    con.close()
    return path.read_bytes()


def crc(dtype: str, shape: str, data: bytes) -> int:
    return zlib.crc32(data, zlib.crc32(f"{dtype}{shape}".encode()))


def read_everything(path: Path) -> None:
    with SampleStore(path, create=False) as store:
        store.labels()
        DataLoader(store, 3).next()
        for i in range(store.size()):
            store[i]


STORE_CASES = {
    "not-sqlite": (
        lambda p: p.write_bytes(b"PK\x03\x04" + bytes(200)),
        r"not an edgetrain sample store: not an SQLite database",
    ),
    "other-schema": (
        lambda p: edit(p, "DROP TABLE meta; CREATE TABLE meta (a, b)"),
        r"its meta table is not ours",
    ),
    "meta-version-blob": (
        lambda p: edit(p, "UPDATE meta SET value = x'3100' WHERE key = 'version'"),
        r"damaged: its format version b'1\\x00' is not a number >= 1",
    ),
    "meta-version-superscript": (
        lambda p: edit(p, "UPDATE meta SET value = '²' WHERE key = 'version'"),
        r"damaged: its format version '²' is not a number >= 1",
    ),
    "meta-version-huge": (
        lambda p: edit(p, "UPDATE meta SET value = '" + "9" * 5000 + "' WHERE key = 'version'"),
        r"damaged: its format version '9999+\.\.\. is not a number >= 1",
    ),
    "meta-version-newer": (
        lambda p: edit(p, "UPDATE meta SET value = '7' WHERE key = 'version'"),
        r"format version 7, newer",
    ),
    "meta-format-int": (
        lambda p: edit(p, "UPDATE meta SET value = 3 WHERE key = 'format'"),
        r"says format '3', not",
    ),
    "samples-a-view": (
        lambda p: edit(
            p,
            "CREATE TABLE t2 AS SELECT * FROM samples; DROP TABLE samples; CREATE VIEW samples AS SELECT * FROM t2",
        ),
        r"damaged: no table samples",
    ),
    "text-ids": (
        lambda p: edit(
            p,
            "CREATE TABLE t2 AS SELECT * FROM samples; DROP TABLE samples; "
            "CREATE TABLE samples AS SELECT 'abc' AS id, created, y_dtype, y_shape, y, y_crc FROM t2",
        ),
        r"damaged: a sample id 'abc', not an integer",
    ),
    "object-dtype": (
        lambda p: edit(p, "UPDATE sample_x SET x_dtype = 'object' WHERE id = 2"),
        r"damaged: sample 2's x does not match what was stored \(dtype 'object' is not one a store holds\)",
    ),
    "shape-lies-crc-recomputed": (
        lambda p: edit(
            p,
            "UPDATE sample_x SET x_shape = ?, x_crc = ? WHERE id = 2",
            args=("[3,4]", crc("float32", "[3,4]", np.full((3, 3), 1, np.float32).tobytes())),
        ),
        r"sample 2's x does not match what was stored \(36 bytes for float32 \[3, 4\]\)",
    ),
    "huge-zero-shape": (
        lambda p: edit(
            p,
            "UPDATE sample_x SET x_shape = ?, x = x'', x_crc = ? WHERE id = 2",
            args=("[0,4000000000000]", crc("float32", "[0,4000000000000]", b"")),
        ),
        r"sample 2's x does not match what was stored \(shape '\[0,4000000000000\]' is not a list",
    ),
    "nested-shape": (
        lambda p: edit(p, "UPDATE sample_x SET x_shape = ? WHERE id = 2", args=("[" * 300 + "]" * 300,)),
        r"sample 2's x does not match what was stored \(shape '\[\[\[",
    ),
    "crc-of-wrong-type": (
        lambda p: edit(p, "UPDATE samples SET y_crc = 'zero' WHERE id = 3"),
        r"sample 3's label does not match what was stored \(crc32\)",
    ),
    "missing-x-row": (
        lambda p: edit(p, "DELETE FROM sample_x WHERE id = 4"),
        r"sample 4's x does not match what was stored \(nothing stored\)",
    ),
}


@pytest.mark.parametrize("case", list(STORE_CASES))
def test_hostile_store_files_are_refused_and_left_untouched(tmp_path, case):
    path = tmp_path / "s.db"
    good_store(path)
    damage, says = STORE_CASES[case]
    damage(path)
    before = path.read_bytes()
    with pytest.raises(DataError, match=says) as e:
        read_everything(path)
    assert str(path) in str(e.value)
    assert path.read_bytes() == before  # nothing of the user's file was changed (it stays in WAL mode)


@pytest.mark.parametrize("where", ["header-page", "a-data-page", "truncated-to-one-page", "zeroed-tail"])
def test_corrupt_store_pages_are_refused_without_writing(tmp_path, where):
    path = tmp_path / "s.db"
    data = bytearray(good_store(path, 40))
    page = int.from_bytes(data[16:18], "big")
    if where == "header-page":
        data[100:160] = bytes(range(60))
    elif where == "a-data-page":
        data[3 * page : 3 * page + 64] = b"\xff" * 64
    elif where == "truncated-to-one-page":
        data = data[:page]
    else:
        data[page * 2 :] = bytes(len(data) - page * 2)
    path.write_bytes(bytes(data))
    with pytest.raises(DataError) as e:
        read_everything(path)
    assert str(path) in str(e.value)
    assert path.read_bytes() == bytes(data)


def test_a_store_without_tables_but_with_pages_is_not_recreated(tmp_path):
    """A store whose schema lost its tables (page 1's b-tree emptied) is not overwritten with a new schema."""
    path = tmp_path / "s.db"
    good_store(path, 30)
    data = bytearray(path.read_bytes())
    # page 1's b-tree header (at 100): a leaf table page with no cells, so sqlite_master lists nothing
    data[100:108] = bytes([0x0D, 0, 0, 0, 0, 0x10, 0, 0])
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"damaged: an SQLite file of \d+ pages whose schema lists no tables"):
        SampleStore(path)  # create=True: it would have made a store of it
    assert path.read_bytes() == bytes(data)


def test_a_rollback_journal_store_is_checked_before_its_header_is_rewritten(tmp_path):
    path = tmp_path / "s.db"
    good_store(path, 40)
    edit(path, "PRAGMA journal_mode=DELETE")
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[4 * page + 8 : 4 * page + 40] = b"\xee" * 32  # damage a page that holds samples
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"s\.db: damaged \(.*\); it was left untouched"):
        SampleStore(path, create=False)
    assert path.read_bytes() == bytes(data)


# ---- the fuzzers' findings -------------------------------------------------------------------------------------
def test_regression_npz_member_of_only_the_magic(tmp_path):
    """NPZ_MEMBERS: an x.npy of the 6 magic bytes alone read past its end (IndexError)."""
    path = tmp_path / "f.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", b"\x93NUMPY")
        z.writestr("y.npy", npy_bytes(np.arange(4)))
    with pytest.raises(DataError, match=r"f\.npz: member 'x\.npy' is not a \.npy array"):
        NpzDataView(path)


# ---- numpy alone -----------------------------------------------------------------------------------------------
DEVICE_SCRIPT = """
import gzip, io, os, sqlite3, struct, tempfile, zipfile
import numpy as np
import loaders
from loaders import ConfigError, DataError, DataLimitError

d = tempfile.mkdtemp()
def p(name):
    return os.path.join(d, name)

def refused(cls, make, *words):
    try:
        make()
    except cls as e:
        assert all(w in str(e) for w in words), (str(e), words)
        assert isinstance(e, ValueError), type(e).__mro__
        return
    raise AssertionError(f"not refused: {words}")

# an idx .gz declaring more than the ceiling; one that holds more than it declares
with open(p("i.gz"), "wb") as f:
    f.write(gzip.compress(bytes([0, 0, 8, 3]) + struct.pack(">III", 100, 28, 28) + bytes(100 * 784)))
refused(DataLimitError, lambda: loaders.read_idx(p("i.gz"), max_bytes=1000), "declares 100 x 28 x 28")
with open(p("j.gz"), "wb") as f:
    f.write(gzip.compress(bytes([0, 0, 8, 1]) + struct.pack(">I", 4) + bytes(4000)))
refused(DataLimitError, lambda: loaders.read_idx(p("j.gz")), "inflates to more than its idx header declares")
# npz: our own .npy reader (numpy's header parser, numpy 1.24's too)
np.savez(p("o.npz"), x=np.array([None, 1], dtype=object), y=np.arange(2))
refused(DataError, lambda: loaders.NpzDataView(p("o.npz")), "holds Python objects")
np.savez_compressed(p("s.npz"), x=np.zeros(3, [("a", "<i4")]), y=np.arange(3))
refused(DataError, lambda: loaders.NpzDataView(p("s.npz")), "structured array")
x = np.arange(12, dtype=np.float64).reshape(6, 2); x[5, 1] = np.nan
np.savez(p("n.npz"), x=np.asfortranarray(x), y=np.arange(6))
refused(DataError, lambda: loaders.NpzDataView(p("n.npz")), "sample 5 holds a non-finite feature (nan at position [1])")
x[5, 1] = 1
np.savez_compressed(p("f.npz"), x=np.asfortranarray(x), y=np.arange(6))
v = loaders.NpzDataView(p("f.npz"))
assert v.x.dtype == np.float32 and v.x.tolist() == x.tolist(), v.x
# csv: values checked by line and column
with open(p("t.csv"), "w") as f:
    f.write("a,b,label\\n1,2,0\\n3,1e39,1\\n")
refused(DataError, lambda: loaders.CsvDataView(p("t.csv")), "line 3", "'1e39' is beyond float32")
with open(p("t.csv"), "w") as f:
    f.write("a,b,label\\n1,2,0\\n3,4,1e30\\n")
refused(DataError, lambda: loaders.CsvDataView(p("t.csv")), "the label 1e+30 is not an integer class within int64")
with open(p("g.csv.gz"), "wb") as f:
    f.write(gzip.compress(b"1,2,0\\n" * 2000))
refused(DataLimitError, lambda: loaders.CsvDataView(p("g.csv.gz"), max_bytes=1000), "declares 12000 bytes")
assert len(loaders.open_data(p("g.csv.gz"))) == 2000
# the store refuses a lying shape, the loader a bad state, a view an index out of range
with loaders.SampleStore(p("s.db")) as st:
    st.add_many([np.ones((2, 2), np.float32)] * 3, [0, 1, 2])
con = sqlite3.connect(p("s.db"))
con.execute("UPDATE sample_x SET x_shape = '[9]' WHERE id = 2")
con.commit()
con.close()
with loaders.SampleStore(p("s.db"), create=False) as st:
    refused(DataError, lambda: st.get_batch(np.arange(3)), "sample 2's x does not match what was stored")
view = loaders.ArrayDataView(np.zeros((4, 2), np.float32), np.arange(4))
refused(ConfigError, lambda: loaders.DataLoader(view, 2).restore({"epoch": "x", "position": 0, "seed": 0,
        "shuffle": False, "size": 4}), "not an integer")
try:
    view[9]
except IndexError as e:
    assert isinstance(e, DataError)
print("hostile loaders numpy-only OK", np.__version__)
"""


@pytest.mark.parametrize("python", PYTHONS)
def test_hostile_loaders_refuse_with_numpy_alone(python):
    proc = run_on_device(python, DEVICE_SCRIPT, blocked=("edgetrain", *BUILD_SIDE), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hostile loaders numpy-only OK" in proc.stdout


def test_regression_store_whose_damage_sqlite_reports_in_bytes_that_are_not_utf8(tmp_path):
    """STORE: bytes inserted into page 1's schema text; SQLite's error message quotes them and Python's sqlite3,
    decoding it, raised UnicodeDecodeError instead of sqlite3.DatabaseError."""
    path = tmp_path / "s.db"
    data = good_store(path)
    path.write_bytes(data[:4055] + b"\x00\x00\x00\x00\x00\x80" + data[4055:])
    before = path.read_bytes()
    with pytest.raises(
        DataError, match=r"s\.db: opening failed: SQLite reported damage in words that are not UTF-8"
    ):
        SampleStore(path, create=False)
    assert path.read_bytes() == before


def test_csv_of_short_rows_costs_a_few_times_its_text(tmp_path, report):
    """16 MiB of "0,1" rows (4 Mi rows): a list of every line cost ~60 bytes per line (550 MB here, 2.2 GB for
    64 MiB); blocks of lines keep it near text + labels + features."""
    path = tmp_path / "short.csv.gz"
    path.write_bytes(gzip.compress(b"0,1\n" * (4 << 20), compresslevel=1))
    out = in_child("csv", memory=768 << 20, path=str(path))
    assert out["class"] is None, out
    report("loaders", f"CSV of 4 Mi short rows (16 MiB of text): peak RSS {out['maxrss_mib']:.0f} MiB")
    assert out["maxrss_mib"] < 250


def test_regression_csv_sniffing_a_bom_and_a_character_cut_at_the_end(tmp_path):
    """CSV: open_data's sniffer cut the text at the error offset of a utf-8-sig decode, which does not count the
    byte order mark, splitting a 4-byte character: UnicodeDecodeError."""
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbf1,2,0\n3,4,\xf0\x9f\x98\x80\xc2")
    with pytest.raises(DataError, match=r"t\.csv: not a text file \(not UTF-8 at byte 17\)"):
        open_data(path)


@pytest.mark.parametrize("text", ["{'descr': '<f4\\", "{'descr': '''<f4", '{"a": ['])
def test_an_npz_whose_npy_header_cannot_be_tokenized_is_a_data_error(tmp_path, text):
    """Found by the fleet door's fuzzing (issue 33): numpy tokenizes a .npy header before it parses it, and a string or
    bracket left open there raised tokenize.TokenError, past the reader's refusals."""
    header = text.encode() + b" " * (118 - len(text)) + b"\n"
    npy = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(8)
    path = tmp_path / "damaged.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", npy)
        z.writestr("y.npy", npy)
    with pytest.raises(DataError, match="damaged .npy header") as e:
        open_data(str(path))
    assert str(path) in str(e.value)
