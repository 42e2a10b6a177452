"""Every optimized path at once against the plain interpreter (issue 25): the same model converted and trained with
all fast paths on (the default) and with all of them off (edgetrain.core.fastpaths.plain()) gives the same losses
and weights, within 1e-6 relative, over a few device steps (the saved artifact, its memory plan, the fused
optimizer), on the test models, the onnx zoo's light models and real torchvision exports."""

from __future__ import annotations

import numpy as np
import pytest
from models import MODELS, batch_for

import edgetrain as et
from edgetrain.core import fastpaths

STEPS = 2


def _train(model, x, y, tmp_path, tag: str, *, batch: int, lr: float):
    art = et.convert(
        model,
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=lr, momentum=0.9, weight_decay=5e-4),
        batch_size=batch,
    )
    path = tmp_path / f"{tag}.etrain"
    art.save(path)
    sess = et.TrainingSession(path)
    losses = [sess.train_step(x, y) for _ in range(STEPS)]
    return losses, sess.parameters()


def _same(model, x, y, tmp_path, *, batch: int, lr: float = 0.01) -> None:
    fast = _train(model, x, y, tmp_path, "fast", batch=batch, lr=lr)
    with fastpaths.plain():
        plain = _train(model, x, y, tmp_path, "plain", batch=batch, lr=lr)
    np.testing.assert_allclose(fast[0], plain[0], rtol=1e-6)
    assert fast[1].keys() == plain[1].keys()
    for name, p in plain[1].items():
        scale = max(1.0, float(np.max(np.abs(p))))
        err = float(np.max(np.abs(fast[1][name] - p))) if p.size else 0.0
        assert err <= 1e-6 * scale, (name, err)
    assert np.isfinite(fast[0]).all()


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("batch", [1, 8])
def test_fast_paths_equal_the_plain_interpreter_on_the_test_models(name, batch, tmp_path):
    x, y = batch_for(name, batch)
    _same(MODELS[name][0](), x, y, tmp_path, batch=batch)


@pytest.mark.slow
# (a few of each kind: the whole zoo trains in tests/derive/test_training_zoo.py; here each model converts
# and trains twice)
@pytest.mark.parametrize("name", ["squeezenet", "inception_v1"])
def test_fast_paths_equal_the_plain_interpreter_on_the_zoo(name, tmp_path):
    from zoo import load, randomize_weights

    model = randomize_weights(load(name), seed=sum(map(ord, name)))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    _same(model, x, np.array([7]), tmp_path, batch=1, lr=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small"])
def test_fast_paths_equal_the_plain_interpreter_on_torchvision_exports(name, tmp_path):
    exports = pytest.importorskip("exports", reason="needs torch and torchvision (tests/harness/exports.py)")
    e = exports.export(name, tmp_path, exporter="torchscript", mode="eval", batch=4)
    import onnx

    dims = [int(d.dim_value) for d in onnx.load(str(e.path)).graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(dims).astype(np.float32)
    _same(str(e.path), x, rng.integers(0, 10, dims[0]), tmp_path, batch=dims[0], lr=1e-3)
