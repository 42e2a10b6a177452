"""TrainingSession on artifact files: exact resume across processes, the same steps as onnxruntime running
training_onnx(), artifact size and determinism, checkpoints refused for another model, export to onnxruntime."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from device import run_on_device
from models import MODELS, batch_for

import edgetrain as et

BATCH = 8
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_device_script(script: str) -> subprocess.CompletedProcess:
    """Runs a script in a fresh interpreter without onnx, onnxruntime or torch (a "device"); it must succeed."""
    proc = run_on_device(sys.executable, script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def make_artifact(tmp_path, model="lenet", *, name="model.etrain", **kw) -> tuple[et.TrainingArtifact, str]:
    opts = dict(
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4),
        batch_size=BATCH,
    )
    opts.update(kw)
    art = et.convert(MODELS[model][0](), **opts)
    path = str(tmp_path / name)
    art.save(path)
    return art, path


def test_resume_in_a_new_process_is_bit_identical(tmp_path):
    _, path = make_artifact(tmp_path)
    x, y = batch_for("lenet", BATCH)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    whole = et.TrainingSession(path)
    for _ in range(6):
        whole.train_step(x, y)
    first = et.TrainingSession(path)
    for _ in range(3):
        first.train_step(x, y)
    ckpt = tmp_path / "half.etck"
    first.save_checkpoint(ckpt, user_state={"epoch": 1, "loader": {"position": 24, "seed": 7}})
    script = textwrap.dedent(f"""
        import numpy as np
        import edgetrain as et
        s = et.TrainingSession({path!r})
        state = s.load_checkpoint({str(ckpt)!r})
        assert state == {{"epoch": 1, "loader": {{"position": 24, "seed": 7}}}}, state
        assert s.step == 3
        x, y = np.load({str(tmp_path / "x.npy")!r}), np.load({str(tmp_path / "y.npy")!r})
        for _ in range(3):
            s.train_step(x, y)
        np.savez({str(tmp_path / "resumed.npz")!r}, **s.parameters())
    """)
    run_device_script(script)
    resumed = np.load(tmp_path / "resumed.npz")
    for name, value in whole.parameters().items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)


@pytest.mark.parametrize("model,trainable", [(m, None) for m in MODELS] + [("lenet", ["fc3.*"])])
def test_twenty_steps_follow_onnxruntime(tmp_path, model, trainable):
    art, path = make_artifact(tmp_path, model, trainable=trainable)
    x, y = batch_for(model, BATCH)
    sess = et.TrainingSession(path)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ref = ort.InferenceSession(
        art.training_onnx().SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    state = {k: np.array(v) for k, v in art.initial.items()}
    names = [o.name for o in ref.get_outputs()]
    for step in range(20):
        feeds = {"input": x, art.target: y, art.lr: np.asarray(0.05, np.float32), **state}
        out = dict(zip(names, ref.run(None, feeds)))
        ours = sess.train_step(x, y)
        assert ours == pytest.approx(float(out[art.loss]), rel=1e-4, abs=1e-6), f"step {step}"
        state = {k: out[v] for k, v in art.updates.items()}
    for name, value in sess.parameters().items():
        np.testing.assert_allclose(
            value, state[name], rtol=1e-4, atol=1e-5 * np.abs(state[name]).max(), err_msg=name
        )


@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adam"])
def test_artifact_is_compact_and_deterministic(tmp_path, report, optimizer):
    # Optimizer state that starts at zero is declared, not stored: the file is the parameters and a little more.
    opt = et.SGD(lr=0.05, momentum=0.9) if optimizer == "sgd_momentum" else et.Adam(lr=1e-3)
    for model in ("mlp", "lenet"):
        art, path = make_artifact(tmp_path, model, name=f"{model}.etrain", optimizer=opt)
        _, again = make_artifact(tmp_path, model, name=f"{model}_again.etrain", optimizer=opt)
        with open(path, "rb") as f1, open(again, "rb") as f2:
            assert f1.read() == f2.read(), "building the same model twice must give the same bytes"
        params = sum(v.nbytes for v in art.inference.initializers.values() if v.dtype.kind == "f")
        state = sum(art.initial[s].nbytes for s in art.state)
        assert state >= params, "the test needs a state as large as the parameters"
        size = os.path.getsize(path)
        assert size <= params * 1.02 + 16 * 1024, (size, params, state)
        sess = et.TrainingSession(path)  # the declared state comes back as zeros of the right shape and dtype
        assert sess._values.keys() == art.initial.keys()
        for k, v in art.initial.items():
            assert sess._values[k].dtype == v.dtype and np.array_equal(sess._values[k], v), k
        report(
            f"artifact size (batch 8, {optimizer}; zero state declared, not stored)",
            f"{model:6s} file {size / 1024:8.1f} KiB  parameters {params / 1024:8.1f} KiB  "
            f"optimizer state {state / 1024:8.1f} KiB  overhead {(size - params) / 1024:5.1f} KiB",
        )


def test_session_interface(tmp_path):
    art, path = make_artifact(tmp_path, "resnet_tiny")
    sess = et.TrainingSession(path)
    x, y = batch_for("resnet_tiny", BATCH)
    assert sess.lr == pytest.approx(0.05)
    before = sess.parameters()
    assert set(before) == set(art.parameters)
    loss0, out0 = sess.evaluate(x, y)
    assert out0.shape == (BATCH, 10)
    np.testing.assert_allclose(sess.run(x), out0, rtol=1e-5, atol=1e-6)  # run = inference semantics
    np.testing.assert_allclose(sess.run(x[:3]), out0[:3], rtol=1e-5, atol=1e-6)  # any batch size
    assert sess.train_step(x, y) == pytest.approx(loss0, rel=1e-5)
    assert sess.evaluate(x, y)[0] < loss0
    sess.lr = 0.0  # a step with lr 0 changes no parameter (weight decay acts through lr too)
    snapshot = sess.parameters()
    sess.train_step(x, y)
    for k, v in sess.parameters().items():
        np.testing.assert_array_equal(v, snapshot[k])
    sess.set_parameters(before)
    assert sess.evaluate(x, y)[0] == pytest.approx(loss0, rel=1e-6)
    with pytest.raises(et.FeedError, match="label 12 is out of range: the model has 10 classes"):
        sess.train_step(x, np.full(BATCH, 12))
    with pytest.raises(et.FeedError, match=r"'nope' is not a trainable parameter"):
        sess.set_parameters({"nope": np.zeros(3)})
    with pytest.raises(et.FeedError, match="shape"):
        sess.set_parameters({"fc.bias": np.zeros(3, np.float32)})


def test_checkpoint_of_another_model_is_refused(tmp_path):
    _, lenet_path = make_artifact(tmp_path, "lenet", name="lenet.etrain")
    _, mlp_path = make_artifact(tmp_path, "mlp", name="mlp.etrain")
    ck = tmp_path / "mlp.etck"
    et.TrainingSession(mlp_path).save_checkpoint(ck)
    with pytest.raises(et.ArtifactError, match=r"belongs to another model.*mlp.etrain.*lenet.etrain"):
        et.TrainingSession(lenet_path).load_checkpoint(ck)
    with pytest.raises(et.ArtifactError, match="checkpoint"):
        et.TrainingSession(ck)  # a checkpoint is not an artifact


def test_export_runs_in_onnxruntime_like_run(tmp_path):
    art, path = make_artifact(tmp_path, "depthwise_separable", trainable=["head.*", "pw.*"])
    sess = et.TrainingSession(path)
    x, y = batch_for("depthwise_separable", BATCH)
    for _ in range(5):
        sess.train_step(x, y)
    out = tmp_path / "personalized.onnx"
    sess.export_onnx(out)
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    assert not [n for n in model.graph.node if n.domain], "no training ops in the export"
    assert {i.name for i in model.graph.input} == {"input"}
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"input": x[:5]})[0]
    np.testing.assert_allclose(got, sess.run(x[:5]), rtol=1e-5, atol=1e-6)
    trained = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    np.testing.assert_array_equal(trained["head.weight"], sess.parameters()["head.weight"])
    np.testing.assert_array_equal(
        trained["conv1.weight"], art.initial.get("conv1.weight", art.inference.initializers["conv1.weight"])
    )


def test_export_without_onnx_says_so(tmp_path):
    _, path = make_artifact(tmp_path, "mlp")
    script = textwrap.dedent(f"""
        import edgetrain as et
        s = et.TrainingSession({path!r})
        try:
            s.export_onnx({str(tmp_path / "x.onnx")!r})
        except et.UnsupportedError as e:
            print("REFUSED:", e)
    """)
    proc = run_device_script(script)
    assert "REFUSED: export_onnx needs the onnx package" in proc.stdout
    assert "pip install 'edgetrain[convert]'" in proc.stdout
    assert not (tmp_path / "x.onnx").exists()


def test_inspect_describes_artifacts_and_checkpoints(tmp_path):
    art, path = make_artifact(tmp_path, "lenet", trainable=["fc*"])
    sess = et.TrainingSession(path)
    x, y = batch_for("lenet", BATCH)
    sess.train_step(x, y)
    ck = tmp_path / "c.etck"
    sess.save_checkpoint(ck, user_state={"epoch": 2})
    run = [sys.executable, "-m", "edgetrain.cli", "inspect"]
    out = subprocess.run([*run, path], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "ConvGradWeight" not in text and "Gemm" in text  # the frozen convs get no backward
    assert "parameters: 6 trainable" in text and "frozen    conv1.weight" in text
    assert "planned arena (peak)" in text and "lower bound" in text and "source_sha256" in text
    assert "trainable parameters" in text and "optimizer state" in text
    out = subprocess.run([*run, str(ck)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "step       1" in out.stdout and "'epoch': 2" in out.stdout
    bad = tmp_path / "bad.etrain"
    bad.write_bytes(open(path, "rb").read()[:500])
    out = subprocess.run([*run, str(bad)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "truncated" in out.stderr and "Traceback" not in out.stderr


# ---- the planned peak of a training step (`edgetrain inspect`, the benchmark) -----------------------------------
RSS_SCRIPT = """
import sys
import numpy as np

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

from edgetrain.runtime import TrainingSession

x, y = np.load(sys.argv[2]), np.load(sys.argv[3])
before = hwm()
sess = TrainingSession(sys.argv[1])
for _ in range(3):
    sess.train_step(x, y)
print(hwm() - before)
"""


@pytest.mark.parametrize(
    "model,optimizer",
    [("lenet", et.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4)), ("mlp", et.Adam(lr=1e-3))],
)
def test_inspect_reports_the_planned_peak_of_a_step_part_by_part(tmp_path, model, optimizer):
    from edgetrain.runtime.describe import artifact_step_memory, step_memory

    _, path = make_artifact(tmp_path, model, optimizer=optimizer)
    mem = artifact_step_memory(path)
    # the parts, from the session's own objects: what it really holds for a step
    sess = et.TrainingSession(path)
    art, fused = sess.artifact, sess._fused
    assert mem["fused"] and fused is not None
    params = sum(art.initial[p].nbytes for p in art.io.parameters)
    state = sum(art.initial[s].nbytes for s in art.io.state)
    step_counter = sum(art.initial[n].nbytes for n in art.io.state if n == fused.step_name)
    flat = sum(a.nbytes for g in fused.groups for a in [g.params, *g.state.values(), g.grad, g.s1, g.s2])
    program = art.fused.program
    outputs = [o for o in program.outputs if o not in set(art.fused.gradients.values())]
    assert mem["arena_bytes"] == art.fused.plan.arena_size == sess._step_program.arena.nbytes
    assert mem["parameters_bytes"] == params and mem["state_bytes"] == state
    assert mem["constants_bytes"] == sum(v.nbytes for v in program.initializers.values())
    # the flat buffers: parameters and state (updated in place), gradients, two scratch chunks
    assert params + state - step_counter + mem["optimizer_buffers_bytes"] == flat
    assert mem["outputs_bytes"] == sum(
        int(np.prod(program.values[o].shape)) * program.values[o].dtype.itemsize for o in outputs
    )
    parts = [k for k in mem if k.endswith("_bytes") and k not in ("peak_bytes", "budgeted_bytes")]
    assert mem["peak_bytes"] == sum(mem[k] for k in parts) > mem["arena_bytes"] + params
    # a memory budget counts all but the frozen weights, which the session reads from the file's pages
    assert mem["budgeted_bytes"] == mem["peak_bytes"] - mem["constants_bytes"]

    # without the fused optimizer the step's new parameters and state are outputs of the whole step program
    plain = step_memory(dataclasses.replace(art.record, fused=None))
    assert not plain["fused"] and plain["arena_bytes"] == art.plan.arena_size
    assert plain["optimizer_buffers_bytes"] == params + state

    text = subprocess.run(
        [sys.executable, "-m", "edgetrain.cli", "inspect", path], capture_output=True, text=True, timeout=120
    ).stdout
    line = next(s for s in text.splitlines() if s.startswith("planned peak of a training step"))
    assert f"{mem['peak_bytes'] / 2**20:.2f} MiB" in line or f"{mem['peak_bytes'] / 1024:.1f} KiB" in line
    assert "arena (fused step program)" in text and "optimizer buffers" in text
    out = subprocess.run(
        [sys.executable, "-m", "edgetrain.cli", "inspect", path, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["memory"] == mem


def test_a_real_step_stays_within_sight_of_the_planned_peak(tmp_path):
    # RSS growth (VmHWM) of a fresh process over loading the session and three steps: at least the arena, which
    # the steps write all of; at most a few times the plan (kernels' own temporaries, the modules loaded, the
    # allocator's slack are not planned). Memory, not time.
    from edgetrain.runtime.describe import artifact_step_memory

    batch = 256
    _, path = make_artifact(tmp_path, "lenet", batch_size=batch)
    x, y = batch_for("lenet", batch)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    mem = artifact_step_memory(path)
    proc = subprocess.run(
        [sys.executable, "-c", RSS_SCRIPT, path, str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    growth = int(proc.stdout.strip().splitlines()[-1])
    assert mem["arena_bytes"] > 8 * 2**20  # large enough for the lower bound to mean something
    assert mem["arena_bytes"] <= growth <= 3 * mem["peak_bytes"] + 30 * 2**20, (growth, mem)


def test_a_session_of_a_training_artifact_object_trains_as_one_of_its_file(tmp_path):
    art, path = make_artifact(tmp_path)
    x, y = batch_for("lenet", BATCH)
    from_object, from_file = et.TrainingSession(art), et.TrainingSession(path)
    assert [from_object.train_step(x, y) for _ in range(3)] == [from_file.train_step(x, y) for _ in range(3)]
    for k, v in from_file.parameters().items():
        assert np.array_equal(from_object.parameters()[k], v), k


@pytest.mark.parametrize("wrong", [42, None, b"model.etrain", {"path": "model.etrain"}])
def test_a_session_of_something_else_says_what_it_takes(wrong):
    with pytest.raises(et.ConfigError, match="the path .* of an .etrain file, not a value of type"):
        et.TrainingSession(wrong)
