"""The nn kernels (Conv, ConvTranspose, Max/Average/Lp/Global pools, LRN) against onnxruntime, onnx's
ReferenceEvaluator where onnxruntime lacks a dtype or attribute combination, and onnx's node test cases."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import assert_close, node_cases, ort_run, ref_run, spy

from edgetrain.core.errors import ShapeError, UnsupportedError
from edgetrain.core.kernels import KERNELS, window
from edgetrain.core.kernels import conv as conv_kernels

OPS = (
    "Conv",
    "ConvTranspose",
    "MaxPool",
    "AveragePool",
    "LpPool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "LRN",
)

# case name -> why it is not run
EXCLUDED: dict[str, str] = {}

SIZES = (6, 7, 5)  # spatial sizes per axis (odd and even, so SAME pads are odd on some axes)
TOL = {
    np.float16: (1e-2, 1e-2),
    np.float32: (1e-4, 1e-5),
    np.float64: (1e-10, 1e-12),
    np.int8: (0, 0),
    np.uint8: (0, 0),
}


def _run(op, inputs, attrs, n_outputs=1, out=None):
    kern = KERNELS[op]
    extra = {"noutputs": n_outputs} if kern.wants_noutputs else {}
    if out is not None:
        extra["out"] = out
    got = kern.fn(*inputs, **attrs, **extra)
    return list(got) if isinstance(got, tuple) else [got]


def _check(op, inputs, attrs, *, n_outputs=1, ref=ort_run, atol_scale=1.0):
    expected = ref(op, inputs, attrs, n_outputs=n_outputs)
    got = _run(op, inputs, attrs, n_outputs)
    assert len(got) == n_outputs
    rtol, atol = TOL[inputs[0].dtype.type]
    for g, e in zip(got, expected, strict=True):
        assert_close(g, e, rtol=rtol, atol=atol * atol_scale, what=f"{op} {attrs}")


def _axes(values, nd):
    """A per-axis attribute from a short pattern, varied across axes so asymmetries show."""
    return [values[i % len(values)] for i in range(nd)]


def _rand(rng, shape, dtype=np.float32):
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------- Conv

# (name, attrs builder) for spatial rank nd
CONV_GEOMETRIES = {
    "k3": lambda nd: {"kernel_shape": _axes([3], nd)},
    "k3_pads": lambda nd: {"pads": [1] * 2 * nd},
    "k3_s2_asym_pads": lambda nd: {
        "strides": _axes([2, 1], nd),
        "pads": _axes([1, 0], nd) + _axes([0, 2], nd),
    },
    "k2_dil2_pads": lambda nd: {"dilations": _axes([2, 1], nd), "pads": _axes([1, 2], nd) * 2},
    "valid_s2": lambda nd: {"auto_pad": "VALID", "strides": [2] * nd},
    "same_upper_s2": lambda nd: {"auto_pad": "SAME_UPPER", "strides": _axes([2, 1], nd)},
    "same_lower_s2": lambda nd: {"auto_pad": "SAME_LOWER", "strides": _axes([2, 1], nd)},
    "same_upper_s1": lambda nd: {"auto_pad": "SAME_UPPER"},
    "same_lower_s3": lambda nd: {"auto_pad": "SAME_LOWER", "strides": [3] * nd},
    "k1": lambda nd: {},
    "k1_s2": lambda nd: {"strides": _axes([2, 3], nd)},
    "k1_pads": lambda nd: {"pads": _axes([1, 0], nd) * 2},
}
CONV_KERNEL = {
    "k3": [3],
    "k2_dil2_pads": [2],
    "k1": [1],
    "k1_s2": [1],
    "k1_pads": [1],
    "same_upper_s1": [2, 3],
    "same_lower_s2": [3, 2],
}
# (C_in, C_out, group): plain, grouped, depthwise, depthwise with channel multiplier
CONV_GROUPS = {"g1": (3, 4, 1), "g2": (4, 6, 2), "dw": (4, 4, 4), "dw_mult2": (3, 6, 3)}


@pytest.mark.parametrize("mult", [1, 2])
@pytest.mark.parametrize("strides", [[1, 1], [2, 2]])
def test_depthwise_conv_many_channels_few_pixels_vs_onnxruntime(mult, strides):
    """Late mobile-net layers (hundreds of channels over a few pixels) take the depthwise kernel's channels-last
    layout; batches of 1 and 3, with a bias."""
    rng = np.random.default_rng(mult * 10 + strides[0])
    for n in (1, 3):
        x, w, b = _rand(rng, (n, 48, 3, 4)), _rand(rng, (48 * mult, 1, 3, 3)), _rand(rng, (48 * mult,))
        _check("Conv", [x, w, b], {"group": 48, "pads": [1, 1, 1, 1], "strides": strides})


@pytest.mark.parametrize("positions_max", [0, 16])
@pytest.mark.parametrize("mult,strides,k", [(1, [1, 1], 3), (2, [2, 2], 3), (1, [1, 1], 5)])
def test_depthwise_conv_few_positions_both_paths(monkeypatch, positions_max, mult, strides, k):
    """Mobile nets' last layers (hundreds of channels over 2x2..4x4): on their own output positions
    (depthwise._conv_positions, dead offsets skipped) and, with that path off, on the phase grid."""
    from edgetrain.core.kernels import depthwise

    monkeypatch.setattr(depthwise, "POSITIONS_MAX", positions_max)
    calls = spy(monkeypatch, depthwise, "_conv_positions")
    rng = np.random.default_rng(mult * 10 + k)
    x, w, b = _rand(rng, (3, 40, 2, 3)), _rand(rng, (40 * mult, 1, k, k)), _rand(rng, (40 * mult,))
    _check("Conv", [x, w, b], {"group": 40, "pads": [k // 2] * 4, "strides": strides})
    # with a channel multiplier the forward takes im2col's columns (conv.conv), not the depthwise kernel
    assert bool(calls) == (positions_max > 0 and mult == 1)


CONV_CASES = [
    (nd, geo, grp)
    for nd in (1, 2, 3)
    for geo in CONV_GEOMETRIES
    for grp in CONV_GROUPS
    if nd < 3 or grp in ("g1", "dw_mult2")
]


@pytest.mark.parametrize("nd,geo,grp", CONV_CASES, ids=[f"{nd}d-{g}-{c}" for nd, g, c in CONV_CASES])
def test_conv_vs_onnxruntime(nd, geo, grp):
    rng = np.random.default_rng(len(CONV_CASES) * nd + list(CONV_GEOMETRIES).index(geo))
    cin, cout, group = CONV_GROUPS[grp]
    k = _axes(CONV_KERNEL.get(geo, [3, 2]), nd)
    x = _rand(rng, (2, cin, *SIZES[:nd]))
    w = _rand(rng, (cout, cin // group, *k))
    b = _rand(rng, (cout,)) if list(CONV_GEOMETRIES).index(geo) % 2 or grp == "dw" else None
    attrs = {"group": group, **CONV_GEOMETRIES[geo](nd)}
    _check("Conv", [x, w, b] if b is not None else [x, w], attrs)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_conv_dtypes(dtype):
    rng = np.random.default_rng(1)
    x, w, b = _rand(rng, (2, 4, 7, 6), dtype), _rand(rng, (6, 2, 3, 3), dtype), _rand(rng, (6,), dtype)
    for attrs in ({"group": 2, "pads": [1, 0, 0, 1], "strides": [2, 1]}, {"group": 4, "pads": [1, 1, 1, 1]}):
        if attrs["group"] == 4:
            w = _rand(rng, (4, 1, 3, 3), dtype)
            b = _rand(rng, (4,), dtype)
        # onnxruntime's CPU Conv has no float64 kernel
        _check("Conv", [x, w, b], attrs, ref=ort_run if dtype == np.float16 else ref_run, atol_scale=5)


def test_conv_same_with_dilations_vs_reference():
    # onnxruntime rejects SAME_* with dilations; the spec (and onnx's reference) pad for the dilated kernel
    rng = np.random.default_rng(2)
    x, w = _rand(rng, (2, 3, 7, 6)), _rand(rng, (4, 3, 3, 2))
    for auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        _check("Conv", [x, w], {"auto_pad": auto_pad, "dilations": [2, 3], "strides": [1, 2]}, ref=ref_run)


def test_conv_im2col_in_batch_chunks(monkeypatch):
    monkeypatch.setattr(conv_kernels, "IM2COL_BUDGET", 1000)  # forces one sample per chunk
    rng = np.random.default_rng(3)
    x, w, b = _rand(rng, (5, 4, 9, 8)), _rand(rng, (6, 2, 3, 3)), _rand(rng, (6,))
    _check("Conv", [x, w, b], {"group": 2, "pads": [1, 2, 0, 1], "strides": [2, 1]})


FLAT_CASES = [
    (nd, geo, grp)
    for nd in (1, 2, 3)
    for geo in ("k3", "k3_pads", "k2_dil2_pads", "same_upper_s1")
    for grp in ("g1", "g2", "dw_mult2")
    if nd < 3 or grp == "g1"
]


@pytest.mark.parametrize("nd,geo,grp", FLAT_CASES, ids=[f"{nd}d-{g}-{c}" for nd, g, c in FLAT_CASES])
def test_conv_flattened_rows_vs_onnxruntime(monkeypatch, nd, geo, grp):
    """Stride-1 convs through the flattened-rows columns (conv._flat_conv), one image per chunk."""
    monkeypatch.setattr(conv_kernels, "FLAT_MIN_POSITIONS", 1)
    monkeypatch.setattr(conv_kernels, "FLAT_MAX_WASTE", 100.0)
    monkeypatch.setattr(conv_kernels, "CACHE_BUDGET", 1)
    calls = spy(monkeypatch, conv_kernels, "_flat_conv")
    rng = np.random.default_rng(7 * nd + len(geo))
    cin, cout, group = CONV_GROUPS[grp]
    k = _axes(CONV_KERNEL.get(geo, [3, 2]), nd)
    x, w, b = _rand(rng, (3, cin, *SIZES[:nd])), _rand(rng, (cout, cin // group, *k)), _rand(rng, (cout,))
    _check("Conv", [x, w, b], {"group": group, **CONV_GEOMETRIES[geo](nd)})
    assert calls


@pytest.mark.parametrize("path", ["_flat_conv", "_batch_last_conv"])
def test_conv_lenet_sizes_take_their_path(monkeypatch, path):
    """LeNet's layers at their real sizes (the default thresholds): the 28x28 one through the flattened rows, the
    10x10 one through batch-last columns."""
    calls = spy(monkeypatch, conv_kernels, path)
    rng = np.random.default_rng(8)
    if path == "_flat_conv":
        x, w, b = _rand(rng, (5, 1, 28, 28)), _rand(rng, (6, 1, 5, 5)), _rand(rng, (6,))
        attrs = {"pads": [2] * 4}
    else:
        x, w, b = _rand(rng, (5, 6, 14, 14)), _rand(rng, (16, 6, 5, 5)), _rand(rng, (16,))
        attrs = {}
    _check("Conv", [x, w, b], attrs, atol_scale=5)
    assert calls


@pytest.mark.parametrize("case", ["im2col", "depthwise", "1x1", "float16"])
def test_conv_writes_out(case):
    rng = np.random.default_rng(4)
    dtype = np.float16 if case == "float16" else np.float32
    x = _rand(rng, (2, 4, 6, 5), dtype)
    w = _rand(rng, {"depthwise": (4, 1, 3, 3), "1x1": (3, 4, 1, 1)}.get(case, (3, 4, 3, 3)), dtype)
    attrs = {"group": 4 if case == "depthwise" else 1, "pads": [1, 1, 1, 1] if case != "1x1" else [0] * 4}
    expected = ort_run("Conv", [x, w], attrs)[0]
    out = np.full(expected.shape, np.nan, dtype)
    got = KERNELS["Conv"].fn(x, w, **attrs, out=out)
    assert got is out
    assert_close(out, expected, rtol=TOL[dtype][0], atol=TOL[dtype][1] * 5)


# ---------------------------------------------------------------- ConvTranspose


def _convt_cases():
    cases = []
    for nd in (1, 2, 3):
        for s in (1, 2, 3):
            for d in (1, 2):
                if nd == 3 and (s, d) not in ((2, 1), (1, 2)):
                    continue
                adj = [0] if s == 1 else [0, s - 1]  # onnxruntime needs output_padding < stride
                for a in adj:
                    base = {"strides": [s] * nd, "dilations": _axes([d, 1], nd), "output_padding": [a] * nd}
                    cases.append((nd, base))
                    cases.append((nd, {**base, "pads": _axes([1, 0], nd) + _axes([0, 2], nd)}))
                    for ap in ("VALID", "SAME_UPPER", "SAME_LOWER"):
                        cases.append((nd, {**base, "auto_pad": ap}))
                    # output_shape below / above the full result (above only where onnxruntime's forward
                    # Conv maps it back to the input size)
                    for extra in (-1, -2, 1) if s > 1 and a == 0 else (-1, -2):
                        cases.append((nd, {**base, "output_shape": extra}))
                        cases.append((nd, {**base, "output_shape": extra, "auto_pad": "SAME_UPPER"}))
                        cases.append((nd, {**base, "output_shape": extra, "auto_pad": "SAME_LOWER"}))
    return cases


CONVT_CASES = _convt_cases()


def _convt_id(nd, attrs):
    short = {
        "strides": "s",
        "dilations": "d",
        "output_padding": "adj",
        "pads": "pads",
        "auto_pad": "",
        "output_shape": "out",
    }
    return f"{nd}d-" + "-".join(f"{short[k]}{v[0] if isinstance(v, list) else v}" for k, v in attrs.items())


@pytest.mark.parametrize("nd,attrs", CONVT_CASES, ids=[_convt_id(nd, a) for nd, a in CONVT_CASES])
def test_conv_transpose_vs_onnxruntime(nd, attrs):
    rng = np.random.default_rng(len(attrs) + nd)
    group = 2 if nd < 3 else 1
    k = _axes([3, 2], nd)
    x = _rand(rng, (2, 4, *SIZES[:nd]))
    w = _rand(rng, (4, 3, *k))
    b = _rand(rng, (3 * group,))
    attrs = {"group": group, **attrs}
    if "output_shape" in attrs:
        s, d, a = attrs["strides"], attrs["dilations"], attrs["output_padding"]
        full = [(n - 1) * s[i] + a[i] + (k[i] - 1) * d[i] + 1 for i, n in enumerate(SIZES[:nd])]
        attrs["output_shape"] = [f + attrs["output_shape"] for f in full]
    _check("ConvTranspose", [x, w, b], attrs)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_conv_transpose_dtypes(dtype):
    rng = np.random.default_rng(6)
    x, w, b = _rand(rng, (2, 4, 5, 4), dtype), _rand(rng, (4, 3, 3, 2), dtype), _rand(rng, (3,), dtype)
    attrs = {"strides": [2, 3], "pads": [1, 0, 0, 1], "output_padding": [1, 0]}
    # onnxruntime has no float64 ConvTranspose; onnx's reference has, but fails on group > 1
    _check("ConvTranspose", [x, w, b], attrs, ref=ort_run if dtype == np.float16 else ref_run, atol_scale=5)


def test_conv_transpose_writes_out():
    rng = np.random.default_rng(7)
    x, w, b = _rand(rng, (2, 3, 4, 5)), _rand(rng, (3, 2, 3, 3)), _rand(rng, (2,))
    attrs = {"strides": [2, 2], "pads": [1, 1, 0, 0]}
    expected = ort_run("ConvTranspose", [x, w, b], attrs)[0]
    out = np.full(expected.shape, np.nan, np.float32)
    assert KERNELS["ConvTranspose"].fn(x, w, b, **attrs, out=out) is out
    assert_close(out, expected, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- MaxPool, AveragePool, LpPool

POOL_GEOMETRIES = {
    "k2": lambda nd: {"kernel_shape": [2] * nd},
    "k2_s2": lambda nd: {"kernel_shape": [2] * nd, "strides": [2] * nd},
    "k3_s2_pads": lambda nd: {"kernel_shape": [3] * nd, "strides": [2] * nd, "pads": [1] * 2 * nd},
    "k3_asym_pads": lambda nd: {
        "kernel_shape": _axes([3, 2], nd),
        "strides": _axes([1, 2], nd),
        "pads": _axes([2, 0], nd) + _axes([0, 1], nd),
    },
    "k2_dil2": lambda nd: {
        "kernel_shape": [2] * nd,
        "dilations": _axes([2, 1], nd),
        "pads": _axes([1, 0], nd) * 2,
    },
    "ceil_k3_s2": lambda nd: {"kernel_shape": [3] * nd, "strides": [2] * nd, "ceil_mode": 1},
    "ceil_k2_s2_pads": lambda nd: {
        "kernel_shape": [2] * nd,
        "strides": [2] * nd,
        "ceil_mode": 1,
        "pads": _axes([1, 0], nd) + _axes([1, 1], nd),
    },
    # the last window would start in the end padding: ceil_mode drops it
    "ceil_drops_last": lambda nd: {
        "kernel_shape": [3] * nd,
        "strides": [3] * nd,
        "ceil_mode": 1,
        "pads": [1] * 2 * nd,
    },
    "ceil_dil2": lambda nd: {
        "kernel_shape": [2] * nd,
        "strides": [2] * nd,
        "dilations": [2] * nd,
        "ceil_mode": 1,
    },
    "valid_s2": lambda nd: {"kernel_shape": [3] * nd, "strides": [2] * nd, "auto_pad": "VALID"},
    "same_upper": lambda nd: {
        "kernel_shape": _axes([3, 2], nd),
        "strides": _axes([2, 1], nd),
        "auto_pad": "SAME_UPPER",
    },
    "same_lower": lambda nd: {
        "kernel_shape": _axes([3, 2], nd),
        "strides": _axes([2, 1], nd),
        "auto_pad": "SAME_LOWER",
    },
    # onnxruntime sizes SAME padding for pools with the undilated kernel; we match it
    "same_upper_dil2": lambda nd: {"kernel_shape": [3] * nd, "dilations": [2] * nd, "auto_pad": "SAME_UPPER"},
    "same_lower_ceil": lambda nd: {
        "kernel_shape": [3] * nd,
        "strides": [2] * nd,
        "auto_pad": "SAME_LOWER",
        "ceil_mode": 1,
    },
}
POOL_CASES = [(nd, geo) for nd in (1, 2, 3) for geo in POOL_GEOMETRIES]
POOL_IDS = [f"{nd}d-{geo}" for nd, geo in POOL_CASES]


@pytest.mark.parametrize("nd,geo", POOL_CASES, ids=POOL_IDS)
def test_max_pool_vs_onnxruntime(nd, geo):
    rng = np.random.default_rng(10 + nd)
    x = _rand(rng, (2, 3, *SIZES[:nd]))
    attrs = POOL_GEOMETRIES[geo](nd)
    _check("MaxPool", [x], attrs)
    for order in (0, 1):
        _check("MaxPool", [x], {**attrs, "storage_order": order}, n_outputs=2)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.uint8])
def test_max_pool_dtypes(dtype):
    rng = np.random.default_rng(11)
    x = _rand(rng, (2, 3, 7, 6), dtype)
    if dtype == np.uint8:
        x[0, 0] = 0  # real elements equal to the padding's stand-in for -inf (the dtype's minimum)
    for attrs in (
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 2, 2], "ceil_mode": 1},
        {"kernel_shape": [2, 3], "dilations": [2, 1], "auto_pad": "SAME_UPPER"},
    ):
        _check("MaxPool", [x], attrs)
        _check("MaxPool", [x], {**attrs, "storage_order": 1}, n_outputs=2)


@pytest.mark.parametrize("nd,geo", POOL_CASES, ids=POOL_IDS)
def test_average_pool_vs_onnxruntime(nd, geo):
    rng = np.random.default_rng(20 + nd)
    x = _rand(rng, (2, 3, *SIZES[:nd]))
    for count_include_pad in (0, 1):
        _check("AveragePool", [x], {**POOL_GEOMETRIES[geo](nd), "count_include_pad": count_include_pad})


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_average_pool_dtypes(dtype):
    rng = np.random.default_rng(21)
    x = _rand(rng, (2, 3, 7, 6), dtype)
    attrs = {
        "kernel_shape": [3, 2],
        "strides": [2, 2],
        "pads": [1, 0, 1, 1],
        "ceil_mode": 1,
        "count_include_pad": 1,
    }
    _check("AveragePool", [x], attrs, ref=ort_run if dtype == np.float16 else ref_run)


@pytest.mark.parametrize("nd,geo", POOL_CASES, ids=POOL_IDS)
def test_lp_pool_vs_onnxruntime(nd, geo):
    rng = np.random.default_rng(30 + nd)
    x = _rand(rng, (2, 3, *SIZES[:nd]))
    for p in (1, 2, 3):
        _check("LpPool", [x], {**POOL_GEOMETRIES[geo](nd), "p": p})


def test_lp_pool_float64_vs_reference():
    x = _rand(np.random.default_rng(31), (2, 3, 7, 6), np.float64)
    attrs = {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 0, 1], "p": 3}
    _check("LpPool", [x], attrs, ref=ref_run)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
def test_pool_writes_out(op):
    x = _rand(np.random.default_rng(32), (2, 3, 7, 6))
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}
    expected = ort_run(op, [x], attrs)[0]
    out = np.full(expected.shape, np.nan, np.float32)
    assert _run(op, [x], attrs, out=out)[0] is out
    assert_close(out, expected)


# ---------------------------------------------------------------- global pools, LRN


def _as_2d(op, ref, x, attrs):
    """Runs a channel-wise op (global pools, LRN) on x viewed as [N, C, H, W] and views the result back:
    the references only accept 4-D LRN and onnx's GlobalMaxPool mishandles 1-D."""
    n, c = x.shape[:2]
    y = ref(op, [x.reshape(n, c, -1, 1)], attrs)[0]
    return y.reshape((n, c) + ((1,) * (x.ndim - 2) if op.startswith("Global") else x.shape[2:]))


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_global_pools(op, dtype):
    rng = np.random.default_rng(40)
    rtol, atol = TOL[dtype]
    for nd in (1, 2, 3):
        x = _rand(rng, (2, 3, *SIZES[:nd]), dtype)
        if dtype == np.float64:  # onnxruntime has no float64 global pools
            assert_close(_run(op, [x], {})[0], _as_2d(op, ref_run, x, {}), rtol=rtol, atol=atol)
        else:
            _check(op, [x], {})
    out = np.full((2, 3, 1, 1), np.nan, dtype)
    x = _rand(rng, (2, 3, 5, 4), dtype)
    assert _run(op, [x], {}, out=out)[0] is out
    assert_close(out, _as_2d(op, ref_run if dtype == np.float64 else ort_run, x, {}), rtol=rtol, atol=atol)


LRN_CASES = [
    (shape, attrs)
    for shape in ((2, 7, 5, 4), (2, 4, 6), (1, 5, 3, 2, 2))
    for attrs in ({"size": 1}, {"size": 3}, {"size": 5}, {"size": 3, "alpha": 0.5, "beta": 0.3, "bias": 2.0})
]


@pytest.mark.parametrize("shape,attrs", LRN_CASES, ids=[f"{len(s) - 2}d-{a}" for s, a in LRN_CASES])
def test_lrn_vs_onnxruntime(shape, attrs):
    # onnxruntime takes 4-D inputs only: other ranks are compared through a 4-D view (LRN mixes channels only)
    x = _rand(np.random.default_rng(50), shape) * 3
    assert_close(_run("LRN", [x], attrs)[0], _as_2d("LRN", ort_run, x, attrs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size", [2, 4])
def test_lrn_even_size_vs_reference(size):
    # onnxruntime rejects even sizes; onnx's reference loops its channel window over the batch axis, so N == C
    x = _rand(np.random.default_rng(51), (6, 6, 3, 2)) * 3
    _check("LRN", [x], {"size": size, "alpha": 0.1}, ref=ref_run)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_lrn_dtypes(dtype):
    x = _rand(np.random.default_rng(52), (5, 5, 4, 3), dtype)  # N == C for onnx's reference (see above)
    if dtype == np.float16:
        _check("LRN", [x], {"size": 3, "alpha": 0.125})
    else:  # onnx's reference computes alpha / size in float32, hence the float32-level tolerance
        expected = ref_run("LRN", [x], {"size": 3, "alpha": 0.125})[0]
        assert_close(_run("LRN", [x], {"size": 3, "alpha": 0.125})[0], expected, rtol=1e-7, atol=1e-9)


def test_lrn_writes_out():
    x = _rand(np.random.default_rng(53), (2, 6, 4, 3))
    out = np.full(x.shape, np.nan, np.float32)
    assert KERNELS["LRN"].fn(x, size=3, out=out) is out
    assert_close(out, ort_run("LRN", [x], {"size": 3})[0])


# ---------------------------------------------------------------- onnx's node test cases

NODE_CASES = [c for op in OPS for c in ((op,) + case for case in node_cases(op))]


@pytest.mark.parametrize(
    "op,name,opset,inputs,attrs,expected,rtol,atol",
    NODE_CASES,
    ids=[f"{c[1]}-{i}" for i, c in enumerate(NODE_CASES)],
)
def test_onnx_node_case(op, name, opset, inputs, attrs, expected, rtol, atol):
    if name in EXCLUDED:
        pytest.skip(EXCLUDED[name])
    got = _run(op, inputs, attrs, n_outputs=len(expected))
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert_close(g, e, rtol=max(rtol, 1e-5), atol=max(atol, 1e-6), what=name)


def test_node_case_counts(report):
    for op in OPS:
        names = [c[1] for c in NODE_CASES if c[0] == op]
        skipped = [n for n in names if n in EXCLUDED]
        report("nn node cases", f"{op}: {len(names) - len(skipped)} run, {len(skipped)} excluded")
    assert {c[0] for c in NODE_CASES} == set(OPS)


# ---------------------------------------------------------------- user-caused failures


def _x(*shape):
    return np.ones(shape, np.float32)


ERROR_CASES = {
    "unknown_auto_pad": (
        "Conv",
        [_x(1, 2, 5, 5), _x(3, 2, 3, 3)],
        {"auto_pad": "SAME"},
        UnsupportedError,
        ["auto_pad", "'SAME'", "SAME_UPPER"],
    ),
    "unknown_auto_pad_pool": (
        "MaxPool",
        [_x(1, 2, 5, 5)],
        {"kernel_shape": [2, 2], "auto_pad": "same_upper"},
        UnsupportedError,
        ["auto_pad", "'same_upper'", "NOTSET"],
    ),
    "unknown_auto_pad_convt": (
        "ConvTranspose",
        [_x(1, 2, 5, 5), _x(2, 3, 3, 3)],
        {"auto_pad": "FULL"},
        UnsupportedError,
        ["auto_pad", "'FULL'", "VALID"],
    ),
    "channel_mismatch": (
        "Conv",
        [_x(1, 3, 5, 5), _x(4, 2, 3, 3)],
        {},
        ShapeError,
        ["[1, 3, 5, 5]", "[4, 2, 3, 3]"],
    ),
    "channel_mismatch_convt": (
        "ConvTranspose",
        [_x(1, 3, 5, 5), _x(2, 2, 3, 3)],
        {},
        ShapeError,
        ["[1, 3, 5, 5]", "[2, 2, 3, 3]"],
    ),
    "group_not_dividing_inputs": (
        "Conv",
        [_x(1, 4, 5, 5), _x(3, 1, 3, 3)],
        {"group": 3},
        ShapeError,
        ["group=3", "4 input channels"],
    ),
    "group_not_dividing_outputs": (
        "Conv",
        [_x(1, 4, 5, 5), _x(3, 2, 3, 3)],
        {"group": 2},
        ShapeError,
        ["group=2", "3 output channels"],
    ),
    "kernel_larger_than_input": (
        "Conv",
        [_x(1, 2, 4, 4), _x(3, 2, 5, 5)],
        {"pads": [0, 0, 0, 0]},
        ShapeError,
        ["kernel_shape=[5, 5]", "[4, 4]"],
    ),
    "pool_kernel_larger_than_input": (
        "AveragePool",
        [_x(1, 2, 4, 4)],
        {"kernel_shape": [3, 6]},
        ShapeError,
        ["kernel_shape=[3, 6]", "[4, 4]"],
    ),
    "kernel_shape_vs_w": (
        "Conv",
        [_x(1, 2, 5, 5), _x(3, 2, 3, 3)],
        {"kernel_shape": [2, 2]},
        ShapeError,
        ["kernel_shape=[2, 2]", "[3, 2, 3, 3]"],
    ),
    "kernel_shape_rank": (
        "MaxPool",
        [_x(1, 2, 5, 5)],
        {"kernel_shape": [2]},
        ShapeError,
        ["kernel_shape=[2]", "2 spatial axes"],
    ),
    "strides_length": (
        "Conv",
        [_x(1, 2, 5, 5), _x(3, 2, 3, 3)],
        {"strides": [1, 1, 1]},
        ShapeError,
        ["strides=[1, 1, 1]", "expected 2"],
    ),
    "negative_pads": (
        "MaxPool",
        [_x(1, 2, 5, 5)],
        {"kernel_shape": [2, 2], "pads": [0, -1, 0, 0]},
        UnsupportedError,
        ["pads=[0, -1, 0, 0]", "negative"],
    ),
    "zero_stride": (
        "LpPool",
        [_x(1, 2, 5, 5)],
        {"kernel_shape": [2, 2], "strides": [0, 1]},
        UnsupportedError,
        ["strides=[0, 1]"],
    ),
    "storage_order": (
        "MaxPool",
        [_x(1, 2, 5, 5)],
        {"kernel_shape": [2, 2], "storage_order": 2},
        UnsupportedError,
        ["storage_order=2", "column-major"],
    ),
    "bias_shape": ("Conv", [_x(1, 2, 5, 5), _x(3, 2, 3, 3), _x(4)], {}, ShapeError, ["B [4]", "[3]"]),
    "mixed_dtypes": (
        "Conv",
        [_x(1, 2, 5, 5), _x(3, 2, 3, 3).astype(np.float64)],
        {},
        UnsupportedError,
        ["float32", "float64"],
    ),
    "integer_conv": (
        "Conv",
        [_x(1, 2, 5, 5).astype(np.int32), _x(3, 2, 3, 3).astype(np.int32)],
        {},
        UnsupportedError,
        ["int32", "float32"],
    ),
    "integer_average_pool": (
        "AveragePool",
        [_x(1, 2, 5, 5).astype(np.int8)],
        {"kernel_shape": [2, 2]},
        UnsupportedError,
        ["int8", "float32"],
    ),
    "bool_max_pool": (
        "MaxPool",
        [_x(1, 2, 5, 5).astype(bool)],
        {"kernel_shape": [2, 2]},
        UnsupportedError,
        ["bool"],
    ),
    "lrn_size": ("LRN", [_x(1, 2, 5, 5)], {"size": 0}, UnsupportedError, ["size=0"]),
    "lp_pool_p": ("LpPool", [_x(1, 2, 5, 5)], {"kernel_shape": [2, 2], "p": 0}, UnsupportedError, ["p=0"]),
    "no_spatial_axes": ("GlobalAveragePool", [_x(2, 3)], {}, ShapeError, ["[2, 3]"]),
    "convt_output_size": (
        "ConvTranspose",
        [_x(1, 2, 2), _x(2, 3, 2)],
        {"pads": [2, 2]},
        ShapeError,
        ["output size", "pads=[2, 2]"],
    ),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_user_errors_name_the_attribute(case):
    op, inputs, attrs, exc, fragments = ERROR_CASES[case]
    with pytest.raises(exc) as info:
        _run(op, inputs, attrs)
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_output_shape_helpers_match_onnxruntime():
    # the helpers the gradient kernels reuse give the shapes onnxruntime produces
    x = _x(1, 1, 7, 6)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 3], "pads": [1, 0, 1, 2], "ceil_mode": 1}
    shape, _ = window.pool_output_shape((7, 6), [3, 3], strides=[2, 3], pads=[1, 0, 1, 2], ceil_mode=1)
    assert shape == ort_run("MaxPool", [x], attrs)[0].shape[2:]
    shape, pads = window.conv_output_shape((7, 6), (3, 3), auto_pad="SAME_UPPER", strides=[2, 2])
    conv_attrs = {"auto_pad": "SAME_UPPER", "strides": [2, 2]}
    assert shape == ort_run("Conv", [x, _x(1, 1, 3, 3)], conv_attrs)[0].shape[2:]
    assert pads == (1, 0, 1, 1)  # odd total padding goes at the end for SAME_UPPER
    shape, pads = window.conv_transpose_output_shape((3, 3), (3, 3), auto_pad="SAME_LOWER", strides=[2, 2])
    assert (
        shape
        == ort_run(
            "ConvTranspose", [_x(1, 1, 3, 3), _x(1, 1, 3, 3)], {"auto_pad": "SAME_LOWER", "strides": [2, 2]}
        )[0].shape[2:]
    )
