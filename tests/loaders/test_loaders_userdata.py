"""loaders/ takes the user's data as it is: npz dtypes kept, sample shapes adapted to the model only where no value
moves out of place (flatten, unflatten, channels-last transpose), batch preprocessing, CSV text columns named,
dataset fingerprints; checked against numpy's own reshape/transpose and hand-computed values, on a device."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
from device import BUILD_SIDE, PYTHONS, run_on_device

from loaders import (
    ArrayDataView,
    DataError,
    DataLoader,
    IDataView,
    NpzDataView,
    Preprocess,
    SampleAdapter,
    adapt_samples,
    fingerprint,
    open_data,
    parse_normalize,
    parse_scale,
)


def nhwc_images(n: int = 6, h: int = 4, w: int = 5, c: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, c), dtype=np.uint8)


# -- NpzDataView keeps the data's dtype -------------------------------------------------------------------------
def test_npz_integer_data_is_kept_exactly(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 2**40, (7, 16), dtype=np.int64)  # beyond float32's 24 bits
    np.savez(tmp_path / "tok.npz", x=tokens, y=np.arange(7, dtype=np.int32))
    view = NpzDataView(tmp_path / "tok.npz")
    assert view.x.dtype == np.int64 and view.y.dtype == np.int64
    np.testing.assert_array_equal(view.x, tokens)
    X, Y = DataLoader(view, 7).next()
    assert X.dtype == np.int64 and np.array_equal(X, tokens) and Y.tolist() == list(range(7))

    images = nhwc_images()
    np.savez(tmp_path / "img.npz", x=images, y=np.zeros(6, np.uint8), mask=np.ones((6, 2), bool))
    assert NpzDataView(tmp_path / "img.npz").x.dtype == np.uint8
    np.testing.assert_array_equal(NpzDataView(tmp_path / "img.npz").x, images)
    assert NpzDataView(tmp_path / "img.npz", x_key="mask").x.dtype == np.bool_


@pytest.mark.parametrize(
    "dtype, x_dtype, y_dtype",
    [("auto", np.float32, np.float32), (None, np.float64, np.float64), (np.float16, np.float16, np.float16)],
)
def test_npz_float_data_and_explicit_dtypes(tmp_path, dtype, x_dtype, y_dtype):
    x = np.random.default_rng(1).standard_normal((5, 3))
    np.savez(tmp_path / "f.npz", x=x, y=np.linspace(0, 1, 5))
    view = NpzDataView(tmp_path / "f.npz", dtype=dtype)
    assert view.x.dtype == x_dtype and view.y.dtype == y_dtype
    np.testing.assert_allclose(view.x, x, rtol=1e-3)


def test_npz_explicit_dtype_casts_integers_and_bad_dtype_is_a_value_error(tmp_path):
    np.savez(tmp_path / "i.npz", x=np.arange(6, dtype=np.uint8).reshape(3, 2), y=np.arange(3))
    cast = NpzDataView(tmp_path / "i.npz", dtype=np.float32)
    assert cast.x.dtype == np.float32 and cast.x.tolist() == [[0, 1], [2, 3], [4, 5]]
    assert NpzDataView(tmp_path / "i.npz", dtype=None).x.dtype == np.uint8
    with pytest.raises(ValueError, match="dtype must be 'auto', None or a numpy dtype"):
        NpzDataView(tmp_path / "i.npz", dtype="floaty")


# -- sample adapters --------------------------------------------------------------------------------------------
def test_uint8_nhwc_npz_is_transposed_with_a_notice(tmp_path):
    images = nhwc_images()
    np.savez(tmp_path / "cam.npz", x=images, y=np.arange(6) % 2)
    view = open_data(tmp_path / "cam.npz")
    adapter = adapt_samples(view[0][0].shape, (3, 4, 5), source=view.source)
    assert adapter.kind == "transpose" and adapter.model_shape == (3, 4, 5)
    assert "cam.npz" in adapter.notice and "[4, 5, 3]" in adapter.notice and "[3, 4, 5]" in adapter.notice
    assert "--layout nchw" in adapter.notice and "layout='nchw'" in adapter.notice
    assert "\n" not in adapter.notice
    X, _ = DataLoader(view, 6, batch_transform=Preprocess(adapter, dtype=None)).next()
    expected = np.transpose(images, (0, 3, 1, 2))
    assert X.dtype == np.uint8 and X.shape == (6, 3, 4, 5)
    np.testing.assert_array_equal(X, expected)
    assert X[2, 1, 3, 4] == images[2, 3, 4, 1]  # pixel (3, 4), channel 1
    # the bug this replaces: reading NHWC memory as NCHW keeps the shape and scrambles the pixels
    assert not np.array_equal(images.reshape(6, 3, 4, 5), expected)


@pytest.mark.parametrize(
    "model",
    [(3, 5), (3, 4, 5), (2, 3, 4, 5)],  # channels-last for any rank >= 2
)
def test_channels_last_transpose_matches_moveaxis(model):
    sample = model[1:] + model[:1]
    x = np.arange(2 * np.prod(sample)).reshape((2, *sample))
    adapter = adapt_samples(sample, model)
    out = adapter(x)
    assert adapter.kind == "transpose" and out.shape == (2, *model)
    np.testing.assert_array_equal(out, np.moveaxis(x, -1, 1))
    assert np.shares_memory(out, x)  # a view
    stated = adapt_samples(sample, model, layout="NHWC")
    assert stated.kind == "transpose" and "as stated" in stated.notice


@pytest.mark.parametrize(
    "sample, model",
    [
        ((784,), (1, 28, 28)),  # a CSV row to an image
        ((1, 28, 28), (784,)),  # an image to an MLP
        ((28, 28), (1, 28, 28)),
        ((1, 28, 28), (28, 28)),
        ((28, 28, 1), (1, 28, 28)),  # one channel: channels-last and -first are the same memory
        ((12,), (3, 4)),
        ((2, 1, 6), (2, 6, 1)),
    ],
)
def test_pure_flatten_and_unflatten_reshape(sample, model):
    x = np.random.default_rng(0).standard_normal((3, *sample)).astype(np.float32)
    for layout in (None, "nchw"):
        adapter = adapt_samples(sample, model, layout=layout, source="rows.csv")
        out = adapter(x)
        assert adapter.kind == "reshape"
        assert (
            adapter.notice == f"rows.csv: samples {list(sample)} reshaped to the model's input {list(model)}"
        )
        np.testing.assert_array_equal(out, x.reshape((3, *model)))
        # a reshape keeps the memory order: element k of a sample is element k of the model input
        np.testing.assert_array_equal(out.reshape(3, -1), x.reshape(3, -1))
        assert np.shares_memory(out, x)


def test_same_shape_is_left_alone_unless_nhwc_is_stated():
    x = np.arange(2 * 16).reshape(2, 4, 4)
    same = adapt_samples((4, 4), (4, 4))
    assert same.kind == "same" and same.notice is None and same(x) is x
    assert adapt_samples([3, 32, 32], [3, 32, 32], layout="nchw").kind == "same"
    told = adapt_samples((4, 4), (4, 4), layout="nhwc")  # the channels-last reading fits too: do as told
    assert told.kind == "transpose"
    np.testing.assert_array_equal(told(x), np.transpose(x, (0, 2, 1)))
    # one channel: the stated layout cannot move a value, so a flatten is still fine
    assert adapt_samples((28, 28), (1, 28, 28), layout="nhwc").kind == "reshape"


@pytest.mark.parametrize(
    "sample, model, layout, expected",
    [
        (
            (28, 28),
            (4, 14, 14),
            None,
            r"data\.npz: samples \[28, 28\] \(784 values\) do not fit the model's input \[4, 14, 14\] "
            r"\(784 values\).*would scramble.*reshape your data to \[4, 14, 14\] yourself",
        ),
        (
            (32, 32, 3),
            (3, 32, 32),
            "nchw",
            r"\[32, 32, 3\].*\[3, 32, 32\].*layout 'nchw' was stated.*pass layout='nhwc' \(--layout nhwc\)",
        ),
        (
            (3, 32, 32),
            (3, 32, 32),
            "nhwc",
            r"layout 'nhwc' was stated, but channels-last samples for this model would be \[32, 32, 3\]",
        ),
        ((3072,), (3, 32, 32), "nhwc", r"flattened channels-last rows, reshape your data to \[32, 32, 3\]"),
        ((784,), (784,), "nhwc", r"\[784\] has no channel axis"),
        ((32, 32, 3), (1, 28, 28), None, r"\(3072 values\).*\(784 values\).*another number of values"),
        ((785,), (1, 28, 28), None, r"one value too many: is the label among the feature columns"),
        ((32, 32, 3), (32, 3, 32), None, r"another arrangement"),
    ],
)
def test_scrambling_or_contradicting_shapes_are_refused(sample, model, layout, expected):
    with pytest.raises(DataError, match=expected) as info:
        adapt_samples(sample, model, layout=layout, source="data.npz")
    assert info.value.path == "data.npz"


def test_adapter_arguments_and_batches_are_checked():
    with pytest.raises(ValueError, match="layout must be None, 'nchw' or 'nhwc'"):
        adapt_samples((3,), (3,), layout="chw")
    with pytest.raises(ValueError, match="model_shape must be a sequence of positive integers"):
        adapt_samples((3,), (0, 3))
    with pytest.raises(ValueError, match="sample_shape"):
        adapt_samples(("N", 3), (3,))
    adapter = adapt_samples((4, 5, 3), (3, 4, 5), source="cam")
    assert isinstance(adapter, SampleAdapter)
    with pytest.raises(DataError, match=r"cam: a batch of shape \[2, 5, 4, 3\].*samples \[4, 5, 3\]"):
        adapter(np.zeros((2, 5, 4, 3)))


# -- Preprocess -------------------------------------------------------------------------------------------------
def test_preprocess_transposes_scales_and_normalises_per_channel():
    images = nhwc_images(n=5, h=3, w=4, c=3, seed=2)
    original = images.copy()
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    pre = Preprocess(adapt_samples((3, 4, 3), (3, 3, 4)), scale=parse_scale("1/255"), mean=mean, std=std)
    y = np.arange(5)
    X, Y = pre(images, y)
    # the reference, in float64, channel by channel
    ref = np.empty((5, 3, 3, 4))
    for c in range(3):
        ref[:, c] = (images[..., c].astype(np.float64) / 255.0 - mean[c]) / std[c]
    assert X.dtype == np.float32 and X.shape == (5, 3, 3, 4) and X.flags.c_contiguous
    np.testing.assert_allclose(X, ref, rtol=1e-5, atol=1e-6)
    assert Y is y
    np.testing.assert_array_equal(images, original)  # the input is never written
    # one value for every channel; no adapter: the batch's axis 1 is the channel axis
    X1, _ = Preprocess(scale=0.5, mean=1.0, std=2.0)(np.full((2, 3, 2), 6, np.uint8), y[:2])
    np.testing.assert_array_equal(X1, np.full((2, 3, 2), (6 * 0.5 - 1.0) / 2.0, np.float32))
    # only a cast
    X2, _ = Preprocess()(images, y)
    assert X2.dtype == np.float32 and np.array_equal(X2, images.astype(np.float32))


def test_preprocess_refuses_bad_arguments():
    adapter = adapt_samples((8, 8, 3), (3, 8, 8))
    with pytest.raises(ValueError, match=r"mean has 2 values; the model's input channels.* is 3"):
        Preprocess(adapter, mean=(0.5, 0.5))
    with pytest.raises(ValueError, match=r"std has 4 values; the batch's axis 1 \(shape \[2, 3, 5\]\) is 3"):
        Preprocess(std=(1, 2, 3, 4))(np.zeros((2, 3, 5)), np.zeros(2))
    with pytest.raises(ValueError, match="std must be > 0"):
        Preprocess(std=(1, 0, 1))
    with pytest.raises(ValueError, match="scale must be a finite number"):
        Preprocess(scale=float("nan"))
    with pytest.raises(ValueError, match="need a float dtype"):
        Preprocess(scale=2.0, dtype=np.int64)
    with pytest.raises(ValueError, match="dtype must be a numpy dtype or None"):
        Preprocess(dtype="floaty")
    with pytest.raises(ValueError, match="need float data; X is uint8"):
        Preprocess(scale=2.0, dtype=None)(np.zeros((1, 2), np.uint8), np.zeros(1))


@pytest.mark.parametrize(
    "text, value", [("0.00392", 0.00392), ("1/255", 1 / 255), (" 2 ", 2.0), ("1e-3", 1e-3)]
)
def test_parse_scale_accepts(text, value):
    assert parse_scale(text) == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("text", ["", "abc", "1/0", "0", "-1/255", "inf", "1/2/3", "nan"])
def test_parse_scale_rejects_with_the_accepted_forms(text):
    with pytest.raises(ValueError, match=r"accepted: a number \(0\.00392\) or a fraction \(1/255\)"):
        parse_scale(text)


@pytest.mark.parametrize(
    "text, mean, std",
    [
        ("0.5,0.25", (0.5,), (0.25,)),
        ("0.485:0.456:0.406,0.229:0.224:0.225", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        (" 0.1307 , 0.3081 ", (0.1307,), (0.3081,)),
        ("0.5,0.1:0.2:0.3", (0.5,), (0.1, 0.2, 0.3)),
    ],
)
def test_parse_normalize_accepts(text, mean, std):
    assert parse_normalize(text) == (mean, std)


@pytest.mark.parametrize(
    "text", ["0.5", "0.5,0.2,0.1", "0.5,", "a,b", "0.5,0", "0.5,-1", "0.1:0.2,0.1:0.2:0.3", "0.5:,0.2"]
)
def test_parse_normalize_rejects_with_the_accepted_forms(text):
    with pytest.raises(
        ValueError, match=r"MEAN,STD with one value each \(0\.5,0\.25\).*0\.485:0\.456:0\.406"
    ):
        parse_normalize(text)


# -- DataLoader batch_transform ---------------------------------------------------------------------------------
def test_batch_transform_runs_after_the_sample_transform_and_resumes_exactly():
    images = nhwc_images(n=23, h=2, w=3, c=3, seed=5)
    view = ArrayDataView(images, np.arange(23))
    pre = Preprocess(adapt_samples((2, 3, 3), (3, 2, 3)), scale=1 / 255)

    def make():
        return DataLoader(view, 4, shuffle=True, seed=9, transform=lambda x, y: (x, y), batch_transform=pre)

    loader = make()
    for _ in range(7):  # into the second epoch (6 batches per epoch)
        loader.next()
    state = json.loads(json.dumps(loader.state()))
    assert set(state) == set(DataLoader(view, 4).state())  # the state is what it always was
    expected = [loader.next() for _ in range(8)]
    resumed = make()
    resumed.restore(state)
    for (X, Y), (EX, EY) in zip([resumed.next() for _ in range(8)], expected):
        np.testing.assert_array_equal(X, EX)
        np.testing.assert_array_equal(Y, EY)
        # each batch holds exactly the samples its labels name, transposed and scaled
        ref = np.transpose(images[Y], (0, 3, 1, 2)).astype(np.float32) / np.float32(
            255
        )  # a scale of 1/255 divides (255 -> 1.0)
        np.testing.assert_array_equal(X, ref)
        assert X.dtype == np.float32 and Y.dtype == np.int64
    # a state from a loader without a batch transform restores into one with it, and the reverse
    plain = DataLoader(view, 4, shuffle=True, seed=9)
    plain.restore(state)
    np.testing.assert_array_equal(plain.next()[1], expected[0][1])


# -- CSV with a text column -------------------------------------------------------------------------------------
def test_csv_text_column_is_named_not_hex_dumped(tmp_path):
    p = tmp_path / "weather.csv"
    p.write_text("temp,city,humidity,label\n20.5,Paris,0.3,1\n18,Lyon,0.5,0\n25,Nice,0.2,1\n")
    with pytest.raises(DataError) as info:
        open_data(p)
    message = str(info.value)
    assert "row 1 (line 2), column 2 ('city'): 'Paris' is not a number" in message
    assert "holds text in 3 of 3 rows" in message and "drop the column, or encode it as numbers" in message
    assert "unrecognised" not in message and "starts with" not in message
    assert info.value.path == str(p)
    # the same file without its text column is a dataset
    p.write_text("temp,humidity,label\n20.5,0.3,1\n18,0.5,0\n25,0.2,1\n")
    assert open_data(p).y.tolist() == [1, 0, 1]


def test_csv_text_labels_and_a_stray_cell_get_their_own_advice(tmp_path):
    p = tmp_path / "pets.tsv"
    p.write_text("w\th\tlabel\n1\t2\tcat\n3\t4\tdog\n")
    with pytest.raises(DataError, match=r"column 3 \('label'\) is the label column.*class ids 0\.\.K-1"):
        open_data(p)
    q = tmp_path / "typo.csv"
    q.write_text("a,b,label\n1,2,0\n3,x,1\n5,6,0\n")
    with pytest.raises(
        DataError, match=r"row 2 \(line 3\), column 2 \('b'\): 'x' is not a number \(the other rows"
    ):
        open_data(q)
    prose = tmp_path / "notes.csv"  # lines of words with commas here and there: not a table
    prose.write_text("Remember to buy milk.\nCall Anna, then Bob.\nDone, done, done.\n")
    with pytest.raises(DataError, match="unrecognised data"):
        open_data(prose)


# -- fingerprint ------------------------------------------------------------------------------------------------
class CountingView(IDataView):
    """Sample i is x = [i, i + 1] and y = i % 3, made on demand; records which indices were read."""

    def __init__(self, n: int):
        self.n, self.read = n, []

    def get_item(self, idx):
        self.read.append(idx)
        return np.array([idx, idx + 1], np.float32), np.int64(idx % 3)

    def size(self):
        return self.n


def test_fingerprint_is_stable_and_sees_changed_or_added_samples(tmp_path):
    x = np.random.default_rng(0).standard_normal((10, 2, 3)).astype(np.float32)
    y = np.arange(10) % 4
    np.savez(tmp_path / "a.npz", x=x, y=y)
    first = fingerprint(NpzDataView(tmp_path / "a.npz"))
    assert first == fingerprint(NpzDataView(tmp_path / "a.npz"))  # two opens of the same file
    assert json.loads(json.dumps(first)) == first and first["size"] == 10 and len(first["sha256"]) == 64
    changed = x.copy()
    changed[5, 1, 2] += 1
    np.savez(tmp_path / "b.npz", x=changed, y=y)
    assert fingerprint(NpzDataView(tmp_path / "b.npz"))["sha256"] != first["sha256"]
    relabelled = y.copy()
    relabelled[3] = 0
    np.savez(tmp_path / "c.npz", x=x, y=relabelled)
    assert fingerprint(NpzDataView(tmp_path / "c.npz"))["sha256"] != first["sha256"]
    np.savez(tmp_path / "d.npz", x=np.concatenate([x, x[:1]]), y=np.concatenate([y, y[:1]]))
    added = fingerprint(NpzDataView(tmp_path / "d.npz"))
    assert added["size"] == 11 and added["sha256"] != first["sha256"]
    # the same values under another dtype are other data
    np.savez(tmp_path / "e.npz", x=x.astype(np.float64), y=y)
    assert fingerprint(NpzDataView(tmp_path / "e.npz", dtype=None))["sha256"] != first["sha256"]


def test_fingerprint_reads_at_most_64_samples_first_and_last_included():
    view = CountingView(100_000)
    result = fingerprint(view)
    assert result["size"] == 100_000
    assert len(view.read) == 64 and view.read[0] == 0 and view.read[-1] == 99_999
    assert len(set(view.read)) == 64 and view.read == sorted(view.read)
    assert fingerprint(CountingView(100_000)) == result
    assert fingerprint(CountingView(100_001))["sha256"] != result["sha256"]


# -- on a device: numpy only, numpy 1.24 and 2.x ----------------------------------------------------------------
DEVICE_SCRIPT = textwrap.dedent("""
    import json, os, tempfile
    import numpy as np
    import loaders

    d = tempfile.mkdtemp()
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (10, 4, 5, 3), dtype=np.uint8)
    np.savez(os.path.join(d, "cam.npz"), x=images, y=np.arange(10))  # y names the sample
    tokens = rng.integers(0, 2**40, (10, 8), dtype=np.int64)
    np.savez(os.path.join(d, "tok.npz"), x=tokens, y=np.arange(10) % 2)

    tok = loaders.open_data(os.path.join(d, "tok.npz"))
    assert tok.x.dtype == np.int64 and np.array_equal(tok.x, tokens)
    view = loaders.open_data(os.path.join(d, "cam.npz"))
    assert view.x.dtype == np.uint8
    adapter = loaders.adapt_samples(view[0][0].shape, (3, 4, 5), source=view.source)
    assert adapter.kind == "transpose" and "--layout nchw" in adapter.notice
    mean, std = loaders.parse_normalize("0.5:0.4:0.3,0.2:0.25:0.5")
    pre = loaders.Preprocess(adapter, scale=loaders.parse_scale("1/255"), mean=mean, std=std)
    loader = loaders.DataLoader(view, 3, shuffle=True, seed=1, batch_transform=pre)
    loader.next()
    state = json.loads(json.dumps(loader.state()))
    X, Y = loader.next()
    ref = (np.transpose(images[Y], (0, 3, 1, 2)) / 255.0 - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]
    assert X.dtype == np.float32 and np.allclose(X, ref, rtol=1e-5, atol=1e-6)
    again = loaders.DataLoader(view, 3, shuffle=True, batch_transform=pre)
    again.restore(state)
    assert np.array_equal(again.next()[0], X)
    try:
        loaders.adapt_samples((28, 28), (4, 14, 14))
        raise AssertionError("a scrambling reshape was allowed")
    except loaders.DataError as e:
        assert "would scramble" in str(e)
    with open(os.path.join(d, "t.csv"), "w") as f:
        f.write("city,temp,label\\nParis,20,1\\nLyon,18,0\\n")
    try:
        loaders.open_data(os.path.join(d, "t.csv"))
        raise AssertionError("a text column was read")
    except loaders.DataError as e:
        assert "column 1 ('city')" in str(e) and "starts with" not in str(e)
    fp = loaders.fingerprint(view)
    assert fp == loaders.fingerprint(loaders.open_data(os.path.join(d, "cam.npz")))
    print("userdata numpy-only OK", np.__version__)
""")


@pytest.mark.parametrize("python", PYTHONS)
def test_userdata_api_runs_on_a_device_with_numpy_alone(python):
    proc = run_on_device(python, DEVICE_SCRIPT, blocked=("edgetrain", *BUILD_SIDE), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "userdata numpy-only OK" in proc.stdout
