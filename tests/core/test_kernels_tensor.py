"""Tensor-family kernels against onnxruntime, onnx's reference evaluator and onnx's node test cases."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import assert_close, node_cases, ort_run, ref_run

from edgetrain.core.errors import ShapeError, UnsupportedError
from edgetrain.core.kernels import KERNELS

OPS = (
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Transpose",
    "Concat",
    "Split",
    "Slice",
    "Expand",
    "Tile",
    "Shape",
    "Size",
    "Constant",
    "ConstantOfShape",
    "Range",
    "EyeLike",
    "Gather",
    "GatherElements",
    "GatherND",
    "ScatterElements",
    "ScatterND",
    "OneHot",
    "Pad",
    "NonZero",
    "TopK",
    "Trilu",
    "DepthToSpace",
    "SpaceToDepth",
    "Resize",
)

_ALIGN = (
    "onnx's expected value uses the fractional output length in align_corners; onnxruntime (which we "
    "match) uses the integer one"
)
EXCLUDED: dict[str, str] = {
    "test_resize_downsample_scales_linear_align_corners": _ALIGN,
    "test_resize_downsample_scales_cubic_align_corners": _ALIGN,
}

CASES = [c for op in OPS for c in ((op, *case) for case in node_cases(op))]


def run(op, *inputs, n_outputs=1, **attrs):
    """Calls the kernel through the table, as the interpreter does; always returns a list of outputs."""
    k = KERNELS[op]
    if k.wants_noutputs:
        attrs["noutputs"] = n_outputs
    res = k.fn(*inputs, **attrs)
    return list(res) if isinstance(res, tuple) else [res]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_node_case(case):
    op, name, opset, inputs, attrs, expected, rtol, atol = case
    if name in EXCLUDED:
        pytest.skip(EXCLUDED[name])
    while inputs and inputs[-1] is None:
        inputs = inputs[:-1]
    got = run(op, *inputs, n_outputs=len(expected), **attrs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert_close(g, e, rtol=max(rtol, 1e-5), atol=max(atol, 1e-6), what=name)


# ---------------------------------------------------------------- helpers
RNG = np.random.default_rng(0)
INT_MAX, INT_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


def rand(shape, dtype=np.float32, lo=-5, hi=5):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return RNG.random(shape) < 0.5
    if dtype.kind in "iu":
        return RNG.integers(max(lo, np.iinfo(dtype).min), hi, size=shape).astype(dtype)
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def i64(*v):
    return np.array(v, dtype=np.int64)


def ort_or_ref(op, inputs, attrs=None, **kw):
    """onnxruntime, or onnx's reference evaluator where onnxruntime has no kernel for the dtypes."""
    from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as OrtNotImplemented

    try:
        return ort_run(op, inputs, attrs, **kw)
    except OrtNotImplemented:
        return ref_run(op, inputs, attrs, **kw)


def check(
    op, inputs, attrs=None, *, n_outputs=1, ref=ort_run, opset=21, ref_attrs=None, rtol=1e-5, atol=1e-6
):
    """Runs op in the reference and through the kernel table; compares every output. Returns the kernel's."""
    attrs, args = attrs or {}, list(inputs)
    while args and args[-1] is None:  # trailing omitted inputs are left off the node, as exporters do
        args.pop()
    expected = ref(op, args, attrs if ref_attrs is None else ref_attrs, n_outputs=n_outputs, opset=opset)
    got = run(op, *args, n_outputs=n_outputs, **attrs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert_close(g, e, rtol=rtol, atol=atol, what=f"{op} {attrs}")
    return got


def check_out(op, inputs, attrs=None, **kw):
    """The kernel writes into a preallocated (garbage-filled) out= buffer and returns it."""
    expected = check(op, inputs, attrs, **kw)[0]
    buf = np.empty_like(expected)
    if buf.dtype.kind in "fiu":
        buf[...] = 7
    args = list(inputs)
    while args and args[-1] is None:
        args.pop()
    res = KERNELS[op].fn(*args, **(attrs or {}), out=buf)
    assert res is buf
    assert_close(buf, expected, what=f"{op} out=")


# ---------------------------------------------------------------- views
@pytest.mark.parametrize(
    "shape,target,allowzero",
    [
        ((2, 3, 4), (4, 6), 0),
        ((2, 3, 4), (-1,), 0),
        ((2, 3, 4), (0, -1), 0),
        ((2, 3, 4), (0, 0, 2, 2), 0),
        ((2, 3, 4), (-1, 3, 0), 0),
        ((0, 3, 4), (3, 4, 0), 1),
        ((0, 3), (0, 5), 1),
        ((6,), (1, 2, 1, 3), 0),
        ((1,), (), 0),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_reshape(shape, target, allowzero, dtype):
    x = rand(shape, dtype)
    got = check("Reshape", [x, i64(*target)], {"allowzero": allowzero})[0]
    assert x.size == 0 or np.shares_memory(got, x)


@pytest.mark.parametrize("axis", range(-4, 5))
def test_flatten(axis):
    x = rand((2, 3, 4, 5), np.float16)
    assert np.shares_memory(check("Flatten", [x], {"axis": axis})[0], x)


@pytest.mark.parametrize(
    "shape,axes",
    [
        ((1, 3, 1, 5), None),
        ((1, 3, 1, 5), (0,)),
        ((1, 3, 1, 5), (-2, 0)),
        ((1,), None),
        ((3, 1), (1,)),
        ((1, 3, 1), ()),
    ],
)
def test_squeeze(shape, axes):
    x = rand(shape, np.int32)
    assert np.shares_memory(check("Squeeze", [x, None if axes is None else i64(*axes)])[0], x)


@pytest.mark.parametrize(
    "shape,axes",
    [((3, 4), (0,)), ((3, 4), (2,)), ((3, 4), (-1,)), ((3, 4), (4, 0, -2)), ((), (0, 1)), ((2,), (-1, -3))],
)
def test_unsqueeze(shape, axes):
    x = rand(shape, np.float64)
    assert np.shares_memory(check("Unsqueeze", [x, i64(*axes)])[0], x)


@pytest.mark.parametrize("perm", [None, [0, 1, 2, 3], [3, 2, 1, 0], [0, 2, 3, 1], [1, 0, 3, 2]])
def test_transpose(perm):
    x = rand((2, 3, 4, 5), np.uint8, 0, 200)
    attrs = {} if perm is None else {"perm": perm}
    assert np.shares_memory(check("Transpose", [x], attrs)[0], x)


# ---------------------------------------------------------------- Concat, Split, Slice, Expand, Tile
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.bool_])
def test_concat(axis, dtype):
    shapes = [[2, 3, 4] for _ in range(3)]
    for k, s in enumerate(shapes):
        s[axis] = k  # includes a zero-size input
    check("Concat", [rand(s, dtype) for s in shapes], {"axis": axis})


def test_concat_out():
    check_out("Concat", [rand((2, 3)), rand((2, 5))], {"axis": 1})


@pytest.mark.parametrize(
    "shape,split,attrs,n",
    [
        ((6, 4), (1, 2, 3), {}, 3),
        ((6, 4), (4, 0), {"axis": 1}, 2),
        ((6, 4), None, {"num_outputs": 3}, 3),
        ((7, 4), None, {"num_outputs": 3}, 3),
        ((3, 8), None, {"axis": -1, "num_outputs": 3}, 3),
        ((5,), None, {"num_outputs": 1}, 1),
    ],
)
def test_split(shape, split, attrs, n):
    check("Split", [rand(shape), None if split is None else i64(*split)], attrs, n_outputs=n)


@pytest.mark.parametrize("axis,n", [(0, 3), (1, 2), (-1, 4)])
def test_split_evenly_by_outputs(axis, n):
    # Neither split nor num_outputs: the outputs count, as in Split-13 (run at opset 13 in onnxruntime).
    check("Split", [rand((6, 8))], {"axis": axis}, n_outputs=n, opset=13)


SLICES = [  # starts, ends, axes, steps
    ((0, 1), (3, 4), None, None),
    ((1,), (-1,), (1,), None),
    ((-3,), (INT_MAX,), (0,), None),
    ((5,), (1,), (1,), (-2,)),
    ((-1,), (INT_MIN,), (2,), (-1,)),
    ((INT_MAX,), (-100,), (-1,), (-3,)),
    ((100,), (200,), (0,), (1,)),
    ((-100,), (2,), (1,), (2,)),
    ((2, 0, 4), (0, INT_MAX, 0), (0, 1, 2), (-1, 3, -1)),
    ((0,), (1,), (-2,), (1,)),
    ((3,), (3,), (0,), (1,)),
    ((0,), (-1,), (2,), (-1,)),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
@pytest.mark.parametrize("idtype", [np.int64, np.int32])
def test_slice(starts, ends, axes, steps, idtype):
    x = rand((5, 7, 6))
    if idtype == np.int32:
        starts, ends = [np.clip(v, -(2**31), 2**31 - 1) for v in (starts, ends)]
    arr = [None if v is None else np.array(v, dtype=idtype) for v in (starts, ends, axes, steps)]
    got = check("Slice", [x, *arr])[0]
    assert got.size == 0 or np.shares_memory(got, x)


@pytest.mark.parametrize(
    "shape,target",
    [
        ((3, 1), (2, 3, 6)),
        ((3, 1), (3, 4)),
        ((4,), (1,)),
        ((1, 4), (3, 1)),
        ((2, 1, 3), (5, 1, 1, 1)),
        ((), (2, 2)),
    ],
)
def test_expand(shape, target):
    check("Expand", [rand(shape, np.int16), i64(*target)])


def test_expand_out():
    check_out("Expand", [rand((3, 1)), i64(2, 3, 4)])


@pytest.mark.parametrize(
    "shape,reps", [((2, 3), (2, 3)), ((2, 3, 4), (1, 2, 1)), ((3,), (4,)), ((2, 2), (0, 2)), ((), ())]
)
def test_tile(shape, reps):
    check("Tile", [rand(shape, np.float64), i64(*reps)])


def test_tile_out():
    check_out("Tile", [rand((2, 3)), i64(3, 2)])
    # A non-contiguous out (e.g. a slice of an arena) still gets the result.
    buf = np.zeros((4, 12), np.float32)[:, ::2]
    x = rand((2, 3))
    assert KERNELS["Tile"].fn(x, i64(2, 2), out=buf) is buf
    assert_close(buf, ort_run("Tile", [x, i64(2, 2)])[0])


# ---------------------------------------------------------------- generators
@pytest.mark.parametrize("start,end", [(0, None), (1, None), (-1, None), (0, -1), (-10, 10), (2, 1), (1, 3)])
def test_shape(start, end):
    attrs = {"start": start} if end is None else {"start": start, "end": end}
    check("Shape", [rand((2, 3, 4, 5))], attrs)


@pytest.mark.parametrize("shape", [(), (0, 3), (2, 3, 4)])
def test_size(shape):
    check("Size", [rand(shape, np.int8)])


@pytest.mark.parametrize(
    "attrs",
    [
        {"value_float": 1.5},
        {"value_floats": [1.0, -2.5]},
        {"value_int": 7},
        {"value_ints": [1, 2, 3]},
        {"value_strings": ["ab", "c"]},
        {"value_string": "x"},
    ],
)
def test_constant(attrs):
    check("Constant", [], attrs)


@pytest.mark.parametrize(
    "value",
    [np.array([3.5], np.float32), np.array([-2], np.int64), np.array([True]), np.array([1.25], np.float16)],
)
def test_constant_tensor(value):
    from onnx import numpy_helper

    got = check("Constant", [], {"value": value}, ref_attrs={"value": numpy_helper.from_array(value)})[0]
    with pytest.raises(ValueError):
        got[...] = 0  # the attribute itself is handed out: read-only


@pytest.mark.parametrize("shape", [(2, 3), (0,), ()])
@pytest.mark.parametrize(
    "value",
    [
        None,
        np.array([2.5], np.float32),
        np.array([7], np.int32),
        np.array([True]),
        np.array([-1.5], np.float64),
    ],
)
def test_constant_of_shape(shape, value):
    from onnx import numpy_helper

    ref_attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    attrs = {} if value is None else {"value": value}
    check("ConstantOfShape", [i64(*shape)], attrs, ref_attrs=ref_attrs)
    if shape == (2, 3):
        check_out("ConstantOfShape", [i64(*shape)], attrs, ref_attrs=ref_attrs)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int16])
@pytest.mark.parametrize("start,limit,delta", [(0, 10, 3), (10, 4, -2), (5, 5, 1), (3, 1, 1), (-7, 12, 5)])
def test_range_int(start, limit, delta, dtype):
    check("Range", [np.array(v, dtype) for v in (start, limit, delta)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "start,limit,delta", [(0.1, 100.0, 0.7), (1.0, -3.0, -0.25), (0.0, 1.0, 0.3), (2, 2, 1)]
)
def test_range_float(start, limit, delta, dtype):
    check("Range", [np.array(v, dtype) for v in (start, limit, delta)], atol=1e-5)


@pytest.mark.parametrize("stash_type", [1, 11])
def test_range_float16(stash_type):
    # onnxruntime lacks float16 Range (and stash_type, opset 27): onnx's reference checks it.
    inputs = [np.array(v, np.float16) for v in (1000.0, 1100.0, 0.5)]
    check("Range", inputs, {"stash_type": stash_type}, ref=ref_run, opset=27)


@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (5, 2)])
@pytest.mark.parametrize("k", [0, 1, -2, 7])
@pytest.mark.parametrize("dtype", [None, 1, 7, 9])
def test_eye_like(shape, k, dtype):
    attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    check("EyeLike", [rand(shape, np.int32)], attrs, ref=ort_or_ref)


# ---------------------------------------------------------------- gather and scatter
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("ishape", [(), (4,), (2, 3)])
@pytest.mark.parametrize("idtype", [np.int64, np.int32])
def test_gather(axis, ishape, idtype):
    x = rand((5, 6, 4), np.float16)
    n = x.shape[axis]
    check("Gather", [x, RNG.integers(-n, n, size=ishape).astype(idtype)], {"axis": axis})
    check("Gather", [x[:, 0, 0], np.array(-2, idtype)])  # one element of 1-D data: a 0-d array


def test_gather_out():
    check_out("Gather", [rand((5, 6)), i64(4, -1, 0)], {"axis": 1})


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("smaller", [False, True])
def test_gather_elements(axis, smaller):
    x = rand((4, 5, 3), np.int64)
    ishape = [2, 3, 2] if smaller else [4, 5, 3]  # indices may be smaller than data off the axis
    ishape[axis] = 6
    n = x.shape[axis]
    check("GatherElements", [x, RNG.integers(-n, n, size=ishape)], {"axis": axis})


@pytest.mark.parametrize(
    "dshape,ishape,b",
    [
        ((4, 5, 6), (3, 1), 0),
        ((4, 5, 6), (3, 2), 0),
        ((4, 5, 6), (2, 2, 3), 0),
        ((4, 5, 6), (4, 2, 1), 1),
        ((4, 5, 6), (4, 2), 1),
        ((4, 5, 6), (4, 5, 3, 1), 2),
        ((2, 3), (2,), 0),
    ],
)
def test_gather_nd(dshape, ishape, b):
    x = rand(dshape)
    k = ishape[-1]
    dims = np.array(dshape[b : b + k])
    idx = RNG.integers(0, 1 << 30, size=ishape) % dims
    idx -= dims * RNG.integers(0, 2, size=ishape)  # some negative
    check("GatherND", [x, idx.astype(np.int64)], {"batch_dims": b})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_scatter_elements(reduction, axis, dtype):
    x = rand((4, 5, 3), dtype)
    ishape = [2, 3, 2]
    n = x.shape[axis]
    ishape[axis] = n if reduction == "none" else 6
    if reduction == "none":  # no duplicate targets: their winner is unspecified
        idx = np.argsort(RNG.random(ishape), axis=axis)[tuple(slice(0, s) for s in ishape)]
        idx = idx - n * (RNG.random(ishape) < 0.3)  # some negative
    else:
        idx = RNG.integers(-n, n, size=ishape)  # duplicates accumulate
    check(
        "ScatterElements",
        [x, idx.astype(np.int64), rand(ishape, dtype)],
        {"axis": axis, "reduction": reduction},
    )


def test_scatter_elements_out():
    idx = np.array([[1, 0, 2, 2], [1, 1, 0, 2]])
    check_out("ScatterElements", [rand((3, 4)), idx, rand((2, 4))], {"reduction": "add"})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize(
    "dshape,ishape", [((4, 5, 6), (3, 1)), ((4, 5, 6), (2, 2, 2)), ((4, 5, 6), (5, 3)), ((6,), (4, 1))]
)
def test_scatter_nd(reduction, dshape, ishape):
    x = rand(dshape)
    k = ishape[-1]
    if reduction == "none":  # distinct targets
        flat = RNG.permutation(int(np.prod(dshape[:k])))[: int(np.prod(ishape[:-1]))]
        idx = np.stack(np.unravel_index(flat, dshape[:k]), axis=-1).reshape(ishape)
    else:
        idx = RNG.integers(0, 1 << 30, size=ishape) % np.array(dshape[:k])
    updates = rand(tuple(ishape[:-1]) + tuple(dshape[k:]))
    check("ScatterND", [x, idx.astype(np.int64), updates], {"reduction": reduction})


def test_scatter_nd_out():
    check_out("ScatterND", [rand((4, 3)), np.array([[1], [3]]), rand((2, 3))])


@pytest.mark.parametrize("axis", [-1, 0, 1, 2, -3])
@pytest.mark.parametrize(
    "idtype,vdtype",
    [(np.int64, np.float32), (np.int32, np.int64), (np.float32, np.float32), (np.int8, np.int32)],
)
def test_one_hot(axis, idtype, vdtype):
    ind = RNG.integers(-7, 7, size=(3, 4)).astype(idtype)  # out-of-range -7, 6 give all-off rows
    check("OneHot", [ind, np.array(6, np.int64), np.array([2, 9], vdtype)], {"axis": axis}, ref=ort_or_ref)


def test_one_hot_float_depth():
    check("OneHot", [i64(0, 2, -1), np.array([4.0], np.float32), np.array([0.0, 1.0], np.float32)])


# ---------------------------------------------------------------- Pad
# On a (3, 4, 5) input; reflect allows at most size - 1 per side after cropping, and these stay within it.
PADS = [
    (1, 2, 0, 2, 2, 1),
    (0, 0, 0, 0, 0, 0),
    (-1, 0, 2, 1, -2, 0),
    (1, -1, -1, -1, 2, 1),
    (0, 3, 3, 0, 2, 2),
]


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", PADS)
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_pad(mode, pads, dtype):
    x = rand((3, 4, 5), dtype)
    cv = np.array(2.5 if dtype == np.float32 else 3, dtype) if mode == "constant" else None
    check("Pad", [x, i64(*pads), cv], {"mode": mode})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("axes,pads", [((1,), (2, 3)), ((-1, 0), (1, -1, 0, 1)), ((2, 1), (0, 3, 2, 0))])
def test_pad_axes(mode, axes, pads):
    check("Pad", [rand((3, 4, 5), np.float64), i64(*pads), None, i64(*axes)], {"mode": mode})


def test_pad_wrap_more_than_size():
    check("Pad", [rand((3, 2)), i64(0, 5, 1, 3)], {"mode": "wrap"})


# ---------------------------------------------------------------- NonZero, TopK, Trilu
@pytest.mark.parametrize("shape", [(), (7,), (3, 4), (2, 3, 4), (0, 3)])
@pytest.mark.parametrize("dtype", [np.bool_, np.float32, np.int64, np.uint8])
def test_non_zero(shape, dtype):
    x = rand(shape, dtype, -1, 2)
    check("NonZero", [x])
    check("NonZero", [np.zeros(shape, dtype)])


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("k", [0, 1, 3, 5])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.float64])
def test_top_k(largest, axis, k, dtype):
    x = rand((6, 6, 5), dtype, 0, 4)  # few distinct values: many ties, the lower index must win
    check("TopK", [x, i64(k)], {"axis": axis, "largest": largest}, n_outputs=2)


def test_top_k_unsorted_selects_same_elements():
    x = rand((4, 9), np.int32, 0, 3)
    ref_v, ref_i = ort_run("TopK", [x, i64(4)], {"sorted": 0}, n_outputs=2)
    v, i = run("TopK", x, i64(4), sorted=0, n_outputs=2)
    assert_close(np.sort(i, axis=-1), np.sort(ref_i, axis=-1))
    assert_close(np.take_along_axis(x, i, -1), v)


@pytest.mark.parametrize("upper", [1, 0])
@pytest.mark.parametrize("k", [None, 0, 1, -1, 3, -5, 9])
@pytest.mark.parametrize("shape", [(4, 5), (2, 5, 3), (3, 3, 3), (1, 0, 4)])
def test_trilu(upper, k, shape):
    check("Trilu", [rand(shape, np.int64), None if k is None else np.array(k, np.int64)], {"upper": upper})


def test_trilu_out():
    check_out("Trilu", [rand((2, 4, 4)), np.array(1, np.int64)], {"upper": 0})


# ---------------------------------------------------------------- DepthToSpace, SpaceToDepth
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("bs,shape", [(2, (2, 8, 3, 4)), (3, (1, 18, 2, 2)), (1, (1, 3, 2, 2))])
def test_depth_to_space(mode, bs, shape):
    check_out("DepthToSpace", [rand(shape)], {"blocksize": bs, "mode": mode})


@pytest.mark.parametrize("bs,shape", [(2, (2, 3, 4, 6)), (3, (1, 2, 6, 3))])
def test_space_to_depth(bs, shape):
    x = rand(shape)
    check_out("SpaceToDepth", [x], {"blocksize": bs})
    # The mode attribute is newer than onnxruntime's opset: onnx's reference checks CRD.
    check("SpaceToDepth", [x], {"blocksize": bs, "mode": "CRD"}, ref=ref_run, opset=28)
    check("SpaceToDepth", [x], {"blocksize": bs, "mode": "DCR"}, ref=ref_run, opset=28)


# ---------------------------------------------------------------- Resize
CTMS = [
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
]
RESIZE_SPECS = [
    ("scales", (1, 1, 2.0, 1.5)),
    ("scales", (1, 1, 0.5, 0.6)),
    ("scales", (1, 1, 0.7, 1.7)),
    ("sizes", (2, 3, 9, 7)),
    ("sizes", (2, 3, 3, 2)),
    ("sizes", (2, 3, 1, 1)),
]


def resize_inputs(x, spec, ctm, roi=(0, 0, 0.1, -0.2, 1, 1, 0.8, 1.1)):
    kind, vals = spec
    roi = np.array(roi, np.float32) if ctm == "tf_crop_and_resize" else None
    if kind == "scales":
        return [x, roi, np.array(vals, np.float32)]
    return [x, roi, None, i64(*vals)]


@pytest.mark.parametrize(
    "mode",
    [
        "nearest-round_prefer_floor",
        "nearest-round_prefer_ceil",
        "nearest-floor",
        "nearest-ceil",
        "linear",
        "cubic",
    ],
)
@pytest.mark.parametrize("ctm", CTMS)
@pytest.mark.parametrize("spec", RESIZE_SPECS)
def test_resize(mode, ctm, spec):
    mode, _, nearest = mode.partition("-")
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm, "extrapolation_value": -3.0}
    if nearest:
        attrs["nearest_mode"] = nearest
    check("Resize", resize_inputs(rand((2, 3, 5, 4)), spec, ctm), attrs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("ctm", ["half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"])
@pytest.mark.parametrize("spec", RESIZE_SPECS[:5] + [("scales", (1, 1, 0.3, 0.45))])
# onnxruntime rejects exclude_outside for plain linear (where it changes nothing).
@pytest.mark.parametrize(
    "mode,antialias,exclude_outside,a",
    [
        ("linear", 1, 0, -0.75),
        ("linear", 1, 1, -0.5),
        ("cubic", 1, 0, -0.75),
        ("cubic", 1, 1, -0.5),
        ("cubic", 0, 1, -0.5),
    ],
)
def test_resize_antialias_exclude_outside(mode, ctm, spec, antialias, exclude_outside, a):
    attrs = {
        "mode": mode,
        "coordinate_transformation_mode": ctm,
        "antialias": antialias,
        "exclude_outside": exclude_outside,
        "cubic_coeff_a": a,
    }
    check("Resize", resize_inputs(rand((2, 3, 7, 8)), spec, ctm), attrs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("axes,sizes", [((2, 3), (9, 3)), ((3, 2), (3, 9)), ((-1,), (6,)), ((1, 2), (2, 11))])
@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_axes_aspect_policy(axes, sizes, policy, mode):
    if policy != "stretch" and min(axes) < 0:
        axes = [a % 4 for a in axes]  # both references ignore a negative axis under a keep-aspect policy
    attrs = {"axes": list(axes), "keep_aspect_ratio_policy": policy, "mode": mode}
    check("Resize", [rand((2, 3, 5, 4)), None, None, i64(*sizes)], attrs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32, np.float16])
def test_resize_dtypes(dtype):
    x = rand((1, 2, 5, 6), dtype, 0, 100)
    check("Resize", [x, None, np.array([1, 1, 1.6, 0.5], np.float32)], {"mode": "nearest"})
    if dtype == np.float16:
        check("Resize", [x, None, np.array([1, 1, 1.6, 0.5], np.float32)], {"mode": "linear"}, rtol=2e-3)


def test_resize_roi_axes():
    x = rand((1, 2, 6, 5))
    roi = np.array([0.2, -0.1, 0.7, 0.9], np.float32)
    check(
        "Resize",
        [x, roi, None, i64(4, 7)],
        {
            "axes": [3, 2],
            "mode": "linear",
            "extrapolation_value": 1.5,
            "coordinate_transformation_mode": "tf_crop_and_resize",
        },
    )


# ---------------------------------------------------------------- user-caused failures
X234 = np.zeros((2, 3, 4), np.float32)
IMG = np.zeros((1, 4, 4, 4), np.float32)
ERRORS = [  # op, inputs, attrs, exception, words the message must hold
    ("Reshape", [X234, i64(5, 5)], {}, ShapeError, ["[2, 3, 4]", "[5, 5]"]),
    ("Reshape", [X234, i64(-1, -1)], {}, ShapeError, ["[-1, -1]", "one -1"]),
    ("Reshape", [X234, i64(1, 1, 1, 0)], {}, ShapeError, ["[1, 1, 1, 0]", "[2, 3, 4]"]),
    ("Flatten", [X234], {"axis": 4}, ShapeError, ["axis=4", "rank 3"]),
    ("Squeeze", [X234, i64(1)], {}, ShapeError, ["[1]", "[2, 3, 4]"]),
    ("Unsqueeze", [X234, i64(0, 0)], {}, ShapeError, ["axes=[0, 0]"]),
    ("Transpose", [X234], {"perm": [0, 0, 1]}, ShapeError, ["perm=[0, 0, 1]"]),
    ("Concat", [X234, np.zeros((2, 5, 5), np.float32)], {"axis": 1}, ShapeError, ["[2, 5, 5]", "axis=1"]),
    ("Concat", [X234, X234], {"axis": -4}, ShapeError, ["axis=-4", "rank 3"]),
    ("Split", [X234, i64(1, 2)], {"noutputs": 2}, ShapeError, ["split=[1, 2]", "size of axis 0"]),
    ("Split", [X234], {"axis": 1, "noutputs": 2}, ShapeError, ["size 3", "2 outputs"]),
    ("Split", [X234], {"num_outputs": 2, "noutputs": 3}, ShapeError, ["3 outputs", "[1, 1]"]),
    ("Slice", [X234, i64(0), i64(2), i64(1), i64(0)], {}, ShapeError, ["steps=[0]"]),
    ("Slice", [X234, i64(0, 1), i64(2)], {}, ShapeError, ["starts [0, 1]", "ends [2]"]),
    ("Expand", [X234, i64(5, 1)], {}, ShapeError, ["[2, 3, 4]", "[5, 1]"]),
    ("Tile", [X234, i64(2, 2)], {}, ShapeError, ["repeats=[2, 2]", "3"]),
    ("Constant", [], {"sparse_value": object()}, UnsupportedError, ["sparse_value", "value_float"]),
    ("Constant", [], {"value_int": 1, "value_float": 2.0}, UnsupportedError, ["exactly one", "got 2"]),
    ("ConstantOfShape", [i64(2)], {"value": np.zeros(2, np.float32)}, ShapeError, ["value", "[2]"]),
    ("Range", [np.array(1), np.array(5), np.array(0)], {}, ShapeError, ["delta is 0"]),
    ("Range", [np.array(1, np.float16)] * 3, {"stash_type": 10}, UnsupportedError, ["stash_type=10", "11"]),
    ("EyeLike", [X234], {}, ShapeError, ["2-D", "[2, 3, 4]"]),
    ("EyeLike", [np.zeros((2, 2))], {"dtype": 8}, UnsupportedError, ["dtype=8", "supported"]),
    ("Gather", [X234, i64(2)], {}, ShapeError, ["indices", "out of range"]),
    (
        "GatherElements",
        [X234, np.zeros((3, 3, 4), np.int64)],
        {"axis": 2},
        ShapeError,
        ["[3, 3, 4]", "axis=2"],
    ),
    ("GatherElements", [X234, np.full((2, 3, 4), 9)], {"axis": 2}, ShapeError, ["indices", "out of range"]),
    ("GatherND", [X234, i64([3, 0])], {}, ShapeError, ["indices", "out of range"]),
    (
        "GatherND",
        [X234, np.zeros((3, 1), np.int64)],
        {"batch_dims": 1},
        ShapeError,
        ["[3, 1]", "batch_dims=1"],
    ),
    (
        "ScatterElements",
        [X234, np.zeros((1, 1, 1), np.int64), np.zeros((1, 1, 1), np.float32)],
        {"reduction": "avg"},
        UnsupportedError,
        ["reduction='avg'", "'max'"],
    ),
    (
        "ScatterElements",
        [X234, np.zeros((1, 1, 1), np.int64), np.zeros((1, 1, 2), np.float32)],
        {},
        ShapeError,
        ["[1, 1, 2]", "[1, 1, 1]"],
    ),
    (
        "ScatterND",
        [X234, np.zeros((1, 1), np.int64), np.zeros((1, 3, 5), np.float32)],
        {},
        ShapeError,
        ["[1, 3, 5]", "[2, 3, 4]"],
    ),
    ("ScatterND", [X234, np.array([[5]]), np.zeros((1, 3, 4), np.float32)], {}, ShapeError, ["out of range"]),
    ("OneHot", [i64(1, 2), np.array(3), np.array([0, 1])], {"axis": 3}, ShapeError, ["axis=3", "rank 1"]),
    (
        "Pad",
        [X234, i64(0, 0, 0, 0, 0, 0)],
        {"mode": "symmetric"},
        UnsupportedError,
        ["mode='symmetric'", "wrap"],
    ),
    ("Pad", [X234, i64(1, 1)], {}, ShapeError, ["pads=[1, 1]", "3 axes"]),
    ("Pad", [X234, i64(0, -2, 0, 0, -2, 0)], {}, ShapeError, ["pads=[0, -2, 0, 0, -2, 0]", "[2, 3, 4]"]),
    ("Pad", [X234, i64(0, 0, 4, 0, 0, 0)], {"mode": "reflect"}, ShapeError, ["reflect", "size 4", "(4, 0)"]),
    ("Pad", [np.zeros((0, 2)), i64(1, 0, 0, 0)], {"mode": "edge"}, ShapeError, ["edge", "size 0"]),
    ("TopK", [X234, i64(5)], {}, ShapeError, ["K=5", "size 4"]),
    ("Trilu", [np.zeros(3)], {}, ShapeError, ["rank >= 2", "[3]"]),
    ("DepthToSpace", [IMG], {"blocksize": 2, "mode": "RCD"}, UnsupportedError, ["mode='RCD'", "'CRD'"]),
    ("DepthToSpace", [IMG], {"blocksize": 3}, ShapeError, ["channels 4", "blocksize"]),
    ("SpaceToDepth", [IMG], {"blocksize": 3}, ShapeError, ["[4, 4]", "blocksize=3"]),
    (
        "Resize",
        [IMG, None, np.ones(4, np.float32)],
        {"mode": "area"},
        UnsupportedError,
        ["mode='area'", "cubic"],
    ),
    (
        "Resize",
        [IMG, None, np.ones(4, np.float32)],
        {"coordinate_transformation_mode": "tf_half_pixel_for_nn"},
        UnsupportedError,
        ["coordinate_transformation_mode='tf_half_pixel_for_nn'", "align_corners"],
    ),
    (
        "Resize",
        [IMG, None, np.ones(4, np.float32)],
        {"nearest_mode": "round"},
        UnsupportedError,
        ["nearest_mode='round'", "floor"],
    ),
    (
        "Resize",
        [IMG, None, None, i64(1, 4, 2, 2)],
        {"keep_aspect_ratio_policy": "fit"},
        UnsupportedError,
        ["keep_aspect_ratio_policy='fit'", "not_larger"],
    ),
    (
        "Resize",
        [IMG.astype(np.uint8), None, np.ones(4, np.float32)],
        {"mode": "linear"},
        UnsupportedError,
        ["mode='linear'", "uint8", "nearest"],
    ),
    ("Resize", [IMG, None, np.ones(4, np.float32), i64(1, 4, 2, 2)], {}, ShapeError, ["scales", "sizes"]),
    ("Resize", [IMG, None, np.ones(2, np.float32)], {}, ShapeError, ["scales/sizes (2)", "4 axes"]),
    (
        "Resize",
        [IMG, None, np.array([1, 1, 0, 1], np.float32)],
        {},
        ShapeError,
        ["scales=[1.0, 1.0, 0.0, 1.0]"],
    ),
]


@pytest.mark.parametrize(
    "op,inputs,attrs,exc,words", ERRORS, ids=[f"{e[0]}-{k}" for k, e in enumerate(ERRORS)]
)
def test_errors(op, inputs, attrs, exc, words):
    with pytest.raises(exc) as info:
        KERNELS[op].fn(*inputs, **attrs)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_kernel_signatures():
    """Attribute names and defaults as the ONNX spec has them (what the importer binds by name)."""
    from onnx import defs, helper

    for op in OPS:
        schema = defs.get_schema(op)
        k = KERNELS[op]
        assert set(k.attrs) == set(schema.attributes), op
        for name, a in schema.attributes.items():
            if a.default_value.name:
                default = helper.get_attribute_value(a.default_value)
                default = default.decode() if isinstance(default, bytes) else default
                assert k.attrs[name] == default, (op, name)
        assert k.n_inputs[1] is None or k.n_inputs[1] == len(schema.inputs), op
