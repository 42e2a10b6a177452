"""loaders.SampleStore: exact round trips of many dtypes and shapes, ids, deletes, creation times, atomic
add_many, a split by sample id that never moves a sample, DataLoader and Trainer over snapshots and split parts,
a writer and a trainer in two processes at once, SIGKILLs at random instants that lose no acknowledged sample,
clear DataErrors for foreign, damaged and newer files, and a numpy-only device run (numpy 2.x and 1.24)."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from device import BUILD_SIDE, PYTHONS, run_on_device

from loaders import DataError, DataLoader, SampleStore, StoreView, check_labels, split_score

ROOT = Path(__file__).resolve().parents[2]


# -- references, independent of loaders.store --------------------------------------------------------------
def sample(k: int):
    """Sample number k, a pure function of k (the child processes run this same source): an uint8 image, float32
    features or int64 token ids, with an int class, a float32 target vector or a float64 scalar target."""
    rng = np.random.default_rng(k % 2**32)
    kind = k % 3
    if kind == 0:
        return rng.integers(0, 256, size=(48, 48, 3), dtype=np.uint8), k % 10
    if kind == 1:
        return rng.standard_normal(257).astype(np.float32), np.array([k / 7, -k], dtype=np.float32)
    return rng.integers(0, 30_000, size=40, dtype=np.int64), np.float64(k) / 3


def features(k: int) -> np.ndarray:
    """x of the homogeneous stores (DataLoader tests): float32 [2, 4] that names k."""
    return (np.arange(8, dtype=np.float32).reshape(2, 4) + 1000 * k).astype(np.float32)


def le_bytes(a) -> bytes:
    a = np.asarray(a)
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()


def assert_same(got: np.ndarray, want) -> None:
    want = np.asarray(want)
    assert isinstance(got, np.ndarray)
    assert got.dtype == want.dtype.newbyteorder("=") and got.shape == want.shape, (got.dtype, got.shape, want)
    assert le_bytes(got) == le_bytes(want)


def score(i: int, salt: str = "") -> float:
    """split's documented rule, computed here from hashlib alone."""
    h = hashlib.blake2b(
        i.to_bytes(8, "little", signed=True) + salt.encode(), digest_size=8, person=b"edgetrain-split"
    )
    return int.from_bytes(h.digest(), "little") / 2**64


def homogeneous(path, n: int, start: int = 0) -> SampleStore:
    store = SampleStore(path)
    store.add_many([features(k) for k in range(start, start + n)], list(range(start, start + n)))
    store.refresh()
    return store


def check_batch(x: np.ndarray, y: np.ndarray) -> None:
    assert x.dtype == np.float32 and y.dtype == np.int64 and x.shape == (len(y), 2, 4)
    for xi, yi in zip(x, y):
        np.testing.assert_array_equal(xi, features(int(yi)))


def child(script: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        text=True,
        **kw,
    )


SAMPLE_SOURCE = "import numpy as np\n" + textwrap.dedent(inspect.getsource(sample))
FEATURES_SOURCE = "import numpy as np\n" + textwrap.dedent(inspect.getsource(features))


# -- round trips ----------------------------------------------------------------------------------------------
ROUND_TRIP = [
    (np.arange(32 * 32 * 3, dtype=np.uint8).reshape(32, 32, 3), 7),  # a camera image, an int class
    (np.linspace(-1, 1, 3 * 8 * 8, dtype=np.float32).reshape(3, 8, 8), np.int32(2)),
    (np.array([101, 2023, 2003, 102, 0, 0], dtype=np.int64), np.uint8(1)),  # token ids
    (
        np.arange(12, dtype=np.float64).reshape(3, 4),
        np.array([0.5, -2.0], dtype=np.float32),
    ),  # a target vector
    (np.float32(3.25), np.float64(-1.5)),  # scalars both
    (np.array([1.5, np.nan, -np.inf, 65504], dtype=np.float16), np.array(3)),
    (np.array([[True, False], [False, True]]), True),  # a mask; a bool label is a class
    (np.arange(-8, 8, dtype=np.int8).reshape(4, 4), np.array([[1.0, 2.0], [3.0, 4.0]])),
    (np.arange(6, dtype=">f4").reshape(2, 3), 0),  # big-endian input: stored little-endian, read as float32
    (np.arange(24, dtype=np.uint16).reshape(4, 6).T, 5),  # not C-contiguous
    (np.array([1 + 2j, 3 - 4j], dtype=np.complex64), np.float32(0.0)),
    (np.zeros((0, 3), dtype=np.float32), 9),  # empty
]


def test_round_trip_of_dtypes_and_shapes_is_exact(tmp_path):
    path = tmp_path / "s.db"
    with SampleStore(path) as store:
        ids = [store.add(x, y) for x, y in ROUND_TRIP]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        for i, (x, y) in zip(ids, ROUND_TRIP):
            gx, gy = store.get(i)
            assert_same(gx, x)
            want_y = np.asarray(y).astype(np.int64) if np.asarray(y).dtype.kind in "biu" else np.asarray(y)
            assert_same(gy, want_y)
            gx[...] = 0  # writable copies: the caller may work in place
    with SampleStore(path) as again:  # a fresh open reads the same
        for i, (x, _) in zip(ids, ROUND_TRIP):
            assert_same(again.get(i)[0], x)
    # the file holds dtype names, JSON shapes and little-endian C-order bytes, never pickles
    con = sqlite3.connect(path)
    rows = con.execute("SELECT id, x_dtype, x_shape, x FROM sample_x ORDER BY id").fetchall()
    con.close()
    for (i, dtype, shape, data), (x, _) in zip(rows, ROUND_TRIP):
        x = np.asarray(x)
        assert dtype == x.dtype.name and json.loads(shape) == list(x.shape) and data == le_bytes(x), i


def test_batches_labels_and_items_follow_the_snapshot(tmp_path):
    store = homogeneous(tmp_path / "s.db", 30)
    order = np.array([29, 3, 3, 0, 17, 8])
    x, y = store.get_batch(order)
    assert y.tolist() == order.tolist()  # sample k was added k-th: position k holds label k
    check_batch(x, y)
    assert store.labels().dtype == np.int64 and store.labels().tolist() == list(range(30))
    check_labels(store, 30)
    xi, yi = store.get_item(4)
    np.testing.assert_array_equal(xi, features(4))
    assert yi.shape == () and int(yi) == 4
    assert store[-1][1] == 29 and len(store) == 30
    # a 600-sample batch is read in chunks of one transaction and keeps its order
    big = homogeneous(tmp_path / "big.db", 600)
    perm = np.random.default_rng(0).permutation(600)
    check_batch(*big.get_batch(perm))
    assert big.get_batch(perm)[1].tolist() == perm.tolist()


def test_labels_are_read_without_any_x(tmp_path):
    path = tmp_path / "s.db"
    store = homogeneous(path, 10)
    con = sqlite3.connect(path)  # damage every x: labels() must not need them, batches must refuse them
    con.execute("UPDATE sample_x SET x = zeroblob(length(x))")
    con.commit()
    con.close()
    assert store.labels().tolist() == list(range(10))
    with pytest.raises(DataError, match=r"s\.db: damaged: sample 1's x does not match"):
        store.get_batch([0])
    assert "sample 1: its x does not match" in store.integrity_check()


def test_ids_delete_created(tmp_path):
    store = SampleStore(tmp_path / "s.db")
    t0 = time.time()
    ids = [store.add(features(k), k) for k in range(6)]
    t1 = time.time()
    assert store.ids() == ids == sorted(ids)
    times = [store.created(i) for i in ids]
    assert all(t0 - 1 <= t <= t1 + 1 for t in times) and times == sorted(times)
    store.delete(ids[2])
    store.delete(ids[-1])  # the largest: its id is still never reused
    assert store.ids() == [ids[0], ids[1], ids[3], ids[4]]
    for bad in (ids[2], ids[-1], 10_000):
        with pytest.raises(DataError, match=rf"s\.db: no sample with id {bad}"):
            store.get(bad)
        with pytest.raises(DataError, match=rf"no sample with id {bad}"):
            store.delete(bad)
        with pytest.raises(DataError, match=rf"no sample with id {bad}"):
            store.created(bad)
    new = store.add(features(9), 9)
    assert new > ids[-1]
    # the snapshot keeps deleted ids until refresh(): reading one says so and what to do
    store.refresh()
    store.delete(new)
    with pytest.raises(DataError, match=r"deleted after this view's ids were taken; call refresh\(\)"):
        store.get_batch(np.arange(store.size()))
    store.refresh()
    assert store.labels().tolist() == [0, 1, 3, 4]


def test_add_many_is_all_or_none(tmp_path, monkeypatch):
    path = tmp_path / "s.db"
    store = SampleStore(path)
    first = store.add_many([features(k) for k in range(3)], [0, 1, 2])
    assert first == sorted(first) and store.ids() == first
    bad_xs = [features(3), np.array(["a", "b"]), features(5)]  # the middle sample is text
    with pytest.raises(DataError, match=r"s\.db: x of dtype <U1 cannot be stored"):
        store.add_many(bad_xs, [3, 4, 5])
    with pytest.raises(DataError, match="label y of dtype"):
        store.add_many([features(3), features(4)], [3, "four"])
    # a failure inside the transaction (the disk, say) rolls the first inserts back too
    real = SampleStore._insert
    calls = []

    def failing(conn, row, created):
        calls.append(1)
        if len(calls) == 3:
            raise sqlite3.OperationalError("disk I/O error")
        return real(conn, row, created)

    monkeypatch.setattr(SampleStore, "_insert", staticmethod(failing))
    with pytest.raises(DataError, match=r"s\.db: adding 4 samples failed: disk I/O error"):
        store.add_many([features(k) for k in range(4)], [0, 1, 2, 3])
    monkeypatch.undo()
    assert store.ids() == first
    con = sqlite3.connect(path)
    assert con.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 3
    assert con.execute("SELECT COUNT(*) FROM sample_x").fetchone()[0] == 3
    con.close()
    with pytest.raises(ValueError, match="2 samples but 1 labels"):
        store.add_many([features(0), features(1)], [0])
    assert store.add_many([], []) == []


@pytest.mark.parametrize(
    "x, y, match",
    [
        (np.array(["cat"]), 0, "x of dtype <U3 cannot be stored"),
        (np.array([object()]), 0, "x of dtype object cannot be stored"),
        ([[1, 2], [3]], 0, "a sample must be a numeric array"),
        (np.zeros(3, np.longdouble), 0, "long double differs between x86-64 and aarch64"),
        (np.zeros(3), "cat", "label y of dtype <U3 cannot be stored"),
        (np.zeros(3), 1 + 2j, "label y of dtype complex128 cannot be stored"),
    ],
)
def test_refuses_what_is_not_numbers(tmp_path, x, y, match):
    if np.dtype(np.longdouble).itemsize <= 8 and isinstance(x, np.ndarray) and x.dtype == np.longdouble:
        pytest.skip("long double is float64 on this machine")
    store = SampleStore(tmp_path / "s.db")
    with pytest.raises(DataError, match=match):
        store.add(x, y)
    assert store.ids() == []


def test_snapshot_until_refresh_and_closed_store(tmp_path):
    path = tmp_path / "s.db"
    trainer = homogeneous(path, 5)
    app = SampleStore(path)  # another connection, as the app in its own process
    app.add(features(5), 5)
    assert trainer.size() == 5 and trainer.ids() == [1, 2, 3, 4, 5, 6]  # ids() is now; the view, the snapshot
    frozen = trainer.snapshot()
    trainer.refresh()
    assert trainer.size() == 6 and frozen.size() == 5 and isinstance(frozen, StoreView)
    trainer.close()
    trainer.close()  # idempotent
    with pytest.raises(DataError, match=r"s\.db: reading 1 samples: the sample store is closed"):
        trainer.get_batch([0])
    with SampleStore(path) as s:
        assert s.size() == 6
    with pytest.raises(DataError, match="closed"):
        s.add(features(0), 0)
    app.close()


# -- the split ----------------------------------------------------------------------------------------------
def test_split_by_id_is_deterministic_stable_and_near_the_fraction(tmp_path):
    store = homogeneous(tmp_path / "s.db", 1000)
    train, val = store.split(0.2)
    ref_val = [i for i in range(1, 1001) if score(i) < 0.2]
    assert val.ids.tolist() == ref_val and train.ids.tolist() == [
        i for i in range(1, 1001) if score(i) >= 0.2
    ]
    assert 150 <= val.size() <= 250, val.size()  # 200 expected, binomial sd 12.6
    assert [split_score(i) for i in (1, 2, 999)] == [score(i) for i in (1, 2, 999)]
    t2, v2 = store.split(0.2)
    assert v2.ids.tolist() == ref_val and t2.ids.tolist() == train.ids.tolist()  # deterministic
    # the parts are views of the samples they name
    x, y = val.get_batch(np.arange(val.size()))
    check_batch(x, y)
    assert (y + 1).tolist() == ref_val  # sample k has id k + 1
    # samples arriving and leaving never move an existing one
    store.add_many([features(k) for k in range(1000, 1500)], list(range(1000, 1500)))
    for i in ref_val[::3] + train.ids.tolist()[::5]:
        store.delete(i)
    store.refresh()
    t3, v3 = store.split(0.2)
    alive = set(store.ids())
    assert set(v3.ids.tolist()) & set(train.ids.tolist()) == set()
    assert set(t3.ids.tolist()) & set(val.ids.tolist()) == set()
    assert set(val.ids.tolist()) & alive <= set(v3.ids.tolist())
    assert 0.15 <= v3.size() / store.size() <= 0.25
    # a larger fraction only moves samples into validation; another salt is another split
    _, v4 = store.split(0.3)
    assert set(v3.ids.tolist()) <= set(v4.ids.tolist())
    _, salted = store.split(0.2, salt="round-2")
    assert salted.ids.tolist() == [i for i in store.ids() if score(i, "round-2") < 0.2] != v3.ids.tolist()


def test_split_does_not_depend_on_insertion_order_or_content(tmp_path):
    a = homogeneous(tmp_path / "a.db", 300)
    b = SampleStore(tmp_path / "b.db")
    order = np.random.default_rng(1).permutation(300).tolist()
    b.add_many([np.zeros(5, np.uint8) + k % 256 for k in order], order)  # other data, another order
    b.refresh()
    assert [p.ids.tolist() for p in a.split(0.25)] == [p.ids.tolist() for p in b.split(0.25)]


def test_empty_parts_are_usable_and_clear(tmp_path):
    store = homogeneous(tmp_path / "s.db", 3)
    train, val = store.split(0.0)
    assert train.size() == 3 and val.size() == 0 and len(val) == 0
    assert val.labels().dtype == np.int64 and val.labels().shape == (0,)
    check_labels(val, 10)
    assert [len(a) for a in val.get_batch(np.arange(0))] == [0, 0]
    with pytest.raises(DataError, match=r"s\.db \[validation part of split\(val_fraction=0, salt=''\): 0 of 3\]: "
                                         r"empty dataset"):  # fmt: skip
        DataLoader(val, 2)
    train, val = store.split(1.0)
    assert train.size() == 0 and val.size() == 3
    with pytest.raises(DataError, match=r"train part of split\(val_fraction=1, salt=''\): 0 of 3\]: empty"):
        DataLoader(train, 2)
    empty = SampleStore(tmp_path / "empty.db")
    assert empty.size() == 0 and [p.size() for p in empty.split()] == [0, 0]
    with pytest.raises(DataError, match=r"empty\.db: empty dataset"):
        DataLoader(empty, 2)
    for bad in (-0.1, 1.5, float("nan"), "0.2"):
        with pytest.raises(ValueError, match="val_fraction must be a number in"):
            store.split(bad)


# -- DataLoader and Trainer ----------------------------------------------------------------------------------
def test_dataloader_over_store_and_split_with_state_and_restore_across_refresh(tmp_path):
    path = tmp_path / "s.db"
    store = homogeneous(path, 40)
    loader = DataLoader(store, 6, shuffle=True, seed=0)
    head = [loader.next() for _ in range(3)]
    state = json.loads(json.dumps(loader.state()))
    app = SampleStore(path)
    app.add_many([features(k) for k in range(40, 45)], list(range(40, 45)))  # arrives mid-epoch
    tail = list(loader)
    labels = np.concatenate([y for _, y in head + tail])
    assert sorted(labels.tolist()) == list(range(40))  # the epoch kept to its snapshot
    for x, y in head + tail:
        check_batch(x, y)
    # resuming over the same ids gives exactly the batches that came next ...
    same = DataLoader(StoreView(store, np.arange(1, 41)), 6, shuffle=True)
    same.restore(state)
    assert [y.tolist() for _, y in same] == [y.tolist() for _, y in tail]
    # ... while after a refresh that brought samples, restore refuses the old position plainly
    store.refresh()
    with pytest.raises(ValueError, match="dataset of 40 samples, this one has 45"):
        DataLoader(store, 6, shuffle=True).restore(state)
    # a refresh that brought nothing resumes exactly
    quiet = homogeneous(tmp_path / "q.db", 40)
    ql = DataLoader(quiet, 6, shuffle=True, seed=0)
    [ql.next() for _ in range(3)]
    qstate = ql.state()
    quiet.refresh()
    resumed = DataLoader(quiet, 6, shuffle=True)
    resumed.restore(qstate)
    assert [y.tolist() for _, y in resumed] == [y.tolist() for _, y in tail]

    # split parts keep their ids over a refresh: a loader over one resumes across it
    train, val = store.split(0.25)
    tl = DataLoader(train, 4, shuffle=True, seed=5)
    [tl.next() for _ in range(2)]
    tstate = tl.state()
    expected = [y.tolist() for _, y in tl]
    app.add_many([features(k) for k in range(45, 60)], list(range(45, 60)))
    store.refresh()
    again = DataLoader(train, 4, shuffle=True)
    again.restore(tstate)
    assert [y.tolist() for _, y in again] == expected
    new_train, new_val = store.split(0.25)
    assert set(train.ids.tolist()) <= set(new_train.ids.tolist())
    assert set(val.ids.tolist()) <= set(new_val.ids.tolist())
    for x, y in DataLoader(new_val, 3):
        check_batch(x, y)


def test_trainer_trains_from_a_split_of_the_store(tmp_path):
    et = pytest.importorskip("edgetrain")
    pytest.importorskip("onnx")
    from models import MODELS

    from edgetrain.runtime.trainer import Trainer

    art = et.convert(MODELS["mlp"][0](), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.05), batch_size=8)
    art.save(str(tmp_path / "mlp.etrain"))
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((10, 784)).astype(np.float32)
    labels = rng.integers(0, 10, 96)
    path = tmp_path / "s.db"
    with SampleStore(path) as store:  # the app's side
        store.add_many(
            [centers[c] + 0.3 * rng.standard_normal(784).astype(np.float32) for c in labels], labels
        )

    def run(epochs, resume):
        store = SampleStore(path)
        train, val = store.split(0.25)
        loader = DataLoader(train, 8, shuffle=True, seed=0, drop_last=True)
        sess = et.TrainingSession(str(tmp_path / "mlp.etrain"))
        trainer = Trainer(
            sess, loader, val_loader=DataLoader(val, 8), epochs=epochs, checkpoint=str(tmp_path / "run.etck")
        )
        return trainer.fit(resume=resume)

    first = run(2, False)
    losses = [r["train_loss"] for r in first.history]
    assert len(losses) == 2 and np.isfinite(losses).all()
    resumed = run(4, True)  # a reopened store: same ids, same fingerprint, the run continues
    assert resumed.epochs == 4 and resumed.history[:2] == first.history
    assert resumed.history[-1]["train_loss"] < losses[0]


# -- two processes at once -----------------------------------------------------------------------------------
WRITER = (
    FEATURES_SOURCE
    + """
import sys, time
from loaders import SampleStore
store = SampleStore(sys.argv[1])
n, worst, k = int(sys.argv[2]), 0.0, 0
while k < n:
    t = time.perf_counter()
    if k % 10 == 9 and k + 5 <= n:
        store.add_many([features(j) for j in range(k, k + 5)], list(range(k, k + 5)))
        k += 5
    else:
        store.add(features(k), k)
        k += 1
    worst = max(worst, time.perf_counter() - t)
    time.sleep(0.002)
print(f"slowest add {worst * 1000:.1f} ms", flush=True)
"""
)


def test_app_writes_while_a_trainer_reads_in_another_process(tmp_path, report):
    path = tmp_path / "s.db"
    store = SampleStore(path)
    n = 400
    proc = child(WRITER, str(path), str(n), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sizes, epochs, t0 = [], 0, time.perf_counter()
    try:
        while True:
            writing = proc.poll() is None
            store.refresh()
            if store.size() >= 8:
                ids = store.snapshot().ids
                loader = DataLoader(store, 8, shuffle=True, seed=epochs)
                seen = []
                for x, y in loader:
                    check_batch(x, y)
                    seen += y.tolist()
                assert sorted(seen) == (ids - 1).tolist()  # the whole snapshot, nothing from later
                train, val = store.split(0.25)
                for part in (train, val):
                    if part.size():
                        for x, y in DataLoader(part, 5, shuffle=True, seed=1):
                            check_batch(x, y)
                assert store.labels().tolist() == (ids - 1).tolist()
                epochs += 1
                if writing:
                    sizes.append(store.size())
            if not writing:
                break
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and err == "", err
    store.refresh()
    assert store.ids() == list(range(1, n + 1))
    check_batch(*store.get_batch(np.arange(n)))
    assert len(set(sizes)) >= 2, sizes  # epochs ran over different snapshots while the writer was adding
    report(
        "sample store",
        f"two processes: {n} samples added while {epochs} epochs read {len(set(sizes))} snapshots in "
        f"{time.perf_counter() - t0:.1f}s; {out.strip()}",
    )
    assert store.integrity_check() == "ok"


def test_busy_timeout_lets_a_reader_in_and_waits_for_the_writer(tmp_path):
    path = tmp_path / "s.db"
    homogeneous(path, 3).close()
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    holder.execute("INSERT INTO meta VALUES ('x', 'y')")
    impatient = SampleStore(path, timeout=0.2)
    assert impatient.labels().tolist() == [0, 1, 2]  # readers are never blocked (WAL)
    t = time.perf_counter()
    with pytest.raises(
        DataError, match=r"s\.db: adding a sample failed: database is locked \(another process"
    ):
        impatient.add(features(3), 3)
    assert 0.15 < time.perf_counter() - t < 5
    patient = SampleStore(path, timeout=20)
    threading.Timer(0.5, lambda: holder.execute("ROLLBACK")).start()
    t = time.perf_counter()
    assert patient.add(features(3), 3) == 4
    assert 0.3 < time.perf_counter() - t < 10
    holder.close()


CREATOR = (
    FEATURES_SOURCE
    + """
import sys
from loaders import SampleStore
store = SampleStore(sys.argv[1])
for k in range(int(sys.argv[2]), int(sys.argv[2]) + 20):
    store.add(features(k), k)
"""
)


def test_processes_creating_one_store_at_the_same_instant(tmp_path):
    path = tmp_path / "s.db"
    procs = [child(CREATOR, str(path), str(100 * p), stderr=subprocess.PIPE) for p in range(5)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 5, errors
    with SampleStore(path, create=False) as store:
        assert sorted(store.labels().tolist()) == [100 * p + k for p in range(5) for k in range(20)]
        check_batch(*store.get_batch(np.arange(store.size())))
        assert store.integrity_check() == "ok"
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert dict(con.execute("SELECT key, value FROM meta")) == {
        "format": "edgetrain.sample-store",
        "version": "1",
    }
    con.close()


# -- crash safety ------------------------------------------------------------------------------------------
CRASHER = (
    SAMPLE_SOURCE
    + """
import sys
from loaders import SampleStore
store = SampleStore(sys.argv[1])
k = int(sys.argv[2])
while True:
    ks = [k, k + 1, k + 2] if k % 7 == 6 else [k]
    print("adding", *ks, flush=True)
    if len(ks) > 1:
        ids = store.add_many([sample(j)[0] for j in ks], [sample(j)[1] for j in ks])
    else:
        ids = [store.add(*sample(k))]
    print("\\n".join(f"{i} {j}" for i, j in zip(ids, ks)), flush=True)
    k += len(ks)
"""
)


def label_of(k: int) -> np.ndarray:
    y = np.asarray(sample(k)[1])
    return y.astype(np.int64) if y.dtype.kind in "biu" else y


def kill_rounds(path: Path, kills: int, seed: int) -> dict:
    """Starts the crasher `kills` times, SIGKILLs it at a random instant, and checks the store after each: every
    id it printed (acknowledged) is there with its exact sample; the only other new ids are the whole batch it was
    adding when killed (committed, not yet printed); nothing committed earlier went missing."""
    rnd = random.Random(seed)
    known: dict[int, int] = {}  # id -> k of every sample committed so far
    acked = unprinted = 0
    t0 = time.perf_counter()
    for r in range(kills):
        proc = child(
            CRASHER, str(path), str(r * 1_000_000), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        first = ""
        if (
            r % 2
        ):  # every other round after its first acknowledgement: a slow (emulated) start must not eat all
            while True:
                line = proc.stdout.readline()
                first += line
                if not line or not line.startswith("adding"):
                    break
            time.sleep(rnd.uniform(0.0, 0.5))  # an add, a commit, a checkpoint
        else:
            time.sleep(rnd.uniform(0.05, 0.9))  # during start-up, the open, an add, a commit, a checkpoint
        proc.send_signal(signal.SIGKILL)
        out = (
            first + proc.stdout.read()
        )  # through the same buffered reader readline() used: nothing is skipped
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        printed, in_flight = {}, []
        for line in out.split("\n")[:-1]:  # the last piece is "" or a line the kill cut
            words = line.split()
            if not words:  # an acknowledgement of an empty batch
                continue
            if words[0] == "adding":
                in_flight = [int(w) for w in words[1:]]
            else:
                printed[int(words[0])] = int(words[1])
                in_flight = [k for k in in_flight if k != int(words[1])]
        # killed before its first commit, the child may have left no file, or one without tables yet: the app's
        # next open (create=True) makes the store; once samples were committed the file must open as it is
        with SampleStore(path, create=not (known or printed)) as store:
            assert store.integrity_check() == "ok"
            have = store.ids()
            missing = (set(known) | set(printed)) - set(have)
            assert not missing, sorted(missing)
            rest = sorted(set(have) - set(known) - set(printed))
            assert len(rest) in (0, len(in_flight)), (rest, in_flight)  # add_many: all or none
            known.update(printed)
            known.update(zip(rest, in_flight))
            acked, unprinted = acked + len(printed), unprinted + len(rest)
            # this round's samples byte for byte, and 200 older ones; integrity_check() above already checked
            # every sample's bytes against the crc32 it was stored with
            older = sorted(set(have) - set(printed) - set(rest))
            for i in sorted(printed) + rest + rnd.sample(older, min(200, len(older))):
                x, y = store.get(i)
                assert_same(x, sample(known[i])[0])
                assert_same(y, label_of(known[i]))
            new = store.add(np.zeros(3, np.float32), -1)  # it still accepts samples
            assert new > max(have, default=0) and store.get(new)[1] == -1
            store.delete(new)
    return {"acked": acked, "unprinted": unprinted, "seconds": time.perf_counter() - t0}


def test_killed_writer_loses_no_acknowledged_sample(tmp_path, report):
    res = kill_rounds(tmp_path / "s.db", 4, seed=0)
    assert res["acked"] > 20
    report(
        "sample store",
        f"SIGKILL x4: {res['acked']} acknowledged samples kept ({res['unprinted']} committed but unprinted), "
        f"{res['seconds'] / 4:.2f}s/kill",
    )


def forty_kills(folder: Path) -> dict:
    """In the background (tests/conftest.py): the kills mostly wait for their random instants."""
    return kill_rounds(folder / "s.db", 40, seed=1)


@pytest.mark.slow
@pytest.mark.background(job=forty_kills)
def test_killed_writer_loses_no_acknowledged_sample_many_times(background, report):
    kills = 40
    res, _ = background
    assert res["acked"] > 40 * 10
    report(
        "sample store",
        f"SIGKILL x{kills}: {res['acked']} acknowledged samples kept ({res['unprinted']} committed but unprinted), "
        f"{res['seconds'] / kills:.2f}s/kill",
    )


# -- files that are not ours -----------------------------------------------------------------------------------
def good_store(path: Path) -> bytes:
    with SampleStore(path) as store:
        for k in range(40):
            store.add(*sample(k))
    assert not Path(f"{path}-wal").exists()  # the last close folded the WAL in: the file is whole
    return path.read_bytes()


def damage(kind: str, path: Path, tmp_path: Path) -> None:
    data = good_store(tmp_path / "good.db") if kind not in ("foreign", "text", "random") else b""
    if kind == "random":
        path.write_bytes(np.random.default_rng(0).integers(0, 256, 50_000, dtype=np.uint8).tobytes())
    elif kind == "text":
        path.write_text("id,label\n1,2\n")
    elif kind == "foreign":
        con = sqlite3.connect(path)
        con.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, uri TEXT)")
        con.execute("INSERT INTO photos VALUES (1, 'content://1')")
        con.commit()
        con.close()
    elif kind.startswith("truncated-"):
        path.write_bytes(data[: {"10": 10, "99": 99, "2pages": 8192, "half": len(data) // 2}[kind[10:]]])
    elif kind in ("newer", "other-format", "other-meta"):
        path.write_bytes(data)
        con = sqlite3.connect(path)
        if kind == "newer":
            con.execute("UPDATE meta SET value = '2' WHERE key = 'version'")
        elif kind == "other-format":
            con.execute("UPDATE meta SET value = 'someapp.cache' WHERE key = 'format'")
        else:
            con.execute("DROP TABLE meta")
            con.execute("CREATE TABLE meta (name TEXT, data BLOB)")
        con.commit()
        con.close()
    elif kind == "header":  # the b-tree of page 1 overwritten
        path.write_bytes(data[:100] + bytes(400) + data[500:])
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind, says",
    [
        ("random", "not an edgetrain sample store: not an SQLite database"),
        ("text", "not an edgetrain sample store: not an SQLite database"),
        (
            "foreign",
            r"not an edgetrain sample store: an SQLite database of something else \(no meta table; "
            r"its tables: photos\)",
        ),  # fmt: skip
        ("other-meta", "an SQLite database of something else"),
        ("other-format", "its meta table says format 'someapp.cache'"),
        ("newer", r"format version 2, newer than this edgetrain reads \(version 1\).*update the app"),
        ("truncated-10", "damaged: an SQLite file truncated to 10 bytes"),
        ("truncated-99", "damaged: an SQLite file truncated to 99 bytes"),
        ("truncated-2pages", r"opening failed: database disk image is malformed \(the file is damaged"),
        ("truncated-half", r"opening failed: database disk image is malformed \(the file is damaged"),
        ("header", r"the file is damaged"),
    ],
)
def test_files_that_are_not_a_sample_store_give_one_clear_data_error(tmp_path, kind, says):
    path = tmp_path / "bad.db"
    damage(kind, path, tmp_path)
    before = path.read_bytes()
    for create in (True, False):
        with pytest.raises(DataError, match=says) as e:
            SampleStore(path, create=create)
        assert str(e.value).startswith(f"{path}: ") and e.value.path == str(path)
        assert not isinstance(e.value, sqlite3.Error)
    assert path.read_bytes() == before  # left untouched: never turned to WAL, never given our tables


def test_missing_empty_and_directory_paths(tmp_path):
    with pytest.raises(
        DataError, match=r"new\.db: no sample store there \(no such file\); create=True makes one"
    ):
        SampleStore(tmp_path / "new.db", create=False)
    assert not (tmp_path / "new.db").exists()
    (tmp_path / "empty.db").write_bytes(b"")
    with pytest.raises(DataError, match=r"empty\.db: not an edgetrain sample store: an empty file"):
        SampleStore(tmp_path / "empty.db", create=False)
    assert SampleStore(tmp_path / "empty.db").size() == 0  # create=True makes a store of it
    with pytest.raises(DataError, match="a directory, not a sample store file"):
        SampleStore(tmp_path)


def test_a_damaged_sample_is_named(tmp_path):
    path = tmp_path / "s.db"
    good_store(path)
    con = sqlite3.connect(path)
    (blob,) = con.execute("SELECT x FROM sample_x WHERE id = 7").fetchone()
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0xFF
    con.execute("UPDATE sample_x SET x = ? WHERE id = 7", (bytes(flipped),))
    con.commit()
    con.close()
    store = SampleStore(path)
    with pytest.raises(
        DataError, match=r"s\.db: damaged: sample 7's x does not match what was stored \(crc32\)"
    ):
        store.get(7)
    assert_same(store.get(8)[0], sample(7)[0])  # id 8 holds sample 7 (ids start at 1)
    assert store.integrity_check() == "sample 7: its x does not match what was stored (crc32)"


# -- numpy alone ----------------------------------------------------------------------------------------------
DEVICE = """
import json, os, tempfile
import numpy as np
import loaders
from loaders import DataLoader, SampleStore

path = os.path.join(tempfile.mkdtemp(), "samples.db")
rng = np.random.default_rng(0)
imgs = rng.integers(0, 256, size=(30, 24, 24, 3), dtype=np.uint8)
with SampleStore(path) as store:
    ids = [store.add(imgs[k], k % 4) for k in range(20)] + store.add_many(imgs[20:], [k % 4 for k in range(20, 30)])
    assert ids == list(range(1, 31))
    x, y = store.get(5)
    assert x.dtype == np.uint8 and x.tobytes() == imgs[4].tobytes() and y.dtype == np.int64 and int(y) == 0
    store.add(np.linspace(0, 1, 5, dtype=np.float32), np.float32(0.5))
    assert store.size() == 0
with SampleStore(path, create=False) as store:
    store.delete(31)
    store.refresh()
    assert store.labels().tolist() == [k % 4 for k in range(30)]
    train, val = store.split(0.2, salt="device")
    assert train.size() + val.size() == 30 and val.size() > 0
    loader = DataLoader(train, 4, shuffle=True, seed=0)
    [loader.next() for _ in range(2)]
    state = json.loads(json.dumps(loader.state()))
    rest = [y.tolist() for _, y in loader]
    again = DataLoader(train, 4, shuffle=True)
    again.restore(state)
    assert [y.tolist() for _, y in again] == rest
    X, Y = loader.next()
    assert X.dtype == np.uint8 and X.shape[1:] == (24, 24, 3) and Y.dtype == np.int64
    X, Y = DataLoader(train, 4).next()
    assert X.tobytes() == imgs[train.ids[:4] - 1].tobytes() and Y.tolist() == [(i - 1) % 4 for i in train.ids[:4]]
    assert store.integrity_check() == "ok"
try:
    SampleStore(path + ".missing", create=False)
except loaders.DataError as e:
    assert "no sample store there" in str(e)
print("sample store numpy-only OK", np.__version__)
"""


@pytest.mark.parametrize("python", PYTHONS)
def test_sample_store_runs_with_numpy_alone(python, report):
    proc = run_on_device(python, DEVICE, blocked=("edgetrain", *BUILD_SIDE), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sample store numpy-only OK" in proc.stdout
    report("sample store", proc.stdout.strip().splitlines()[-1] + f"  ({python})")
