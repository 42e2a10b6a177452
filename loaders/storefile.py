"""Opening a sample store's file safely: StoreFile, the part of SampleStore that refuses what is not a store
(another file, another SQLite database, a newer format version, a schema holding a trigger or a view, damage) and
leaves it untouched, creates the schema in a new or empty file, opens a file it cannot write for reading, switches
a store to WAL, and holds the connection (under a lock, sqlite3's errors made DataErrors naming the file)."""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from urllib.parse import quote

from .errors import DataError
from .storeformat import (
    _COLUMNS,
    _OWN_INDEXES,
    _OWN_TABLES,
    _SCHEMA,
    APPLICATION_ID,
    FORMAT,
    VERSION,
    _short,
    _words,
)

_SQLITE_MAGIC = b"SQLite format 3\x00"
_INTEGER = re.compile(r"-?[0-9]+")  # ASCII digits only ('²' is a digit to str.isdigit)
_DECIMAL = re.compile(r"-?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?")


class StoreFile:
    """A store's file and its connection, for SampleStore: its __init__ sets path, timeout, _lock, _conn, _pages
    (from _check_file) and _read_only (from _uri) before _setup, which ends by taking SampleStore's first
    snapshot (refresh())."""

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
