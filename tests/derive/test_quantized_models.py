"""Whole int8 models, quantized in the test by onnxruntime.quantization (quant_pre_process, then quantize_static
in the QDQ and QOperator forms with a small calibration reader, and quantize_dynamic), from the shipped digits
LeNet and, when torch is installed, a torch-exported MLP, CNN and transformer encoder layer: et.InferenceSession
runs them, and its outputs are compared with onnxruntime's on the same inputs.

onnxruntime on x86 without VNNI multiplies uint8 activations by int8 weights with vpmaddubsw, which saturates pairs
of products to int16; edgetrain computes the exact sums the spec defines. So the forms with mixed signedness are
quantized with reduce_range=True (7-bit weights: no pair saturates), or uint8 weights for dynamic quantization,
where both must agree to the bit; the default U8S8 form is run too and its difference reported."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest

import edgetrain as et

DATA = Path(et.__file__).parent / "data"
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _torch_models(folder: Path) -> dict[str, tuple[Path, tuple[int, ...]]]:
    import torch  # optional: only these models need it

    torch.manual_seed(0)

    class Encoder(torch.nn.Module):
        """One transformer encoder layer written out (torch's own exports SDPA, which its tracer refuses)."""

        def __init__(self, d=16, heads=2):
            super().__init__()
            self.h = heads
            self.qkv, self.o = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.n1, self.n2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.ff = torch.nn.Sequential(torch.nn.Linear(d, 32), torch.nn.GELU(), torch.nn.Linear(32, d))

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(x).chunk(3, -1)

            def split(z):
                return z.reshape(b, t, self.h, d // self.h).transpose(1, 2)

            att = torch.softmax(split(q) @ split(k).transpose(-1, -2) * (d // self.h) ** -0.5, -1) @ split(v)
            x = self.n1(x + self.o(att.transpose(1, 2).reshape(b, t, d)))
            return self.n2(x + self.ff(x))

    nets = {
        "mlp": (
            torch.nn.Sequential(
                torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10), torch.nn.Sigmoid()
            ),
            (2, 16),
        ),
        "cnn": (
            torch.nn.Sequential(
                torch.nn.Conv2d(3, 8, 3, padding=1),
                torch.nn.LeakyReLU(0.1),
                torch.nn.Conv2d(8, 8, 3, groups=8),
                torch.nn.ReLU(),
                torch.nn.AdaptiveAvgPool2d(1),
                torch.nn.Flatten(),
                torch.nn.Linear(8, 5),
            ),
            (2, 3, 10, 10),
        ),
        "encoder": (Encoder(), (2, 5, 16)),
    }
    out = {}
    for name, (net, shape) in nets.items():
        path = folder / f"{name}.onnx"
        torch.onnx.export(
            net.eval(), torch.randn(*shape), str(path), input_names=["x"], dynamo=False, opset_version=17
        )
        out[name] = (path, shape)
    return out


class _Reader:
    """onnxruntime's CalibrationDataReader protocol: a few seeded batches."""

    def __init__(self, name: str, shape: tuple[int, ...]):
        self._it = iter(
            [{name: np.random.default_rng(k).standard_normal(shape).astype(np.float32)} for k in range(4)]
        )

    def get_next(self):
        return next(self._it, None)


FORMS = [
    "qdq",
    "qdq_per_channel",
    "qoperator",
    "qoperator_per_channel",
    "qoperator_u8s8",
    "dynamic",
    "dynamic_s8",
]
EXACT = {"qdq", "qdq_per_channel", "qoperator", "qoperator_per_channel", "dynamic"}


def _quantize(src: Path, shape, form: str, folder: Path) -> Path:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = folder / f"{src.stem}_pre.onnx"
    if not pre.exists():
        quant_pre_process(str(src), str(pre))
    out = folder / f"{src.stem}_{form}.onnx"
    name = onnx.load(str(pre)).graph.input[0].name
    if form.startswith("dynamic"):
        weight = QuantType.QInt8 if form == "dynamic_s8" else QuantType.QUInt8
        quantize_dynamic(str(pre), str(out), weight_type=weight)
        return out
    qdq = form.startswith("qdq")
    quantize_static(
        str(pre),
        str(out),
        _Reader(name, shape),
        quant_format=QuantFormat.QDQ if qdq else QuantFormat.QOperator,
        per_channel=form.endswith("per_channel"),
        activation_type=QuantType.QInt8 if qdq else QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        reduce_range=not qdq and form != "qoperator_u8s8",
    )
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("quantized")
    found = {"lenet": (DATA / "digits_lenet.onnx", (3, 1, 28, 28))}
    if HAS_TORCH:
        found.update(_torch_models(folder))
    return folder, found


def _ort(path: Path, feeds):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)


NAMES = ["lenet", "mlp", "cnn", "encoder"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", NAMES)
def test_quantized_model_matches_onnxruntime(models, name, form, report):
    folder, found = models
    if name not in found:
        pytest.skip("torch is not installed: the torch-exported models cannot be made")
    src, shape = found[name]
    path = _quantize(src, shape, form, folder)
    model = onnx.load(str(path))
    x = np.random.default_rng(99).standard_normal(shape).astype(np.float32)
    feeds = {model.graph.input[0].name: x}
    ref = _ort(path, feeds)
    sess = et.InferenceSession(str(path))
    got = sess.run(None, feeds)
    ops = sorted({(n.domain + ":" if n.domain else "") + n.op_type for n in model.graph.node})
    diff = max(float(np.max(np.abs(g.astype(np.float64) - r))) for g, r in zip(got, ref))
    report(
        "quantized models: max |edgetrain - onnxruntime|",
        f"{name:8s} {form:22s} {diff:.3g}  ({' '.join(ops)})",
    )
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype
        if form in EXACT:
            np.testing.assert_allclose(g, r, rtol=2e-7, atol=1e-7 * max(1.0, float(np.abs(r).max())))
        else:  # onnxruntime's saturated pairs: close, not equal
            np.testing.assert_allclose(g, r, atol=0.35 * max(1.0, float(np.abs(r).max())))
    # int8 weights stay int8: no DequantizeLinear of a weight is folded into a float constant
    ints = [v for v in sess.graph.initializers.values() if v.dtype in (np.int8, np.uint8) and v.size > 16]
    assert ints, "the int8 weights were folded to float"


def test_quantized_lenet_artifact_keeps_int8_and_check_does_not_crash(tmp_path):
    """The QDQ LeNet: `edgetrain check` reports, and the session's graph stores its weights as int8."""
    pytest.importorskip("onnxruntime.quantization")
    path = _quantize(DATA / "digits_lenet.onnx", (3, 1, 28, 28), "qdq", tmp_path)
    sess = et.InferenceSession(str(path))
    int8 = sum(v.nbytes for v in sess.graph.initializers.values() if v.dtype == np.int8)
    floats = sum(v.nbytes for v in sess.graph.initializers.values() if v.dtype == np.float32)
    assert int8 > 4 * floats, (int8, floats)
    from edgetrain.cli import main

    code = main(["check", str(path)])
    assert code in (0, 1)
