"""loaders/: views, readers (MNIST idx raw and gz, npz, CSV), open_data, split, and a DataLoader whose shuffling
is repeatable from its seed and whose state resumes a run at exactly the next batch; broken files give DataError
messages that name the file and the fault; the package runs with onnx, onnxruntime and edgetrain unimportable."""

from __future__ import annotations

import gzip
import json
import struct
import textwrap
from pathlib import Path

import numpy as np
import pytest
from device import BUILD_SIDE, PYTHONS, run_on_device

from loaders import (
    ArrayDataView,
    CsvDataView,
    DataError,
    DataLoader,
    IDataView,
    MnistDataView,
    NpzDataView,
    SubsetView,
    check_labels,
    open_data,
    split,
)

ROOT = Path(__file__).resolve().parents[2]


# -- helpers ------------------------------------------------------------------------------------------------
def numbered(n: int, **kwargs) -> ArrayDataView:
    """Sample i has x = [i, -i] (float32) and y = i, so a batch's Y names its samples."""
    x = np.stack([np.arange(n), -np.arange(n)], axis=1).astype(np.float32)
    return ArrayDataView(x, np.arange(n), **kwargs)


def ids(batches) -> list[list[int]]:
    return [b[1].tolist() for b in batches]


def idx_bytes(arr: np.ndarray, type_byte: int = 0x08) -> bytes:
    """An idx file per the spec, byte by byte: 0, 0, type, ndim; each dimension as big-endian uint32; the data."""
    arr = np.asarray(arr)
    head = struct.pack(">BBBB", 0, 0, type_byte, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return head + struct.pack(f">{arr.size}B", *arr.ravel().tolist())


def write(path: Path, data: bytes, gz: bool = False) -> Path:
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def mnist_arrays(n: int = 12, seed: int = 0, rows: int = 28, cols: int = 28):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, rows, cols), dtype=np.uint8)
    images[0, 0, 0], images[0, 0, 1] = 0, 255
    labels = (np.arange(n) % 10).astype(np.uint8)
    return images, labels


def mnist_files(d: Path, split_: str = "train", gz: bool = False, n: int = 12, seed: int = 0):
    images, labels = mnist_arrays(n, seed)
    prefix = {"train": "train", "test": "t10k"}[split_]
    ext = ".gz" if gz else ""
    ip = write(d / f"{prefix}-images-idx3-ubyte{ext}", idx_bytes(images), gz)
    lp = write(d / f"{prefix}-labels-idx1-ubyte{ext}", idx_bytes(labels), gz)
    return ip, lp, images, labels


# -- DataLoader: order ---------------------------------------------------------------------------------------
def test_shuffle_is_a_permutation_repeatable_and_differs_across_epochs_and_seeds():
    view = numbered(23)
    a = DataLoader(view, 5, shuffle=True, seed=3)
    e0, e1 = np.concatenate([y for _, y in a]), np.concatenate([y for _, y in a])
    assert sorted(e0.tolist()) == list(range(23)) and sorted(e1.tolist()) == list(range(23))
    assert e0.tolist() != list(range(23))
    assert e0.tolist() != e1.tolist()  # a new permutation per epoch
    b = DataLoader(view, 5, shuffle=True, seed=3)
    assert np.concatenate([y for _, y in b]).tolist() == e0.tolist()  # repeatable from the seed
    assert np.concatenate([y for _, y in b]).tolist() == e1.tolist()
    c = DataLoader(view, 5, shuffle=True, seed=4)
    assert np.concatenate([y for _, y in c]).tolist() != e0.tolist()
    # the samples travel with their labels
    for x, y in DataLoader(view, 5, shuffle=True, seed=3):
        np.testing.assert_array_equal(x[:, 0], y.astype(np.float32))
        assert x.dtype == np.float32 and y.dtype == np.int64


@pytest.mark.parametrize("n, bs, drop_last", [(10, 3, False), (10, 3, True), (10, 5, False), (10, 5, True),
                                              (10, 10, True), (1, 4, False)])  # fmt: skip
def test_len_drop_last_and_order_without_shuffle(n, bs, drop_last):
    loader = DataLoader(numbered(n), bs, drop_last=drop_last)
    batches = ids(loader)
    assert len(batches) == len(loader) == (n // bs if drop_last else -(-n // bs))
    flat = [i for b in batches for i in b]
    assert flat == list(range(len(flat)))  # in order
    if drop_last:
        assert all(len(b) == bs for b in batches) and len(flat) == n - n % bs
    else:
        assert len(flat) == n and all(len(b) == bs for b in batches[:-1])
    assert ids(loader) == batches  # the next epoch, same order


def test_next_runs_across_epochs():
    loader = DataLoader(numbered(7), 3, shuffle=True, seed=11)
    ref = DataLoader(numbered(7), 3, shuffle=True, seed=11)
    epochs = [ids(ref), ids(ref), ids(ref)]
    got = []
    for _ in range(3 * len(loader)):
        assert loader.epoch == len(got) // len(loader)
        got.append(loader.next()[1].tolist())
    assert got == epochs[0] + epochs[1] + epochs[2]
    assert loader.epoch == 3
    assert next(loader)[1].tolist() == ids(ref)[0]  # the loader is also a Python iterator of batches


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("stop", [0, 1, 3, 4, 5, 8, 9, 12])  # 4 and 8: epoch boundaries (4 batches per epoch)
def test_resume_from_state_through_json_gives_exactly_the_remaining_batches(stop, drop_last):
    n, bs = 18 if drop_last else 14, 4  # 4 batches per epoch either way

    def make(seed):
        return DataLoader(numbered(n), bs, shuffle=True, seed=seed, drop_last=drop_last)

    assert len(make(0)) == 4
    total = 14
    first = make(None)  # no seed given: the loader picks one, and its state carries it
    ref = make(first.seed)
    expected = [ref.next()[1].tolist() for _ in range(total)]
    head = [first.next()[1].tolist() for _ in range(stop)]
    assert head == expected[:stop]
    state = json.loads(json.dumps(first.state()))
    assert set(state) >= {"epoch", "position", "seed"}
    if stop % 4 == 0:
        assert (state["epoch"], state["position"]) == (stop // 4, 0)  # at a boundary: the next epoch's start
    resumed = make(None)
    resumed.restore(state)
    tail = [resumed.next()[1].tolist() for _ in range(total - stop)]
    assert head + tail == expected


def test_resume_mid_epoch_with_iteration():
    ref = DataLoader(numbered(20), 3, shuffle=True, seed=5)
    epoch0, epoch1 = ids(ref), ids(ref)
    a = DataLoader(numbered(20), 3, shuffle=True, seed=5)
    seen = []
    for _, y in a:
        seen.append(y.tolist())
        if len(seen) == 2:
            break
    state = json.dumps(a.state())
    b = DataLoader(numbered(20), 3, shuffle=True, seed=999)
    b.restore(json.loads(state))
    assert ids(b) == epoch0[2:]  # the rest of the interrupted epoch
    assert ids(b) == epoch1  # then whole epochs
    assert ids(a) == epoch0[2:]  # the original loader also continues where it stopped


def test_restore_refuses_a_state_of_another_loader():
    loader = DataLoader(numbered(10), 3, shuffle=True, seed=1)
    state = loader.state()
    with pytest.raises(ValueError, match="10 samples, this one has 9"):
        DataLoader(numbered(9), 3, shuffle=True).restore(state)
    with pytest.raises(ValueError, match="shuffle"):
        DataLoader(numbered(10), 3).restore(state)
    with pytest.raises(ValueError, match="lacks"):
        loader.restore({"epoch": 0})
    with pytest.raises(ValueError, match="position 11"):
        loader.restore(dict(state, position=11))


def test_loader_arguments_and_empty_data():
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(numbered(4), 0)
    with pytest.raises(DataError, match="no full batch"):
        DataLoader(numbered(4), 5, drop_last=True)
    with pytest.raises(DataError, match="empty dataset"):
        DataLoader(SubsetView(numbered(4), []), 2)


def test_transform_is_applied_per_sample():
    seen = []

    def transform(x, y):
        seen.append((x.shape, y.shape))
        return x * 2, y + 1

    x, y = DataLoader(numbered(5), 4, transform=transform).next()
    assert seen == [((2,), ())] * 4
    np.testing.assert_array_equal(x[:, 0], [0, 2, 4, 6])
    assert y.tolist() == [1, 2, 3, 4] and y.dtype == np.int64


class CountingView(ArrayDataView):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.items = self.batches = 0

    def get_item(self, idx):
        self.items += 1
        return super().get_item(idx)

    def get_batch(self, indices):
        self.batches += 1
        return super().get_batch(indices)


def test_array_backed_batches_are_one_take_not_a_loop():
    view = CountingView(np.zeros((50, 3), np.float32), np.arange(50))
    loader = DataLoader(SubsetView(view, np.arange(0, 50, 2)), 8, shuffle=True, seed=0)
    batches = list(loader)
    assert view.batches == len(batches) == 4 and view.items == 0


class PlainView(IDataView):
    """Only the two abstract methods: the loader falls back to stacking samples."""

    def get_item(self, idx):
        return np.full((2, 2), idx, np.float32), np.array(idx % 3)

    def size(self):
        return 7


def test_a_minimal_view_works_through_the_fallbacks():
    view = PlainView()
    assert len(view) == 7 and view[-1][1] == 6 % 3
    with pytest.raises(IndexError):
        view[7]
    x, y = DataLoader(view, 4).next()
    assert (
        x.shape == (4, 2, 2) and x.dtype == np.float32 and y.dtype == np.int64 and y.tolist() == [0, 1, 2, 0]
    )
    check_labels(view, 3)
    with pytest.raises(DataError, match="label 2 of sample 2 is out of range for num_classes=2"):
        check_labels(view, 2)


# -- MNIST idx ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
def test_mnist_reader(tmp_path, gz):
    ip, lp, images, labels = mnist_files(tmp_path, gz=gz)
    view = MnistDataView(ip, lp)
    assert len(view) == 12
    x, y = view[3]
    assert x.dtype == np.float32 and x.shape == (1, 28, 28)
    assert y.dtype == np.int64 and y.shape == () and int(y) == 3
    np.testing.assert_array_equal(x[0], images[3] / np.float32(255))
    assert isinstance(view.images, np.memmap) != gz  # raw files are memory-mapped
    X, Y = DataLoader(view, 5, shuffle=True, seed=0).next()
    assert X.shape == (5, 1, 28, 28) and X.dtype == np.float32 and Y.dtype == np.int64
    assert 0.0 <= X.min() and X.max() <= 1.0
    all_x, _ = view.get_batch(np.arange(12))
    assert all_x.min() == 0.0 and all_x.max() == 1.0
    np.testing.assert_array_equal(view.labels(), labels)


def test_mnist_normalize_options_and_from_dir(tmp_path):
    mnist_files(tmp_path, "train", gz=False)
    _, _, test_images, _ = mnist_files(tmp_path, "test", gz=True, n=5, seed=1)
    train = MnistDataView.from_dir(tmp_path)
    test = MnistDataView.from_dir(tmp_path, split="test", normalize=False)
    assert len(train) == 12 and len(test) == 5
    np.testing.assert_array_equal(test[2][0][0], test_images[2].astype(np.float32))
    std = MnistDataView.from_dir(tmp_path, "test", normalize=(0.1307, 0.3081))
    np.testing.assert_allclose(std[2][0][0], (test_images[2] / 255 - 0.1307) / 0.3081, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="split"):
        MnistDataView.from_dir(tmp_path, split="valid")
    with pytest.raises(DataError, match=r"no MNIST train images file.*train-images-idx3-ubyte"):
        MnistDataView.from_dir(tmp_path / "nowhere")


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
def test_mnist_bad_magic(tmp_path, gz):
    images, labels = mnist_arrays()
    bad = write(tmp_path / "train-images-idx3-ubyte", b"\x00\x01\x08\x03" + idx_bytes(images)[4:], gz)
    lp = write(tmp_path / "train-labels-idx1-ubyte", idx_bytes(labels), gz)
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte: not an idx images file: it starts with "
                                        r"00 01 08 03 \(0x00010803\).*00 00 08 03"):  # fmt: skip
        MnistDataView(bad, lp)
    html = write(tmp_path / "page", b"<!DOCTYPE html><html>404</html>", gz)
    with pytest.raises(DataError, match="web page"):
        MnistDataView(html, lp)


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
@pytest.mark.parametrize("which", ["images", "labels"])
def test_mnist_truncated(tmp_path, gz, which):
    images, labels = mnist_arrays()
    ib, lb = idx_bytes(images), idx_bytes(labels)
    ib, lb = (ib[:-100], lb) if which == "images" else (ib, lb[:-3])
    ip, lp = write(tmp_path / "i", ib, gz), write(tmp_path / "l", lb, gz)
    full = 16 + 12 * 28 * 28 if which == "images" else 8 + 12
    cut = full - (100 if which == "images" else 3)
    with pytest.raises(
        DataError, match=rf"[il]: truncated {which}: .* {full} bytes in all.*the file has {cut} bytes"
    ):
        MnistDataView(ip, lp)


def test_mnist_truncated_gzip_stream_and_header(tmp_path):
    images, labels = mnist_arrays()
    lp = write(tmp_path / "l", idx_bytes(labels))
    ip = write(tmp_path / "i.gz", gzip.compress(idx_bytes(images))[:-40])
    with pytest.raises(DataError, match="damaged or truncated gzip"):
        MnistDataView(ip, lp)
    ip = write(tmp_path / "i", b"\x00\x00\x08\x03\x00\x00")
    with pytest.raises(DataError, match="truncated idx header"):
        MnistDataView(ip, lp)


def test_mnist_count_mismatch_swap_empty_and_label_range(tmp_path):
    images, labels = mnist_arrays()
    ip = write(tmp_path / "i", idx_bytes(images))
    lp = write(tmp_path / "l", idx_bytes(labels[:11]))
    with pytest.raises(DataError, match=r"holds 12 images but .*l holds 11 labels"):
        MnistDataView(ip, lp)
    with pytest.raises(DataError, match="swapped"):
        MnistDataView(lp, ip)
    empty_i = write(tmp_path / "ei", idx_bytes(np.zeros((0, 28, 28), np.uint8)))
    empty_l = write(tmp_path / "el", idx_bytes(np.zeros((0,), np.uint8)))
    with pytest.raises(DataError, match="ei: empty dataset"):
        MnistDataView(empty_i, empty_l)
    bad_labels = labels.copy()
    bad_labels[7] = 10
    lp = write(tmp_path / "l", idx_bytes(bad_labels))
    with pytest.raises(DataError, match="label 10 of sample 7 is out of range for num_classes=10"):
        MnistDataView(ip, lp)
    assert len(MnistDataView(ip, lp, num_classes=None)) == 12
    with pytest.raises(DataError, match="no such file"):
        MnistDataView(tmp_path / "missing", lp)


# -- npz -----------------------------------------------------------------------------------------------------
def test_npz_reader(tmp_path):
    x = np.random.default_rng(0).standard_normal((9, 3, 4))
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(9, dtype=np.int32) % 4)
    view = NpzDataView(tmp_path / "d.npz", num_classes=4)
    assert len(view) == 9 and view.x.dtype == np.float32 and view.y.dtype == np.int64
    np.testing.assert_allclose(view[4][0], x[4], rtol=1e-6)
    np.savez_compressed(tmp_path / "r.npz", features=x, target=np.linspace(0, 1, 9))
    reg = NpzDataView(tmp_path / "r.npz", x_key="features", y_key="target")
    X, Y = DataLoader(reg, 4).next()
    assert X.dtype == np.float32 and Y.dtype == np.float32 and Y.shape == (4,)
    with pytest.raises(DataError, match="label 3 of sample 3 is out of range for num_classes=3"):
        NpzDataView(tmp_path / "d.npz", num_classes=3)


def test_npz_broken(tmp_path):
    np.savez(tmp_path / "k.npz", images=np.zeros((2, 2)), labels=np.zeros(2))
    with pytest.raises(
        DataError, match=r"k\.npz: no array named 'x' or 'y'; the archive holds \['images', 'labels'\]"
    ):
        NpzDataView(tmp_path / "k.npz")
    np.savez(tmp_path / "o.npz", x=np.array([{"a": 1}, None], dtype=object), y=np.zeros(2))
    with pytest.raises(
        DataError, match=r"o\.npz: member 'x\.npy' holds Python objects \(dtype object\), which are never"
    ):
        NpzDataView(tmp_path / "o.npz")
    np.savez(tmp_path / "e.npz", x=np.zeros((0, 3)), y=np.zeros(0, np.int64))
    with pytest.raises(DataError, match=r"e\.npz: empty dataset"):
        NpzDataView(tmp_path / "e.npz")
    np.savez(tmp_path / "m.npz", x=np.zeros((3, 3)), y=np.zeros(2, np.int64))
    with pytest.raises(DataError, match="3 samples in x but 2 labels"):
        NpzDataView(tmp_path / "m.npz")
    data = (tmp_path / "k.npz").read_bytes()
    write(tmp_path / "cut.npz", data[: len(data) // 2])
    with pytest.raises(DataError, match=r"cut\.npz: cannot read"):
        NpzDataView(tmp_path / "cut.npz")
    np.save(tmp_path / "one.npy", np.zeros(3))
    with pytest.raises(DataError, match="not an .npz archive"):
        NpzDataView(tmp_path / "one.npy")


# -- CSV -----------------------------------------------------------------------------------------------------
def test_csv_without_header_label_last(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("0.5,1.5,2\n3,4,0\n\n-1e-3, 7 ,1\n")
    view = CsvDataView(p)
    assert view.columns is None and len(view) == 3
    np.testing.assert_array_equal(view.x, np.array([[0.5, 1.5], [3, 4], [-1e-3, 7]], np.float32))
    assert view.x.dtype == np.float32 and view.y.tolist() == [2, 0, 1] and view.y.dtype == np.int64


def test_csv_with_header_label_by_name_and_by_index(tmp_path):
    p = tmp_path / "h.csv"
    p.write_text('a,"label",b\n1,1,2\n3,0,4\n5,1,6\n')
    by_name = CsvDataView(p, label_column="label")
    by_index = CsvDataView(p, label_column=1)
    assert by_name.columns == ["a", "label", "b"]
    for v in (by_name, by_index):
        np.testing.assert_array_equal(v.x, [[1, 2], [3, 4], [5, 6]])
        assert v.y.tolist() == [1, 0, 1]
    first = CsvDataView(p, label_column=0, num_classes=6)
    assert first.y.tolist() == [1, 3, 5]
    # regression targets stay floats; header=True takes even a numeric first row as names
    q = tmp_path / "r.csv"
    q.write_text("1,2,0.25\n3,4,0.5\n")
    assert CsvDataView(q).y.dtype == np.float32
    assert len(CsvDataView(q, header=True)) == 1 and CsvDataView(q, header=True).columns == ["1", "2", "0.25"]
    assert CsvDataView(q, label_dtype=np.float64).y.dtype == np.float64
    # gzip-compressed, recognised by content
    g = write(tmp_path / "g.csv", gzip.compress(p.read_bytes()))
    assert CsvDataView(g, label_column="label").y.tolist() == [1, 0, 1]
    with pytest.raises(DataError, match=r"no column named 'y'; the header has \['a', 'label', 'b'\]"):
        CsvDataView(p, label_column="y")
    with pytest.raises(DataError, match="no header row"):
        CsvDataView(q, label_column="y")
    with pytest.raises(DataError, match="label column 3 out of range for 3 columns"):
        CsvDataView(q, label_column=3)


def test_csv_broken(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("a,b,label\n1,2,0\n3,abc,1\n")
    with pytest.raises(
        DataError, match=r"bad\.csv: row 2 \(line 3\), column 2 \('b'\): 'abc' is not a number"
    ):
        CsvDataView(p)
    p.write_text("1,2,0\n\n3,,1\n")
    with pytest.raises(DataError, match=r"row 2 \(line 3\), column 2: an empty cell"):
        CsvDataView(p)
    p.write_text("1,2,0\n3,4\n")
    with pytest.raises(DataError, match=r"row 2 \(line 2\) has 2 cells, the first row 3"):
        CsvDataView(p)
    p.write_text("a,b,label\n1,2,3,4\n5,6,7,8\n")  # numpy reads this table; its width does not match
    with pytest.raises(DataError, match=r"row 1 \(line 2\) has 4 cells, the first row 3"):
        CsvDataView(p)
    p.write_text("a,b,label\n")
    with pytest.raises(DataError, match="empty dataset"):
        CsvDataView(p)
    p.write_text("\n \n")
    with pytest.raises(DataError, match=r"bad\.csv: empty dataset"):
        CsvDataView(p)
    p.write_text("1,2,7\n")
    with pytest.raises(DataError, match="label 7 of sample 0 is out of range for num_classes=5"):
        CsvDataView(p, num_classes=5)


# -- split, subsets, labels ----------------------------------------------------------------------------------
def test_split_is_deterministic_disjoint_and_covering():
    view = numbered(101)
    parts = split(view, (0.7, 0.2, 0.1), seed=4)
    got = [p.labels().tolist() for p in parts]
    assert [len(p) for p in parts] == [71, 20, 10]
    flat = [i for g in got for i in g]
    assert sorted(flat) == list(range(101)) and len(set(flat)) == 101
    assert [p.labels().tolist() for p in split(view, (0.7, 0.2, 0.1), seed=4)] == got
    assert [p.labels().tolist() for p in split(view, (0.7, 0.2, 0.1), seed=5)] != got
    assert got[0] != list(range(71))  # shuffled before splitting
    assert [p.labels().tolist() for p in split(view, seed=None)] == [list(range(81)), list(range(81, 101))]
    train = parts[0]
    x, y = train[0]
    assert int(y) == got[0][0] and x[0] == got[0][0]
    with pytest.raises(ValueError, match="add up to 1"):
        split(view, (0.5, 0.4))
    with pytest.raises(DataError, match="leaves a part empty"):
        split(numbered(3), (0.9, 0.1))


def test_subset_view_and_check_labels():
    view = numbered(10)
    sub = SubsetView(view, [9, 0, 4])
    assert len(sub) == 3 and [int(sub[i][1]) for i in range(3)] == [9, 0, 4]
    assert sub.get_batch(np.array([2, 0]))[1].tolist() == [4, 9]
    with pytest.raises(ValueError, match="index 10 out of range"):
        SubsetView(view, [1, 10])
    check_labels(view, 10)
    with pytest.raises(DataError, match="label 9 of sample 9"):
        check_labels(view, 9)
    with pytest.raises(DataError, match="not integer classes"):
        check_labels(ArrayDataView(np.zeros((2, 1)), np.zeros(2)), 3)
    with pytest.raises(DataError, match="2 samples in x but 3 labels"):
        ArrayDataView(np.zeros((2, 1)), np.zeros(3))


# -- open_data -----------------------------------------------------------------------------------------------
def test_open_data_recognises_by_content(tmp_path):
    mnist = tmp_path / "mnist"
    mnist.mkdir()
    ip, lp, _, _ = mnist_files(mnist, "train", gz=True)
    mnist_files(mnist, "test", gz=False, n=5)
    assert isinstance(open_data(mnist), MnistDataView) and len(open_data(mnist)) == 12
    assert len(open_data(mnist, split="test")) == 5
    assert len(open_data((lp, ip))) == 12  # a pair, in either order
    assert len(open_data(ip)) == 12  # one file: its partner is found by the MNIST names
    np.savez(tmp_path / "arrays.bin", x=np.zeros((4, 2)), y=np.arange(4))
    assert isinstance(open_data(tmp_path / "arrays.bin.npz"), NpzDataView)
    (tmp_path / "table.txt").write_text("f1,f2,label\n1,2,0\n3,4,1\n")
    assert isinstance(open_data(tmp_path / "table.txt", label_column="label"), CsvDataView)
    (tmp_path / "noext").write_text("1\t2\t0\n3\t4\t1\n")
    assert open_data(tmp_path / "noext").y.tolist() == [0, 1]
    (tmp_path / "semi.csv").write_bytes(gzip.compress(b"1;2;0\n3;4;1\n"))
    assert open_data(tmp_path / "semi.csv").x.tolist() == [[1, 2], [3, 4]]


def test_wide_csv_is_recognised_and_its_label_column_found(tmp_path):
    """MNIST as CSV (Kaggle's layout): a header 'label,pixel0,...,pixel783', the label first, rows longer than
    the first block open_data reads to recognise a file."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (6, 784))
    y = rng.integers(0, 10, 6)
    header = "label," + ",".join(f"pixel{i}" for i in range(784))
    rows = [",".join(map(str, [label, *pixels])) for label, pixels in zip(y, x)]
    (tmp_path / "mnist_train.csv").write_text(header + "\n" + "\n".join(rows) + "\n")
    view = open_data(tmp_path / "mnist_train.csv")
    assert isinstance(view, CsvDataView) and len(view) == 6
    assert view.y.tolist() == y.tolist()  # the column named label, not the last one
    np.testing.assert_array_equal(view.x, x.astype(np.float32))
    # without a header naming it, the label is the last column
    (tmp_path / "plain.csv").write_text("1,2,0\n3,4,1\n")
    assert CsvDataView(tmp_path / "plain.csv").y.tolist() == [0, 1]
    (tmp_path / "named.csv").write_text("Target,a,b\n0,1,2\n1,3,4\n")
    assert CsvDataView(tmp_path / "named.csv").x.tolist() == [[1, 2], [3, 4]]


def test_open_data_refuses_what_it_does_not_know(tmp_path):
    (tmp_path / "README.csv").write_text("This is not a table.\nJust words, and more words.\n")
    with pytest.raises(DataError, match=r"README\.csv: unrecognised data.*MNIST idx.*npz.*CSV"):
        open_data(tmp_path / "README.csv")
    write(tmp_path / "blob", bytes(range(7, 200)))
    with pytest.raises(DataError, match="blob: unrecognised data"):
        open_data(tmp_path / "blob")
    np.save(tmp_path / "x.npy", np.zeros(3))
    with pytest.raises(DataError, match="np.savez"):
        open_data(tmp_path / "x.npy")
    images, _ = mnist_arrays()
    write(tmp_path / "lonely-idx3-ubyte", idx_bytes(images))
    with pytest.raises(DataError, match="alone"):
        open_data(tmp_path / "lonely-idx3-ubyte")
    with pytest.raises(DataError, match="no such file"):
        open_data(tmp_path / "absent")
    with pytest.raises(DataError, match=r"no MNIST train images file.*it holds \["):
        open_data(tmp_path)


# -- numpy only ----------------------------------------------------------------------------------------------
SCRIPT = textwrap.dedent("""
    import gzip, json, struct, tempfile, os
    import numpy as np
    import loaders

    d = tempfile.mkdtemp()
    imgs = np.arange(10 * 28 * 28, dtype=np.int64).reshape(10, 28, 28) % 256
    files = (("train-images-idx3-ubyte", imgs, False), ("train-labels-idx1-ubyte.gz", imgs[:, 0, 0] % 10, True))
    for name, arr, gz in files:
        data = struct.pack(">BBBB", 0, 0, 8, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
        data += struct.pack(f">{arr.size}B", *arr.ravel().tolist())
        with open(os.path.join(d, name), "wb") as f:
            f.write(gzip.compress(data) if gz else data)
    view = loaders.open_data(d)
    train, val = loaders.split(view, (0.8, 0.2), seed=0)
    loader = loaders.DataLoader(train, 3, shuffle=True, seed=1)
    first = [loader.next()[1].tolist() for _ in range(4)]
    state = json.loads(json.dumps(loader.state()))
    more = [loader.next()[1].tolist() for _ in range(3)]
    again = loaders.DataLoader(train, 3, shuffle=True)
    again.restore(state)
    assert [again.next()[1].tolist() for _ in range(3)] == more
    x, y = loader.next()
    assert x.dtype == np.float32 and x.shape[1:] == (1, 28, 28) and y.dtype == np.int64
    print("loaders numpy-only OK", np.__version__)
""")


@pytest.mark.parametrize("python", PYTHONS)
def test_loaders_run_without_edgetrain_onnx_or_onnxruntime(python):
    # edgetrain, onnx and onnxruntime cannot be imported, as on a device without them
    proc = run_on_device(python, SCRIPT, blocked=("edgetrain", *BUILD_SIDE), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "loaders numpy-only OK" in proc.stdout
