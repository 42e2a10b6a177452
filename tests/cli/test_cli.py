"""The `edgetrain` command line end to end, each command in a subprocess on small files the tests write: convert
(checked against onnxruntime running the emitted step), train (history, checkpoints, exact resume), eval (against
numpy on the checkpoint's outputs), export (against onnxruntime), and the exit codes and one-line messages of
bad input."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from device import PYTHONS, run_on_device
from models import mlp

import edgetrain as et
from edgetrain.core.container import read_container
from edgetrain.runtime.progress import TrainProgress

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "edgetrain" / "data"


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgetrain.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def blobs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A learnable 10-class problem for the 784-input MLP, as 28x28 images: one prototype per class plus noise."""
    rng = np.random.default_rng(seed)
    protos = np.random.default_rng(99).random((10, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, n)
    x = protos[y] + 0.6 * rng.standard_normal((n, 28, 28)).astype(np.float32)
    return x.astype(np.float32), y.astype(np.int64)


@pytest.fixture
def work(tmp_path):
    onnx.save(mlp(), tmp_path / "mlp.onnx")
    x, y = blobs(160)
    np.savez(tmp_path / "train.npz", x=x, y=y)
    x, y = blobs(60, seed=1)
    np.savez(tmp_path / "test.npz", x=x, y=y)
    return tmp_path


def convert_mlp(work, *extra) -> Path:
    out = work / "mlp.etrain"
    ok(cli("convert", work / "mlp.onnx", "-o", out, "--batch-size", 16, *extra))
    return out


# ---- convert -------------------------------------------------------------------------------------------------------
def test_convert_options_and_step_onnx_against_onnxruntime(work):
    out = work / "mlp.etrain"
    proc = ok(
        cli(
            "convert",
            work / "mlp.onnx",
            "-o",
            out,
            "--trainable",
            "fc2.*",
            "--batch-size",
            16,
            "--optimizer",
            "adam",
            "--lr",
            0.002,
            "--emit-onnx",
            work / "step.onnx",
        )
    )
    assert "2 trainable (1,290 values), 2 frozen (100,480 values)" in proc.stdout
    assert "Adam (lr 0.002" in proc.stdout and "batch       16" in proc.stdout
    sess = et.TrainingSession(out)
    assert sess.parameter_names == ["fc2.weight", "fc2.bias"]
    assert sess.artifact.record.optimizer.type == "Adam"
    # the emitted step is standard ONNX: onnxruntime's loss is edgetrain's
    x, y = blobs(16)
    o = ort.InferenceSession(str(work / "step.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in o.get_inputs()]
    feeds = {names[0]: x.reshape(16, 784), names[1]: y, names[2]: np.asarray(0.002, np.float32)}
    ort_loss = float(o.run(None, feeds)[0])
    assert np.isclose(sess.train_step(x.reshape(16, 784), y), ort_loss, rtol=1e-5)


def test_convert_inference_model_is_edgetrain_convert(work):
    script = Path(sys.executable).with_name("convert-inference-model")
    if not script.exists():
        pytest.skip("the convert-inference-model script is not installed (pip install -e .)")
    a, b = work / "a.etrain", work / "b.etrain"
    ok(cli("convert", work / "mlp.onnx", "-o", a, "--loss", "cross-entropy", "--weight-decay", 1e-4))
    proc = ok(
        subprocess.run(
            [script, work / "mlp.onnx", "-o", b, "--weight-decay", "1e-4"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    )
    assert "converted" in proc.stdout
    assert a.read_bytes() == b.read_bytes()
    help_text = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "--trainable" in help_text and "--emit-onnx" in help_text


# ---- train, eval, export ---------------------------------------------------------------------------------------------
def test_train_eval_export_end_to_end(work):
    art = convert_mlp(work, "--lr", 0.05)
    proc = ok(
        cli(
            "train",
            art,
            "--data",
            work / "train.npz",
            "--val-split",
            0.25,
            "--epochs",
            3,
            "--log",
            work / "h.jsonl",
        )
    )
    # history: one JSON line per epoch, the training loss falling
    hist = [json.loads(line) for line in (work / "h.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in hist] == [1, 2, 3]
    assert hist[-1]["train_loss"] < hist[0]["train_loss"] / 2
    assert "trained 3 epoch(s)" in proc.stdout and "mlp.etck" in proc.stdout
    assert proc.stderr.count("val accuracy") == 3  # an epoch line each (not a terminal: no bar)
    ckpt = work / "mlp.etck"
    assert ckpt.exists()

    # eval: the printed loss and accuracy are those of the checkpoint's parameters, computed here with numpy
    proc = ok(cli("eval", art, "--data", work / "test.npz", "--checkpoint", ckpt))
    x, y = blobs(60, seed=1)
    sess = et.TrainingSession(art)
    sess.load_checkpoint(ckpt)
    logits = sess.run(x.reshape(60, 784)).astype(np.float64)
    logp = logits - logits.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    want_loss = -logp[np.arange(60), y].mean()
    want_acc = float(np.mean(logits.argmax(1) == y))
    got_loss = float(re.search(r"loss\s+([\d.]+)", proc.stdout).group(1))
    got_acc = float(re.search(r"accuracy\s+([\d.]+)%", proc.stdout).group(1)) / 100
    assert abs(got_loss - want_loss) < 1e-3 and abs(got_acc - want_acc) < 1e-3, proc.stdout
    assert want_acc > 0.8  # it learned
    assert "per class" in proc.stdout and "checkpoint" in proc.stdout

    # without --checkpoint: the initial parameters, and a hint at the trained ones
    proc = ok(cli("eval", art, "--data", work / "test.npz"))
    assert "initial parameters" in proc.stdout and "--checkpoint" in proc.stdout

    # export: onnxruntime runs the personalized model and agrees with the session
    proc = ok(cli("export", art, "--checkpoint", ckpt, "-o", work / "p.onnx"))
    assert "matches edgetrain" in proc.stdout
    o = ort.InferenceSession(str(work / "p.onnx"), providers=["CPUExecutionProvider"])
    (got,) = o.run(None, {o.get_inputs()[0].name: x.reshape(60, 784)})
    np.testing.assert_allclose(got, logits, rtol=1e-5, atol=1e-5)


def test_resume_through_the_cli_is_exact(work):
    art = convert_mlp(work, "--lr", 0.05)
    a, b = work / "a.etck", work / "b.etck"

    def train(ckpt, epochs, *extra):
        log = work / f"{ckpt.stem}.jsonl"
        args = ["--epochs", epochs, "--checkpoint", ckpt, "--log", log, *extra]
        return ok(cli("train", art, "--data", work / "train.npz", *args))

    train(a, 3)  # uninterrupted
    train(b, 1, "--checkpoint-every", 4)  # stopped after an epoch, then resumed
    proc = train(b, 3, "--resume")
    assert "resuming from" in proc.stderr and "1 epoch(s), 10 steps done" in proc.stderr
    ha, ta = read_container(a, kind="checkpoint")
    hb, tb = read_container(b, kind="checkpoint")
    assert ha["step"] == hb["step"] == 30
    for k in ta:
        assert np.array_equal(ta[k], tb[k]), k

    def rows(p):
        return [
            {k: v for k, v in json.loads(s).items() if not k.endswith("seconds")}
            for s in p.read_text().splitlines()
        ]

    assert rows(work / "a.jsonl") == rows(work / "b.jsonl")


def test_train_on_an_mnist_directory_and_a_csv(work):
    # the embedded digits, read as MNIST idx files, with the embedded LeNet converted head-only
    art = work / "lenet.etrain"
    ok(cli("convert", DATA / "digits_lenet.onnx", "-o", art, "--trainable", "fc3.*", "--batch-size", 10))
    proc = ok(cli("train", art, "--data", DATA / "newuser", "--val-data", DATA / "newuser", "--epochs", 2))
    assert "50 samples, 400 for validation" in proc.stderr
    proc = ok(cli("eval", art, "--data", DATA / "newuser", "--checkpoint", work / "lenet.etck"))
    assert "400 samples" in proc.stdout

    # a CSV table: label first, then the 784 pixels
    x, y = blobs(48, seed=3)
    table = np.concatenate([y[:, None].astype(np.float32), x.reshape(48, -1)], axis=1)
    np.savetxt(
        work / "train.csv",
        table,
        delimiter=",",
        fmt="%.4f",
        header="label," + ",".join(f"p{i}" for i in range(784)),
        comments="",
    )
    mlp_art = convert_mlp(work)
    proc = ok(cli("train", mlp_art, "--data", work / "train.csv", "--epochs", 2))
    assert "48 samples" in proc.stderr


def test_non_finite_loss_exits_1_and_writes_no_checkpoint(work):
    art = convert_mlp(work)
    proc = cli("train", art, "--data", work / "train.npz", "--epochs", 2, "--lr", 1e30)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert (
        "non-finite update of" in out and "nothing of that step was committed" in out
    )  # lr 1e30: the 1st step
    assert not (work / "mlp.etck").exists()


# ---- bad input ------------------------------------------------------------------------------------------
def test_bad_input_gets_one_clear_line(work):
    art = convert_mlp(work)
    (work / "junk.bin").write_bytes(b"\x00\x01garbage" * 10)
    x, y = blobs(32)
    np.savez(work / "badlabels.npz", x=x, y=np.where(y == 3, 12, y))
    np.savez(work / "badshape.npz", x=x[:, :20, :20], y=y)
    (work / "existing.etck").write_bytes(b"keep me")
    cases = [
        # (arguments, exit code, what the message must say)
        (["convert", work / "nope.onnx"], 1, "nope.onnx: no such file"),
        (["convert", work / "mlp.onnx", "--loss", "hinge"], 2, "invalid choice: 'hinge'"),
        (
            ["convert", work / "mlp.onnx", "--optimizer", "adam", "--momentum", "0.9"],
            2,
            "--momentum applies to",
        ),
        (["convert", work / "mlp.onnx", "--trainable", "conv*"], 1, "conv*"),
        (["convert", work / "junk.bin"], 1, "junk.bin"),
        (["train", art], 2, "--data"),
        (["train", art, "--data", work / "junk.bin"], 1, "unrecognised data"),
        (["train", art, "--data", work / "badlabels.npz"], 1, "12"),
        (["train", art, "--data", work / "badshape.npz"], 1, "do not fit the model's input [784]"),
        (
            [
                "train",
                art,
                "--data",
                work / "train.npz",
                "--val-split",
                "0.2",
                "--val-data",
                work / "test.npz",
            ],
            2,
            "not both",
        ),
        (["train", art, "--data", work / "train.npz", "--lr-schedule", "wobbly"], 2, "--lr-schedule wobbly"),
        (["train", art, "--data", work / "train.npz", "--checkpoint", work / "existing.etck"], 2, "--resume"),
        (
            ["train", art, "--data", work / "train.npz", "--resume", "--checkpoint", work / "none.etck"],
            1,
            "no checkpoint",
        ),
        (["train", art, "--data", work / "train.npz", "--early-stopping", "2"], 2, "needs validation data"),
        (["train", work / "mlp.onnx", "--data", work / "train.npz"], 1, "mlp.onnx"),
        (
            ["eval", art, "--data", work / "test.npz", "--checkpoint", work / "existing.etck"],
            1,
            "existing.etck",
        ),
        (["export", art, "-o", work / "out.onnx", "--checkpoint", work / "none.etck"], 1, "none.etck"),
        (["inspect", work / "junk.bin"], 1, "junk.bin"),
        (["frobnicate"], 2, "invalid choice"),
    ]
    for args, code, needle in cases:
        proc = cli(*args)
        shown = f"{args}: rc {proc.returncode}\n{proc.stdout}{proc.stderr}"
        assert proc.returncode == code, shown
        assert needle in proc.stderr, shown
        assert "Traceback" not in proc.stderr, shown
        if code == 1:  # one line says what failed, and it is the last
            errors = [line for line in proc.stderr.splitlines() if "error:" in line]
            assert len(errors) == 1 and proc.stderr.strip().splitlines()[-1] == errors[0], shown
    assert (work / "existing.etck").read_bytes() == b"keep me"  # refused, untouched


def test_debug_shows_the_traceback(work):
    proc = cli("--debug", "convert", work / "mlp.onnx", "--trainable", "conv*")
    assert proc.returncode == 1 and "Traceback" in proc.stderr
    proc = cli("convert", work / "mlp.onnx", "--trainable", "conv*", "--debug")
    assert proc.returncode == 1 and "Traceback" in proc.stderr


# ---- the progress bar ------------------------------------------------------------------------------------------------
class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal_and_in_a_log():
    term = Terminal()
    bar = TrainProgress(20, 8, stream=term, refresh=1e9)
    for step in range(1, 11):
        bar({"event": "step", "epoch": 1, "epochs": 2, "step": step, "loss": 2.0 / step})
    frame = term.getvalue().split("\r")[-1]
    assert re.search(r"epoch 1/2 \[#{12}-{12}\] 10/20 steps  loss 0\.2000  [\d,]+ samples/s  ETA", frame), (
        frame
    )
    bar(
        {
            "event": "epoch",
            "epoch": 1,
            "step": 10,
            "train_loss": 0.5,
            "val_loss": 0.6,
            "val_accuracy": 0.875,
            "lr": 0.01,
            "seconds": 1.5,
        }
    )
    assert (
        "epoch   1  train loss 0.5000  val loss 0.6000  val accuracy 87.5%  lr 0.01  1.5 s\n"
        in term.getvalue()
    )
    bar.close()

    log = io.StringIO()  # not a terminal: epoch lines only, no carriage returns
    bar = TrainProgress(20, 8, stream=log)
    bar({"event": "step", "epoch": 1, "epochs": 2, "step": 1, "loss": 1.0})
    bar({"event": "epoch", "epoch": 1, "step": 10, "train_loss": 0.5, "lr": 0.01, "seconds": 0.2})
    assert log.getvalue() == "epoch   1  train loss 0.5000  lr 0.01  0.2 s\n"


# ---- the device side ------------------------------------------------------------------------------------
DEVICE_CLI = """
import numpy as np
from edgetrain.cli import main
art, data = sys.argv[1], sys.argv[2]
assert main(["train", art, "--data", data, "--epochs", "2", "--val-split", "0.25"]) == 0
assert main(["eval", art, "--data", data, "--checkpoint", art.replace(".etrain", ".etck")]) == 0
assert main(["inspect", art]) == 0
print("device cli OK", np.__version__)
"""


@pytest.mark.parametrize("python", PYTHONS)
def test_train_and_eval_need_numpy_alone(work, python):
    art = convert_mlp(work)
    proc = run_on_device(python, DEVICE_CLI, str(art), str(work / "train.npz"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "device cli OK" in proc.stdout and "trained 2 epoch(s)" in proc.stdout


def test_no_stray_files(work):
    """train writes only the checkpoint (and the log asked for); a failed run leaves nothing behind."""
    art = convert_mlp(work)
    before = set(os.listdir(work))
    ok(cli("train", art, "--data", work / "train.npz", "--epochs", 1))
    assert set(os.listdir(work)) - before == {"mlp.etck"}
    shutil.copy(work / "mlp.etck", work / "keep.etck")
    assert (
        cli("train", art, "--data", work / "train.npz", "--epochs", 1, "--lr", 1e30, "--overwrite").returncode
        == 1
    )
    assert (work / "mlp.etck").read_bytes() == (work / "keep.etck").read_bytes()  # the last good one stays


def test_regression_with_mse(tmp_path):
    """A regression model: MSE loss, float targets from an .npz, no accuracy; eval's loss is numpy's."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((8, 3)) * 0.1).astype(np.float32)
    g = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "W"], ["y"])],
        "regressor",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3])],
        [onnx.numpy_helper.from_array(w, "W")],
    )
    onnx.save(
        onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 18)]), tmp_path / "reg.onnx"
    )
    x = rng.standard_normal((200, 8)).astype(np.float32)
    t = x @ rng.standard_normal((8, 3)).astype(np.float32)
    np.savez(tmp_path / "reg.npz", x=x, y=t)
    art = tmp_path / "reg.etrain"
    proc = ok(
        cli("convert", tmp_path / "reg.onnx", "-o", art, "--loss", "mse", "--lr", 0.05, "--batch-size", 20)
    )
    assert "MSELoss" in proc.stdout and "1 forward node," in proc.stdout
    proc = ok(cli("train", art, "--data", tmp_path / "reg.npz", "--epochs", 8, "--val-split", 0.2))
    assert "val accuracy" not in proc.stderr and "val loss" in proc.stderr
    proc = ok(cli("eval", art, "--data", tmp_path / "reg.npz", "--checkpoint", tmp_path / "reg.etck"))
    assert "accuracy" not in proc.stdout
    sess = et.TrainingSession(art)
    sess.load_checkpoint(tmp_path / "reg.etck")
    want = float(np.mean((x.astype(np.float64) @ sess.parameters()["W"] - t) ** 2))
    got = float(re.search(r"loss\s+([\d.]+)", proc.stdout).group(1))
    assert abs(got - want) <= 1e-4 + 1e-3 * want, (got, want)
    assert want < 0.5 * float(np.mean((x.astype(np.float64) @ w - t) ** 2))  # it learned


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_result(work):
    """SIGKILL a real `edgetrain train` mid-run; `--resume` from its checkpoint ends bit for bit where an
    uninterrupted run does, and the checkpoint it left was whole."""
    import signal
    import time

    art = convert_mlp(work, "--lr", 0.02)
    steps = 200 * 10  # 200 epochs of 10 batches: seconds, so that the kill lands mid-run
    common = ["--data", work / "train.npz", "--epochs", 200, "--checkpoint-every", 7]
    ok(cli("train", art, *common, "--checkpoint", work / "ref.etck", "--log", work / "ref.jsonl"))
    cmd = [sys.executable, "-m", "edgetrain.cli", "train", art, *common, "--checkpoint", work / "run.etck"]
    cmd += ["--log", work / "run.jsonl"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        list(map(str, cmd)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    deadline = time.monotonic() + 120
    while not (work / "run.etck").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    header, _ = read_container(work / "run.etck", kind="checkpoint")  # whole: its checksum verifies
    killed_at = header["step"]
    proc = ok(
        cli("train", art, *common, "--checkpoint", work / "run.etck", "--log", work / "run.jsonl", "--resume")
    )
    _, ref = read_container(work / "ref.etck", kind="checkpoint")
    _, got = read_container(work / "run.etck", kind="checkpoint")
    assert all(np.array_equal(ref[k], got[k]) for k in ref)

    def rows(p):
        return [
            {k: v for k, v in json.loads(s).items() if not k.endswith("seconds")}
            for s in p.read_text().splitlines()
        ]

    assert rows(work / "run.jsonl") == rows(work / "ref.jsonl")
    assert 0 < killed_at < steps and killed_at % 7 == 0, killed_at
