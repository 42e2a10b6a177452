"""Fuzzing the loaders with hostile user data (tests/harness/fuzzing.py runs each target in a child process under
RLIMIT_AS, one input at a time under an alarm): only an EdgeTrainError may come out (a DataError, a
DataLimitError, a ConfigError), its message must name the file, and a store that is refused is left as it was.

- IDX_RAW: real idx files (the demo's new-user digits, cut to 12 samples) with bit flips, byte and big-endian
  word writes (dims of 0, 2**31, 2**32 - 1 ...), truncations, insertions, appended bytes; through open_data on
  the directory, every sample and a DataLoader batch; and read_idx on the file itself.
- IDX_GZ: the same mutations before gzip (so they reach the idx parser through a valid gzip stream) or after it
  (the gzip reader, its CRC and length checks), and streams that hold more or less than their header declares.
- NPZ: real .npz archives (np.savez, np.savez_compressed) with byte mutations, and archives written member by
  member from generated .npy headers (shapes negative, huge, of too many dims; object, structured, text, void,
  complex, big-endian dtypes; headers too long or not a dict), generated data sizes, non-array members, a zip
  directory whose sizes lie; through NpzDataView and open_data, every sample and a batch.
- CSV: generated tables (numbers huge, tiny, NaN, inf, 1e39, 1e30 labels, text, empty cells, quotes, ragged rows,
  headers, another delimiter, CR line ends, a BOM, bytes that are not UTF-8), raw or gzip; through open_data and
  CsvDataView with generated arguments, every sample and a batch.
- STORE: a real SampleStore file with bytes flipped, pages zeroed, truncated; and edits made with sqlite3
  (blobs, dtypes, shapes and crc32s rewritten, the crc32 recomputed so that the lie reaches the decoder; NaN
  samples; meta rows of the wrong types and versions; tables dropped or renamed); through SampleStore (open,
  every sample, labels, split, a DataLoader batch, integrity_check). The file must be untouched when refused.

EDGETRAIN_FUZZ_EXAMPLES sets the inputs per target (150 in CI); a developer runs thousands.
"""

from __future__ import annotations

import functools
import gzip
import io
import os
import sqlite3
import struct
import warnings
import zipfile
import zlib
from pathlib import Path

import fuzzing
import numpy as np
from hypothesis import strategies as st

import loaders
from loaders import CsvDataView, DataLoader, NpzDataView, SampleStore, open_data, read_idx

ROOT = Path(__file__).resolve().parents[2]
NEWUSER = ROOT / "edgetrain" / "data" / "newuser"
SAMPLES = 12


# ---- byte mutations ------------------------------------------------------------------------------------------
def mutations(header: int = 32):
    """A list of edits; positions are taken modulo the data's length, and half of them fall in the first
    `header` bytes, where the format's fields are."""
    pos = st.one_of(st.integers(0, header), st.integers(0, 2**31))
    word = st.one_of(
        st.sampled_from([0, 1, 2, 3, 255, 256, 2**16, 2**24, 2**31 - 1, 2**31, 2**32 - 1]),
        st.integers(0, 2**32 - 1),
    )
    op = st.one_of(
        st.tuples(st.just("flip"), pos, st.integers(0, 7)),
        st.tuples(st.just("set"), pos, st.integers(0, 255)),
        st.tuples(st.just("u32"), pos, word),
        st.tuples(st.just("cut"), st.one_of(st.integers(0, header), st.integers(0, 2**31))),
        st.tuples(st.just("insert"), pos, st.binary(min_size=1, max_size=24)),
        st.tuples(st.just("append"), st.binary(min_size=1, max_size=64)),
        st.tuples(st.just("zero"), pos, st.integers(1, 4096)),
    )
    return st.lists(op, min_size=1, max_size=4)


def mutate(data: bytes, ops) -> bytes:
    b = bytearray(data)
    for op in ops:
        kind = op[0]
        if kind == "append":
            b += op[1]
            continue
        at = op[1] % (len(b) + 1)
        if kind == "flip" and at < len(b):
            b[at] ^= 1 << op[2]
        elif kind == "set" and at < len(b):
            b[at] = op[2]
        elif kind == "u32":
            b[at : at + 4] = op[2].to_bytes(4, "big")
        elif kind == "cut":
            del b[at:]
        elif kind == "insert":
            b[at:at] = op[2]
        elif kind == "zero":
            b[at : at + op[2]] = bytes(min(op[2], max(0, len(b) - at)))
    return bytes(b)


def names_file(e: Exception, *paths) -> None:
    """A refusal's message must name the file (or the view built on it)."""
    text = str(e)
    assert any(os.fspath(p) in text or Path(p).name in text for p in paths), f"no file named in: {text}"


def read_all(view) -> None:
    """Every sample, every label, and one batch through a DataLoader (with a shuffle)."""
    n = view.size()
    if n == 0:
        return
    for i in range(min(n, 64)):
        view[i]
    view.labels()
    loader = DataLoader(view, min(n, 5), shuffle=True, seed=1)
    x, y = loader.next()
    assert x.shape[0] == y.shape[0]


# ---- idx -----------------------------------------------------------------------------------------------------
@functools.cache
def idx_seeds() -> tuple[bytes, bytes]:
    """The new user's first 12 images and labels, as raw idx bytes (a real file, cut to 12 samples)."""
    images = gzip.decompress((NEWUSER / "train-images-idx3-ubyte.gz").read_bytes())
    labels = gzip.decompress((NEWUSER / "train-labels-idx1-ubyte.gz").read_bytes())
    rows, cols = struct.unpack(">II", images[8:16])
    images = images[:4] + struct.pack(">III", SAMPLES, rows, cols) + images[16 : 16 + SAMPLES * rows * cols]
    labels = labels[:4] + struct.pack(">I", SAMPLES) + labels[8 : 8 + SAMPLES]
    return images, labels


IMAGES, LABELS = "train-images-idx3-ubyte", "train-labels-idx1-ubyte"


def _run_idx(workdir: Path, images: bytes, labels: bytes, gz: bool) -> None:
    suffix = ".gz" if gz else ""
    ip, lp = workdir / (IMAGES + suffix), workdir / (LABELS + suffix)
    ip.write_bytes(images)
    lp.write_bytes(labels)
    for p in (ip, lp):
        try:
            read_idx(p)
        except loaders.DataError as e:
            names_file(e, p)
    try:
        read_all(open_data(workdir))
    except loaders.DataError as e:
        names_file(e, ip, lp, workdir)
        raise


def _idx_raw(example, workdir: Path) -> None:
    which, ops = example
    images, labels = idx_seeds()
    if which == "images":
        images = mutate(images, ops)
    else:
        labels = mutate(labels, ops)
    _run_idx(workdir, images, labels, gz=False)


IDX_RAW = fuzzing.FuzzTarget(st.tuples(st.sampled_from(["images", "labels"]), mutations(16)), _idx_raw)


def _gzip(data: bytes, members: int) -> bytes:
    if members <= 1:
        return gzip.compress(data, mtime=0)
    cut = len(data) // members
    return b"".join(
        gzip.compress(data[k * cut : (k + 1) * cut if k < members - 1 else None], mtime=0)
        for k in range(members)
    )


def _idx_gz(example, workdir: Path) -> None:
    which, where, ops, members = example
    images, labels = idx_seeds()
    files = {"images": images, "labels": labels}
    data = files[which]
    if where == "inner":  # the idx bytes mutated, then a valid gzip stream of them
        files[which] = _gzip(mutate(data, ops), members)
    else:  # the gzip stream itself mutated
        files[which] = mutate(_gzip(data, members), ops)
    other = "labels" if which == "images" else "images"
    files[other] = _gzip(files[other], 1)
    _run_idx(workdir, files["images"], files["labels"], gz=True)


IDX_GZ = fuzzing.FuzzTarget(
    st.tuples(
        st.sampled_from(["images", "labels"]),
        st.sampled_from(["inner", "outer"]),
        mutations(24),
        st.integers(1, 3),
    ),
    _idx_gz,
)


# ---- npz -----------------------------------------------------------------------------------------------------
@functools.cache
def npz_seeds() -> list[bytes]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((10, 4)).astype(np.float32)
    y = np.arange(10) % 3
    out = []
    for save in (np.savez, np.savez_compressed):
        buf = io.BytesIO()
        save(buf, x=x, y=y)
        out.append(buf.getvalue())
    buf = io.BytesIO()
    np.savez(buf, x=rng.integers(0, 255, (6, 3, 5, 5), dtype=np.uint8), y=rng.standard_normal(6))
    out.append(buf.getvalue())
    return out


def _npz_view(path: Path, kwargs: dict) -> None:
    try:
        read_all(NpzDataView(path, **kwargs))
    except loaders.DataError as e:
        names_file(e, path)
    try:
        read_all(open_data(path))
    except loaders.DataError as e:
        names_file(e, path)
        raise


def _npz_bytes(example, workdir: Path) -> None:
    k, ops = example
    path = workdir / "data.npz"
    path.write_bytes(mutate(npz_seeds()[k], ops))
    _npz_view(path, {})


NPZ_BYTES = fuzzing.FuzzTarget(
    st.tuples(st.integers(0, 2), mutations(64)),
    _npz_bytes,
)

DESCRS = [
    "<f4",
    ">f8",
    "<f2",
    "|u1",
    "<i8",
    ">i4",
    "|b1",
    "<c8",
    "|O",
    "<U3",
    "|S4",
    "|V8",
    "<M8[s]",
    "<m8[D]",
    [("a", "<i4"), ("b", "<f4")],
    ("<f4", (2,)),
    "float32",
    "<f16",
    "xyz",
    3,
    None,
    "<f4 ",
]
SHAPES = st.one_of(
    st.lists(st.integers(0, 12), min_size=1, max_size=4).map(tuple),
    st.lists(st.integers(-3, 2**40), min_size=0, max_size=3).map(tuple),
    st.just((10**12,)),
    st.just((2**62, 0)),
    st.just(tuple([1] * 40)),
    st.sampled_from(["(3,)", "[3]", "3", "(3.0,)", "(True,)", "((3,),)", "()"]),
)


def _npy(descr, shape, fortran, data_len: int, extra: str, version: int) -> bytes:
    shape_text = shape if isinstance(shape, str) else repr(tuple(shape))
    header = f"{{'descr': {descr!r}, 'fortran_order': {fortran!r}, 'shape': {shape_text}, {extra}}}"
    header += " " * (63 - (len(header) + 12) % 64) + "\n"
    raw = header.encode("latin-1")
    size = struct.pack("<H", len(raw)) if version == 1 else struct.pack("<I", len(raw))
    return (
        b"\x93NUMPY"
        + bytes([version, 0])
        + size
        + raw
        + bytes(range(256)) * (data_len // 256)
        + bytes(data_len % 256)
    )


MEMBER = st.one_of(
    st.builds(
        _npy,
        st.sampled_from(DESCRS),
        SHAPES,
        st.sampled_from([False, True, 0, "no"]),
        st.integers(0, 2048),
        st.sampled_from(["", "'x': 1, ", "'shape': (1,), "]),
        st.sampled_from([1, 2, 3]),
    ),
    st.binary(max_size=200),  # not an array
    st.binary(max_size=200).map(lambda b: b"\x93NUMPY\x01\x00" + b),  # a broken header
)


def _matching_npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x)
    return buf.getvalue()


def _npz_members(example, workdir: Path) -> None:
    xm, ym, names, method, lie = example
    path = workdir / "crafted.npz"
    good = {"x": _matching_npy(np.zeros((4, 3), np.float32)), "y": _matching_npy(np.arange(4))}
    members = {"x": xm if xm is not None else good["x"], "y": ym if ym is not None else good["y"]}
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w", method) as z:
        warnings.simplefilter("ignore")  # a duplicate name, on purpose
        for key, name in zip(("x", "y"), names):
            z.writestr(name, members[key])
    if lie is not None:  # rewrite the uncompressed size in the central directory (and the local header)
        data = bytearray(path.read_bytes())
        for sig, off in ((b"PK\x01\x02", 24), (b"PK\x03\x04", 22)):
            at = data.find(sig)
            while at >= 0:
                data[at + off : at + off + 4] = (lie % 2**32).to_bytes(4, "little")
                at = data.find(sig, at + 4)
        path.write_bytes(bytes(data))
    _npz_view(path, {})


ARRAY = st.builds(
    lambda dtype, shape, fortran, fill: _matching_npy(
        np.asfortranarray(np.full(shape, fill).astype(dtype))
        if fortran
        else np.full(shape, fill).astype(dtype)
    ),
    st.sampled_from(["f4", ">f8", "f2", "u1", "i8", ">i2", "?", "c8", "U2", "S3", "M8[s]", "V4"]),
    st.lists(st.integers(0, 6), min_size=0, max_size=4).map(tuple),
    st.booleans(),
    st.sampled_from([0, 1, 3.5, -2, 1e39, np.nan, np.inf, 300]),
)
NPZ_MEMBERS = fuzzing.FuzzTarget(
    st.tuples(
        st.one_of(st.none(), ARRAY, ARRAY, MEMBER),
        st.one_of(st.none(), st.none(), ARRAY, MEMBER),
        st.sampled_from([("x.npy", "y.npy")] * 5 + [("x", "y.npy"), ("x.npy", "x.npy"), ("x.npy", "z.npy")]),
        st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]),
        # a lying size in the zip directory, for one archive in 8
        st.tuples(st.integers(0, 7), st.integers(0, 2**32 - 1)).map(lambda t: t[1] if t[0] == 3 else None),
    ),
    _npz_members,
)


# ---- csv -----------------------------------------------------------------------------------------------------
NICE = st.one_of(
    st.integers(0, 9).map(str),
    st.integers(-1000, 1000).map(str),
    st.floats(-1e6, 1e6, allow_nan=False).map(repr),
)
HOSTILE = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True, width=64).map(repr),
    st.sampled_from(
        [
            "1e39",
            "-1e39",
            "1e30",
            "1e400",
            "1e-50",
            "nan",
            "NaN",
            "inf",
            "-inf",
            "Infinity",
            "-0",
            "0x10",
            "1_0",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775809",
            "3.5",
            "  7 ",
            "+2",
            ".5",
            "5.",
            "",
            "cat",
            '"1"',
            '"a,b"',
            '"',
            "label",
            "y",
            "\t",
            "１２",
            "70000",
            "-70000",
            "2.5e5",
        ]
    ),
    st.text(max_size=8),
)
CELL = st.one_of(*[NICE] * 12, HOSTILE)
RAGGED = st.lists(st.tuples(st.integers(0, 20), st.integers(-2, 2)), max_size=2)  # (row, cells added/removed)
HEADER_NAME = st.sampled_from(["a", "b", "label", "y", "target", "", "1", "class", "pixel0", "Label"])
TABLE = st.integers(2, 6).flatmap(
    lambda k: st.tuples(
        st.one_of(st.none(), st.lists(HEADER_NAME, min_size=k, max_size=k)),
        st.lists(st.lists(CELL, min_size=k, max_size=k), min_size=0, max_size=12),
        st.sampled_from([",", ",", ",", ";", "\t"]),
        st.sampled_from(["\n", "\n", "\r\n", "\r"]),
        st.one_of(st.just([]), st.just([]), st.just([]), RAGGED),
    )
)
CSV_ARGS = st.fixed_dictionaries(
    {},
    optional={
        "label_column": st.one_of(st.integers(-8, 8), st.sampled_from(["auto", "label", "y", "nope"])),
        "header": st.sampled_from(["auto", True, False]),
        "num_classes": st.integers(1, 12),
        "label_dtype": st.sampled_from(["auto", np.float32, np.int64, np.uint8, np.float16]),
        "dtype": st.sampled_from([np.float32, np.float16, np.float64, np.int16]),
    },
)


def _csv(example, workdir: Path) -> None:
    table, extra, bom, gz, kwargs = example
    head, rows, delim, newline, ragged = table
    rows = [list(r) for r in rows]
    for r, change in ragged:
        if rows:
            row = rows[r % len(rows)]
            del row[len(row) + min(change, 0) :]
            row += ["1"] * max(change, 0)
    lines = ([delim.join(head)] if head is not None else []) + [delim.join(r) for r in rows]
    raw = (("\ufeff" if bom else "") + newline.join(lines) + newline).encode("utf-8", "surrogatepass")
    raw = mutate(raw, extra) if extra else raw
    if gz:
        raw = gzip.compress(raw, mtime=0)
    path = workdir / ("table.csv.gz" if gz else "table.csv")
    path.write_bytes(raw)
    try:
        read_all(CsvDataView(path, delimiter=delim, **kwargs))
    except loaders.DataError as e:
        names_file(e, path)
    try:
        read_all(open_data(path))
    except loaders.DataError as e:
        names_file(e, path)
        raise


CSV = fuzzing.FuzzTarget(
    st.tuples(
        TABLE,
        st.one_of(st.none(), st.none(), mutations(16)),
        st.booleans(),
        st.booleans(),
        CSV_ARGS,
    ),
    _csv,
)


# ---- the SQLite sample store ---------------------------------------------------------------------------------
@functools.cache
def store_seed() -> bytes:
    """A real store made by SampleStore: 12 float32 [4, 4] images with int classes, 2 deleted (id gaps)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "seed.db"
        rng = np.random.default_rng(0)
        with SampleStore(path) as store:
            store.add_many(list(rng.standard_normal((12, 4, 4)).astype(np.float32)), list(range(12)))
            store.delete(3)
            store.delete(9)
        return path.read_bytes()


def _crc(dtype: str, shape: str, data: bytes) -> int:
    return zlib.crc32(data, zlib.crc32(f"{dtype}{shape}".encode()))


SQL_VALUE = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.binary(max_size=80),
    st.sampled_from(
        [
            "float32",
            "float64",
            "int64",
            "uint8",
            "object",
            "O",
            "<U3",
            "V8",
            "float128",
            "[4,4]",
            "[4]",
            "[]",
            "[0,1000000000000]",
            "[[[[[[[[1]]]]]]]]",
            "[-1]",
            "[2,8]",
            "[64]",
            "1e999",
        ]
    ),
)


def _store_edit(con: sqlite3.Connection, edit) -> None:
    kind = edit[0]
    if kind == "x":  # a column of one sample's x (or y) rewritten, with a crc32 that matches the new bytes
        _, table, column, value, fix_crc, sample = edit
        ids = [r[0] for r in con.execute(f"SELECT id FROM {table} ORDER BY id")]
        if not ids:
            return
        i = ids[sample % len(ids)]
        con.execute(f"UPDATE {table} SET {column} = ? WHERE id = ?", (value, i))
        moved = con.execute(f"SELECT id FROM {table} WHERE id = ?", (i,)).fetchone() is None  # id rewritten
        if fix_crc and not moved:
            p = "x" if table == "sample_x" else "y"
            d, s, b = con.execute(
                f"SELECT {p}_dtype, {p}_shape, {p} FROM {table} WHERE id = ?", (i,)
            ).fetchone()
            if isinstance(d, str) and isinstance(s, str) and isinstance(b, bytes):
                con.execute(f"UPDATE {table} SET {p}_crc = ? WHERE id = ?", (_crc(d, s, b), i))
    elif kind == "nan":  # a NaN or inf written into a sample, its crc32 recomputed
        _, value, sample = edit
        ids = [r[0] for r in con.execute("SELECT id FROM sample_x ORDER BY id")]
        if not ids:
            return
        i = ids[sample % len(ids)]
        d, s, b = con.execute("SELECT x_dtype, x_shape, x FROM sample_x WHERE id = ?", (i,)).fetchone()
        if not (isinstance(b, bytes) and len(b) % 4 == 0 and b and isinstance(d, str) and isinstance(s, str)):
            return  # an earlier edit made it something else
        a = np.frombuffer(b, np.float32).copy()
        a[sample % a.size] = value
        con.execute(
            "UPDATE sample_x SET x = ?, x_crc = ? WHERE id = ?", (a.tobytes(), _crc(d, s, a.tobytes()), i)
        )
    elif kind == "meta":
        _, key, value = edit
        con.execute("DELETE FROM meta WHERE key = ?", (key,))
        if value != "<absent>":
            con.execute("INSERT INTO meta VALUES (?, ?)", (key, value))
    elif kind == "sql":
        con.executescript(edit[1])


STORE_EDIT = st.one_of(
    st.tuples(
        st.just("x"),
        st.sampled_from(["samples", "sample_x"]),
        st.sampled_from(["y_dtype", "y_shape", "y", "y_crc", "created", "id"]),
        SQL_VALUE,
        st.booleans(),
        st.integers(0, 100),
    ).map(
        lambda e: (
            e
            if e[1] == "samples"
            else (e[0], e[1], e[2].replace("y", "x", 1) if e[2] != "id" else "id", *e[3:])
        )
    ),
    st.tuples(st.just("nan"), st.sampled_from([np.nan, np.inf, -np.inf]), st.integers(0, 100)),
    st.tuples(
        st.just("meta"),
        st.sampled_from(["format", "version"]),
        st.one_of(
            SQL_VALUE, st.sampled_from(["<absent>", "2", "0", "1", "01", "²", "edgetrain.sample-store"])
        ),
    ),
    st.tuples(
        st.just("sql"),
        st.sampled_from(
            [
                "DROP TABLE sample_x",
                "DROP TABLE meta",
                "ALTER TABLE samples RENAME TO s2",
                "ALTER TABLE sample_x DROP COLUMN x_crc",
                "DELETE FROM samples",
                "DELETE FROM sample_x WHERE id = 5",
                "INSERT INTO samples (id, created, y_dtype, y_shape, y, y_crc) "
                "VALUES (100, 'later', 'int64', '[]', x'00', 0)",
                "CREATE TABLE t2 AS SELECT * FROM samples; DROP TABLE samples; CREATE VIEW samples AS SELECT * FROM t2",
                "UPDATE samples SET id = id * 1000000000000",
                "PRAGMA journal_mode=DELETE",
                "UPDATE sample_x SET x_shape = '[2,8]' WHERE id = 2",
            ]
        ),
    ),
)


def _masked(data: bytes) -> bytes:
    """A store file with the header bytes a switch to WAL rewrites zeroed: the read and write versions (18, 19),
    the change counter (24-27) and the version-valid-for number (92-95)."""
    b = bytearray(data)
    for a, z in ((18, 20), (24, 28), (92, 96)):
        b[a:z] = bytes(len(b[a:z]))
    return bytes(b)


def _store(example, workdir: Path) -> None:
    edits, ops = example
    path = workdir / "samples.db"
    path.write_bytes(store_seed())
    if edits:
        con = sqlite3.connect(path, isolation_level=None)
        try:
            for e in edits:
                try:
                    _store_edit(con, e)
                except sqlite3.Error:
                    pass  # an edit SQLite itself refuses (a constraint): the next one
        finally:
            con.close()
        for extra in (workdir / "samples.db-wal", workdir / "samples.db-shm"):
            assert not extra.exists()
    data = mutate(path.read_bytes(), ops) if ops else path.read_bytes()
    path.write_bytes(data)
    try:
        with SampleStore(path, create=False) as store:
            read_all(store)
            train, val = store.split(0.3)
            for part in (train, val):
                if part.size():
                    read_all(part)
            store.integrity_check()
    except loaders.DataError as e:
        names_file(e, path)
        # refused: the user's file was not changed, whatever stage refused it (an intact file of the rollback
        # journal mode is switched to WAL at open, which rewrites only the header's mode and counters)
        assert _masked(path.read_bytes()) == _masked(data), "a refused store file was modified"
        raise
    finally:
        for extra in (workdir / "samples.db-wal", workdir / "samples.db-shm"):
            extra.unlink(missing_ok=True)


STORE = fuzzing.FuzzTarget(
    st.one_of(
        st.tuples(st.lists(STORE_EDIT, min_size=1, max_size=3), st.none()),
        st.tuples(st.just([]), mutations(32768)),
        st.tuples(st.lists(STORE_EDIT, max_size=2), mutations(32768)),
    ),
    _store,
)


# ---- the tests -----------------------------------------------------------------------------------------------
def test_fuzz_idx_raw(report):
    r = fuzzing.run_target("test_fuzz_loaders:IDX_RAW")
    report("fuzzing", f"loaders idx (raw): {r['tried']} inputs, {r['refused']} refused {r['errors']}")


def test_fuzz_idx_gz(report):
    r = fuzzing.run_target("test_fuzz_loaders:IDX_GZ")
    report("fuzzing", f"loaders idx (.gz): {r['tried']} inputs, {r['refused']} refused {r['errors']}")


def test_fuzz_npz_bytes(report):
    r = fuzzing.run_target("test_fuzz_loaders:NPZ_BYTES")
    report("fuzzing", f"loaders npz (bytes): {r['tried']} inputs, {r['refused']} refused {r['errors']}")


def test_fuzz_npz_members(report):
    r = fuzzing.run_target("test_fuzz_loaders:NPZ_MEMBERS")
    report("fuzzing", f"loaders npz (members): {r['tried']} inputs, {r['refused']} refused {r['errors']}")


def test_fuzz_csv(report):
    r = fuzzing.run_target("test_fuzz_loaders:CSV")
    report("fuzzing", f"loaders csv: {r['tried']} inputs, {r['refused']} refused {r['errors']}")


def test_fuzz_store(report):
    r = fuzzing.run_target("test_fuzz_loaders:STORE")
    report("fuzzing", f"loaders sample store: {r['tried']} inputs, {r['refused']} refused {r['errors']}")
