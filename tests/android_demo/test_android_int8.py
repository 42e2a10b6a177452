"""The on-phone loop (android_demo) with an int8 model: the shipped digits LeNet quantized to int8 QDQ by
onnxruntime's static quantizer (edgetrain.demo.quantize_model: per-channel int8 weights, calibrated on the base
model's training digits) and converted on the build side as the embedded artifact is, full and head-only. `init`
takes it; a burst trains its float master weights through fake quantization, is kept when validation says so and
rolled back bit for bit when not; a kill mid-burst leaves the previous version; the page's predictions are the int8
model's probabilities (not a softmax of them); a kept version exports as an int8 model that onnxruntime runs with
the app's own outputs; and the phone side of it runs with numpy alone (numpy 1.24 too)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from device import PYTHONS, run_on_device
from interrupts import Lines, finish, python_m

import edgetrain as et
from android_demo.app import Home
from android_demo.simulate import ARTIFACT, _new_user, heldout_accuracy
from edgetrain.demo import BASE_DIGITS, BASE_MODEL, quantize_model
from loaders import MnistDataView

ROOT = Path(__file__).resolve().parents[2]
USER, HELD = _new_user()  # raw 0..255 pixels, as a phone holds them
NEW_USER = ROOT / "edgetrain" / "data" / "newuser"


@pytest.fixture(scope="module")
def int8(tmp_path_factory) -> dict[str, Path]:
    """The int8 model and its artifacts, built as a workstation would: full ("full", as the embedded artifact:
    CrossEntropyLoss(ignore_index=-100), SGD 0.01 with momentum, batch 10) and head-only ("head", fc3 at 0.05)."""
    folder = tmp_path_factory.mktemp("int8")
    base = MnistDataView.from_dir(BASE_DIGITS, "train")
    quantize_model(BASE_MODEL, str(folder / "int8.onnx"), base.get_batch(np.arange(len(base)))[0])
    out = {"model": folder / "int8.onnx"}
    for name, lr, trainable in (("full", 0.01, None), ("head", 0.05, ["fc3*"])):
        art = et.convert(
            folder / "int8.onnx",
            loss=et.CrossEntropyLoss(ignore_index=-100),
            optimizer=et.SGD(lr=lr, momentum=0.9),
            trainable=trainable,
            batch_size=10,
        )
        out[name] = folder / f"{name}.etrain"
        art.save(out[name])
    return out


def home_with(tmp_path: Path, artifact: Path, n: int, **settings) -> Home:
    home = Home.init(tmp_path / "home", artifact, max_seconds=None, **settings)
    for i in range(n):
        home.add(*USER.get_item(i))
    return home


def app(*args, home: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "android_demo", "--home", str(home), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_the_command_line_takes_an_int8_model_end_to_end(int8, tmp_path):
    home = tmp_path / "phone"
    proc = app("init", "--artifact", int8["full"], home=home)
    assert proc.returncode == 0 and "an int8 model (QDQ form)" in proc.stdout, proc.stdout + proc.stderr
    assert app("add", "--data", NEW_USER, home=home).returncode == 0
    proc = app("personalize", "--json", "--max-steps", 25, "--max-seconds", 120, home=home)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["steps"] == 25 and r["kept"] and r["model_version"] == 1, r
    assert r["val_accuracy_after"] > r["val_accuracy_before"]
    e = json.loads(app("evaluate", "--data", NEW_USER, "--json", home=home).stdout)
    # the base int8 model: 39%; 25 steps of 7-bit weights: 49%
    assert e["samples"] == 400 and e["accuracy"] > 0.45
    st = json.loads(app("status", "--json", home=home).stdout)
    assert st["model_version"] == 1 and st["samples"] == 50
    init = Home(home).events("init")[0]
    assert init["int8"] == "qdq" and init["parameters"] == 61706


def test_a_kept_version_exports_as_the_int8_model_the_app_runs(int8, tmp_path):
    """`edgetrain export` of a kept version (a real process, build side): int8 QDQ as the model came, the trained
    weights requantized; onnxruntime with its graph optimizations off gives the app's outputs to the bit, with its
    defaults (fused integer kernels) within one output step; --float writes the float model."""
    home = home_with(tmp_path, int8["full"], 50, max_steps=25)
    assert home.personalize(force=True).kept
    x, _ = HELD.get_batch(np.arange(len(HELD)))
    phone = home.predict(x)
    for flag, name in (("", "v1.onnx"), ("--float", "v1-float.onnx")):
        cmd = [
            sys.executable,
            "-m",
            "edgetrain.cli",
            "export",
            home.path + "/model.etrain",
            "-o",
            tmp_path / name,
        ]
        cmd += ["--checkpoint", home.path + "/versions/v000001.etck"] + ([flag] if flag else [])
        proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    graph = onnx.load(str(tmp_path / "v1.onnx")).graph
    weights = [t for t in graph.initializer if t.name.endswith(".weight_quantized")]
    assert len(weights) == 5 and all(t.data_type == onnx.TensorProto.INT8 for t in weights)
    ops, shipped = (
        [n.op_type for n in graph.node],
        [n.op_type for n in onnx.load(str(int8["model"])).graph.node],
    )
    # the int8 model's nodes as they came, after the input pipeline (x / 255 of the raw uint8 pixels)
    assert ops[-len(shipped) :] == shipped and set(ops[: -len(shipped)]) <= {"Cast", "Div", "Identity"}, ops
    for level, atol in ((ort.GraphOptimizationLevel.ORT_DISABLE_ALL, 0.0), (None, 1 / 255 + 1e-6)):
        opts = ort.SessionOptions()
        if level is not None:
            opts.graph_optimization_level = level
        sess = ort.InferenceSession(str(tmp_path / "v1.onnx"), opts, providers=["CPUExecutionProvider"])
        (probs,) = sess.run(None, {"image": x.astype(np.uint8)})
        np.testing.assert_allclose(probs, phone, rtol=0, atol=atol, err_msg=str(level))
    sess = ort.InferenceSession(str(tmp_path / "v1-float.onnx"), providers=["CPUExecutionProvider"])
    (probs,) = sess.run(None, {"image": x.astype(np.uint8)})
    assert np.mean(probs.argmax(1) == phone.argmax(1)) > 0.9  # the float model of the same trained weights


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_destructive_burst_on_an_int8_model_is_rolled_back_bit_for_bit(int8, tmp_path):
    home = home_with(tmp_path, int8["full"], 30, max_steps=10)
    assert home.personalize(force=True).kept
    before = home.session().parameters()
    pointer = (tmp_path / "home" / "current.json").read_bytes()
    r = home.personalize(force=True, lr=30.0)
    assert not r.kept and r.model_version == 1 and "rolled back" in r.reason
    assert (tmp_path / "home" / "current.json").read_bytes() == pointer
    for name, value in home.session().parameters().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


KILLER = """
import sys
from android_demo.app import Home
home = Home(sys.argv[1])
def progress(info):
    print("step", info["step"], flush=True)
home.personalize(force=True, max_steps=100000, max_seconds=None, progress=progress)
"""


def test_a_kill_mid_burst_leaves_the_previous_int8_version(int8, tmp_path):
    home = home_with(tmp_path, int8["full"], 30, max_steps=10)
    assert home.personalize(force=True).kept
    before = home.session().parameters()
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLER, str(tmp_path / "home")], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        Lines(proc.stdout).wait_for(lambda line: line.split()[-1] == "5", "step 5")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    again = Home(tmp_path / "home")
    assert again.version == 1
    for name, value in again.session().parameters().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    assert again.personalize(force=True).steps == 10


def test_head_only_keeps_the_frozen_weights_int8_and_caches_them(int8, tmp_path):
    """A head-only int8 artifact: the versions hold fc3's masters alone; the bursts reuse the frozen int8 part's
    results (the feature cache) and help the user."""
    home = home_with(tmp_path, int8["head"], 50, max_steps=25)
    before = heldout_accuracy(home, HELD)
    results = [home.personalize(force=True) for _ in range(2)]
    assert results[0].kept and "on:" in results[1].feature_cache, results[1].feature_cache
    assert sorted(home.session().parameters()) == ["fc3.bias", "fc3.weight"]
    assert heldout_accuracy(home, HELD) > before + 0.1
    assert (tmp_path / "home" / "model.etrain").stat().st_size < 100_000  # the frozen weights stay int8


def test_the_page_shows_the_int8_models_probabilities(int8, tmp_path):
    """`serve` in a real process: /api/predict gives the int8 model's own quantized probabilities (they sum to 1
    within its output steps; a softmax of them would flatten them), and /api/personalize runs a burst."""
    home = home_with(tmp_path, int8["full"], 50, max_steps=10)
    sess = home.session()
    x = next(  # a digit whose quantized probabilities do not sum to 1 within 1e-3
        x
        for x, _ in map(USER.get_item, range(50))
        if abs(sess.run(sess.preprocess(x[None])).sum() - 1) > 1e-3
    )
    proc = subprocess.Popen(
        python_m("android_demo", "--home", tmp_path / "home", "serve", "--port", 0),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    lines = Lines(proc.stdout)
    try:
        url = lines.wait_for(lambda line: "http://127.0.0.1:" in line, "the page's address").split()[1]
        got = _post(url + "api/predict", {"pixels": x.tolist()})
        raw = sess.run(sess.preprocess(x[None]))[0]
        np.testing.assert_allclose(got["probabilities"], raw, rtol=0, atol=1e-7)
        assert got["confidence"] == pytest.approx(float(raw.max()))
        assert abs(sum(got["probabilities"]) - 1) < 10 / 255
        assert _post(url + "api/personalize", {"force": True}) == {"started": True}
        state = _wait_for_burst(url)
        assert state["error"] is None and state["result"]["steps"] == 10, state
    finally:
        proc.send_signal(signal.SIGINT)
        finish(proc, 60, lines)


def _post(url: str, obj) -> dict:
    req = urllib.request.Request(
        url, json.dumps(obj).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _wait_for_burst(url: str, timeout: float = 120) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "api/progress", timeout=60) as r:
            state = json.loads(r.read())
        if not state["running"]:
            return state
        time.sleep(0.1)
    pytest.fail(f"the burst did not end within {timeout:g} s")


def test_predict_gives_the_int8_models_own_probabilities(int8, tmp_path):
    """On 400 digits, rows whose quantized probabilities do not sum to 1 within 1e-3 among them: predict gives the
    model's output as it is, for every row."""
    home = home_with(tmp_path, int8["full"], 0)
    x, _ = HELD.get_batch(np.arange(len(HELD)))
    sess = home.session()
    raw = sess.run(sess.preprocess(x))
    assert np.mean(np.abs(raw.sum(axis=1) - 1) > 1e-3) > 0.1  # the case a softmax used to flatten
    np.testing.assert_allclose(home.predict(x), raw, rtol=0, atol=1e-7)


def test_a_float_models_predictions_are_unchanged(tmp_path):
    """The embedded float artifact ends in a Softmax: its probabilities, as before."""
    home = home_with(tmp_path, Path(ARTIFACT), 0)
    x, _ = HELD.get_batch(np.arange(20))
    sess = home.session()
    np.testing.assert_allclose(home.predict(x), sess.run(sess.preprocess(x)), rtol=0, atol=1e-7)


DEVICE = """
import sys
import numpy as np
from android_demo.app import Home
from android_demo.simulate import _new_user, heldout_accuracy
user, held = _new_user()
home = Home.init(sys.argv[2], sys.argv[1], max_seconds=None, max_steps=25)
for i in range(50):
    home.add(*user.get_item(i))
before = heldout_accuracy(home, held)
r = home.personalize(force=True)
after = heldout_accuracy(home, held)
assert r.kept and r.steps == 25 and after > before + 0.05, (r, before, after)  # 39% -> 49%
p = home.predict(held.get_batch(np.arange(5))[0])
assert home.int8_form == "qdq" and p.shape == (5, 10) and p.max() > 0.5
print("int8 burst numpy-only OK", np.__version__, f"{before:.3f} -> {after:.3f}")
"""


@pytest.mark.slow
@pytest.mark.parametrize("python", PYTHONS)
def test_an_int8_burst_runs_with_numpy_alone(int8, tmp_path, python):
    proc = run_on_device(python, DEVICE, str(int8["full"]), str(tmp_path / "home"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "int8 burst numpy-only OK" in proc.stdout
