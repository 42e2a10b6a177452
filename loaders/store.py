"""The user's own samples <-> an SQLite file (WAL): SampleStore, added to by the app while a trainer in another
process reads snapshots of it; StoreView (a fixed set of ids) and a split by sample id that never moves a sample.

Format (version 1), readable with any SQLite tool:
  meta(key, value)        format = 'edgetrain.sample-store', version = '1'
  samples(id, created, y_dtype, y_shape, y, y_crc)      id: INTEGER PRIMARY KEY AUTOINCREMENT (never reused)
  sample_x(id, x_dtype, x_shape, x, x_crc)              x in its own table: ids and labels are read without it
An array is its dtype's numpy name ('uint8', 'float32'), its shape as a JSON list and its bytes, little-endian in
C order; crc is zlib.crc32 of dtype + shape + bytes. Nothing is pickled. A file whose schema holds anything else
(a trigger, a view, an index, another table, one of these defined otherwise) is not opened: a trigger could drop a
sample add() has acknowledged.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import operator
import os
import re
import sqlite3
import threading
import time
import zlib
from collections.abc import Iterator
from urllib.parse import quote

import numpy as np

from .errors import ConfigError, DataError
from .views import IDataView, check_finite

FORMAT = "edgetrain.sample-store"
VERSION = 1
APPLICATION_ID = 0x45545353  # "ETSS" at offset 68 of the SQLite header: tools like `file` can tell what it is
_SQLITE_MAGIC = b"SQLite format 3\x00"
_CHUNK = 500  # ids bound per query: below the 999 parameters of the oldest SQLite builds
_X_KINDS, _Y_KINDS = "biufc", "biuf"

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # AUTOINCREMENT: an id is never given to a second sample after a delete, so the split (by id) and any id the
    # app shows the user keep naming one sample forever
    "CREATE TABLE samples (id INTEGER PRIMARY KEY AUTOINCREMENT, created REAL NOT NULL, y_dtype TEXT NOT NULL, "
    "y_shape TEXT NOT NULL, y BLOB NOT NULL, y_crc INTEGER NOT NULL)",
    # x, large, lives apart (small columns first): listing ids and labels never reads a page of an image
    "CREATE TABLE sample_x (id INTEGER PRIMARY KEY, x_dtype TEXT NOT NULL, x_shape TEXT NOT NULL, "
    "x BLOB NOT NULL, x_crc INTEGER NOT NULL)",
)
_COLUMNS = {
    "samples": {"id", "created", "y_dtype", "y_shape", "y", "y_crc"},
    "sample_x": {"id", "x_dtype", "x_shape", "x", "x_crc"},
}
_INTEGER = re.compile(r"-?[0-9]+")  # ASCII digits only ('²' is a digit to str.isdigit)
_DECIMAL = re.compile(r"-?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?")


def _words(sql) -> str | None:
    """SQL text with its whitespace runs made single spaces (how a definition is compared)."""
    return " ".join(sql.split()) if isinstance(sql, str) else None


# What sqlite_master of a store holds, name -> (table, definition): its tables as _SCHEMA makes them, and SQLite's
# own bookkeeping (AUTOINCREMENT's counter, meta's primary-key index, the statistics of ANALYZE, which a tool may run)
_OWN_TABLES = {
    **{s.split()[2]: (s.split()[2], _words(s)) for s in _SCHEMA},
    "sqlite_sequence": ("sqlite_sequence", "CREATE TABLE sqlite_sequence(name,seq)"),
    "sqlite_stat1": ("sqlite_stat1", "CREATE TABLE sqlite_stat1(tbl,idx,stat)"),
    "sqlite_stat4": ("sqlite_stat4", "CREATE TABLE sqlite_stat4(tbl,idx,neq,nlt,ndlt,sample)"),
}
_OWN_INDEXES = {"sqlite_autoindex_meta_1": ("meta", None)}
_SELECT_Y = "SELECT id, y_dtype, y_shape, y, y_crc FROM samples WHERE id IN ({})"
_SELECT_XY = (
    "SELECT s.id, s.y_dtype, s.y_shape, s.y, s.y_crc, x.x_dtype, x.x_shape, x.x, x.x_crc "
    "FROM samples AS s LEFT JOIN sample_x AS x ON x.id = s.id WHERE s.id IN ({})"
)
_SELECT_XY_AFTER = _SELECT_XY.replace("s.id IN ({})", "s.id > ? ORDER BY s.id LIMIT ?")


# -- arrays <-> rows -----------------------------------------------------------------------------------------
def _encode(a: np.ndarray, kinds: str, what: str, path: str) -> tuple[str, str, bytes, int]:
    dt = a.dtype
    if dt.kind not in kinds or (dt.kind in "fc" and dt.itemsize > 8 * (1 + (dt.kind == "c"))):
        allowed = "bool, integers, floats" + (", complex" if "c" in kinds else "")
        extra = (
            " (long double differs between x86-64 and aarch64: cast to float64)" if dt.kind in "fc" else ""
        )
        raise DataError(f"{path}: {what} of dtype {dt} cannot be stored{extra}; stored are: {allowed}", path)
    le = np.ascontiguousarray(a, dtype=dt.newbyteorder("<"))
    shape = json.dumps(list(a.shape), separators=(",", ":"))
    data = le.tobytes()
    return dt.name, shape, data, zlib.crc32(data, zlib.crc32(f"{dt.name}{shape}".encode()))


def _sample(x, y, path: str) -> tuple[tuple, tuple]:
    """(x, y) -> the two rows' values; labels: integers become an int64 class, floats stay as given."""
    try:
        x, y = np.asarray(x), np.asarray(y)
    except ValueError as e:  # a ragged list
        raise DataError(f"{path}: a sample must be a numeric array ({e})", path) from None
    if y.dtype.kind in "biu":
        y = y.astype(np.int64)
    return _encode(x, _X_KINDS, "x", path), _encode(y, _Y_KINDS, "label y", path)


class _Damaged(Exception):
    """A stored array that is not what was written (its words go into the DataError naming the sample)."""


# the dtype names a store holds: what _encode writes (numpy's names; no object, text, void or long double), in a
# table, so that a name from the file never reaches np.dtype()
_DTYPES = {
    np.dtype(t).name: np.dtype(t).newbyteorder("<")
    for t in ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16")
}
_MAX_SHAPE_TEXT = 400  # '[' + 32 dimensions of 10 digits + commas: a shape is short
_MAX_DIMS = 32  # numpy 1.24's limit
_LAYOUTS: dict[tuple, tuple[np.dtype, tuple[int, ...]]] = {}


def _layout(dtype, shape, kinds: str) -> tuple[np.dtype, tuple[int, ...]]:
    key = (dtype, shape, kinds)
    if key not in _LAYOUTS:
        if len(_LAYOUTS) > 4096:
            _LAYOUTS.clear()
        if dtype is None and shape is None:
            raise _Damaged("nothing stored")
        dt = _DTYPES.get(dtype) if isinstance(dtype, str) else None
        if dt is None or dt.kind not in kinds:
            raise _Damaged(f"dtype {str(dtype)[:40]!r} is not one a store holds")
        if not isinstance(shape, str) or len(shape) > _MAX_SHAPE_TEXT:
            raise _Damaged(f"shape {str(shape)[:40]!r} is not a short JSON list")
        try:
            dims = json.loads(shape)
        except (ValueError, RecursionError):
            dims = None
        if not (
            isinstance(dims, list)
            and len(dims) <= _MAX_DIMS
            and all(type(d) is int and 0 <= d < 2**31 for d in dims)
        ):
            raise _Damaged(f"shape {shape[:40]!r} is not a list of up to {_MAX_DIMS} sizes")
        _LAYOUTS[key] = dt, tuple(dims)
    return _LAYOUTS[key]


def _check(dtype, shape, data, crc, kinds: str) -> tuple[np.dtype, tuple[int, ...]]:
    """A stored array's layout, after checking that its bytes are those written (size and crc)."""
    dt, dims = _layout(dtype, shape, kinds)
    if not isinstance(data, bytes) or len(data) != dt.itemsize * math.prod(dims):
        size = len(data) if isinstance(data, bytes) else type(data).__name__
        raise _Damaged(f"{size} bytes for {dt.name} {list(dims)}")
    if type(crc) is not int or zlib.crc32(data, zlib.crc32(f"{dtype}{shape}".encode())) != crc:
        raise _Damaged("crc32")
    return dt, dims


def _short(value) -> str:
    """A value read from a file, for a message: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _native(a: np.ndarray) -> np.ndarray:
    return a.astype(a.dtype.newbyteorder("="), copy=False)


def split_score(id: int, salt: str = "") -> float:
    """A sample id -> a number in [0, 1) fixed by the id and salt alone: the first 8 bytes of blake2b(person=
    b"edgetrain-split", data = id as 8 bytes little-endian + the salt's UTF-8), little-endian, / 2**64.
    split(f) puts a sample in validation when its score < f: raising f only moves samples into validation."""
    h = hashlib.blake2b(digest_size=8, person=b"edgetrain-split")
    h.update(operator.index(id).to_bytes(8, "little", signed=True) + salt.encode())
    return int.from_bytes(h.digest(), "little") / 2.0**64


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


class SampleStore(IDataView):
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

    # -- opening ------------------------------------------------------------------------------------------
    def _not_ours(self, what: str) -> DataError:
        return DataError(
            f"{self.path}: not an edgetrain sample store: {what}. It was left untouched; give SampleStore a path "
            f"of its own (a new store is created there), or move this file away",
            self.path,
        )

    def _uri(self, create: bool) -> str:
        """What SQLite opens: the file read-write (made when missing and create), or read-only when this process
        cannot write it. Read-only needs no writable folder while the WAL holds nothing (immutable=1: SQLite then
        reads the file alone, with no PATH-shm to make); with commits still in PATH-wal, SQLite reads them
        through a PATH-shm that must exist already."""
        path = os.path.abspath(self.path)
        base = f"file:{quote(path)}"
        if not os.path.exists(path):
            return f"{base}?mode={'rwc' if create else 'rw'}"
        folder = os.access(os.path.dirname(path), os.W_OK | os.X_OK)
        wal, shm = f"{path}-wal", f"{path}-shm"
        if not os.access(path, os.W_OK):
            self._read_only = "the file is not writable"
        elif not folder and not (os.access(wal, os.W_OK) and os.access(shm, os.W_OK)):
            self._read_only = "its folder is not writable, and SQLite writes PATH-wal and PATH-shm beside it"
        if self._read_only is None:
            return f"{base}?mode={'rwc' if create else 'rw'}"
        if folder:
            return f"{base}?mode=ro"
        pending = os.path.exists(wal) and os.path.getsize(wal) > 0
        if not pending:
            return f"{base}?mode=ro&immutable=1"
        if not os.path.exists(shm):
            raise DataError(
                f"{self.path}: a read-only store whose {os.path.basename(wal)} still holds samples not yet folded "
                f"into it, which SQLite cannot read without {os.path.basename(shm)} in a folder it cannot write; "
                f"copy the store and its -wal file to a writable folder (or make this one writable) and open it "
                f"there",
                self.path,
            )
        return f"{base}?mode=ro"

    def _writable(self, doing: str) -> None:
        """A DataError for a write to a store opened for reading."""
        if self._read_only is not None:
            raise DataError(
                f"{self.path}: {doing}: the sample store is read-only here ({self._read_only}), so it was opened "
                f"for reading only; make the file and its folder writable, or copy the store to a writable folder",
                self.path,
            )

    def _check_file(self, create: bool) -> int:
        """Refuses what is not an SQLite file; returns how many pages it holds (0 for none or an empty file)."""
        path = self.path
        if os.path.isdir(path):
            raise DataError(f"{path}: a directory, not a sample store file; name a file in it", path)
        if not os.path.exists(path):
            if not create:
                raise DataError(f"{path}: no sample store there (no such file); create=True makes one", path)
            return 0
        try:
            with open(path, "rb") as f:
                head = f.read(100)
                size = os.fstat(f.fileno()).st_size
        except OSError as e:
            raise DataError(f"{path}: cannot read the sample store ({e.strerror or e})", path) from e
        cut = 0 < len(head) < 100 and (head.startswith(_SQLITE_MAGIC) or _SQLITE_MAGIC.startswith(head))
        if head and not cut and not head.startswith(_SQLITE_MAGIC):
            raise self._not_ours(f"not an SQLite database (it starts with {head[:16]!r})")
        if cut:
            raise DataError(
                f"{path}: damaged: an SQLite file truncated to {len(head)} bytes, shorter than its header; "
                f"move it away (the samples in it are lost) and start a new store",
                path,
            )
        page = int.from_bytes(head[16:18], "big") if head else 0
        page = 65536 if page == 1 else page
        return -(-size // page) if page >= 512 else (1 if size else 0)

    def _setup(self, create: bool) -> None:
        with self._db("opening") as conn:
            # FULL, not NORMAL. In WAL mode both survive a kill of the process at any instant: a commit's
            # write() is in the OS's cache, which the kernel writes out after the process is gone, and neither
            # setting ever corrupts the file. They differ when the OS itself stops (a phone's battery dies, a
            # kernel panic): NORMAL syncs the WAL only at checkpoints, so the last commits before power loss
            # can roll back - samples add() already acknowledged to the user would vanish. FULL fsyncs the WAL
            # at every commit, so add() returns only once the sample is on storage. The price, one fsync per
            # add() (add_many() shares one), is nothing at the pace a person adds samples.
            conn.execute("PRAGMA synchronous=FULL")
            # Apple's fsync() does not flush the drive's cache, F_FULLFSYNC does; elsewhere this is a no-op
            conn.execute("PRAGMA fullfsync=ON")
            tables = self._tables(conn)
            if not tables:  # a new (or empty) file: another process may be creating it now too
                if self._pages > 1:  # an empty database made by a tool has one page: this lost its tables
                    raise DataError(
                        f"{self.path}: damaged: an SQLite file of {self._pages} pages whose schema lists no "
                        f"tables (a store that lost them, or a database another tool emptied); it was left "
                        f"untouched: move it away (keep it: SQLite's .recover may save samples) and start a new "
                        f"store",
                        self.path,
                    )
                if not create:
                    raise self._not_ours("an empty file (create=True makes a new store in it)")
                if self._read_only is not None:
                    raise DataError(
                        f"{self.path}: an empty file, and read-only here ({self._read_only}): no store can be "
                        f"made in it; make it writable, or give SampleStore a path in a writable folder",
                        self.path,
                    )
                with self._transaction(conn):  # the busy timeout covers BEGIN IMMEDIATE: one creator wins
                    if not self._tables(conn):
                        for statement in _SCHEMA:
                            conn.execute(statement)
                        conn.executemany(
                            "INSERT INTO meta VALUES (?, ?)", [("format", FORMAT), ("version", str(VERSION))]
                        )
                        conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                tables = self._tables(conn)
            self._check_format(conn, tables)  # before anything is changed in a file that may not be ours
            # new, or a copy that a tool turned back to a rollback journal (a read-only store stays as it is)
            switch = self._read_only is None and conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal"
            if switch and self._pages > 1:  # switching rewrites the header: not in a file that may be damaged
                found = [" ".join(str(r[0]).split()) for r in conn.execute("PRAGMA quick_check(3)")]
                if found != ["ok"]:
                    raise DataError(
                        f"{self.path}: damaged ({'; '.join(found)}); it was left untouched: move it away "
                        f"(keep it) and start a new store",
                        self.path,
                    )
            # The ids are read before the schema's other objects are judged, so that damage to the samples
            # themselves is named as such; reading runs no trigger (SQLite has none on SELECT), and the tables
            # read are tables (_check_format), so nothing in the file has run when _check_objects refuses it.
            self.refresh()
            self._check_objects(conn)
            if switch:
                self._to_wal(conn)

    def _to_wal(self, conn: sqlite3.Connection) -> None:
        # Switching to WAL needs the file to itself, and SQLite answers "locked" at once instead of waiting
        # (the busy timeout does not cover it): when several processes open a new store at the same instant,
        # retry until the timeout.
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as e:
                if "locked" not in str(e).lower() or time.monotonic() > deadline:
                    raise
                time.sleep(0.005)
        if mode != "wal":
            raise DataError(
                f"{self.path}: SQLite cannot use WAL mode here (the journal mode stays {mode!r}); WAL is what lets "
                f"the app add while a trainer reads: put the store on a local file system",
                self.path,
            )

    @staticmethod
    def _tables(conn: sqlite3.Connection) -> set[str]:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def _check_format(self, conn: sqlite3.Connection, tables: set[str]) -> None:
        if "meta" not in tables:
            names = ", ".join(sorted(t for t in tables if not t.startswith("sqlite_")))
            raise self._not_ours(f"an SQLite database of something else (no meta table; its tables: {names})")
        try:
            meta = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('format', 'version')"))
        except (sqlite3.OperationalError, ValueError, TypeError):
            raise self._not_ours(
                "an SQLite database of something else (its meta table is not ours)"
            ) from None
        if meta.get("format") != FORMAT:
            raise self._not_ours(f"its meta table says format {_short(meta.get('format'))}, not {FORMAT!r}")
        version = self._version(meta.get("version"))
        if version > VERSION:
            far = " (a version that far ahead is more likely damage)" if version > VERSION + 1000 else ""
            raise DataError(
                f"{self.path}: a sample store of format version {version}, newer than this edgetrain reads "
                f"(version {VERSION}): written by a newer edgetrain (schema {version}); this one reads up to "
                f"{VERSION}{far}. It was left untouched: update the app (edgetrain) to open it",
                self.path,
            )
        for table, columns in _COLUMNS.items():
            if table not in tables:  # a view or a virtual table of that name could run anything
                raise DataError(
                    f"{self.path}: damaged: no table {table} (the samples); move it away and start a new store",
                    self.path,
                )
            have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
            if not columns <= have:
                raise DataError(
                    f"{self.path}: damaged: table {table} lacks columns {sorted(columns - have)}; move it away "
                    f"and start a new store",
                    self.path,
                )

    def _version(self, version) -> int:
        """The meta table's format version as an int >= 1, or a DataError saying what it is instead."""
        fault = None
        if version is None:
            fault = "is missing (meta holds no 'version' row)"
        elif not isinstance(version, str) or not _INTEGER.fullmatch(version):
            decimal = isinstance(version, str) and _DECIMAL.fullmatch(version)
            fault = "is not a whole number; versions are 1, 2, 3, ..." if decimal else "is not a number >= 1"
        elif len(version.lstrip("-")) > 18:  # beyond SQLite's integers: no edgetrain wrote that
            fault = f"is not a number >= 1 that any edgetrain writes ({len(version.lstrip('-'))} digits)"
        elif int(version) < 0:
            fault = "is negative; versions are 1, 2, 3, ..."
        elif int(version) == 0:
            fault = "is zero; versions are 1, 2, 3, ..."
        if fault is not None:
            raise DataError(
                f"{self.path}: damaged: its format version {_short(version)} {fault}; it was left untouched: move "
                f"it away (keep it) and start a new store",
                self.path,
            )
        return int(version)

    def _check_objects(self, conn: sqlite3.Connection) -> None:
        """Refuses a file whose schema holds anything but a store's own tables (as _SCHEMA makes them) and
        SQLite's bookkeeping: a trigger could delete or rewrite a sample add() has acknowledged, a view or a
        table of another definition (ON CONFLICT REPLACE, a default) change what is stored, behind the app."""
        strange = []
        for kind, name, table, sql in conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"):
            ours = {"table": _OWN_TABLES, "index": _OWN_INDEXES}.get(kind, {})
            if isinstance(name, str) and name in ours and ours[name] == (table, _words(sql)):
                continue
            what = f"{kind if isinstance(kind, str) else _short(kind)} {_short(name)}"
            if name in _OWN_TABLES and kind == "table":
                what = f"table {name} of another definition ({_short(sql)})"
            elif table != name and isinstance(table, str):
                what += f" on {table}"
            strange.append(what)
        if strange:
            more = f" and {len(strange) - 4} more" if len(strange) > 4 else ""
            raise DataError(
                f"{self.path}: this is not a sample store edgetrain wrote: its schema also holds "
                f"{', '.join(strange[:4])}{more}, where a store has only its tables meta, samples and sample_x "
                f"(a trigger or view could change or drop samples behind the app). It was left untouched and "
                f"nothing was written to it: copy the samples you trust out with an SQLite tool into a new store, "
                f"or give SampleStore a path of its own",
                self.path,
            )

    # -- the connection -----------------------------------------------------------------------------------
    def _error(self, doing: str, e: sqlite3.Error) -> DataError:
        low = str(e).lower()
        if "locked" in low or "busy" in low:
            hint = f"another process held the store longer than timeout={self.timeout:g}s; try again"
        elif "malformed" in low or "not a database" in low or "corrupt" in low:
            hint = (
                "the file is damaged (truncated or overwritten); move it away (keep it) and start a new store"
            )
        elif "readonly" in low or "unable to open" in low or "permission" in low:
            hint = "its directory must exist and be writable, and so must the file (SQLite adds PATH-wal, PATH-shm)"
        elif "full" in low:
            hint = "the storage is full; free space and try again"
        else:
            hint = "SQLite's own words"
        return DataError(f"{self.path}: {doing} failed: {e} ({hint})", self.path)

    @contextlib.contextmanager
    def _db(self, doing: str) -> Iterator[sqlite3.Connection]:
        """The connection, under the lock; sqlite3's errors come out as a DataError naming the file."""
        with self._lock:
            if self._conn is None:
                raise DataError(f"{self.path}: {doing}: the sample store is closed", self.path)
            try:
                yield self._conn
            except sqlite3.Error as e:
                raise self._error(doing, e) from e
            except UnicodeDecodeError as e:  # sqlite3 decodes SQLite's message, which can quote damaged bytes
                raise DataError(
                    f"{self.path}: {doing} failed: SQLite reported damage in words that are not UTF-8 ({e}); the "
                    f"file is damaged: move it away (keep it) and start a new store",
                    self.path,
                ) from e

    @staticmethod
    @contextlib.contextmanager
    def _transaction(conn: sqlite3.Connection, mode: str = "IMMEDIATE") -> Iterator[None]:
        # IMMEDIATE takes the write lock at BEGIN, where the busy timeout applies; a read lock upgraded later
        # could fail at once with SQLITE_BUSY_SNAPSHOT. Reads use DEFERRED: one consistent snapshot, no lock.
        conn.execute(f"BEGIN {mode}")
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise

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
        self._writable("adding samples")
        xs, ys = list(xs), list(ys)
        if len(xs) != len(ys):
            raise ConfigError(f"add_many got {len(xs)} samples but {len(ys)} labels")
        rows = [_sample(x, y, self.path) for x, y in zip(xs, ys)]
        created = time.time()
        with self._db(f"adding {len(rows)} samples") as conn, self._transaction(conn):
            new = [self._insert(conn, row, created) for row in rows]
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
