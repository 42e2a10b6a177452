"""The user's own samples <-> an SQLite file (WAL): SampleStore, added to by the app while a trainer in another
process reads snapshots of it; StoreView (a fixed set of ids) and a split by sample id that never moves a sample.

The file's format and samples <-> rows are in storeformat.py; opening a file safely and the connection in
storefile.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import operator
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from .errors import ConfigError, DataError
from .storefile import StoreFile
from .storeformat import _X_KINDS, _Y_KINDS, _check, _Damaged, _native, _sample, _short
from .views import IDataView, check_finite

_CHUNK = 500  # ids bound per query: below the 999 parameters of the oldest SQLite builds
_SELECT_Y = "SELECT id, y_dtype, y_shape, y, y_crc FROM samples WHERE id IN ({})"
_SELECT_XY = (
    "SELECT s.id, s.y_dtype, s.y_shape, s.y, s.y_crc, x.x_dtype, x.x_shape, x.x, x.x_crc "
    "FROM samples AS s LEFT JOIN sample_x AS x ON x.id = s.id WHERE s.id IN ({})"
)
_SELECT_XY_AFTER = _SELECT_XY.replace("s.id IN ({})", "s.id > ? ORDER BY s.id LIMIT ?")


def split_score(id: int, salt: str = "") -> float:
    """A sample id -> a number in [0, 1) fixed by the id and salt alone: the first 8 bytes of blake2b(person=
    b"edgetrain-split", data = id as 8 bytes little-endian + the salt's UTF-8), little-endian, / 2**64.
    split(f) puts a sample in validation when its score < f: raising f only moves samples into validation."""
    h = hashlib.blake2b(digest_size=8, person=b"edgetrain-split")
    h.update(operator.index(id).to_bytes(8, "little", signed=True) + salt.encode())
    return int.from_bytes(h.digest(), "little") / 2.0**64


class _Produced(Exception):
    """An error raised by add_stream's batches while the store's transaction is open: carried past the store's
    handling of sqlite3's errors (which would name the store as damaged) to be raised as it was."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error

    @classmethod
    def pull(cls, batches: Iterator) -> Iterator:
        while True:
            try:
                item = next(batches)
            except StopIteration:
                return
            except Exception as e:  # noqa: BLE001  (any error of the caller's: it is raised again, unchanged)
                raise cls(e) from e
            yield item


class StoreView(IDataView):
    """A fixed list of sample ids of a SampleStore (a split part, a snapshot): sample i is store.get(ids[i]).

    Refreshing the store does not change it. A sample deleted since the view was made gives a DataError when
    read (make the view again: store.refresh() then store.split() or store.snapshot())."""

    finite_checked = True  # batches refuse NaN and inf, naming the sample id

    def __init__(self, store: SampleStore, ids, source: str | None = None):
        self.store = store
        try:
            self.ids = np.array(ids, dtype=np.int64).reshape(-1)
        except (TypeError, ValueError, OverflowError) as e:
            raise ConfigError(f"StoreView ids must be sample ids (integers), got {ids!r:.80} ({e})") from None
        self.source = source if source is not None else f"{store.path} [{self.ids.size} samples]"

    def get_item(self, idx: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.store._batch(self.ids[[idx]], self.source)
        return x[0, ...], y[0, ...]

    def size(self) -> int:
        return int(self.ids.size)

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One query (per 500 samples), in the order of `indices`."""
        return self.store._batch(self.ids[np.asarray(indices, dtype=np.intp)], self.source)

    def labels(self) -> np.ndarray:
        """Every label (int64 [n] for classes) without reading any x; int64 [0] for an empty view."""
        return self.store._labels(self.ids, self.source)


class SampleStore(StoreFile, IDataView):
    """The user's samples in an SQLite file: the app adds (one durable transaction each) while a trainer in
    another process reads. As an IDataView it is the snapshot of ids taken at open and at each refresh(), so a
    DataLoader's epoch never shifts while samples arrive; after refresh(), make a new DataLoader (or train on
    split()/snapshot() views, which keep their ids). Thread-safe; one store object per process is enough.
    A store this process cannot write (a file of mode 0444, a read-only folder) is opened for reading: read_only
    is True, and writes raise a DataError saying so.
    """

    finite_checked = True

    def __init__(self, path: str | os.PathLike, *, create: bool = True, timeout: float = 30.0):
        self.path = self.source = os.fspath(path)
        if not (isinstance(timeout, (int, float)) and 0 <= timeout < math.inf):
            raise ConfigError(f"SampleStore timeout must be a number of seconds >= 0, got {timeout!r}")
        self.timeout = float(timeout)
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._snap = np.zeros(0, dtype=np.int64)
        self._pages = self._check_file(create)  # pages the file held before we opened it (0: new or empty)
        # why this process cannot write the store (it is then opened for reading); None when it can
        self._read_only: str | None = None
        uri = self._uri(create)
        try:
            self._conn = sqlite3.connect(
                uri, uri=True, timeout=self.timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as e:
            raise self._error("opening", e) from e
        except UnicodeDecodeError as e:
            raise DataError(f"{self.path}: opening failed: the file is damaged ({e})", self.path) from e
        try:
            self._setup(create)
        except BaseException:
            self.close()
            raise

    @property
    def read_only(self) -> bool:
        """True when this process cannot write the store (a file of mode 0444, a read-only folder): it was opened
        for reading, and add(), add_many() and delete() raise a DataError saying so."""
        return self._read_only is not None

    # -- writing ------------------------------------------------------------------------------------------
    @staticmethod
    def _insert(conn: sqlite3.Connection, row: tuple[tuple, tuple], created: float) -> int:
        x, y = row
        cur = conn.execute(
            "INSERT INTO samples (created, y_dtype, y_shape, y, y_crc) VALUES (?, ?, ?, ?, ?)", (created, *y)
        )
        conn.execute(
            "INSERT INTO sample_x (id, x_dtype, x_shape, x, x_crc) VALUES (?, ?, ?, ?, ?)",
            (cur.lastrowid, *x),
        )
        return int(cur.lastrowid)

    def add(self, x, y) -> int:
        """Stores one sample (x and its label y) in one transaction; returns its id once it is committed and
        synced, so an id the app has seen survives a kill of the process and a power loss."""
        self._writable("adding a sample")
        row = _sample(x, y, self.path)
        with self._db("adding a sample") as conn, self._transaction(conn):
            new = self._insert(conn, row, time.time())
        return new

    def add_many(self, xs, ys) -> list[int]:
        """Stores all the samples in one transaction (all or none: a bad one adds nothing); their ids, in order."""
        xs, ys = list(xs), list(ys)
        if len(xs) != len(ys):
            raise ConfigError(f"add_many got {len(xs)} samples but {len(ys)} labels")
        return self._add_batches([(xs, ys)], f"adding {len(xs)} samples")

    def add_stream(self, batches: Iterable[tuple[Sequence, Sequence]]) -> list[int]:
        """Stores the samples of every (xs, ys) batch that `batches` gives, all in one transaction (all or none: a
        bad sample, or an error raised by `batches` itself, adds nothing); their ids, in order. A batch is encoded
        and written as it comes, so only one is held at a time: a large file streams through it."""
        return self._add_batches(batches, "adding samples")

    def _add_batches(self, batches: Iterable[tuple[Sequence, Sequence]], doing: str) -> list[int]:
        self._writable(doing)
        created = time.time()
        new: list[int] = []
        try:
            with self._db(doing) as conn, self._transaction(conn):
                for xs, ys in _Produced.pull(iter(batches)):
                    xs, ys = list(xs), list(ys)
                    if len(xs) != len(ys):
                        raise ConfigError(f"add_stream got a batch of {len(xs)} samples but {len(ys)} labels")
                    rows = [_sample(x, y, self.path) for x, y in zip(xs, ys)]
                    new += [self._insert(conn, row, created) for row in rows]
        except _Produced as e:
            # the batches' own error (not the store's), raised as it was after the rollback
            raise e.error from e.error.__cause__
        return new

    def delete(self, id: int) -> None:
        """Removes sample `id` (DataError when there is none). Views and the snapshot keep their ids: reading
        it through them gives a DataError until they are made again (refresh())."""
        i = operator.index(id)
        self._writable(f"deleting sample {i}")
        with self._db(f"deleting sample {i}") as conn, self._transaction(conn):
            if conn.execute("DELETE FROM samples WHERE id = ?", (i,)).rowcount == 0:
                raise DataError(f"{self.path}: no sample with id {i} to delete", self.path)
            conn.execute("DELETE FROM sample_x WHERE id = ?", (i,))

    # -- reading ------------------------------------------------------------------------------------------
    def ids(self) -> list[int]:
        """The ids committed now (by any process), ascending."""
        with self._db("listing ids") as conn:
            ids = [r[0] for r in conn.execute("SELECT id FROM samples ORDER BY id")]
        bad = next((i for i in ids if type(i) is not int), None)
        if bad is not None or len(set(ids)) != len(ids):
            what = f"a sample id {_short(bad)}, not an integer" if bad is not None else "repeated sample ids"
            raise DataError(f"{self.path}: damaged: {what}; move it away and start a new store", self.path)
        return ids

    def created(self, id: int) -> float:
        """When sample `id` was added, in unix seconds."""
        i = operator.index(id)
        with self._db(f"reading sample {i}") as conn:
            row = conn.execute("SELECT created FROM samples WHERE id = ?", (i,)).fetchone()
        if row is None:
            raise DataError(f"{self.path}: no sample with id {i}", self.path)
        if isinstance(row[0], bool) or not isinstance(row[0], (int, float)):
            raise DataError(
                f"{self.path}: damaged: sample {i}'s creation time is {_short(row[0])}", self.path
            )
        return float(row[0])

    def get(self, id: int) -> tuple[np.ndarray, np.ndarray]:
        """Sample `id` as (x, y), with the dtype, shape and values it was added with (writable copies)."""
        i = operator.index(id)
        with self._db(f"reading sample {i}") as conn:
            found = conn.execute(_SELECT_XY.format("?"), (i,)).fetchone()
        if found is None:
            raise DataError(f"{self.path}: no sample with id {i}", self.path)
        x, y = self._decode([found], self.path, xy=True, finite=False)
        return x[0, ...], y[0, ...]

    def _read(self, ids: np.ndarray, source: str, *, xy: bool) -> list[tuple]:
        """The rows of `ids` (repeats allowed), in their order: one short read transaction, one query per 500."""
        unique = np.unique(ids).tolist()
        rows: dict[int, tuple] = {}
        query = _SELECT_XY if xy else _SELECT_Y
        with self._db(f"reading {len(unique)} samples") as conn:
            with self._transaction(conn, "DEFERRED") if len(unique) > _CHUNK else contextlib.nullcontext():
                for k in range(0, len(unique), _CHUNK):
                    part = unique[k : k + _CHUNK]
                    rows.update(
                        (r[0], r) for r in conn.execute(query.format(",".join("?" * len(part))), part)
                    )
        gone = [i for i in unique if i not in rows]
        if gone:
            raise DataError(
                f"{source}: sample id {gone[0]} ({len(gone)} of the {len(unique)} asked for) was deleted after "
                f"this view's ids were taken; call refresh() on the store (and split() again) and make a new "
                f"DataLoader",
                self.path,
            )
        return [rows[i] for i in ids.tolist()]

    def _decode(
        self, rows: list[tuple], source: str, *, xy: bool, finite: bool = True
    ) -> tuple[np.ndarray, ...]:
        """Rows -> y stacked (and x stacked before it when xy), each one fresh array filled once. finite: NaN or
        inf is a DataError naming the sample id (get() returns what was stored, exactly; a view trains on it)."""
        parts = [(1, _Y_KINDS, "label")] + ([(5, _X_KINDS, "x")] if xy else [])
        out = []
        for col, kinds, what in parts:
            layout, first = None, rows[0][0] if rows else None
            for k, r in enumerate(rows):
                try:
                    this = _check(r[col], r[col + 1], r[col + 2], r[col + 3], kinds)
                except _Damaged as e:
                    raise DataError(
                        f"{source}: damaged: sample {r[0]}'s {what} does not match what was stored ({e}); "
                        f"delete the sample, or run integrity_check()",
                        self.path,
                    ) from None
                if layout is None:
                    layout = this
                    arr = np.empty((len(rows), *layout[1]), dtype=layout[0])
                    flat = arr.reshape(len(rows), math.prod(layout[1])).view(np.uint8)
                elif this != layout:
                    raise DataError(
                        f"{source}: samples {first} and {r[0]} have {what}s of different dtype/shape "
                        f"({layout[0].name} {list(layout[1])} and {this[0].name} {list(this[1])}), which "
                        f"cannot be stacked in one batch",
                        self.path,
                    )
                flat[k] = np.frombuffer(r[col + 2], dtype=np.uint8)
            if rows and finite:
                check_finite(arr, source, what=what, ids=[r[0] for r in rows], path=self.path)
            out.append(_native(arr) if rows else np.zeros(0, np.int64 if col == 1 else np.float32))
        return (out[1], out[0]) if xy else (out[0],)

    def _batch(self, ids: np.ndarray, source: str) -> tuple[np.ndarray, np.ndarray]:
        return self._decode(self._read(np.asarray(ids, dtype=np.int64), source, xy=True), source, xy=True)

    def _labels(self, ids: np.ndarray, source: str) -> np.ndarray:
        return self._decode(self._read(ids, source, xy=False), source, xy=False)[0]

    # -- the snapshot, as an IDataView --------------------------------------------------------------------
    def refresh(self) -> None:
        """Takes a new snapshot of the committed ids for size(), get_item(), get_batch(), labels(), split()."""
        self._snap = np.array(self.ids(), dtype=np.int64)

    def size(self) -> int:
        return int(self._snap.size)

    def get_item(self, idx: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = self._batch(self._snap[[idx]], self.source)
        return x[0, ...], y[0, ...]

    def get_batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Samples at snapshot positions `indices`, in that order: one query (per 500 samples)."""
        return self._batch(self._snap[np.asarray(indices, dtype=np.intp)], self.source)

    def labels(self) -> np.ndarray:
        """Every label of the snapshot (int64 [n] for classes) without reading any x."""
        return self._labels(self._snap, self.source)

    def snapshot(self) -> StoreView:
        """The snapshot's ids as a view of its own, which later refresh() calls leave alone."""
        return StoreView(self, self._snap, f"{self.path} [snapshot of {self._snap.size} samples]")

    def split(self, val_fraction: float = 0.2, *, salt: str = "") -> tuple[StoreView, StoreView]:
        """(train, validation) views of the snapshot, by sample id: a sample is in validation when
        split_score(id, salt) < val_fraction, so its side never changes as samples come and go. Either part may be
        empty (size() 0, labels() empty; a DataLoader refuses it, naming the part): check size() first."""
        if not (isinstance(val_fraction, (int, float)) and 0.0 <= val_fraction <= 1.0):
            raise ConfigError(f"split val_fraction must be a number in [0, 1], got {val_fraction!r}")
        if not isinstance(salt, str):
            raise ConfigError(f"split salt must be a str, got {salt!r}")
        scores = np.array([split_score(i, salt) for i in self._snap.tolist()], dtype=np.float64)
        val = scores < val_fraction
        n, how = self._snap.size, f"split(val_fraction={val_fraction:g}, salt={salt!r})"
        parts = []
        for name, mask in (("train", ~val), ("validation", val)):
            count = int(mask.sum())
            parts.append(
                StoreView(self, self._snap[mask], f"{self.path} [{name} part of {how}: {count} of {n}]")
            )
        return parts[0], parts[1]

    # -- upkeep -------------------------------------------------------------------------------------------
    def integrity_check(self) -> str:
        """'ok', or the damage found, one item per line: SQLite's PRAGMA integrity_check (pages, b-trees), then
        every sample's bytes against its crc32 (SQLite does not checksum data), in short read transactions."""
        with self._db("checking integrity") as conn:
            answer = [str(r[0]) for r in conn.execute("PRAGMA integrity_check")]
            if answer != ["ok"]:
                return "\n".join(answer)
            orphans = conn.execute(
                "SELECT id FROM sample_x WHERE id NOT IN (SELECT id FROM samples)"
            ).fetchall()
        problems = [f"sample {r[0]}: an x without a label row" for r in orphans]
        last = -(2**63)
        while True:
            with self._db("checking integrity") as conn:
                rows = conn.execute(_SELECT_XY_AFTER, (last, 16)).fetchall()  # 16: bounded memory for images
            if not rows:
                return "\n".join(problems) or "ok"
            for r in rows:
                for col, kinds, what in ((1, _Y_KINDS, "label"), (5, _X_KINDS, "x")):
                    try:
                        _check(r[col], r[col + 1], r[col + 2], r[col + 3], kinds)
                    except _Damaged as e:
                        problems.append(f"sample {r[0]}: its {what} does not match what was stored ({e})")
            last = rows[-1][0]

    def close(self) -> None:
        """Closes the file (the last process to close it folds the WAL back in). Idempotent."""
        with self._lock:
            if self._conn is not None:
                conn, self._conn = self._conn, None
                conn.close()

    def __enter__(self) -> SampleStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
