"""LoRA adapters inserted into the imported graph (edgetrain.derive.adapters), against independent references:
edgetrain's own base model (step 0, bit for bit), onnxruntime for every export (merged, served with onnxruntime's
LoraAdapter files, two users on one base), numpy for the merged weights. Parity with PEFT on Hugging Face models is
tests/derive/test_lora_peft.py's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import edgetrain as et

DATA = Path(et.__file__).parent / "data"
LENET = DATA / "digits_lenet.onnx"


def _convert(lora=None, trainable=None, model=LENET):
    return et.convert(
        str(model),
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.05, momentum=0.9),
        batch_size=8,
        adapters=lora,
        trainable=trainable,
    )


def _batch(seed=0, n=8):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 1, 28, 28)).astype(np.uint8), rng.integers(0, 10, n)


def _ort(path, x, adapter=None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    options = None
    if adapter is not None:
        lora = ort.LoraAdapter()
        lora.Load(str(adapter))
        options = ort.RunOptions()
        options.add_active_adapter(lora)
    return sess.run(None, {"image": x}, options)[0]


def test_the_adapted_model_starts_as_the_base_model_bit_for_bit():
    base = et.TrainingSession(_convert())
    adapted = et.TrainingSession(_convert(et.LoRA(rank=4, alpha=8)))
    x, _ = _batch()
    np.testing.assert_array_equal(adapted.run(x), base.run(x))


def test_only_the_adapters_train_and_no_base_gradient_is_computed():
    art = _convert(et.LoRA(rank=4, alpha=8, targets=["fc1*", "fc2*"]))
    assert art.parameters == ["fc1.lora_A", "fc1.lora_B", "fc2.lora_A", "fc2.lora_B"]
    assert art.initial["fc1.lora_A"].shape == (400, 4) and art.initial["fc1.lora_B"].shape == (4, 120)
    bound = 1 / np.sqrt(400)  # PEFT's kaiming_uniform_(a=sqrt(5)) on lora_A [rank, in]
    assert np.abs(art.initial["fc1.lora_A"]).max() <= bound and not np.any(art.initial["fc1.lora_B"])
    weights = {w: art.inference.initializers[w].shape for w in ("fc1.weight", "fc2.weight", "conv1.weight")}
    backward = art.graph.nodes[len(art.inference.nodes) :]
    made = [art.graph.values[o].shape for n in backward for o in n.outputs if o in art.graph.values]
    for w, shape in weights.items():  # no weight gradient of the base: no backward value of a weight's shape
        assert tuple(shape) not in made and tuple(shape[::-1]) not in made, w
    assert not any(
        n.op_type.startswith("Conv") for n in backward
    )  # nothing below the adapters is differentiated


def test_exports_merged_and_served_to_two_users_equal_their_sessions(tmp_path):
    """Two users train their own adapters on one base; the merged export of each equals its session in
    onnxruntime, and one served base with each user's onnxruntime adapter file equals that user's merged model."""
    lora = et.LoRA(rank=4, alpha=8, targets=["fc*"])
    art = _convert(lora)
    x, _ = _batch(9)
    users = []
    for seed in (1, 2):
        sess = et.TrainingSession(art)
        xs, ys = _batch(seed)
        for _ in range(4):
            sess.train_step(xs, ys)
        merged = tmp_path / f"merged{seed}.onnx"
        sess.export_onnx(merged)
        np.testing.assert_allclose(_ort(merged, x), sess.run(x), rtol=1e-5, atol=1e-6)
        model = onnx.load(str(merged))
        src = onnx.load(str(LENET))
        assert sorted(
            n.op_type for n in model.graph.node if not n.name.startswith("preprocessing")
        ) == sorted(n.op_type for n in src.graph.node)  # the original graph: a drop-in replacement
        w = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        p = sess.parameters()
        base = {i.name: numpy_helper.to_array(i) for i in src.graph.initializer}
        np.testing.assert_allclose(  # Gemm(transB=1): W [out, in] + (alpha / rank) (A B)^T
            w["fc1.weight"],
            base["fc1.weight"] + 2.0 * (p["fc1.lora_A"] @ p["fc1.lora_B"]).T,
            rtol=1e-5,
            atol=1e-7,
        )
        adapter = tmp_path / f"user{seed}.onnx_adapter"
        assert sess.export_adapters(adapter, format="onnxruntime") > 0
        users.append((merged, adapter, sess))
        sess.export_onnx(tmp_path / "served.onnx", adapters="serving")
    for merged, adapter, _sess in users:
        np.testing.assert_allclose(
            _ort(tmp_path / "served.onnx", x, adapter), _ort(merged, x), rtol=1e-5, atol=1e-6
        )
    a, b = (_ort(tmp_path / "served.onnx", x, u[1]) for u in users)
    assert np.abs(a - b).max() > 1e-4  # two users, two models


def test_the_adapters_alone_round_trip_and_the_base_stays_bit_identical(tmp_path):
    art = _convert(et.LoRA(rank=2, alpha=4, targets="fc3*"))
    art.save(tmp_path / "m.etrain")
    sess = et.TrainingSession(str(tmp_path / "m.etrain"))
    x, y = _batch(3)
    for _ in range(3):
        sess.train_step(x, y)
    size = sess.export_adapters(tmp_path / "u.etad")
    assert size < 0.05 * (tmp_path / "m.etrain").stat().st_size  # a few KB against the model
    fresh = et.TrainingSession(str(tmp_path / "m.etrain"))
    fresh.load_adapters(tmp_path / "u.etad")
    np.testing.assert_array_equal(fresh.run(x), sess.run(x))
    sess.export_onnx(tmp_path / "s.onnx", adapters="serving")
    served = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / "s.onnx")).graph.initializer}
    src = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(LENET)).graph.initializer}
    for name, value in src.items():  # the frozen base, bit for bit
        assert served[name].tobytes() == value.tobytes(), name
    other = et.TrainingSession(_convert(et.LoRA(rank=3, alpha=4, targets="fc3*")))
    with pytest.raises(et.ArtifactError, match="another training program"):
        other.load_adapters(tmp_path / "u.etad")


def test_a_head_with_adapters_above_a_cached_frozen_prefix(tmp_path):
    """Adapters only in the top layers: the frozen prefix below the first adapter is cached; bit for bit the
    uncached training."""
    path = tmp_path / "m.etrain"
    _convert(et.LoRA(rank=4, alpha=8, targets=["fc2*", "fc3*"])).save(path)
    x, y = _batch(4, n=24)

    def train(cache):
        sess = et.TrainingSession(str(path))
        if cache:
            sess.enable_feature_cache()
        losses = [sess.train_step(x[i : i + 8], y[i : i + 8]) for _ in range(2) for i in range(0, 24, 8)]
        return losses, sess.parameters(), sess.feature_cache_info()

    (la, pa, info), (lb, pb, _) = train(True), train(False)
    assert info["enabled"] and info["hits"] == 24, info
    assert la == lb and all(np.array_equal(pa[k], pb[k]) for k in pb)


def test_bad_lora_settings_say_what_would_work():
    with pytest.raises(et.ConfigError, match="rank"):
        et.LoRA(rank=0)
    with pytest.raises(et.ConfigError, match="dropout"):
        et.LoRA(dropout=0.1)
    with pytest.raises(et.UnsupportedError) as e:
        _convert(et.LoRA(targets="*q_proj*"))
    assert "fc1.weight" in str(e.value)  # it lists the layers LoRA can adapt
    plain = et.TrainingSession(_convert())
    with pytest.raises(et.ConfigError, match="no adapters"):
        plain.export_adapters("x.etad")
