"""The input pipeline, declared once and carried everywhere (issue 21): scaling decided in one place, stored in the
artifact and every checkpoint, applied by train and eval, refused when the data contradicts it, and written into the
exported ONNX model so that onnxruntime on raw data gives the session's answer.

References: numpy written out by hand (x / 255, (x - mean) / std, np.transpose), onnxruntime on the exported model,
and the accuracy an undisturbed run reaches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from test_cli import ROOT, cli, ok
from test_cli_userdata import (
    CLASSES,
    C,
    H,
    W,
    camera_classifier,
    camera_data,
    one_error_line,
    printed,
    tensors,
)

import edgetrain as et
from edgetrain.core.container import read_container
from edgetrain.runtime.feeding import DataOptions, open_feed
from loaders import DataError, DataFacts, InputPipeline, MnistDataView, data_facts, open_data

DIGITS = ROOT / "edgetrain" / "data" / "digits"
LENET = ROOT / "edgetrain" / "data" / "digits_lenet.onnx"


def lenet_without_pipeline(path: Path) -> Path:
    """The shipped LeNet as a user's own export would be: without the metadata that declares its pipeline."""
    model = onnx.load(str(LENET))
    kept = {p.key: p.value for p in model.metadata_props if p.key != "edgetrain.preprocessing"}
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, kept)
    onnx.save(model, str(path))
    return path


def digits_npz(path: Path, *, scaled: bool, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    view = MnistDataView.from_dir(DIGITS, split, normalize=scaled)
    x, y = view.get_batch(np.arange(view.size()))
    x = x if scaled else x.astype(np.uint8)
    np.savez(path, x=x, y=y)
    return x, y


def digits_csv(path: Path, split: str = "test") -> None:
    """The digits as a CSV of 0-255 values, the label first."""
    view = MnistDataView.from_dir(DIGITS, split, normalize=False)
    x, y = view.get_batch(np.arange(view.size()))
    rows = np.concatenate([y[:, None], x.reshape(len(x), -1).astype(np.int64)], axis=1)
    header = "label," + ",".join(f"p{i}" for i in range(784))
    np.savetxt(path, rows, fmt="%d", delimiter=",", header=header, comments="")


def accuracy(proc) -> float:
    return printed("accuracy", proc.stdout)


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    """(an artifact of the LeNet that declares no pipeline, one converted with --scale)."""
    d = tmp_path_factory.mktemp("lenet")
    onnx_path = lenet_without_pipeline(d / "lenet.onnx")
    plain, scaled = d / "plain.etrain", d / "scaled.etrain"
    ok(cli("convert", onnx_path, "-o", plain, "--batch-size", 32))
    ok(cli("convert", onnx_path, "-o", scaled, "--batch-size", 32, "--scale"))
    return plain, scaled


# ---- the pipeline itself ---------------------------------------------------------------------------------------
def test_the_pipeline_round_trips_through_json_and_refuses_what_it_does_not_know():
    p = InputPipeline.from_options(scale="1/255", normalize="0.5:0.4:0.3,0.2:0.2:0.25", layout="nhwc")
    assert p.declared and p.raw_dtype == "uint8" and p.expected_range() == (0.0, 255.0)
    assert InputPipeline.from_json(json.dumps(p.to_json())) == p
    assert not InputPipeline().declared and InputPipeline().expected_range() is None
    for bad, says in (
        ({"scale": 1 / 255, "colour": "rgb"}, "unknown keys ['colour']"),
        ({"version": 7}, "version 7"),
        ({"scale": -1}, "scale must be > 0"),
        ({"std": [0.2, 0]}, "std must be > 0"),
        ({"layout": "hwc"}, "layout must be"),
        ({"size": [224]}, "size must be two positive integers"),
        ({"dtype": "int64", "scale": 0.5}, "float inputs only"),
    ):
        with pytest.raises(et.EdgeTrainError, match=says.replace("[", r"\[").replace("]", r"\]")):
            InputPipeline.from_json(bad, source="test")


def test_the_scale_divides_as_the_mnist_reader_does():
    """1/255 divides by 255 (correctly rounded: 255 -> exactly 1.0), the MNIST reader's own arithmetic."""
    raw = MnistDataView.from_dir(DIGITS, "test", normalize=False)
    x, y = raw.get_batch(np.arange(64))
    got, _ = InputPipeline.from_options(scale="1/255").preprocess()(x, y)
    assert np.array_equal(got, MnistDataView.from_dir(DIGITS, "test").get_batch(np.arange(64))[0])
    assert np.array_equal(got, x / np.float32(255))
    assert got.max() == 1.0 or x.max() < 255


def facts(lo, hi, integral, dtype=np.float32) -> DataFacts:
    return DataFacts("d.npz", np.dtype(dtype), (28, 28), lo, hi, integral)


def test_data_that_contradicts_the_pipeline_is_refused_with_the_fix():
    divides = InputPipeline.from_options(scale="1/255")
    assert divides.check(facts(0, 255, True, np.uint8)) == []
    with pytest.raises(DataError, match="would scale these a second time"):
        divides.check(facts(0, 1, False))  # pixels scaled already
    with pytest.raises(DataError, match="outside the 0..255"):
        divides.check(facts(0, 4095, True, np.uint16))
    unit = InputPipeline.from_options(input_range="0,1")
    assert unit.check(facts(0, 1, False)) == []
    with pytest.raises(DataError, match="8-bit pixels.*--scale 1/255"):
        unit.check(facts(0, 255, True, np.uint8))
    (note,) = InputPipeline().check(facts(0, 255, True))  # nothing declared: a note, as before
    assert "8-bit" in note and "--scale 1/255" in note


def test_readers_report_what_their_data_is(tmp_path):
    digits_npz(tmp_path / "u8.npz", scaled=False)
    f = data_facts(open_data(tmp_path / "u8.npz"))
    assert (f.dtype, f.lo, f.hi, f.integral, f.eight_bit) == (np.uint8, 0.0, 255.0, True, True)
    f = data_facts(open_data(DIGITS))  # the MNIST reader scales to [0, 1] by itself
    assert f.unit and not f.eight_bit and "already in [0, 1]" in f.describe()


# ---- train and eval -------------------------------------------------------------------------------------------
def test_scale_on_mnist_does_not_divide_twice(lenet):
    """eval --scale on an MNIST folder: the reader gives raw pixels and the pipeline divides once (the reader
    divided by 255 and --scale a second time: 12.8% instead of 90.9%)."""
    plain, _ = lenet
    base = accuracy(ok(cli("eval", plain, "--data", DIGITS)))
    assert accuracy(ok(cli("eval", plain, "--data", DIGITS, "--scale"))) == base
    assert base > 0.85


def test_a_declared_pipeline_reads_every_format_alike(lenet, tmp_path):
    """The artifact converted with --scale: MNIST idx, a uint8 npz and a CSV of 0-255 values give the accuracy the
    base model has on [0, 1] pixels; [0, 1] floats are refused, saying why."""
    plain, scaled = lenet
    want = accuracy(ok(cli("eval", plain, "--data", DIGITS)))
    proc = ok(cli("eval", scaled, "--data", DIGITS))
    assert accuracy(proc) == want and "uint8 0..255, x / 255" in proc.stdout
    digits_npz(tmp_path / "u8.npz", scaled=False, split="test")
    assert accuracy(ok(cli("eval", scaled, "--data", tmp_path / "u8.npz"))) == want
    digits_csv(tmp_path / "d.csv")
    assert accuracy(ok(cli("eval", scaled, "--data", tmp_path / "d.csv"))) == want
    digits_npz(tmp_path / "f.npz", scaled=True, split="test")
    proc = cli("eval", scaled, "--data", tmp_path / "f.npz")
    assert proc.returncode == 1 and "scale these a second time" in one_error_line(proc)
    proc = cli("eval", scaled, "--data", DIGITS, "--scale", "1/256")
    assert proc.returncode == 1 and "leave the option out" in one_error_line(proc)


def test_a_csv_of_8bit_values_gets_the_note_an_npz_gets(lenet, tmp_path):
    plain, _ = lenet
    digits_csv(tmp_path / "d.csv")
    proc = ok(cli("eval", plain, "--data", tmp_path / "d.csv"))
    assert "8-bit" in proc.stderr and "--scale 1/255" in proc.stderr
    scaled = accuracy(ok(cli("eval", plain, "--data", tmp_path / "d.csv", "--scale")))
    assert scaled == accuracy(ok(cli("eval", plain, "--data", DIGITS))) > accuracy(proc)


def test_eval_applies_the_scale_the_checkpoint_recorded(lenet, tmp_path):
    plain, _ = lenet
    digits_npz(tmp_path / "u8.npz", scaled=False)
    ck = tmp_path / "run.etck"
    ok(cli("train", plain, "--data", tmp_path / "u8.npz", "--scale", "--checkpoint", ck, "--epochs", 1))
    header, _ = read_container(ck, kind="checkpoint")
    assert header["preprocessing"]["scale"] == pytest.approx(1 / 255)
    assert "input      pipeline uint8 0..255, x / 255" in ok(cli("inspect", ck)).stdout
    assert json.loads(ok(cli("inspect", ck, "--json")).stdout)["preprocessing"] == header["preprocessing"]
    assert "no input pipeline declared" in ok(cli("inspect", plain)).stdout
    digits_npz(tmp_path / "t.npz", scaled=False, split="test")
    given = accuracy(ok(cli("eval", plain, "--data", tmp_path / "t.npz", "--checkpoint", ck, "--scale")))
    recorded = ok(cli("eval", plain, "--data", tmp_path / "t.npz", "--checkpoint", ck))
    assert accuracy(recorded) == given > 0.85


def test_old_artifacts_keep_todays_behaviour():
    sess = et.TrainingSession(ROOT / "tests" / "data" / "release-0.1.0-lenet-sgd.etrain")
    assert not sess.preprocessing.declared
    assert "none declared" in sess.preprocessing.describe()


# ---- the export ------------------------------------------------------------------------------------------------
@pytest.fixture
def camera(tmp_path):
    """A camera classifier converted with its pipeline: channels-last uint8, x / 255, then normalized."""
    camera_classifier(tmp_path / "cam.onnx")
    options = ["--layout", "nhwc", "--scale", "--normalize", "0.5:0.4:0.3,0.25:0.2:0.3"]
    ok(cli("convert", tmp_path / "cam.onnx", "-o", tmp_path / "cam.etrain", "--batch-size", 8, *options))
    camera_data(tmp_path / "train.npz", 48)
    ok(cli("train", tmp_path / "cam.etrain", "--data", tmp_path / "train.npz", "--epochs", 2))
    return tmp_path


def by_hand(x: np.ndarray) -> np.ndarray:
    """What the camera model must see, written out: channels first, / 255, per-channel normalization."""
    mean = np.array([0.5, 0.4, 0.3], np.float32).reshape(1, 3, 1, 1)
    std = np.array([0.25, 0.2, 0.3], np.float32).reshape(1, 3, 1, 1)
    return (np.transpose(x, (0, 3, 1, 2)).astype(np.float32) / np.float32(255) - mean) / std


def test_the_exported_model_takes_raw_camera_images(camera):
    ok(cli("export", camera / "cam.etrain", "--checkpoint", camera / "cam.etck", "-o", camera / "p.onnx"))
    x, _ = camera_data(camera / "test.npz", 21, seed=1)
    o = ort.InferenceSession(str(camera / "p.onnx"), providers=["CPUExecutionProvider"])
    (info,) = o.get_inputs()
    assert info.name == "input" and info.type == "tensor(uint8)" and info.shape[1:] == [H, W, C]
    (got,) = o.run(None, {"input": x})
    sess = et.TrainingSession(camera / "cam.etrain")
    sess.load_checkpoint(camera / "cam.etck")
    want = sess.run(by_hand(x))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert tensors(camera / "cam.etck")  # trained
    model = onnx.load(str(camera / "p.onnx"))
    props = {p.key: p.value for p in model.metadata_props}
    assert "edgetrain.preprocessing_in_graph" in props and "edgetrain.preprocessing" not in props


def test_without_the_pipeline_the_export_says_how_and_convert_reads_it_back(camera):
    out = camera / "bare.onnx"
    args = ["--checkpoint", camera / "cam.etck", "-o", out, "--no-preprocessing-in-export"]
    proc = ok(cli("export", camera / "cam.etrain", *args))
    assert "left to the app" in proc.stdout
    o = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert o.get_inputs()[0].type == "tensor(float)"
    x, _ = camera_data(camera / "test.npz", 8, seed=2)
    (a,) = o.run(None, {"input": by_hand(x)})
    ok(cli("convert", out, "-o", camera / "again.etrain", "--batch-size", 8))
    again = et.TrainingSession(camera / "again.etrain")
    assert again.preprocessing == et.TrainingSession(camera / "cam.etrain").preprocessing
    np.testing.assert_allclose(again.run(by_hand(x)), a, rtol=1e-5, atol=1e-6)


def test_a_declared_pipeline_refuses_contradicting_options(camera):
    proc = cli(
        "train", camera / "cam.etrain", "--data", camera / "train.npz", "--layout", "nchw", "--overwrite"
    )
    assert proc.returncode == 1 and "--layout nchw contradicts" in one_error_line(proc)
    proc = cli("convert", camera / "cam.onnx", "-o", camera / "x.etrain", "--normalize", "0.5:0.5,1:1")
    assert proc.returncode == 1 and "3 channels" in one_error_line(proc)
    assert CLASSES == 3


# ---- images as people keep them ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def png_digits(tmp_path_factory):
    """200 test digits as 32x32 PNG files in ROOT/<digit>/ folders (what a phone's gallery would hold)."""
    image = pytest.importorskip("PIL.Image", reason="Pillow (edgetrain[images]) decodes image folders")
    root = tmp_path_factory.mktemp("png") / "digits"
    x, y = MnistDataView.from_dir(DIGITS, "test", normalize=False).get_batch(np.arange(200))
    for i, (pixels, label) in enumerate(zip(x, y)):
        (root / str(label)).mkdir(parents=True, exist_ok=True)
        image.fromarray(pixels[0].astype(np.uint8)).resize((32, 32)).save(root / str(label) / f"{i}.png")
    return root


def test_a_folder_of_pngs_trains_evaluates_and_exports_through_the_pipeline(png_digits, tmp_path):
    """--resize at convert joins the model's own pipeline (x / 255): 32x32 PNGs are resized to 28x28 by it, the
    base model reads them as it reads the idx digits, and the export resizes raw uint8 images of any size itself."""
    art = tmp_path / "png.etrain"
    proc = ok(cli("convert", LENET, "-o", art, "--batch-size", 8, "--resize", "28,28"))
    assert "input pipeline (merged): uint8 0..255, resized to 28x28, x / 255" in proc.stdout
    assert accuracy(ok(cli("eval", art, "--data", png_digits))) > 0.9
    ok(cli("train", art, "--data", png_digits, "--epochs", 1))
    ok(cli("export", art, "--checkpoint", tmp_path / "png.etck", "-o", tmp_path / "p.onnx"))
    sess = et.TrainingSession(art)
    sess.load_checkpoint(tmp_path / "png.etck")
    feed = open_feed(str(png_digits), "train", sess, DataOptions())
    x, _ = feed.view.get_batch(np.arange(16))
    want = sess.run(feed.transform(x, np.zeros(16))[0])
    image = pytest.importorskip("PIL.Image")
    raw = np.stack([np.asarray(image.open(p)) for p in feed.view.paths[:16]])  # the files as stored, 32x32
    assert raw.shape == (16, 32, 32) and raw.dtype == np.uint8
    o = ort.InferenceSession(str(tmp_path / "p.onnx"), providers=["CPUExecutionProvider"])
    (got,) = o.run(None, {o.get_inputs()[0].name: raw[:, None]})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_images_of_another_size_say_how_to_resize_them(png_digits, tmp_path):
    proc = cli("eval", ROOT / "android_demo" / "data" / "digits.etrain", "--data", png_digits)
    assert proc.returncode == 1 and "convert with --resize 28,28" in one_error_line(proc)


# ---- the phone app ---------------------------------------------------------------------------------------------
def android(*args, home: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "android_demo", "--home", str(home), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_the_app_scales_files_and_page_samples_by_the_models_pipeline(tmp_path):
    """The shipped app's model declares x / 255: a uint8 file and a page's 8-bit drawing are stored as the model's
    [0, 1] input, [0, 1] floats are refused, and a prediction on raw pixels is the session's on x / 255."""
    from android_demo.app import Home
    from android_demo.simulate import ARTIFACT

    home = Home.init(tmp_path / "home", ARTIFACT)
    x, y = digits_npz(tmp_path / "u8.npz", scaled=False)
    assert ok(android("add", "--data", tmp_path / "u8.npz", home=home.path)).returncode == 0
    with home.store() as s:
        stored, _ = s.get(min(s.ids()))
    assert np.array_equal(stored, x[0] / np.float32(255))
    digits_npz(tmp_path / "f.npz", scaled=True)
    proc = android("add", "--data", tmp_path / "f.npz", home=home.path)
    assert proc.returncode == 1 and "scale these a second time" in proc.stderr
    proc = android("add", "--data", tmp_path / "u8.npz", "--scale", "1/256", home=home.path)
    assert proc.returncode == 1 and "contradicts the model's input pipeline" in proc.stderr
    sid = home.add(x[1], y[1])  # what the page sends: 8-bit pixels
    with home.store() as s:
        assert np.array_equal(s.get(sid)[0], x[1] / np.float32(255))
    sess = et.TrainingSession(ARTIFACT)
    np.testing.assert_allclose(
        home.predict(x[:4]), sess.run(x[:4] / np.float32(255)), atol=1e-6
    )  # probabilities
    assert home.input_range() == (0.0, 255.0)


def test_a_home_without_a_pipeline_adopts_the_scale_of_its_first_file(tmp_path):
    """`add --scale` was advised and did not exist; now a home whose model declares nothing adopts it for every
    later sample (files, page, bursts, evaluation), and refuses it once unscaled samples are stored."""
    art = tmp_path / "plain.etrain"
    ok(cli("convert", lenet_without_pipeline(tmp_path / "l.onnx"), "-o", art, "--batch-size", 10))
    digits_npz(tmp_path / "u8.npz", scaled=False)
    digits_npz(tmp_path / "t.npz", scaled=False, split="test")
    ok(android("init", "--artifact", art, home=tmp_path / "a"))
    proc = android("add", "--data", tmp_path / "u8.npz", home=tmp_path / "a")
    assert proc.returncode == 1 and "--scale 1/255" in proc.stderr  # uint8 unscaled: refused, naming the fix
    x, y = digits_npz(tmp_path / "f.npz", scaled=False)
    np.savez(tmp_path / "f.npz", x=x.astype(np.float32), y=y)  # 0-255 as floats: fed as they are, with a note
    proc = ok(android("add", "--data", tmp_path / "f.npz", home=tmp_path / "a"))
    assert "--scale 1/255" in proc.stderr  # the note names the fix, which the app now takes
    proc = android("add", "--data", tmp_path / "u8.npz", "--scale", home=tmp_path / "a")
    assert proc.returncode == 1 and "set up a new home" in proc.stderr

    ok(android("init", "--artifact", art, home=tmp_path / "b"))
    ok(android("add", "--data", tmp_path / "u8.npz", "--scale", home=tmp_path / "b"))
    evaluated = ok(android("evaluate", "--data", tmp_path / "t.npz", "--json", home=tmp_path / "b"))
    plain = accuracy(ok(cli("eval", art, "--data", DIGITS)))
    assert json.loads(evaluated.stdout)["accuracy"] == pytest.approx(plain, abs=6e-4)  # eval prints 99.3%
    from android_demo.app import Home

    assert Home(tmp_path / "b").input_range() == (0.0, 255.0)


def test_augmentation_from_the_command_line_is_seeded_and_resumes_exactly(tmp_path):
    """train --augment: the same run twice gives the same weights, a run resumed after its first epoch (the
    option restored from the checkpoint) ends where the uninterrupted one does, and without it the weights differ."""
    art = tmp_path / "a.etrain"
    ok(cli("convert", LENET, "-o", art, "--batch-size", 32, "--trainable", "fc3.*"))
    aug = ["--augment", "crop:2,flip,rotate:10"]

    def run(name, *extra):
        return ok(cli("train", art, "--data", DIGITS, "--checkpoint", tmp_path / name, *extra))

    proc = run("a.etck", "--epochs", 2, *aug)
    assert "feature cache off" in proc.stderr and "augment" in proc.stderr
    run("b.etck", "--epochs", 1, *aug)
    run("b.etck", "--epochs", 2, "--resume")
    run("c.etck", "--epochs", 2)
    a, b, c = (tensors(tmp_path / n) for n in ("a.etck", "b.etck", "c.etck"))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["fc3.weight"], c["fc3.weight"])
    proc = cli("train", art, "--data", DIGITS, "--augment", "zoom:2", "--checkpoint", tmp_path / "d.etck")
    assert proc.returncode == 2 and "--augment zoom:2" in proc.stderr


def test_the_exported_crop_takes_the_window_the_reader_takes(png_digits, tmp_path):
    """--resize 31,31 --crop 28,28: 3 pixels to spare, which torchvision's rounding (half to even) splits 2 + 1; the
    exported model's Slice must cut where the image reader cuts."""
    art = tmp_path / "crop.etrain"
    ok(cli("convert", LENET, "-o", art, "--batch-size", 8, "--resize", "31,31", "--crop", "28,28"))
    ok(cli("export", art, "-o", tmp_path / "c.onnx"))
    sess = et.TrainingSession(art)
    feed = open_feed(str(png_digits), "train", sess, DataOptions())
    x, _ = feed.view.get_batch(np.arange(8))
    want = sess.run(feed.transform(x, np.zeros(8))[0])
    image = pytest.importorskip("PIL.Image")
    raw = np.stack([np.asarray(image.open(p)) for p in feed.view.paths[:8]])[:, None]
    o = ort.InferenceSession(str(tmp_path / "c.onnx"), providers=["CPUExecutionProvider"])
    (got,) = o.run(None, {o.get_inputs()[0].name: raw})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
