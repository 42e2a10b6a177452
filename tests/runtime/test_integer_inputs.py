"""Integer inputs are never cast silently (issue 22, finding 6): uint8, int64 or bool batches for a model's float
input were converted without scaling, and raw 0-255 pixels drove the loss from 173 to 8.4 million in 3 steps
without a word. One rule (edgetrain.runtime.session.input_cast) decides on every path: TrainingSession's
train_step, evaluate, run and preprocess, InferenceSession.run, the Trainer, and train/eval on the command line.
Refused with a FeedError (exit code 2) that names the input, both dtypes, the values seen and the two ways out,
unless the user opted in (allow_cast=True, --cast: then the numbers are those of casting by hand), or the model
declares an input pipeline that takes integers (the shipped LeNet: uint8, x / 255: then the numbers are those of
the scaled float path). Token ids for an integer input, and float64 for a float one, are fed as before.

References: numpy written out by hand (x.astype(np.float32), x.astype(np.float32) / 255) fed to the same code."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from test_cli import ROOT, cli, ok
from test_cli_userdata import one_error_line, tensors, token_classifier, token_data

import edgetrain as et
from edgetrain.runtime.feeding import DataOptions, open_feed
from edgetrain.runtime.session import input_cast
from edgetrain.runtime.trainer import Trainer
from loaders import ArrayDataView, DataLoader, InputPipeline, MnistDataView

DIGITS = ROOT / "edgetrain" / "data" / "digits"
LENET = ROOT / "edgetrain" / "data" / "digits_lenet.onnx"
BATCH, N = 8, 48
KINDS = ["uint8", "int64", "bool"]


def raw_digits(n: int = N) -> tuple[np.ndarray, np.ndarray]:
    """The first test digits as stored: uint8 pixels 0-255 [n, 1, 28, 28], int64 labels."""
    view = MnistDataView.from_dir(DIGITS, "test", normalize=False)
    x, y = view.get_batch(np.arange(n))
    return x.astype(np.uint8), y


def as_kind(x: np.ndarray, kind: str) -> np.ndarray:
    return x > 127 if kind == "bool" else x.astype(kind)


def by_hand(x: np.ndarray) -> np.ndarray:
    """What a user who casts writes."""
    return x.astype(np.float32)


def scaled(x: np.ndarray) -> np.ndarray:
    """What a user who scales writes (x / 255, as the pipeline divides)."""
    return x.astype(np.float32) / np.float32(255)


@pytest.fixture(scope="module")
def lenets(tmp_path_factory):
    """(bare, piped): the shipped LeNet converted without its pipeline (metadata stripped) and as shipped."""
    d = tmp_path_factory.mktemp("lenets")
    model = onnx.load(str(LENET))
    kept = {p.key: p.value for p in model.metadata_props if p.key != "edgetrain.preprocessing"}
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, kept)
    onnx.save(model, str(d / "bare.onnx"))
    bare, piped = d / "bare.etrain", d / "piped.etrain"
    ok(cli("convert", d / "bare.onnx", "-o", bare, "--batch-size", BATCH, "--lr", 1e-4))
    ok(cli("convert", LENET, "-o", piped, "--batch-size", BATCH, "--lr", 1e-4))
    return bare, piped


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """npz files of the same digits: each integer kind, cast by hand, scaled by hand."""
    d = tmp_path_factory.mktemp("data")
    x, y = raw_digits()
    for kind in KINDS:
        np.savez(d / f"{kind}.npz", x=as_kind(x, kind), y=y)
        np.savez(d / f"{kind}-cast.npz", x=by_hand(as_kind(x, kind)), y=y)
    np.savez(d / "scaled.npz", x=scaled(x), y=y)
    return d


def test_the_shipped_lenet_declares_its_pipeline_and_the_stripped_one_does_not(lenets):
    bare, piped = lenets
    assert "input      pipeline uint8 0..255, x / 255" in ok(cli("inspect", piped)).stdout
    assert "no input pipeline declared" in ok(cli("inspect", bare)).stdout
    assert not et.TrainingSession(bare).preprocessing.declared


# ---- the rule itself ----------------------------------------------------------------------------------------------
def test_the_rule():
    piped = InputPipeline(raw_dtype="uint8", scale=1 / 255)
    layout_only = InputPipeline(layout="nhwc")
    f32, f64, i64 = np.float32, np.float64, np.int64
    assert input_cast("x", f32, f32) == "keep"
    assert input_cast("x", f64, f32) == "cast"  # float64 -> float32: silently, as before
    assert input_cast("x", f64, f32, exact=True) == "keep"  # InferenceSession: check_feeds refuses it
    assert input_cast("x", f64, f32, exact=True, allow_cast=True) == "cast"
    assert input_cast("ids", np.int32, i64) == "cast"  # token ids: integers stay integers
    assert input_cast("ids", np.bool_, i64) == "cast"
    assert input_cast("ids", f32, i64) == "keep"  # never cut fractions: check_feeds refuses it
    for kind in (np.uint8, np.int64, np.int16):
        assert input_cast("x", kind, f32, pipeline=piped) == "pipeline"
        assert input_cast("x", kind, f32, allow_cast=True) == "cast"
        assert input_cast("x", kind, f32, allow_cast=True, pipeline=layout_only) == "cast"
        for pipeline in (None, InputPipeline(), layout_only):
            with pytest.raises(et.FeedError, match=rf"input 'x' takes float32, got {np.dtype(kind).name}"):
                input_cast("x", kind, f32, pipeline=pipeline)
    with pytest.raises(et.FeedError, match="booleans"):  # a pipeline takes integers, never bools
        input_cast("x", np.bool_, f32, pipeline=piped)
    assert input_cast("x", np.bool_, f32, allow_cast=True) == "cast"
    # pipelines that say how integers become the model's values: a scale, a normalization, a raw range past 1
    assert input_cast("x", np.uint8, f32, pipeline=InputPipeline(mean=127.5, std=127.5)) == "pipeline"
    assert input_cast("x", np.uint8, f32, pipeline=InputPipeline(range=[0, 255])) == "pipeline"
    with pytest.raises(et.FeedError, match="takes float data, not integers"):
        input_cast("x", np.uint8, f32, pipeline=InputPipeline(raw_dtype="float32", scale=0.5))


def test_the_message_names_the_input_dtypes_values_and_both_ways_out():
    x = np.array([[0, 17, 255]], np.uint8)
    with pytest.raises(et.FeedError) as e:
        input_cast("image", x.dtype, np.float32, values=x)
    text = str(e.value)
    for part in ("'image'", "float32", "uint8", "values 0..255 (8-bit pixels?)", "no input pipeline"):
        assert part in text, text
    assert "--scale 1/255" in text and "session.preprocessing" in text  # scale them
    assert "x.astype(np.float32)" in text and "allow_cast=True" in text  # or cast them
    with pytest.raises(et.FeedError) as e:
        input_cast("image", x.dtype, np.float32, values=(0, 255), ways="command line")
    assert "--scale 1/255" in str(e.value) and "--cast" in str(e.value)


# ---- TrainingSession ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_training_session_refuses_integers_on_every_path(lenets, kind):
    bare, _ = lenets
    x, y = raw_digits(BATCH)
    xi = as_kind(x, kind)
    sess = et.TrainingSession(bare)
    before = sess.parameters()
    for call in (
        lambda: sess.train_step(xi, y),
        lambda: sess.evaluate(xi, y),
        lambda: sess.run(xi),
        lambda: sess.run(xi[:3]),
        lambda: sess.preprocess(xi),
    ):
        with pytest.raises(et.FeedError, match=rf"input 'image' takes float32, got {kind}") as e:
            call()
        assert "allow_cast=True" in str(e.value)
    assert sess.step == 0
    for name, value in sess.parameters().items():
        assert np.array_equal(value, before[name]), name


@pytest.mark.parametrize("kind", KINDS)
def test_allow_cast_feeds_the_values_cast_by_hand(lenets, kind):
    bare, _ = lenets
    x, y = raw_digits(BATCH)
    xi = as_kind(x, kind)
    got, want = et.TrainingSession(bare, allow_cast=True), et.TrainingSession(bare)
    results = {}
    for sess, xs in ((got, xi), (want, by_hand(xi))):
        results[sess] = (sess.train_step(xs, y), sess.evaluate(xs, y)[0], sess.run(xs[:3]))
    (loss, ev, out), (loss_by_hand, ev_by_hand, out_by_hand) = results[got], results[want]
    assert loss == loss_by_hand and ev == ev_by_hand and np.array_equal(out, out_by_hand)
    for name, value in got.parameters().items():
        assert np.array_equal(value, want.parameters()[name]), name
    later = et.TrainingSession(bare)  # the attribute, set after the session is made
    later.allow_cast = True
    assert np.array_equal(later.run(xi[:3]), et.TrainingSession(bare).run(by_hand(xi[:3])))


@pytest.mark.parametrize("kind", ["uint8", "int64"])
def test_a_declared_pipeline_scales_integers_as_the_float_path(lenets, kind):
    bare, piped = lenets
    x, y = raw_digits(BATCH)
    xi = as_kind(x, kind)
    got, want = et.TrainingSession(piped), et.TrainingSession(bare)
    assert got.preprocessing.describe() == "uint8 0..255, x / 255"
    assert np.array_equal(got.run(xi[:3]), want.run(scaled(x[:3])))
    assert got.evaluate(xi, y)[0] == want.evaluate(scaled(x), y)[0]
    assert got.train_step(xi, y) == want.train_step(scaled(x), y)
    for name, value in got.parameters().items():
        assert np.array_equal(value, want.parameters()[name]), name
    assert np.array_equal(got.preprocess(xi), scaled(x))
    with pytest.raises(et.FeedError, match="booleans"):  # bools are not pixels, even there
        got.run(x > 127)
    with pytest.raises(et.DataError, match="outside the 0..255"):  # the pipeline's own check still holds
        got.run(xi.astype(np.int64) * 2)


def test_float64_is_still_cast_silently(lenets):
    bare, _ = lenets
    x, _ = raw_digits(3)
    sess = et.TrainingSession(bare)
    assert np.array_equal(sess.run(scaled(x).astype(np.float64)), sess.run(scaled(x)))


def test_token_ids_still_run(tmp_path):
    token_classifier(tmp_path / "tok.onnx")
    art = tmp_path / "tok.etrain"
    ok(cli("convert", tmp_path / "tok.onnx", "-o", art, "--batch-size", BATCH))
    x, y = token_data(tmp_path / "tok.npz", 16)
    sess = et.TrainingSession(art)
    want = sess.run(x)
    assert np.array_equal(sess.run(x.astype(np.int32)), want)  # int32 ids for the int64 input, as before
    assert np.isfinite(sess.train_step(x[:BATCH], y[:BATCH]))
    assert np.isfinite(sess.evaluate(x[:BATCH].astype(np.uint8), y[:BATCH])[0])
    proc = ok(cli("train", art, "--data", tmp_path / "tok.npz", "--checkpoint", tmp_path / "t.etck"))
    assert "note:" not in proc.stderr
    ok(cli("eval", art, "--data", tmp_path / "tok.npz", "--checkpoint", tmp_path / "t.etck"))
    inf = et.InferenceSession(str(tmp_path / "tok.onnx"))
    assert inf.run(None, {"ids": x})[0].shape == (16, 4)


# ---- InferenceSession ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_inference_session_refuses_integers_unless_allowed(lenets, tmp_path, kind):
    x, _ = raw_digits(4)
    xi = as_kind(x, kind)
    model = onnx.load(str(LENET))
    name = model.graph.input[0].name
    with pytest.raises(et.FeedError, match=rf"input '{name}' takes float32, got {kind}") as e:
        et.InferenceSession(model).run(None, {name: xi})
    assert "InferenceSession(..., allow_cast=True)" in str(e.value) and "x.astype(np.float32)" in str(e.value)
    got = et.InferenceSession(model, allow_cast=True).run(None, {name: xi})[0]
    assert np.array_equal(got, et.InferenceSession(model).run(None, {name: by_hand(xi)})[0])


def test_inference_session_keeps_onnxruntimes_dtypes_but_for_allow_cast():
    model = onnx.load(str(LENET))
    name = model.graph.input[0].name
    x = scaled(raw_digits(2)[0])
    with pytest.raises(et.FeedError, match="must be float32, got float64"):  # as before, as onnxruntime
        et.InferenceSession(model).run(None, {name: x.astype(np.float64)})
    want = et.InferenceSession(model).run(None, {name: x})[0]
    got = et.InferenceSession(model, allow_cast=True).run(None, {name: x.astype(np.float64)})[0]
    assert np.array_equal(got, want)


# ---- Trainer over a DataLoader -----------------------------------------------------------------------------------
def fit(artifact: Path, x: np.ndarray, y: np.ndarray, **session) -> dict[str, np.ndarray]:
    sess = et.TrainingSession(artifact, **session)
    Trainer(sess, DataLoader(ArrayDataView(x, y), BATCH, shuffle=True, seed=3), epochs=2).fit()
    return sess.parameters()


@pytest.mark.parametrize("kind", KINDS)
def test_trainer_refuses_integers_and_follows_allow_cast(lenets, kind):
    bare, _ = lenets
    x, y = raw_digits()
    xi = as_kind(x, kind)
    sess = et.TrainingSession(bare)
    trainer = Trainer(sess, DataLoader(ArrayDataView(xi, y), BATCH), epochs=1)
    with pytest.raises(et.FeedError, match=rf"input 'image' takes float32, got {kind}"):
        trainer.fit()
    assert sess.step == 0
    got, want = fit(bare, xi, y, allow_cast=True), fit(bare, by_hand(xi), y)
    for name in want:
        assert np.array_equal(got[name], want[name]), name


def test_trainer_on_raw_digits_with_the_declared_pipeline(lenets):
    bare, piped = lenets
    x, y = raw_digits()
    got, want = fit(piped, x, y), fit(bare, scaled(x), y)
    for name in want:
        assert np.array_equal(got[name], want[name]), name


# ---- the command line -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_cli_train_and_eval_refuse_integers_with_exit_2(lenets, files, tmp_path, kind):
    bare, _ = lenets
    data = files / f"{kind}.npz"
    for command in (["train", bare, "--checkpoint", tmp_path / "c.etck"], ["eval", bare]):
        proc = cli(*command, "--data", data)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        line = one_error_line(proc)
        assert f"input 'image' takes float32, got {kind}" in line and "--cast" in line, line
        if kind != "bool":
            assert "values 0..255" in line and "--scale 1/255" in line, line
    assert not (tmp_path / "c.etck").exists()
    # Python's feeding (the phone app's, the fleet's) refuses with a FeedError
    with pytest.raises(et.FeedError, match=rf"got {kind}"):
        open_feed(str(data), "train", et.TrainingSession(bare), DataOptions())


def eval_lines(proc) -> list[str]:
    return [line for line in proc.stdout.splitlines() if line.strip().startswith(("loss", "accuracy"))]


@pytest.mark.parametrize("kind", KINDS)
def test_cli_cast_runs_and_equals_casting_by_hand(lenets, files, tmp_path, kind):
    bare, _ = lenets
    ok(cli("train", bare, "--data", files / f"{kind}.npz", "--cast", "--checkpoint", tmp_path / "a.etck"))
    ok(cli("train", bare, "--data", files / f"{kind}-cast.npz", "--checkpoint", tmp_path / "b.etck"))
    got, want = tensors(tmp_path / "a.etck"), tensors(tmp_path / "b.etck")
    assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)
    proc = ok(
        cli("eval", bare, "--data", files / f"{kind}.npz", "--cast", "--checkpoint", tmp_path / "a.etck")
    )
    assert "cast" in proc.stderr or "fed as they are" in proc.stderr  # a note says what was done
    by = ok(cli("eval", bare, "--data", files / f"{kind}-cast.npz", "--checkpoint", tmp_path / "a.etck"))
    assert eval_lines(proc) == eval_lines(by) and len(eval_lines(proc)) == 2


def test_cli_resume_keeps_cast(lenets, files, tmp_path):
    bare, _ = lenets
    ck = tmp_path / "r.etck"
    ok(cli("train", bare, "--data", files / "uint8.npz", "--cast", "--checkpoint", ck))
    ok(cli("train", bare, "--resume", "--epochs", 2, "--checkpoint", ck))  # --cast recorded, not repeated
    assert tensors(ck)  # trained on


@pytest.mark.parametrize("kind", ["uint8", "int64"])
def test_cli_with_the_declared_pipeline_needs_no_cast_and_equals_the_scaled_path(
    lenets, files, tmp_path, kind
):
    bare, piped = lenets
    proc = ok(cli("train", piped, "--data", files / f"{kind}.npz", "--checkpoint", tmp_path / "p.etck"))
    assert "--cast" not in proc.stderr
    ok(cli("train", bare, "--data", files / "scaled.npz", "--checkpoint", tmp_path / "s.etck"))
    got, want = tensors(tmp_path / "p.etck"), tensors(tmp_path / "s.etck")
    assert all(np.array_equal(got[k], want[k]) for k in want)
    proc = ok(cli("eval", piped, "--data", files / f"{kind}.npz", "--checkpoint", tmp_path / "p.etck"))
    by = ok(cli("eval", bare, "--data", files / "scaled.npz", "--checkpoint", tmp_path / "s.etck"))
    assert eval_lines(proc) == eval_lines(by) and len(eval_lines(proc)) == 2
    # and a bare model given --scale at train/eval declares the same pipeline
    proc = ok(
        cli("eval", bare, "--data", files / f"{kind}.npz", "--scale", "--checkpoint", tmp_path / "s.etck")
    )
    assert eval_lines(proc) == eval_lines(by)
