"""loaders.SampleStore against crafted store files (issue 22, finding 4): a schema holding a trigger, a view, an
index, a table of its own or one of our tables defined otherwise is refused before anything is written, naming
what it found; a store this process cannot write (file mode 0444, a read-only folder, for real: in a child that
gives up root's override of file modes) opens for reading, and a write says it is read-only; absurd format versions
are named for what they are (newer, negative, zero, not a whole number)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from loaders import DataError, SampleStore

ROOT = Path(__file__).resolve().parents[2]


def good_store(path: Path, n: int = 5) -> list[int]:
    with SampleStore(path) as store:
        ids = store.add_many([np.full((2, 3), k, np.float32) for k in range(n)], list(range(n)))
    assert not Path(f"{path}-wal").exists()
    return ids


def edit(path: Path, sql: str) -> bytes:
    con = sqlite3.connect(path, isolation_level=None)
    con.executescript(sql)
    con.close()
    return path.read_bytes()


# ---- schemas that are not a store's --------------------------------------------------------------------------
# (the SQL that crafts the file, the words the refusal names)
CRAFTED = {
    # the attack of the issue: add() acknowledged a sample that the trigger then deleted
    "trigger-deletes-new-samples": (
        "CREATE TRIGGER eat AFTER INSERT ON samples BEGIN DELETE FROM samples WHERE id = new.id; END",
        "trigger 'eat' on samples",
    ),
    "trigger-rewrites-labels": (
        "CREATE TRIGGER relabel AFTER INSERT ON sample_x BEGIN UPDATE samples SET y = x'00' WHERE id = new.id; END",
        "trigger 'relabel' on sample_x",
    ),
    "trigger-on-delete": (
        "CREATE TRIGGER wipe BEFORE DELETE ON samples BEGIN DELETE FROM sample_x; END",
        "trigger 'wipe' on samples",
    ),
    "trigger-on-meta": (
        "CREATE TRIGGER m AFTER UPDATE ON meta BEGIN DELETE FROM samples; END",
        "trigger 'm' on meta",
    ),
    "view": ("CREATE VIEW recent AS SELECT id FROM samples", "view 'recent'"),
    "extra-table": ("CREATE TABLE notes (a, b)", "table 'notes'"),
    "index": ("CREATE INDEX by_time ON samples (created)", "index 'by_time' on samples"),
    "unique-index": ("CREATE UNIQUE INDEX one_label ON samples (y)", "index 'one_label' on samples"),
    "virtual-table": ("CREATE VIRTUAL TABLE search USING rtree(id, a, b)", "table 'search'"),
    # no trigger at all: a second sample with the same label dtype silently replaces the first
    "samples-on-conflict-replace": (
        "CREATE TABLE s2 (id INTEGER PRIMARY KEY AUTOINCREMENT, created REAL NOT NULL, y_dtype TEXT NOT NULL, "
        "y_shape TEXT NOT NULL, y BLOB NOT NULL, y_crc INTEGER NOT NULL, UNIQUE (y_dtype) ON CONFLICT REPLACE); "
        "DROP TABLE samples; ALTER TABLE s2 RENAME TO samples",
        "table samples of another definition",
    ),
    "extra-column": (
        "ALTER TABLE sample_x ADD COLUMN note TEXT DEFAULT 'x'",
        "table sample_x of another definition",
    ),
    "many": (
        "CREATE TABLE t1 (a); CREATE TABLE t2 (a); CREATE TABLE t3 (a); CREATE VIEW v1 AS SELECT 1; "
        "CREATE VIEW v2 AS SELECT 2; CREATE TRIGGER t AFTER INSERT ON samples BEGIN SELECT 1; END",
        "and 2 more",
    ),
}


@pytest.mark.parametrize("case", list(CRAFTED))
@pytest.mark.parametrize("create", [True, False])
def test_a_schema_that_is_not_a_stores_is_refused_untouched(tmp_path, case, create):
    path = tmp_path / "s.db"
    good_store(path)
    sql, says = CRAFTED[case]
    before = edit(path, sql)
    with pytest.raises(DataError) as e:
        SampleStore(path, create=create)
    text = str(e.value)
    assert text.startswith(f"{path}: this is not a sample store edgetrain wrote: its schema also holds "), (
        text
    )
    assert says in text and "left untouched" in text and "new store" in text, text
    assert e.value.path == str(path)
    assert path.read_bytes() == before  # nothing written, not even the switch back to WAL
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0


def test_the_trigger_attack_would_have_lost_an_acknowledged_sample(tmp_path):
    """What the refusal prevents: through plain sqlite3 (as the store wrote before), the insert is acknowledged
    and the sample is gone."""
    path = tmp_path / "s.db"
    good_store(path, 2)
    edit(path, CRAFTED["trigger-deletes-new-samples"][0])
    con = sqlite3.connect(path, isolation_level=None)
    cur = con.execute(
        "INSERT INTO samples (created, y_dtype, y_shape, y, y_crc) VALUES (0, 'int64', '[]', x'00', 0)"
    )
    assert cur.lastrowid and con.execute("SELECT count(*) FROM samples").fetchone()[0] == 2
    con.close()


def test_a_rollback_journal_store_with_a_trigger_is_not_switched_to_wal(tmp_path):
    path = tmp_path / "s.db"
    good_store(path)
    before = edit(path, "PRAGMA journal_mode=DELETE; " + CRAFTED["trigger-deletes-new-samples"][0])
    with pytest.raises(DataError, match="trigger 'eat' on samples"):
        SampleStore(path)
    assert path.read_bytes() == before


def test_what_tools_leave_in_a_store_is_fine(tmp_path):
    """ANALYZE's statistics, a VACUUM, a rollback-journal copy: still a store, opened and written as ever."""
    path = tmp_path / "s.db"
    ids = good_store(path)
    edit(path, "ANALYZE; VACUUM; PRAGMA journal_mode=DELETE")
    with SampleStore(path, create=False) as store:
        assert not store.read_only and store.ids() == ids
        new = store.add(np.zeros((2, 3), np.float32), 9)
        assert store.get(new)[1] == 9 and store.integrity_check() == "ok"


# ---- format versions ------------------------------------------------------------------------------------------
VERSIONS = [
    (
        "999999999999",
        r"written by a newer edgetrain \(schema 999999999999\); this one reads up to 1 \(a version ",
    ),
    (
        "2",
        r"written by a newer edgetrain \(schema 2\); this one reads up to 1\. It was left untouched: update",
    ),
    ("-3", r"damaged: its format version '-3' is negative; versions are 1, 2, 3"),
    ("0", r"damaged: its format version '0' is zero"),
    ("-0", r"damaged: its format version '-0' is zero"),
    ("1.5", r"damaged: its format version '1\.5' is not a whole number"),
    ("1e3", r"damaged: its format version '1e3' is not a whole number"),
    ("9" * 40, r"is not a number >= 1 that any edgetrain writes \(40 digits\)"),
    ("one", r"damaged: its format version 'one' is not a number >= 1"),
    ("", r"damaged: its format version '' is not a number >= 1"),
    (None, r"damaged: its format version None is missing"),
]


@pytest.mark.parametrize("version, says", VERSIONS, ids=[str(v)[:14] for v, _ in VERSIONS])
def test_absurd_format_versions_are_named_for_what_they_are(tmp_path, version, says):
    path = tmp_path / "s.db"
    good_store(path)
    con = sqlite3.connect(path, isolation_level=None)
    if version is None:
        con.execute("DELETE FROM meta WHERE key = 'version'")
    else:
        con.execute("UPDATE meta SET value = ? WHERE key = 'version'", (version,))
    con.close()
    before = path.read_bytes()
    with pytest.raises(DataError, match=says) as e:
        SampleStore(path, create=False)
    assert str(e.value).startswith(f"{path}: ") and "left untouched" in str(e.value)
    assert path.read_bytes() == before


# ---- stores this process cannot write ---------------------------------------------------------------------------
READ_ONLY_CHILD = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    from loaders import DataError, SampleStore
    path, want = sys.argv[1], json.loads(sys.argv[2])
    folder = os.path.dirname(path)
    before = {f: open(os.path.join(folder, f), "rb").read() for f in os.listdir(folder)}
    with SampleStore(path) as store:  # create=True (the default): an existing store is only opened
        assert store.read_only
        assert store.ids() == want["ids"], store.ids()
        x, y = store.get_batch(np.arange(store.size()))
        assert x.tolist() == want["x"] and y.tolist() == want["y"]
        assert store.integrity_check() == "ok"
        for name, write in [("add", lambda: store.add(np.zeros((2, 3), np.float32), 1)),
                            ("add_many", lambda: store.add_many([np.zeros((2, 3), np.float32)], [1])),
                            ("delete", lambda: store.delete(want["ids"][0]))]:
            try:
                write()
                print("WROTE", name)
            except DataError as e:
                assert str(e).startswith(path + ": ") and "read-only here" in str(e), str(e)
                print("REFUSED", name, "|", e)
        assert store.ids() == want["ids"]
    after = {f: open(os.path.join(folder, f), "rb").read() for f in os.listdir(folder)}
    changed = sorted(f for f in after if f in before and after[f] != before[f] and not f.endswith("-shm"))
    print("CHANGED", changed, "NEW", sorted(set(after) - set(before)))
""")


def _without_dac_override() -> None:
    """In a child about to run as root: drops the capabilities that let root ignore file modes (CAP_DAC_OVERRIDE,
    CAP_DAC_READ_SEARCH) from its bounding set, so that after exec chmod binds it too."""
    if os.geteuid() != 0:
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def _pending_wal(path: Path) -> None:
    """Leaves a commit in PATH-wal (and PATH-shm beside it), as a writer that was killed does."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA wal_autocheckpoint=0")
    con.execute("DELETE FROM sample_x WHERE id = 5")
    con.execute("DELETE FROM samples WHERE id = 5")
    keep = {s: Path(f"{path}{s}").read_bytes() for s in ("", "-wal", "-shm")}
    con.close()  # folds the WAL back in and removes it: put the files back as they were before the close
    for s, data in keep.items():
        Path(f"{path}{s}").write_bytes(data)


@pytest.mark.parametrize(
    "how",
    [
        "file-0444",
        "file-0444-rollback-journal",
        "folder-0555",
        "folder-0555-file-0444",
        "folder-0555-wal-0444",
    ],
)
def test_a_read_only_store_opens_for_reading_and_refuses_writes(tmp_path, how):
    folder = tmp_path / "store"
    folder.mkdir()
    path = folder / "s.db"
    ids = good_store(path)
    if how == "file-0444-rollback-journal":
        edit(path, "PRAGMA journal_mode=DELETE")
    if how == "folder-0555-wal-0444":
        _pending_wal(path)
        ids = ids[:4]
    want = {
        "ids": ids,
        "x": [np.full((2, 3), k, np.float32).tolist() for k in range(len(ids))],
        "y": list(range(len(ids))),
    }
    files = [path] + [Path(f"{path}{s}") for s in ("-wal", "-shm") if Path(f"{path}{s}").exists()]
    if "file-0444" in how:
        path.chmod(0o444)
    if (
        "wal-0444" in how
    ):  # with PATH-wal and PATH-shm writable, SQLite writes in a read-only folder: not this
        for f in files:
            f.chmod(0o444)
    if "folder-0555" in how:
        folder.chmod(0o555)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", READ_ONLY_CHILD, str(path), __import__("json").dumps(want)],
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
        for f in files:
            f.chmod(0o644)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("add", "add_many", "delete"):
        assert f"REFUSED {name} |" in proc.stdout, proc.stdout
    assert "WROTE" not in proc.stdout
    assert "CHANGED []" in proc.stdout, proc.stdout  # the store's file (and its WAL) as they were
    if "folder" in how:
        assert "NEW []" in proc.stdout, proc.stdout  # nothing made in a folder that cannot be written
    why = "its folder is not writable" if how == "folder-0555" else "the file is not writable"
    assert why in proc.stdout, proc.stdout


def test_an_empty_read_only_file_is_not_made_a_store(tmp_path):
    """create=True on an empty file that cannot be written: a clear refusal, not SQLite's 'readonly database'."""
    path = tmp_path / "empty.db"
    path.write_bytes(b"")
    path.chmod(0o444)
    child = textwrap.dedent("""
        import sys
        from loaders import DataError, SampleStore
        try:
            SampleStore(sys.argv[1])
        except DataError as e:
            print("REFUSED", e)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", child, str(path)],
            capture_output=True,
            text=True,
            env=env,
            preexec_fn=_without_dac_override,
            timeout=120,
        )
    except subprocess.SubprocessError as e:
        pytest.skip(f"running as root and cannot give up CAP_DAC_OVERRIDE: {e}")
    finally:
        path.chmod(0o644)
    assert proc.returncode == 0, proc.stderr
    assert (
        "REFUSED" in proc.stdout
        and "an empty file, and read-only here (the file is not writable)" in proc.stdout
    )
    assert path.read_bytes() == b""
