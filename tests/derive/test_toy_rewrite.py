"""A new rewrite is one module: this file defines a toy one and nothing else in edgetrain knows it. ScaleWeight stores
one weight multiplied by a constant c at convert (the graph reads it through a Mul by 1/c, so the model computes
what it did) and undoes that at export (the Mul goes, the weight is divided back). Its section is registered here
and read back by the artifact's reader; convert, train, checkpoint, resume, run and export handle it through the
Rewrite and Section hooks alone. c is a power of two, so storing and undoing are exact and the comparisons with the
model without the rewrite are bit for bit; the trained weight is checked against the closed form of SGD on it."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import MODELS, batch_for

import edgetrain as et
from edgetrain.core.container import short
from edgetrain.core.errors import ArtifactError
from edgetrain.core.ir import Node, TensorInfo
from edgetrain.derive.rewrite import Conversion, Rewrite
from edgetrain.graph.fields import Reader
from edgetrain.graph.sections import ExportView, Section, register

ROOT = Path(__file__).resolve().parents[2]
WEIGHT, FACTOR = "fc1.weight", 4.0


@register
class ScaledWeightSection(Section):
    """The device's part: which weight is stored scaled, by what, and the node that unscales it."""

    KEY = "scaled_weight"

    def __init__(self, weight: str, factor: float, node: str, output: str):
        self.weight, self.factor, self.node, self.output = weight, factor, node, output

    @classmethod
    def read(cls, value: Any, r: Reader) -> ScaledWeightSection:
        base = r.context["base"]
        ok = isinstance(value, dict) and isinstance(value.get("factor"), (int, float))
        ok = ok and math.isfinite(value["factor"]) and value["factor"] != 0
        ok = (
            ok
            and value.get("weight") in base.initializers
            and value.get("node") in {n.name for n in base.nodes}
        )
        if not ok or not isinstance(value.get("output"), str):
            raise r.bad(
                f"its scaled weight {short(value)} names no weight and node of the model, or no factor"
            )
        return cls(value["weight"], float(value["factor"]), value["node"], value["output"])

    def to_json(self):
        return {"weight": self.weight, "factor": self.factor, "node": self.node, "output": self.output}, {}

    def export(self, view: ExportView, options: dict[str, Any]) -> ExportView:
        nodes = [
            n.replace(inputs=tuple(self.weight if i == self.output else i for i in n.inputs))
            for n in view.graph.nodes
            if n.name != self.node
        ]
        read = {i for n in nodes for i in n.inputs}
        inits = {k: v for k, v in view.graph.initializers.items() if k in read or k in view.graph.outputs}
        values = {
            k: v
            for k, v in view.graph.values.items()
            if k != self.output and (k in inits or k not in view.graph.initializers)
        }
        graph = view.graph.copy(nodes=nodes, values=values, initializers=inits)
        params = {**view.params, self.weight: view.params[self.weight] / np.float32(self.factor)}
        return replace(view, graph=graph, params=params)


class ScaleWeight(Rewrite):
    """The build side: the weight stored times `factor`, read through a Mul by 1 / factor."""

    KEY = "scaled_weight"

    def __init__(self, weight: str, factor: float):
        self.weight, self.factor = weight, factor

    def roles_found(self, c: Conversion) -> None:
        g = c.graph
        node, out = f"{self.weight}/unscale", f"{self.weight}.unscaled"
        inverse = f"{self.weight}.inverse_scale"
        nodes = [n.replace(inputs=tuple(out if i == self.weight else i for i in n.inputs)) for n in g.nodes]
        g.initializers[self.weight] = g.initializers[self.weight] * np.float32(self.factor)
        g.initializers[inverse] = np.asarray(1 / self.factor, np.float32)
        g.values[inverse] = TensorInfo(np.dtype("float32"), ())
        g.values[out] = g.values[self.weight]
        g.nodes[:] = [Node("Mul", (self.weight, inverse), (out,), {}, node), *nodes]
        c.found[self.KEY] = (node, out)

    def section(self, c: Conversion, art: Any) -> ScaledWeightSection:
        node, out = c.found[self.KEY]
        return ScaledWeightSection(self.weight, self.factor, node, out)


def _convert(**kw):
    return et.convert(
        MODELS["mlp"][0](), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.1), batch_size=8, **kw
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("toy")
    paths = {"plain": d / "plain.etrain", "scaled": d / "scaled.etrain"}
    _convert().save(paths["plain"])
    art = _convert(rewrites=[ScaleWeight(WEIGHT, FACTOR)])
    assert art.section(ScaledWeightSection) is not None
    art.save(paths["scaled"])
    return paths


def test_the_section_is_written_and_read_back(files):
    sess = et.TrainingSession(files["scaled"])
    s = sess.record.section(ScaledWeightSection)
    assert (s.weight, s.factor) == (WEIGHT, FACTOR)
    plain = et.TrainingSession(files["plain"])
    np.testing.assert_array_equal(sess.parameters()[WEIGHT], plain.parameters()[WEIGHT] * np.float32(FACTOR))


def test_runs_and_exports_the_model_it_came_from_before_training(files, tmp_path):
    x, _ = batch_for("mlp", 8)
    sess, plain = et.TrainingSession(files["scaled"]), et.TrainingSession(files["plain"])
    np.testing.assert_array_equal(sess.run(x), plain.run(x))
    sess.export_onnx(tmp_path / "scaled.onnx")
    plain.export_onnx(tmp_path / "plain.onnx")
    a, b = onnx.load(str(tmp_path / "scaled.onnx")), onnx.load(str(tmp_path / "plain.onnx"))
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node]
    weights = [{t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer} for m in (a, b)]
    assert weights[0].keys() == weights[1].keys()
    for name in weights[1]:
        np.testing.assert_array_equal(weights[0][name], weights[1][name], err_msg=name)


def test_trains_as_sgd_on_the_scaled_weight_and_exports_it_unscaled(files, tmp_path):
    """One SGD step on the stored weight Ws = c W moves it by lr * g / c, so the model's W moves by lr * g / c**2,
    where g is the plain model's gradient (its own first step: (W0 - W1) / lr). The export holds W, and onnxruntime
    runs it as the session does."""
    x, y = batch_for("mlp", 8)
    plain, sess = et.TrainingSession(files["plain"]), et.TrainingSession(files["scaled"])
    w0 = plain.parameters()[WEIGHT].astype(np.float64)
    assert plain.train_step(x, y) == sess.train_step(x, y)  # the same model, the same loss
    g = (w0 - plain.parameters()[WEIGHT]) / 0.1
    sess.export_onnx(tmp_path / "trained.onnx")
    exported = {
        t.name: onnx.numpy_helper.to_array(t)
        for t in onnx.load(str(tmp_path / "trained.onnx")).graph.initializer
    }
    np.testing.assert_allclose(exported[WEIGHT], w0 - 0.1 * g / FACTOR**2, rtol=0, atol=1e-6)
    got = ort.InferenceSession(str(tmp_path / "trained.onnx")).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, sess.run(x), rtol=1e-5, atol=1e-5)


def test_a_checkpoint_resumes_bit_for_bit(files, tmp_path):
    x, y = batch_for("mlp", 8)
    whole = et.TrainingSession(files["scaled"])
    losses = [whole.train_step(x, y) for _ in range(5)]
    first = et.TrainingSession(files["scaled"])
    got = [first.train_step(x, y) for _ in range(3)]
    first.save_checkpoint(tmp_path / "c.etck")
    second = et.TrainingSession(files["scaled"])
    second.load_checkpoint(tmp_path / "c.etck")
    got += [second.train_step(x, y) for _ in range(2)]
    assert got == losses
    for k, v in whole.parameters().items():
        np.testing.assert_array_equal(second.parameters()[k], v, err_msg=k)


def test_an_edgetrain_that_does_not_know_the_rewrite_refuses_its_artifact(files):
    """In a process that never imports this module, the section is unknown: the artifact is refused, not trained
    and exported without the undoing."""
    code = f"import edgetrain as et; et.TrainingSession({str(files['scaled'])!r})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode != 0 and "holds 'scaled_weight', a part of the training program" in proc.stderr
    assert "ArtifactError" in proc.stderr and ArtifactError.__name__ == "ArtifactError"
