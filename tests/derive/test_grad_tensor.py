"""Gradient rules of shape and data-movement ops against float64 finite differences and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from grad_harness import build, check_against_onnxruntime, check_grad, grads_of, rnd

from edgetrain.core.errors import UnsupportedError
from edgetrain.core.ir import Node


def check(op, inputs, attrs=None, **kw) -> float:
    """check_grad, differentiating the data input only unless told otherwise."""
    return check_grad(op, inputs, attrs, wrt=kw.pop("wrt", [0]), **kw)


def ints(*v):
    return np.array(v, np.int64)


# ------------------------------------------------------------------------------------------------ views


@pytest.mark.parametrize(
    "op,inputs,attrs",
    [
        ("Reshape", [(2, 3, 4), ints(4, -1)], None),
        ("Reshape", [(2, 3, 4), ints(0, 0, 2, 2)], None),
        ("Flatten", [(2, 3, 4)], None),
        ("Flatten", [(2, 3, 4)], {"axis": 0}),
        ("Flatten", [(2, 3, 4)], {"axis": -1}),
        ("Flatten", [(2, 3, 4)], {"axis": 3}),
        ("Squeeze", [(2, 1, 4, 1), ints(1)], None),
        ("Squeeze", [(2, 1, 4, 1), ints(-1, 1)], None),
        ("Squeeze", [(2, 1, 4, 1)], None),
        ("Unsqueeze", [(2, 4), ints(0, -1)], None),
        ("Unsqueeze", [(), ints(0)], None),
        ("Transpose", [(2, 3, 4)], {"perm": [2, 0, 1]}),
        ("Transpose", [(2, 3, 4)], {"perm": [1, 2, 0]}),
        ("Transpose", [(2, 3, 4)], None),
        ("Expand", [(3, 1), ints(2, 3, 4)], None),
        ("Expand", [(2, 1, 4), ints(3, 1)], None),
        ("Expand", [(3,), ints(3)], None),
        ("Tile", [(2, 3), ints(2, 1)], None),
        ("Tile", [(2, 1, 3), ints(3, 2, 2)], None),
        ("Tile", [(2, 3), ints(1, 1)], None),
        ("DepthToSpace", [(1, 8, 2, 3)], {"blocksize": 2}),
        ("DepthToSpace", [(2, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"}),
        ("DepthToSpace", [(1, 9, 2, 1)], {"blocksize": 3, "mode": "CRD"}),
        ("SpaceToDepth", [(2, 2, 4, 6)], {"blocksize": 2}),
        ("Trilu", [(4, 5)], None),
        ("Trilu", [(2, 4, 5), ints(1)], {"upper": 0}),
        ("Trilu", [(4, 5), ints(-2)], {"upper": 1}),
    ],
    ids=lambda v: str(v),
)
def test_views(op, inputs, attrs):
    check(op, [rnd(*inputs[0]), *inputs[1:]], attrs)


# ------------------------------------------------------------------------------------------------ Concat, Split


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    shapes = [[(1, 3, 4), (2, 3, 4)], [(2, 1, 4), (2, 3, 4), (2, 2, 4)], [(2, 3, 1), (2, 3, 2), (2, 3, 4)]][
        axis
    ]
    xs = [rnd(*s, seed=k) for k, s in enumerate(shapes)]
    check("Concat", xs, {"axis": axis}, wrt=list(range(len(xs))))
    check("Concat", xs, {"axis": axis}, wrt=[1])  # one needed: a Slice instead of a Split
    check("Concat", xs[:1], {"axis": axis})


@pytest.mark.parametrize(
    "inputs,attrs,n",
    [
        ([(2, 6), ints(1, 3, 2)], {"axis": 1}, 3),
        ([(6, 2), ints(4, 2)], {"axis": -2}, 2),
        ([(2, 6)], {"axis": 1, "num_outputs": 3}, 3),
        ([(7, 2)], {"num_outputs": 3}, 3),  # uneven: 3, 3, 1
        ([(3, 2), ints(3)], None, 1),
    ],
    ids=str,
)
def test_split(inputs, attrs, n):
    check("Split", [rnd(*inputs[0]), *inputs[1:]], attrs, n_outputs=n)


def test_split_with_unused_outputs_gets_zeros_there():
    x = rnd(7, 2)
    r = rnd(3, 2, seed=3)
    nodes = [
        Node("Split", ("x",), ("y0", "y1", "y2"), {"num_outputs": 3}),
        Node("Mul", ("y1", "r"), ("t",)),
        Node("ReduceSum", ("t",), ("loss",), {"keepdims": 0}),
    ]
    feeds = {"x": x, "r": r}
    _, (got,) = grads_of(nodes, feeds, "loss", ["x"])
    np.testing.assert_array_equal(got, np.concatenate([np.zeros((3, 2)), r, np.zeros((1, 2))]))


# ------------------------------------------------------------------------------------------------ Slice, Pad


@pytest.mark.parametrize(
    "shape,starts,ends,axes,steps",
    [
        ((5, 7), (1,), (4,), None, None),
        ((5, 7), (1, -1), (4, -8), (0, 1), (1, -2)),
        ((6, 7, 3), (0, 6), (5, 1), (0, 1), (2, -2)),
        ((6, 7), (-1,), (-100,), (0,), (-3,)),
        ((6, 7), (-100, 2), (100, 100), (-1, 0), (3, 1)),
        ((6, 7), (2,), (2,), (1,), None),  # empty result
        ((4, 5, 6), (1, 0, 5), (3, 5, 0), (0, 1, 2), (1, 2, -2)),
        ((9,), (8,), (0,), None, (-4,)),
    ],
    ids=str,
)
def test_slice(shape, starts, ends, axes, steps):
    inputs = [rnd(*shape), ints(*starts), ints(*ends)]
    if axes is not None or steps is not None:
        inputs.append(ints(*(axes or range(len(starts)))))
    if steps is not None:
        inputs.append(ints(*steps))
    check("Slice", inputs)


@pytest.mark.parametrize(
    "pads,extra,mode",
    [
        ((1, 0, 2, 3), [], "constant"),
        ((1, -1, 2, 2), [], "constant"),
        ((-1, -2, 0, -1), [], "constant"),
        ((1, 2), [None, ints(-1)], "constant"),
        ((1, 2, 2, 1), [None, ints(1, 0)], "edge"),
        ((0, 3, 0, 2), [], "edge"),
        ((2, -1, 1, 2), [], "reflect"),
        ((0, 3, 1, 0), [], "reflect"),
    ],
    ids=str,
)
def test_pad(pads, extra, mode):
    check("Pad", [rnd(3, 5), ints(*pads), *extra], {"mode": mode})


def test_pad_constant_value_gradient():
    check("Pad", [rnd(3, 4), ints(1, -1, 2, 2), np.array(0.7)], wrt=[0, 2])
    check("Pad", [rnd(3, 4), ints(1, 0, 0, 2), np.array([0.7])], wrt=[2])


@pytest.mark.parametrize("pads", [(1, 2, 2, 1), (5, 0, 0, 7), (-1, 2, 4, -2)], ids=str)
def test_pad_wrap(pads):
    # wrap is an opset-19 mode: grad_harness's onnxruntime check runs at 18, so it runs here at 19
    x = rnd(3, 4)
    check("Pad", [x, ints(*pads)], {"mode": "wrap"}, ort=False)
    check_against_onnxruntime("Pad", [x, ints(*pads)], {"mode": "wrap"}, wrt=[0], opset=19)


# ------------------------------------------------------------------------------------------------ gathers


@pytest.mark.parametrize(
    "shape,indices,axis",
    [
        ((5, 3), ints(0, 4, 4, -1, 2), 0),  # duplicates and a negative index
        ((6, 4), ints([1, 1], [5, 0], [1, 3]), 0),  # embedding-like: 2-D ids
        ((2, 5, 3), np.array([[1, 1], [0, 4]], np.int32), 1),
        ((2, 5), ints(3), -1),  # 0-d index: the axis disappears
        ((3, 4, 2), ints(-1, 0, -1), -2),
        ((4,), ints(2, 2, 2), 0),
    ],
    ids=str,
)
def test_gather(shape, indices, axis):
    check("Gather", [rnd(*shape), indices], {"axis": axis})


@pytest.mark.parametrize(
    "shape,indices,axis",
    [
        ((3, 4), ints([0, 2, 2, 0], [1, 1, 0, 2]), 0),
        ((3, 4), ints([3, -1], [0, 0], [1, 2]), 1),  # indices smaller than data off the axis
        ((2, 3, 2), ints([[0, 1]], [[2, 2]]), -2),
    ],
    ids=str,
)
def test_gather_elements(shape, indices, axis):
    check("GatherElements", [rnd(*shape), indices], {"axis": axis})


def test_gather_nd():
    check("GatherND", [rnd(3, 4, 2), ints([0, 1], [2, 3], [0, 1])])
    check("GatherND", [rnd(3, 4, 2), ints([[2], [0]], [[2], [-1]])])


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter(reduction):
    attrs = {"reduction": reduction}
    check("ScatterElements", [rnd(3, 4), ints([0, 2], [1, 1]), rnd(2, 2, seed=2)], attrs, wrt=[0, 2])
    check(
        "ScatterElements", [rnd(3, 4), ints([0, -1, 2]), rnd(1, 3, seed=2)], {**attrs, "axis": 1}, wrt=[0, 2]
    )
    check("ScatterND", [rnd(3, 4), ints([0], [2]), rnd(2, 4, seed=2)], attrs, wrt=[0, 2])
    check("ScatterND", [rnd(3, 4), ints([0, 1], [2, 3], [1, 1]), rnd(3, seed=2)], attrs, wrt=[2])


# ------------------------------------------------------------------------------------------------ Resize


def f32(*v):
    return np.array(v, np.float32)


@pytest.mark.parametrize(
    "shape,roi,scales,sizes,attrs",
    [
        ((1, 2, 3, 4), None, f32(1, 1, 2, 1.5), None, {"mode": "nearest"}),
        ((1, 2, 3, 4), None, f32(1, 1, 2, 1.5), None, {"mode": "linear"}),
        ((1, 2, 3, 4), None, f32(1, 1, 2, 1.5), None, {"mode": "cubic"}),
        ((1, 2, 6, 8), None, None, ints(1, 2, 4, 3), {"mode": "linear", "antialias": 1}),
        (
            (2, 3, 4),
            None,
            None,
            ints(3, 4, 7),
            {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
        ),
        ((1, 1, 3, 4), None, None, ints(1, 1, 6, 3), {"mode": "cubic", "exclude_outside": 1}),
        (
            (1, 1, 4, 4),
            f32(0, 0, 0.2, 0.1, 1, 1, 0.9, 1.2),
            None,
            ints(1, 1, 3, 5),
            {
                "mode": "linear",
                "coordinate_transformation_mode": "tf_crop_and_resize",
                "extrapolation_value": 2.0,
            },
        ),
        (
            (1, 1, 4, 4),
            None,
            f32(1, 1, 0.6, 2.5),
            None,
            {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
        ),
        ((2, 3, 4), None, f32(2, 1.5), None, {"mode": "linear", "axes": [0, -1]}),
    ],
    ids=str,
)
def test_resize(shape, roi, scales, sizes, attrs):
    check("Resize", [rnd(*shape), roi, scales, sizes], attrs)


# ------------------------------------------------------------------------------------------------ unsupported


@pytest.mark.parametrize(
    "op,inputs,attrs,wrt",
    [
        ("GatherND", [(2, 3, 2), ints([1], [0])], {"batch_dims": 1}, [0]),
        ("ScatterElements", [(3, 4), ints([0, 2]), (1, 2)], {"reduction": "mul"}, [0]),
        ("Slice", [(5, 4), ints(1), ints(3)], None, [0, 1]),  # starts computed at run time
        ("Resize", [(1, 1, 2, 2), None, f32(1, 1, 2, 2)], None, [0, 2]),  # scales computed at run time
    ],
    ids=str,
)
def test_unsupported_names_the_node(op, inputs, attrs, wrt):
    data = [rnd(*x) if isinstance(x, tuple) else x for x in inputs]
    with pytest.raises(UnsupportedError, match="under_test"):
        build(op, data, attrs, wrt, 1, 0, np.float64)
