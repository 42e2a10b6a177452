"""The command line on users' own data and models, in subprocesses, against references built here: int64 token
ids, camera-layout uint8 images (--layout/--scale/--normalize), --init-from, settings that --resume restores,
early stopping's best checkpoint, quiet broken pipes, CSV text columns, and re-batching fixed-batch exports."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_cli import ROOT, cli, ok

import edgetrain as et
from edgetrain.core.container import read_container


# ---- helpers -------------------------------------------------------------------------------------------------------
def save_model(path: Path, nodes, inputs, outputs, inits, opset: int = 18) -> Path:
    """An ONNX model from (name, elem type, shape) inputs/outputs and {name: array} initializers."""
    graph = helper.make_graph(
        nodes,
        path.stem,
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(np.asarray(a), name) for name, a in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def tensors(checkpoint: Path) -> dict[str, np.ndarray]:
    """Parameters and optimizer state held by a checkpoint."""
    return read_container(checkpoint, kind="checkpoint")[1]


def onnx_init(model: Path, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(i) for i in onnx.load(model).graph.initializer if i.name == name)


def assert_same_tensors(got: dict, want: dict, **tol) -> None:
    """The same names and values: bit for bit, or within `tol` (assert_allclose's rtol, atol)."""
    assert sorted(got) == sorted(want)
    for k in want:
        if tol:
            np.testing.assert_allclose(got[k], want[k], err_msg=k, **tol)
        else:
            assert np.array_equal(got[k], want[k]), k


def python_run(artifact: Path, batches, out: Path, *, lr: float, start: Path | None = None) -> dict:
    """The reference: TrainingSession.train_step over `batches` in order (from `start`'s weights and optimizer
    state), saved with the session's own save_checkpoint; returns the saved tensors."""
    sess = et.TrainingSession(artifact)
    if start is not None:
        sess.load_checkpoint(start)
    sess.lr = lr
    for x, y in batches:
        sess.train_step(x, y)
    sess.save_checkpoint(out)
    return tensors(out)


def in_order(x, y, batch: int):
    """The batches of --no-shuffle: in file order, a short last batch dropped."""
    return [(x[i : i + batch], y[i : i + batch]) for i in range(0, len(x) - batch + 1, batch)]


def ort_logits(model: Path, params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """onnxruntime's outputs of the original model with `params` in place of its initializers."""
    proto = onnx.load(model)
    for init in proto.graph.initializer:
        if init.name in params:
            init.CopyFrom(numpy_helper.from_array(params[init.name], init.name))
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0].astype(np.float64)


def cross_entropy(logits: np.ndarray, y: np.ndarray) -> float:
    logp = logits - logits.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    return float(-logp[np.arange(len(y)), y].mean())


def printed(name: str, text: str) -> float:
    """A number eval prints: 'loss        0.1234' or 'accuracy    87.5%' (as a fraction)."""
    value = float(re.search(rf"^\s+{name}\s+([\d.]+)", text, re.M).group(1))
    return value / 100 if name == "accuracy" else value


def history(log: Path) -> list[dict]:
    """The --log records without their timings."""
    return [
        {k: v for k, v in json.loads(s).items() if not k.endswith("seconds")}
        for s in log.read_text().splitlines()
    ]


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The single 'error:' line of a failed command, which must also be its last line."""
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and proc.stderr.strip().splitlines()[-1] == errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    return errors[0]


# ---- models and data -----------------------------------------------------------------------------------------------
VOCAB, DIM, TOKENS, TOPICS = 50, 8, 6, 4


def token_classifier(path: Path) -> Path:
    """int64 ids [N, T] -> Gather(embedding [V, D]) -> mean over T -> Gemm -> logits [N, 4]."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Gather", ["embedding", "ids"], ["vectors"], axis=0, name="embed"),
        helper.make_node("ReduceMean", ["vectors", "axes"], ["pooled"], keepdims=0, name="pool"),
        helper.make_node("Gemm", ["pooled", "fc.weight", "fc.bias"], ["logits"], transB=1, name="fc"),
    ]
    inits = {
        "embedding": (rng.standard_normal((VOCAB, DIM)) * 0.5).astype(np.float32),
        "axes": np.array([1], np.int64),
        "fc.weight": (rng.standard_normal((TOPICS, DIM)) * 0.3).astype(np.float32),
        "fc.bias": np.zeros(TOPICS, np.float32),
    }
    ins = [("ids", TensorProto.INT64, ["N", TOKENS])]
    return save_model(path, nodes, ins, [("logits", TensorProto.FLOAT, ["N", TOPICS])], inits)


def token_data(path: Path, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """int64 token ids whose topic is the first token's id modulo 4, saved as x and y in `path`."""
    x = np.random.default_rng(seed).integers(0, VOCAB, (n, TOKENS), dtype=np.int64)
    y = x[:, 0] % TOPICS
    np.savez(path, x=x, y=y)
    return x, y


def train(art: Path, *args) -> subprocess.CompletedProcess:
    """`edgetrain train ART ARGS...`, which must succeed."""
    return ok(cli("train", art, *args))


C, H, W, CLASSES = 3, 6, 5, 3  # H != W: a transpose that swapped them would not even fit


def camera_classifier(path: Path) -> Path:
    """float [N, 3, 6, 5] -> Conv 3x3 (pad 1) -> Relu -> Flatten -> Gemm -> logits [N, 3]."""
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node(
            "Conv",
            ["input", "conv.weight", "conv.bias"],
            ["c"],
            kernel_shape=[3, 3],
            pads=[1] * 4,
            name="conv",
        ),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]),
        helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"], transB=1, name="fc"),
    ]
    inits = {
        "conv.weight": (rng.standard_normal((4, C, 3, 3)) * 0.3).astype(np.float32),
        "conv.bias": np.zeros(4, np.float32),
        "fc.weight": (rng.standard_normal((CLASSES, 4 * H * W)) * 0.1).astype(np.float32),
        "fc.bias": np.zeros(CLASSES, np.float32),
    }
    ins = [("input", TensorProto.FLOAT, ["N", C, H, W])]
    return save_model(path, nodes, ins, [("logits", TensorProto.FLOAT, ["N", CLASSES])], inits)


def camera_data(path: Path, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images as cameras give them, [N, H, W, C], with random labels."""
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, 256, (n, H, W, C), dtype=np.uint8), rng.integers(0, CLASSES, n)
    np.savez(path, x=x, y=y)
    return x, y


def as_model_input(x: np.ndarray, scale: float = 1.0, mean: float = 0.0, std: float = 1.0) -> np.ndarray:
    """What the model should see, written the way a user would: channels first, float, scaled, normalised."""
    return (np.transpose(x, (0, 3, 1, 2)).astype(np.float32) * np.float32(scale) - mean) / std


CAMERA_OPTIONS = ["--layout", "nhwc", "--scale", "--normalize", "0.5,0.25"]


@pytest.fixture
def camera(tmp_path):
    """A converted camera classifier (batch 8, SGD lr 0.05 with momentum) and 48 training images."""
    camera_classifier(tmp_path / "cam.onnx")
    ok(cli("convert", tmp_path / "cam.onnx", "-o", tmp_path / "cam.etrain", "--batch-size", 8, "--lr", 0.05))
    camera_data(tmp_path / "train.npz", 48)
    return tmp_path


# ---- 1. npz keeps its dtype -----------------------------------------------------------------------------------------
def test_int64_token_ids_train_like_train_step(tmp_path):
    token_classifier(tmp_path / "tok.onnx")
    art = tmp_path / "tok.etrain"
    ok(cli("convert", tmp_path / "tok.onnx", "-o", art, "--batch-size", 8, "--lr", 0.1))
    x, y = token_data(tmp_path / "tok.npz", 44)  # 5 batches of 8, and 4 dropped
    proc = train(art, "--data", tmp_path / "tok.npz", "--epochs", 2, "--no-shuffle")
    assert "note:" not in proc.stderr  # ids fit the model as they are: nothing to adapt or announce

    assert et.TrainingSession(art).artifact.program.values["ids"].dtype == np.int64
    want = python_run(art, in_order(x, y, 8) * 2, tmp_path / "ref.etck", lr=0.1)
    assert_same_tensors(tensors(tmp_path / "tok.etck"), want)
    assert not np.array_equal(want["embedding"], onnx_init(tmp_path / "tok.onnx", "embedding"))  # it trained

    # ids stored as whole floats are read as int64; fractional "ids" are refused, naming the input
    np.savez(tmp_path / "float_ids.npz", x=x.astype(np.float64), y=y)
    proc = train(art, "--data", tmp_path / "float_ids.npz", "--checkpoint", tmp_path / "f.etck")
    assert "read as int64 for input 'ids'" in proc.stderr
    np.savez(tmp_path / "frac.npz", x=x + 0.5, y=y)
    proc = cli("train", art, "--data", tmp_path / "frac.npz", "--checkpoint", tmp_path / "g.etck")
    assert proc.returncode == 1 and "'ids'" in one_error_line(proc)


# ---- 2. camera-layout images ----------------------------------------------------------------------------------------
def test_channels_last_uint8_is_transposed_by_default_with_a_note(camera):
    x, y = camera_data(camera / "train.npz", 48)
    # uint8 for a float input: fed as they are only when asked to (tests/runtime/test_integer_inputs.py)
    proc = train(camera / "cam.etrain", "--data", camera / "train.npz", "--no-shuffle", "--cast")
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note:")]
    transposed = [n for n in notes if "transposed" in n]
    assert len(transposed) == 1 and "[6, 5, 3]" in transposed[0] and "[3, 6, 5]" in transposed[0], notes
    assert any("--scale 1/255" in n for n in notes), notes  # 8-bit data fed as 0-255: the fix is named
    # a transpose, not a reshape: the same numbers as train_step on np.transpose'd floats
    want = python_run(camera / "cam.etrain", in_order(as_model_input(x), y, 8), camera / "ref.etck", lr=0.05)
    assert_same_tensors(tensors(camera / "cam.etck"), want, rtol=1e-5, atol=1e-6)


def test_layout_nchw_on_channels_last_images_is_refused(camera):
    proc = cli("train", camera / "cam.etrain", "--data", camera / "train.npz", "--layout", "nchw")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = one_error_line(proc)
    assert "train.npz" in line and "--layout nhwc" in line  # says what would work
    assert not (camera / "cam.etck").exists()


@pytest.mark.parametrize("scale", [[], ["1/255"]], ids=["bare-scale", "scale-1/255"])
def test_nhwc_scale_normalize_train_and_eval_match_numpy(camera, scale):
    x, y = camera_data(camera / "train.npz", 48)
    options = ["--layout", "nhwc", "--scale", *scale, "--normalize", "0.5,0.25"]
    train(camera / "cam.etrain", "--data", camera / "train.npz", "--epochs", 2, "--no-shuffle", *options)
    ref = as_model_input(x, 1 / 255, 0.5, 0.25)
    want = python_run(camera / "cam.etrain", in_order(ref, y, 8) * 2, camera / "ref.etck", lr=0.05)
    got = tensors(camera / "cam.etck")
    assert_same_tensors(got, want, rtol=1e-5, atol=1e-6)

    # eval with the same options on 21 images (a short last batch): numpy's loss on onnxruntime's logits
    xt, yt = camera_data(camera / "test.npz", 21, seed=1)
    trained = ["--checkpoint", camera / "cam.etck", *options]
    proc = ok(cli("eval", camera / "cam.etrain", "--data", camera / "test.npz", *trained))
    logits = ort_logits(camera / "cam.onnx", got, as_model_input(xt, 1 / 255, 0.5, 0.25))
    assert printed("loss", proc.stdout) == pytest.approx(cross_entropy(logits, yt), abs=6e-5)
    assert printed("accuracy", proc.stdout) == pytest.approx(np.mean(logits.argmax(1) == yt), abs=6e-4)


# ---- 3. --init-from ------------------------------------------------------------------------------------------------
def test_init_from_continues_on_grown_data(tmp_path):
    token_classifier(tmp_path / "tok.onnx")
    art, a = tmp_path / "tok.etrain", tmp_path / "a.etck"
    ok(cli("convert", tmp_path / "tok.onnx", "-o", art, "--batch-size", 8, "--lr", 0.1))
    old, _ = token_data(tmp_path / "old.npz", 32)
    train(art, "--data", tmp_path / "old.npz", "--epochs", 2, "--checkpoint", a)
    start = tensors(a)
    new, _ = token_data(tmp_path / "new.npz", 16, seed=1)
    x = np.concatenate([old, new])  # the data has grown by 16 samples
    y = x[:, 0] % TOPICS
    np.savez(tmp_path / "grown.npz", x=x, y=y)
    grown = [art, "--data", tmp_path / "grown.npz"]

    # the old run cannot continue over other data; the refusal names the way that works
    proc = cli("train", *grown, "--epochs", 3, "--checkpoint", a, "--resume")
    assert proc.returncode == 1 and "--init-from" in one_error_line(proc)
    assert_same_tensors(tensors(a), start)

    # --lr 0: one epoch leaves the weights exactly the checkpoint's
    train(*grown, "--init-from", a, "--checkpoint", tmp_path / "z.etck", "--lr", 0)
    got = tensors(tmp_path / "z.etck")
    for name in ("embedding", "fc.weight", "fc.bias"):
        assert np.array_equal(got[name], start[name]), name

    # a real run: train_step from the checkpoint's weights and momentum over the grown data, in order
    want = python_run(art, in_order(x, y, 8), tmp_path / "ref.etck", lr=0.1, start=a)
    train(*grown, "--init-from", a, "--checkpoint", tmp_path / "b.etck", "--no-shuffle")
    assert_same_tensors(tensors(tmp_path / "b.etck"), want)

    # it may replace its own start file without --overwrite
    train(*grown, "--init-from", a, "--checkpoint", a, "--no-shuffle")
    assert_same_tensors(tensors(a), want)

    proc = cli("train", *grown, "--init-from", a, "--resume", "--checkpoint", a)
    assert proc.returncode == 2 and "--init-from" in proc.stderr and "--resume" in proc.stderr, proc.stderr


# ---- 4 and 6. checkpoints record the run's settings; --resume restores them ------------------------------------------
def warmup_then(inner, warmup: int):
    return lambda s: inner(s) * s / warmup if s < warmup else inner(s)


def step_lr(base: float, size: int, gamma: float):
    return lambda s: base * gamma ** (s // size)


def cosine_lr(base: float, total: int):
    return lambda s: base * (1 + math.cos(math.pi * min(s, total) / total)) / 2


def assert_lrs(log: Path, lr_at) -> None:
    """Each epoch's record holds the lr of its last step, step - 1 counted from 0."""
    for record in history(log):
        assert record["lr"] == pytest.approx(lr_at(record["step"] - 1), rel=1e-9, abs=1e-15), record


RUN = ["--lr-schedule", "step:3:0.5", "--warmup", "2", "--seed", "7", "--val-split", "0.25", *CAMERA_OPTIONS]


def test_resume_restores_the_runs_settings(camera):
    """2 epochs, then --resume to 3 with no options, then to 4 repeating them all: the run of 4 epochs straight."""
    art, data = camera / "cam.etrain", ["--data", camera / "train.npz"]

    def run(name, *args):
        return train(
            art, *data, "--checkpoint", camera / f"{name}.etck", "--log", camera / f"{name}.jsonl", *args
        )

    run("straight", "--epochs", 4, *RUN)
    proc = run("split", "--epochs", 2, *RUN)
    steps = int(re.search(r"(\d+) steps per epoch", proc.stderr).group(1))  # 36 of 48 train: 4 steps of 8
    assert f"this run: {2 * steps} steps" in proc.stdout
    proc = run("split", "--epochs", 3, "--resume")
    assert "resuming from" in proc.stderr and "times 0.5 every 3 steps" in proc.stderr
    assert "36 samples, 12 for validation" in proc.stderr  # the --val-split came back
    # 6: the summary counts the whole run, and this run's steps only
    assert f"trained 3 epoch(s), {3 * steps} steps; this run: {steps} steps" in proc.stdout
    proc = run("split", "--epochs", 4, "--resume", *RUN)  # repeating them identically is fine
    assert f"this run: {steps} steps" in proc.stdout

    assert_same_tensors(tensors(camera / "split.etck"), tensors(camera / "straight.etck"))
    assert history(camera / "split.jsonl") == history(camera / "straight.jsonl")
    assert_lrs(camera / "split.jsonl", warmup_then(step_lr(0.05, 3, 0.5), 2))


@pytest.mark.parametrize(
    "flag, given, recorded",
    [
        ("--lr-schedule", "step:5", "--lr-schedule step:3:0.5"),
        ("--lr-schedule", "cosine", "--lr-schedule step:3:0.5"),
        ("--warmup", "1", "--warmup 2"),
        ("--seed", "8", "--seed 7"),
        ("--val-split", "0.5", "--val-split 0.25"),
        ("--scale", "0.5", "--scale 1/255"),
        ("--normalize", "0,1", "--normalize 0.5,0.25"),
        ("--layout", "nchw", "--layout nhwc"),
    ],
)
def test_a_conflicting_setting_on_resume_is_a_usage_error(camera, flag, given, recorded):
    ckpt = camera / "run.etck"
    run = [camera / "cam.etrain", "--data", camera / "train.npz", "--checkpoint", ckpt]
    train(*run, *RUN)
    before = tensors(ckpt)
    proc = cli("train", *run, "--epochs", 2, "--resume", flag, given)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    assert f"{flag} {given}" in message and recorded in message, message  # names the flag and the run's value
    assert_same_tensors(tensors(ckpt), before)


@pytest.mark.parametrize(
    "first, again",
    [
        (["--scale"], ["--scale", "0.00392156862745098"]),
        (["--val-split", "0.25", "--cast"], ["--val-split", ".25"]),
    ],
    ids=["scale-1/255-as-a-decimal", "val-split-spelled-.25"],
)
def test_the_same_setting_spelled_otherwise_is_not_a_conflict(camera, first, again):
    """--scale 0.00392156862745098 is float(1/255): the recorded factor, not a new one."""
    run = [camera / "cam.etrain", "--data", camera / "train.npz", "--checkpoint", camera / "run.etck"]
    train(*run, *first)
    train(*run, "--epochs", 2, "--resume", *again)


def test_raising_epochs_past_the_end_of_a_cosine_does_not_train_silently_at_lr_0(camera):
    """A cosine run keeps its length on resume; epochs added to a finished cosine would all run at its minimum
    lr (0): the weights must move, or the command must say the schedule has ended (or refuse)."""
    ckpt = camera / "cos.etck"
    run = [camera / "cam.etrain", "--data", camera / "train.npz", "--checkpoint", ckpt]
    train(*run, "--epochs", 2, "--lr-schedule", "cosine", "--cast")
    before = tensors(ckpt)
    proc = cli("train", *run, "--epochs", 4, "--resume")
    if proc.returncode == 2:
        assert "--epochs" in proc.stderr, proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    after = tensors(ckpt)
    moved = any(not np.array_equal(before[k], after[k]) for k in ("conv.weight", "fc.weight"))
    said = re.search(r"^(note|warning):.*(cosine|schedule)", proc.stderr, re.M | re.I)
    assert moved or said, f"epochs 3-4 trained at lr 0 without a word:\n{proc.stderr}"


@pytest.mark.slow
def test_killed_cosine_run_resumes_with_its_settings(camera):
    """SIGKILL a cosine run with warm-up, seed, val split and camera options once its --checkpoint-every file
    appears; --resume without any of them ends where an uninterrupted run does, on the closed-form cosine."""
    art, epochs = camera / "cam.etrain", 120
    run = ["--lr-schedule", "cosine", "--warmup", "5", "--seed", "3", "--val-split", "0.25", *CAMERA_OPTIONS]
    common = ["--data", camera / "train.npz", "--epochs", epochs, "--checkpoint-every", 7, *run]
    train(art, *common, "--checkpoint", camera / "ref.etck", "--log", camera / "ref.jsonl")
    files = ["--checkpoint", camera / "run.etck", "--log", camera / "run.jsonl"]
    cmd = [sys.executable, "-m", "edgetrain.cli", "train", art, *common, *files]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        list(map(str, cmd)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    deadline = time.monotonic() + 120
    while not (camera / "run.etck").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    killed_at = read_container(camera / "run.etck", kind="checkpoint")[0]["step"]
    total = epochs * 4  # 36 training images: 4 batches of 8 per epoch
    assert 0 < killed_at < total and killed_at % 7 == 0, killed_at

    # only --data (required) and the files: the schedule, seed, split and camera options come back
    proc = train(art, "--data", camera / "train.npz", *files, "--resume")
    assert f"this run: {total - killed_at} steps" in proc.stdout  # 6: only the resumed part
    assert_same_tensors(tensors(camera / "run.etck"), tensors(camera / "ref.etck"))
    assert history(camera / "run.jsonl") == history(camera / "ref.jsonl")
    assert_lrs(camera / "run.jsonl", warmup_then(cosine_lr(0.05, total), 5))


# ---- 5. early stopping keeps the best weights -----------------------------------------------------------------------
def test_early_stopping_keeps_the_best_epochs_weights(tmp_path):
    """A threshold classifier starts at -0.6, validation's boundary is 0 and training's is 0.6: validation
    accuracy rises while the boundary nears 0, then falls, so the best epoch is not the last."""
    save_model(
        tmp_path / "edge.onnx",
        [helper.make_node("Gemm", ["x", "W", "B"], ["logits"], transB=1, name="fc")],
        [("x", TensorProto.FLOAT, ["N", 1])],
        [("logits", TensorProto.FLOAT, ["N", 2])],
        {"W": np.array([[0.0], [1.0]], np.float32), "B": np.array([0.0, 0.6], np.float32)},
    )
    x = np.linspace(-1, 1, 64, dtype=np.float32)[:, None]
    np.savez(tmp_path / "train.npz", x=x, y=(x[:, 0] > 0.6).astype(np.int64))
    xv = np.linspace(-0.99, 0.99, 50, dtype=np.float32)[:, None]  # 50: a short last batch of 2
    yv = (xv[:, 0] > 0).astype(np.int64)
    np.savez(tmp_path / "val.npz", x=xv, y=yv)
    art = tmp_path / "edge.etrain"
    ok(cli("convert", tmp_path / "edge.onnx", "-o", art, "--batch-size", 8, "--momentum", 0, "--lr", 0.02))
    args = ["--data", tmp_path / "train.npz", "--val-data", tmp_path / "val.npz", "--early-stopping", 3]
    proc = train(art, *args, "--epochs", 40, "--log", tmp_path / "h.jsonl")

    records = history(tmp_path / "h.jsonl")
    best = max(records, key=lambda r: r["val_accuracy"])  # the first of the best: later ties do not improve
    assert best["epoch"] < records[-1]["epoch"] and records[-1]["val_accuracy"] < best["val_accuracy"], (
        records
    )
    assert len(records) == best["epoch"] + 3  # stopped after 3 epochs without improvement
    best_ckpt = tmp_path / "edge.best.etck"
    assert f"kept        the best weights (epoch {best['epoch']}): {best_ckpt}" in proc.stdout, proc.stdout
    assert f"{tmp_path / 'edge.etck'} (the last weights, for --resume)" in proc.stdout

    # the best file holds the best epoch's weights: numpy's loss and accuracy on them are the recorded ones
    for ckpt, record in ((best_ckpt, best), (tmp_path / "edge.etck", records[-1])):
        p = tensors(ckpt)
        logits = xv.astype(np.float64) @ p["W"].T.astype(np.float64) + p["B"]
        assert cross_entropy(logits, yv) == pytest.approx(record["val_loss"], abs=1e-6)
        assert np.mean(logits.argmax(1) == yv) == pytest.approx(record["val_accuracy"])
        proc = ok(cli("eval", art, "--data", tmp_path / "val.npz", "--checkpoint", ckpt))
        assert printed("loss", proc.stdout) == pytest.approx(record["val_loss"], abs=6e-5)
        assert printed("accuracy", proc.stdout) == pytest.approx(record["val_accuracy"], abs=6e-4)

    # a run that ends on its best epoch says it kept the last weights, which are the best
    proc = train(art, *args, "--epochs", 2, "--checkpoint", tmp_path / "short.etck")
    assert (
        f"kept        the last, which are the best weights (epoch 2): {tmp_path / 'short.best.etck'}"
        in proc.stdout
    ), proc.stdout
    assert_same_tensors(tensors(tmp_path / "short.best.etck"), tensors(tmp_path / "short.etck"))


# ---- 7. a reader that stops early ------------------------------------------------------------------------------------
def deep_chain(path: Path, layers: int) -> Path:
    """A chain of 2x2 Gemm layers: `check` lists every parameter, so its report grows with `layers`."""
    nodes, inits, h = [], {}, "input"
    for k in range(layers):
        nodes.append(
            helper.make_node("Gemm", [h, f"l{k}.weight", f"l{k}.bias"], [f"h{k}"], transB=1, name=f"l{k}")
        )
        inits |= {f"l{k}.weight": np.eye(2, dtype=np.float32), f"l{k}.bias": np.zeros(2, np.float32)}
        h = f"h{k}"
    return save_model(
        path, nodes, [("input", TensorProto.FLOAT, ["N", 2])], [(h, TensorProto.FLOAT, ["N", 2])], inits
    )


def piped(command: list, reader: str) -> subprocess.CompletedProcess:
    """`edgetrain COMMAND | READER` in bash with pipefail, as a user's shell runs it: stdout block-buffered (the
    test environment's PYTHONUNBUFFERED would hide a late flush into a closed pipe)."""
    line = " ".join(shlex.quote(str(a)) for a in [sys.executable, "-m", "edgetrain.cli", *command])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {"PYTHONPATH": str(ROOT)}
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"{line} | {reader}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.fixture
def pipe_work(tmp_path):
    token_classifier(tmp_path / "tok.onnx")
    ok(cli("convert", tmp_path / "tok.onnx", "-o", tmp_path / "tok.etrain", "--batch-size", 8))
    token_data(tmp_path / "tok.npz", 20)  # fits the model as it is: eval prints no note on stderr
    deep_chain(tmp_path / "deep.onnx", 60)  # a report of about 10 KB: more than one write of stdout's buffer
    return tmp_path


COMMANDS = {
    "check": lambda w: ["check", w / "tok.onnx"],
    "check-10KB": lambda w: ["check", w / "deep.onnx"],
    "eval": lambda w: ["eval", w / "tok.etrain", "--data", w / "tok.npz"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("reader", ["head -1", "true"], ids=["head-1", "reader-gone"])
def test_a_reader_that_stops_early_ends_the_command_quietly(pipe_work, command, reader):
    """`| head -1`, and `| true` (a reader that has gone before the first write, where head -1 on a long report
    ends up too): exit status 0 under pipefail and nothing on stderr. Repeated: whether head has exited before
    the last write is a race."""
    for _ in range(3):
        proc = piped(COMMANDS[command](pipe_work), reader)
        assert proc.returncode == 0 and proc.stderr == "", f"rc {proc.returncode}\n{proc.stderr}"
    if reader == "head -1":
        assert proc.stdout.count("\n") == 1 and proc.stdout.split()[0] in ("model", "evaluated"), proc.stdout


# ---- 8. CSV text columns ---------------------------------------------------------------------------------------------
def test_csv_text_column_is_named_in_one_line(tmp_path):
    save_model(
        tmp_path / "tab.onnx",
        [helper.make_node("Gemm", ["x", "W", "B"], ["logits"], transB=1)],
        [("x", TensorProto.FLOAT, ["N", 3])],
        [("logits", TensorProto.FLOAT, ["N", 2])],
        {"W": np.full((2, 3), 0.1, np.float32), "B": np.zeros(2, np.float32)},
    )
    art = tmp_path / "tab.etrain"
    ok(cli("convert", tmp_path / "tab.onnx", "-o", art, "--batch-size", 2))
    rows = [
        ("0.5", "Paris", "1.0", "0"),
        ("0.1", "Lyon", "2.0", "1"),
        ("0.3", "Nice", "0.5", "0"),
        ("0.9", "Paris", "1.5", "1"),
    ]
    (tmp_path / "cities.csv").write_text("f1,city,f2,label\n" + "".join(",".join(r) + "\n" for r in rows))
    for command in ("train", "eval"):
        proc = cli(command, art, "--data", tmp_path / "cities.csv")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        line = one_error_line(proc)
        assert "'city'" in line and "Paris" in line and "cities.csv" in line, line
        assert not re.search(r"\\x[0-9a-f]{2}|0x[0-9a-f]{4}", line), line  # no hex dump
    # the same table with the city as a number trains: the refusal was the text column's
    (tmp_path / "ids.csv").write_text(
        "f1,city,f2,label\n" + "".join(f"{r[0]},{k % 2},{r[2]},{r[3]}\n" for k, r in enumerate(rows))
    )
    train(art, "--data", tmp_path / "ids.csv")


# ---- 9. re-batching a model exported with a fixed batch ----------------------------------------------------------
def convnet(path: Path, batch, *, tail: str = "flatten") -> Path:
    """[batch, 1, 8, 8] -> Conv 3x3 -> Relu -> Reshape to [1, -1] (a fixed-batch export's x.view(1, -1)) -> then
    tail: 'flatten' Gemm -> [1, 3]; 'regroup' Reshape [2, 72] + ReduceMean over axis 0 (rows of one sample at
    batch 1, a mix of samples at any other) -> Gemm. batch 'N' with Reshape [0, -1]: the same model, dynamic."""
    rng = np.random.default_rng(2)
    width = {"flatten": 144 * (batch if isinstance(batch, int) else 1), "regroup": 72}[tail]
    inits = {
        "conv.weight": (rng.standard_normal((4, 1, 3, 3)) * 0.4).astype(np.float32),
        "conv.bias": np.zeros(4, np.float32),
        "flat_shape": np.array([1 if isinstance(batch, int) else 0, -1], np.int64),
        "fc.weight": (rng.standard_normal((3, width)) * 0.1).astype(np.float32),
        "fc.bias": np.zeros(3, np.float32),
    }
    nodes = [
        helper.make_node(
            "Conv", ["input", "conv.weight", "conv.bias"], ["c"], kernel_shape=[3, 3], name="conv"
        ),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "flat_shape"], ["f"], name="flatten_reshape"),
    ]
    if tail == "regroup":
        inits["regroup_shape"] = np.array([2, 72], np.int64)
        nodes += [
            helper.make_node("Reshape", ["f", "regroup_shape"], ["g"], name="regroup"),
            helper.make_node("ReduceMean", ["g"], ["f2"], axes=[0], keepdims=1, name="rows_mean"),
        ]
    last = "f2" if tail == "regroup" else "f"
    nodes.append(helper.make_node("Gemm", [last, "fc.weight", "fc.bias"], ["logits"], transB=1, name="fc"))
    out_batch = 1 if isinstance(batch, int) else batch
    ins = [("input", TensorProto.FLOAT, [batch, 1, 8, 8])]
    return save_model(path, nodes, ins, [("logits", TensorProto.FLOAT, [out_batch, 3])], inits, opset=17)


def test_fixed_batch_export_is_rebatched_trained_and_exported_with_its_signature(tmp_path):
    fixed, dynamic = convnet(tmp_path / "fixed.onnx", 1), convnet(tmp_path / "dynamic.onnx", "N")
    proc = ok(cli("convert", fixed, "-o", tmp_path / "fixed.etrain", "--batch-size", 8))
    out = proc.stdout
    assert "re-batched" in out and "float32[1x1x8x8]" in out, out
    assert "'flatten_reshape' (Reshape): [1, -1] -> [8, -1]" in out and "batch       8" in out, out
    ok(cli("convert", dynamic, "-o", tmp_path / "dynamic.etrain", "--batch-size", 8))

    # it trains at batch 8 exactly as the same model exported with a dynamic batch does
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((32, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, 32)
    np.savez(tmp_path / "img.npz", x=x, y=y)
    for name in ("fixed", "dynamic"):
        proc = train(tmp_path / f"{name}.etrain", "--data", tmp_path / "img.npz", "--epochs", 2)
        assert "batch 8, 4 steps per epoch" in proc.stderr
    trained = tensors(tmp_path / "fixed.etck")
    assert_same_tensors(trained, tensors(tmp_path / "dynamic.etck"), rtol=1e-6, atol=1e-7)

    # export: the original signature, checked by onnxruntime, and the trained weights in it
    trained_args = ["--checkpoint", tmp_path / "fixed.etck", "-o", tmp_path / "p.onnx"]
    proc = ok(cli("export", tmp_path / "fixed.etrain", *trained_args))
    assert "matches edgetrain" in proc.stdout
    exported = onnx.load(tmp_path / "p.onnx")
    assert exported.graph.input[0] == onnx.load(fixed).graph.input[0]
    o = ort.InferenceSession(str(tmp_path / "p.onnx"), providers=["CPUExecutionProvider"])
    for k in range(3):
        got = o.run(None, {"input": x[k : k + 1]})[0]
        np.testing.assert_allclose(got, ort_logits(dynamic, trained, x[k : k + 1]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "tail, batch, node",
    [("regroup", 1, "regroup"), ("flatten", 2, "flatten_reshape")],
    ids=["reshape-mixes-rows-of-the-batch", "batch-of-2-flattened-into-one-row"],
)
def test_a_fixed_batch_that_cannot_move_is_refused_or_kept(tmp_path, tail, batch, node):
    model = convnet(tmp_path / "m.onnx", batch, tail=tail)
    proc = cli("convert", model, "-o", tmp_path / "m.etrain", "--batch-size", 8)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{node}" in one_error_line(proc)
    assert not (tmp_path / "m.etrain").exists()
    # without --batch-size it trains at the batch it was exported with, and says so
    proc = ok(cli("convert", model, "-o", tmp_path / "m.etrain"))
    assert "kept the model's fixed batch" in proc.stdout and node in proc.stdout, proc.stdout
    assert f"batch       {batch}\n" in proc.stdout
    assert et.TrainingSession(tmp_path / "m.etrain").artifact.program.values["input"].shape[0] == batch
