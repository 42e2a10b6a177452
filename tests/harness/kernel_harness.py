"""Independent references for kernel tests: onnxruntime and onnx's ReferenceEvaluator on one-node models,
and onnx's own node test cases (onnx.backend.test.case.node) as (inputs, attributes, expected outputs)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

REF_OPSET = 21  # what the installed onnxruntime runs for every op we test


def one_node_model(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any] | None = None,
    *,
    n_outputs: int = 1,
    opset: int = REF_OPSET,
) -> onnx.ModelProto:
    """A model of one node; None inputs become omitted optional inputs ("", or dropped when trailing)."""
    inputs = list(inputs)
    while inputs and inputs[-1] is None:
        inputs.pop()
    in_names, vis = [], []
    for k, x in enumerate(inputs):
        if x is None:
            in_names.append("")
            continue
        name = f"in{k}"
        in_names.append(name)
        x = np.asarray(x)
        vis.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape))
    out_names = [f"out{k}" for k in range(n_outputs)]
    node = helper.make_node(op_type, in_names, out_names, **(attrs or {}))
    graph = helper.make_graph(
        [node], "one_node", vis, [helper.make_empty_tensor_value_info(n) for n in out_names]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _feeds(inputs: Sequence[np.ndarray | None]) -> dict[str, np.ndarray]:
    """The feeds of one_node_model: in0, in1, ... for the inputs given (None ones are omitted)."""
    return {f"in{k}": np.asarray(x) for k, x in enumerate(inputs) if x is not None}


def ort_run(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any] | None = None,
    *,
    n_outputs: int = 1,
    opset: int = REF_OPSET,
) -> list[np.ndarray]:
    """Runs the one-node model in onnxruntime (1 thread) and returns its outputs."""
    import onnxruntime as ort

    model = one_node_model(op_type, inputs, attrs, n_outputs=n_outputs, opset=opset)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3  # one-node models declare no output shapes: ort warns on each
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, _feeds(inputs))


def ref_run(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any] | None = None,
    *,
    n_outputs: int = 1,
    opset: int = REF_OPSET,
) -> list[np.ndarray]:
    """Runs the one-node model in onnx's ReferenceEvaluator (for what onnxruntime lacks)."""
    from onnx.reference import ReferenceEvaluator

    model = one_node_model(op_type, inputs, attrs, n_outputs=n_outputs, opset=opset)
    return ReferenceEvaluator(model).run(None, _feeds(inputs))


@functools.cache
def _all_cases() -> tuple:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(collect_testcases(None))


def node_cases(op_type: str):
    """onnx's own test cases for op_type whose model is that single node: yields
    (case name, opset, inputs by position (None for omitted), attrs dict, expected outputs, rtol, atol)."""
    for case in _all_cases():
        if case.model is None or len(case.model.graph.node) != 1:
            continue
        node = case.model.graph.node[0]
        if node.op_type != op_type or node.domain not in ("", "ai.onnx"):
            continue
        opset = next(o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx"))
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
        attrs = {
            k: (numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v) for k, v in attrs.items()
        }
        for inputs, outputs in case.data_sets:
            it = iter(inputs)
            pos = [None if name == "" else next(it) for name in node.input]
            yield case.name, opset, pos, attrs, list(outputs), case.rtol, case.atol


def assert_close(
    actual: np.ndarray, expected: np.ndarray, *, rtol: float = 1e-5, atol: float = 1e-6, what: str = ""
) -> None:
    """Same shape and dtype, values within tolerance (NaNs in the same places)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if actual.dtype.kind in "fc":
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what, equal_nan=True)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=what)


def spy(monkeypatch, module, name: str) -> list:
    """Wraps module.name so that each call appends 1 to the returned list: a test can check a path was taken."""
    calls: list = []
    fn = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a: calls.append(1) or fn(*a))
    return calls
