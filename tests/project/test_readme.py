"""The ```python blocks of README.md and of every docs/*.md page run as written, each page's in order, in one
namespace, on the files they name; what docs/python.md's print or save is checked against onnxruntime and numpy."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from doc_commands import DOCS, ROOT, page_name, pages, python_blocks
from onnx import TensorProto, helper, numpy_helper

import edgetrain as et

PYTHON_API = DOCS / "python.md"


def run_python_blocks(page: Path) -> dict:
    """Runs a page's ```python blocks in order in one namespace, and returns it."""
    ns: dict = {"__name__": "readme"}
    for before, code in python_blocks(page.read_text(encoding="utf-8")):
        # padded so that a traceback points at the page's own line
        exec(compile("\n" * before + code, str(page), "exec"), ns)
    return ns


def save(path: Path, nodes, x, y, inits: dict[str, np.ndarray]) -> None:
    graph = helper.make_graph(
        nodes,
        path.stem,
        [helper.make_tensor_value_info(*x)],
        [helper.make_tensor_value_info(*y)],
        [numpy_helper.from_array(a, name) for name, a in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)


def digits_classifier(path: Path) -> None:
    """The Python API page's model.onnx: MNIST-shaped 'input' [N, 1, 28, 28] -> Conv 5x5/2 -> Relu -> Flatten -> Gemm
    'fc' (what trainable=["fc.*"] selects) -> Softmax."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node(
            "Conv",
            ["input", "conv.weight", "conv.bias"],
            ["c"],
            kernel_shape=[5, 5],
            strides=[2, 2],
            name="conv",
        ),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]),
        helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"], transB=1, name="fc"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    inits = {
        "conv.weight": (rng.standard_normal((8, 1, 5, 5)) * np.sqrt(2 / 25)).astype(np.float32),
        "conv.bias": np.zeros(8, np.float32),
        "fc.weight": (rng.standard_normal((10, 8 * 12 * 12)) * np.sqrt(1 / 1152)).astype(np.float32),
        "fc.bias": np.zeros(10, np.float32),
    }
    save(
        path,
        nodes,
        ("input", TensorProto.FLOAT, ["N", 1, 28, 28]),
        ("probs", TensorProto.FLOAT, ["N", 10]),
        inits,
    )


def regressor(path: Path) -> None:
    """The Python API page's regressor.onnx: x [b, 8] -> Gemm -> [b, 1], its batch symbolic as exporters leave it."""
    w = np.random.default_rng(1).standard_normal((1, 8)).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "W", "B"], ["y"], transB=1)]
    inits = {"W": w, "B": np.zeros(1, np.float32)}
    save(path, nodes, ("x", TensorProto.FLOAT, ["b", 8]), ("y", TensorProto.FLOAT, ["b", 1]), inits)


@pytest.fixture
def readme_dir(tmp_path, monkeypatch):
    """A directory holding what the pages' Python reads: model.onnx, regressor.onnx and mnist/ (the shipped digits)."""
    digits_classifier(tmp_path / "model.onnx")
    regressor(tmp_path / "regressor.onnx")
    shutil.copytree(ROOT / "edgetrain" / "data" / "digits", tmp_path / "mnist")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_python_api_page_has_its_examples():
    assert len(python_blocks(PYTHON_API.read_text(encoding="utf-8"))) >= 5, (
        "docs/python.md's examples were not found"
    )


@pytest.mark.parametrize(
    "page", [p for p in pages() if python_blocks(p.read_text(encoding="utf-8"))], ids=page_name
)
def test_a_pages_python_blocks_run_as_written(page, readme_dir):
    ns = run_python_blocks(page)  # an example that raises fails here, at its page's line
    if page == PYTHON_API:
        check_the_python_api_page(ns, readme_dir)


def check_the_python_api_page(ns: dict, readme_dir: Path) -> None:
    """What docs/python.md's examples made: checked against onnxruntime and numpy."""
    # InferenceSession and import_model
    assert ns["probs"].shape == (8, 10) and np.allclose(ns["probs"].sum(1), 1, atol=1e-5)
    assert ns["graph"].values["input"].shape == (8, 1, 28, 28)

    # the emitted step: onnxruntime runs it on data, target and lr alone, with a fresh session's loss
    x, y = ns["x"], ns["y"]
    step = ns["step"]
    onnx.checker.check_model(step)
    o = ort.InferenceSession(step.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in o.get_inputs()]
    assert len(names) == 3
    ort_loss = float(o.run(None, dict(zip(names, (x, y, np.asarray(0.01, np.float32)))))[0])
    assert et.TrainingSession("model.etrain").train_step(x, y) == pytest.approx(ort_loss, rel=1e-5)
    assert ns["art"].parameters == ["W", "B"]  # by then `art` is the Huber example's

    # the personalized model exported after one step holds that checkpoint's weights
    sess = et.TrainingSession("model.etrain")
    sess.load_checkpoint("ckpt.etck")
    o = ort.InferenceSession("personalized.onnx", providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(o.run(None, {"input": x})[0], sess.run(x), rtol=1e-5, atol=1e-6)

    # the training loop: its history on disk is the result's, and the trained session beats chance
    result = ns["result"]
    lines = (readme_dir / "history.jsonl").read_text().splitlines()
    assert len(lines) == len(result.history) >= 1 and (readme_dir / "run.etck").exists()
    assert result.history[-1]["val_accuracy"] > 0.3

    # the custom loss is Huber's: 0.5 d^2 up to delta, delta (|d| - delta / 2) beyond, averaged
    ns["art"].save("huber.etrain")
    huber = et.TrainingSession("huber.etrain")
    xr = np.random.default_rng(2).standard_normal((16, 8)).astype(np.float32)
    target = np.random.default_rng(3).standard_normal((16, 1)).astype(np.float32) * 2
    loss, pred = huber.evaluate(xr, target)
    d = np.abs(pred.astype(np.float64) - target)
    want = np.where(d <= 0.5, 0.5 * d**2, 0.5 * (d - 0.25)).mean()
    assert loss == pytest.approx(want, rel=1e-5)
