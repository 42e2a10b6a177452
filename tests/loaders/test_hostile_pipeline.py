"""Hostile input pipelines (issue 33): the values of loaders.InputPipeline and of the options that declare it
(--scale, --normalize, --input-range, --resize, --crop), wherever they enter: a pipeline's JSON (an artifact's
header, a checkpoint, the phone's settings), the command line's texts, a model's metadata, a checkpoint's recorded
run options, and the image readers' resize. Each surface is a Tally: inputs drawn by Hypothesis, judged by a
reference written here (what float32 holds, what a size is), plus the issue's reproductions, each a named case.

A refusal is an EdgeTrainError naming the option or field; an acceptance is checked: the pipeline round-trips through
its JSON and its arithmetic on the raw values it expects stays finite."""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stderr
from pathlib import Path

import numpy as np
import onnx
import pytest
from crafting import crafted, encode
from hostile import Tally
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from models import MODELS
from onnx import TensorProto, helper

import edgetrain as et
from edgetrain.cli import main
from edgetrain.cli.build_config import PipelineConfig
from edgetrain.cli.config import RunConfig
from edgetrain.cli.options import hw
from edgetrain.cli.parser import build_parser
from edgetrain.core.container import read_container
from edgetrain.core.errors import EdgeTrainError, LimitError
from edgetrain.derive.preprocessing import PREPROCESSING_KEY, declared_pipeline
from edgetrain.graph.preprocessing import with_preprocessing
from edgetrain.onnx_io.reader import from_onnx
from loaders import IMAGE_MAX_PIXELS, InputPipeline, Preprocess, parse_normalize, parse_range, parse_scale
from loaders.imageops import RESIZE_MAX_BYTES, resize

# numpy's overflow in a pipeline's arithmetic (a std that float16 holds as inf makes every output 0) is a defect here
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")
ROOT = Path(__file__).resolve().parents[2]
LENET = ROOT / "edgetrain" / "data" / "digits_lenet.onnx"
F32_TINY, F32_MAX = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
RAW = ("uint8", "uint16", "int8", "int16", "int32", "int64", "float16", "float32", "float64")
FLOATS = ("float32", "float64", "float16")
KEYS = ("version", "dtype", "raw_dtype", "layout", "size", "crop", "scale", "mean", "std", "range")
SETTINGS = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# ---- the reference: what a value of a pipeline may be ----------------------------------------------------------
def a_number(v, *, positive: bool = False) -> bool:
    """A real number (not a bool) that is finite and 0 or of a size float32 holds as a normal number."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        f = float(v)
    except OverflowError:
        return False
    if not math.isfinite(f) or (f != 0 and not F32_TINY <= abs(f) <= F32_MAX):
        return False
    return f > 0 if positive else True


def numbers_of(v, *, positive: bool = False) -> list[float] | None:
    """One number or a non-empty list of them, as floats; None when it is not that."""
    items = v if isinstance(v, list) else [v]
    if not items or not all(a_number(x, positive=positive) for x in items):
        return None
    return [float(x) for x in items]


def a_size(v) -> bool:
    return (
        isinstance(v, list)
        and len(v) == 2
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in v)
        and v[0] * v[1] <= IMAGE_MAX_PIXELS
    )


def one_over(scale: float) -> int | None:
    """k when the scale is 1/k (k 255 or 65535: 8- and 16-bit pixels, whose range the pipeline then expects)."""
    k = round(1 / scale) if 0 < scale < 1 and math.isfinite(1 / scale) else 0
    return k if k >= 2 and abs(1 / scale - k) <= 1e-9 * k else None


def raw_values(spec: dict, scale: float | None) -> tuple[float, float]:
    """The raw values a pipeline expects: its range, [0, k] for a scale of 1/k, its raw integer type's, else 0."""
    if "range" in spec:
        return tuple(float(v) for v in spec["range"])
    k = one_over(scale) if scale is not None else None
    if k in (255, 65535):
        return 0.0, float(k)
    raw = spec.get("raw_dtype")
    if raw is not None and np.dtype(raw).kind in "iu":
        return float(np.iinfo(raw).min), float(np.iinfo(raw).max)
    return 0.0, 0.0


def stays_finite(spec: dict, scale, mean, std) -> bool:
    """(x * scale - mean) / std on the raw values' ends, in the model's float type, as the steps compute it."""
    dt = np.dtype(spec.get("dtype", "float32"))
    if dt.kind != "f":
        return True
    big = float(np.finfo(dt).max)
    x = np.clip(np.array(raw_values(spec, scale)), -big, big).astype(dt)[:, None]
    with np.errstate(all="ignore"):
        if scale is not None:
            k = one_over(scale)
            factor = dt.type(k or scale)
            if not np.isfinite(factor) or factor == 0:  # a factor the float type makes inf or 0
                return False
            x = x / dt.type(k) if k else x * dt.type(scale)
        if any(v is not None and not np.isfinite(np.array(v, dtype=dt)).all() for v in (mean, std)):
            return False  # a mean or std the float type holds as inf
        if mean is not None:
            x = x - np.array(mean, dtype=dt)
        if std is not None:
            x = x / np.array(std, dtype=dt)
    return bool(np.isfinite(x).all())


def spec_is_valid(spec: dict) -> bool:
    """The reference: whether InputPipeline.from_json must accept `spec` (a JSON object)."""
    if set(spec) - set(KEYS):
        return False
    version = spec.get("version", 1)
    if isinstance(version, bool) or version != 1:
        return False
    dtype = spec.get("dtype", "float32")
    if dtype not in (*FLOATS, "int64", "int32", "uint8", "bool"):
        return False
    if spec.get("raw_dtype", "uint8") not in RAW or spec.get("layout", "nchw") not in ("nchw", "nhwc"):
        return False
    size, crop = spec.get("size"), spec.get("crop")
    if any(v is not None and not a_size(v) for v in (size, crop)):
        return False
    if size and crop and (crop[0] > size[0] or crop[1] > size[1]):
        return False
    scale = spec.get("scale")
    if isinstance(scale, list):
        scale = scale[0] if len(scale) == 1 else "many"
    checks = {
        "scale": None if scale is None else numbers_of(scale, positive=True),
        "mean": None if "mean" not in spec else numbers_of(spec["mean"]),
        "std": None if "std" not in spec else numbers_of(spec["std"], positive=True),
        "range": None if "range" not in spec else numbers_of(spec["range"]),
    }
    if any(checks[k] is None for k in checks if k in spec):
        return False
    mean, std, rng = checks["mean"], checks["std"], checks["range"]
    if mean and std and len(mean) != len(std) and 1 not in (len(mean), len(std)):
        return False
    if rng is not None and (len(rng) != 2 or rng[0] >= rng[1]):
        return False
    arithmetic = any(k in spec for k in ("scale", "mean", "std"))
    if arithmetic and np.dtype(dtype).kind != "f":
        return False
    return stays_finite(spec, checks["scale"] and checks["scale"][0], mean, std)


def check_accepted(p: InputPipeline, spec: dict) -> None:
    """An accepted pipeline round-trips through its JSON, and its batch transform on the raw values it expects
    (within what its float type holds) gives finite values."""
    assert InputPipeline.from_json(json.loads(json.dumps(p.to_json()))) == p
    dt = np.dtype(p.dtype)
    if dt.kind != "f":
        return
    channels = max(len(p.mean or ()), len(p.std or ()), 1)
    lo, hi = np.clip(raw_values(spec, p.scale), -float(np.finfo(dt).max), float(np.finfo(dt).max))
    x = np.array([[lo] * channels, [hi] * channels], dtype=dt)
    out, _ = p.preprocess()(x, np.zeros(2))
    assert np.isfinite(out).all(), (spec, out)


# ---- strategies ----------------------------------------------------------------------------------------------
NASTY = [
    0.0,
    -0.0,
    1e-320,
    5e-324,
    1e-300,
    1e-39,
    F32_TINY,
    F32_MAX,
    3.5e38,
    1e300,
    math.inf,
    -math.inf,
    math.nan,
    10**400,
    True,
    "0.5",
    None,
]
NUMBERS = st.one_of(
    st.sampled_from(NASTY),
    st.sampled_from([1 / 255, 1 / 65535, 0.5, 0.25, 127.5, 255.0, 1.0, -1.0, 2.0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-300.0, 300.0),
    st.integers(-(10**6), 10**6),
)
VALUES = st.one_of(NUMBERS, st.lists(NUMBERS, min_size=0, max_size=4))
SIZES = st.one_of(
    st.lists(st.integers(1, 512), min_size=2, max_size=2),
    st.lists(st.integers(-2, 10**6), min_size=0, max_size=3),
    st.sampled_from([[100000, 100000], [8192, 8192], [8193, 8192], [1, IMAGE_MAX_PIXELS], [10**400, 1]]),
    st.sampled_from([None, "8,8", [8.5, 8], [True, 8], {"h": 8}]),
)
HOSTILE_SPECS = st.fixed_dictionaries(
    {},
    optional={
        "version": st.sampled_from([1, 1.0, 2, True, "1", None]),
        "dtype": st.sampled_from([*FLOATS, "int64", "bool", "bogus", "S3", "complex64", 5, ["f4"]]),
        "raw_dtype": st.sampled_from([*RAW, "bool", "object", "x" * 100, 3]),
        "layout": st.sampled_from(["nchw", "nhwc", "hwc", "", None, ["nchw"]]),
        "size": SIZES,
        "crop": SIZES,
        "scale": VALUES,
        "mean": VALUES,
        "std": VALUES,
        "range": st.one_of(st.lists(NUMBERS, min_size=0, max_size=3), NUMBERS),
        "colour": st.just("rgb"),
    },
).map(lambda d: {k: v for k, v in d.items() if v is not None})
# pipelines as people declare them (8- and 16-bit pixels, [0, 1] or [-1, 1] floats, per-channel statistics), with
# their values stretched towards float32's ends
PLAIN = st.one_of(
    st.floats(1e-6, 10.0),
    st.sampled_from([1 / 255, 1 / 65535, 0.5, 2.0]),
    st.floats(F32_TINY, F32_MAX),
)
PLAIN_SPECS = st.fixed_dictionaries(
    {"dtype": st.sampled_from(["float32", "float32", "float64", "float16"])},
    optional={
        "raw_dtype": st.sampled_from(["uint8", "uint16", "float32"]),
        "layout": st.sampled_from(["nchw", "nhwc"]),
        "size": st.lists(st.integers(1, 8192), min_size=2, max_size=2),
        "scale": PLAIN,
        "mean": st.one_of(st.floats(-300.0, 300.0), st.lists(st.floats(-3.0, 3.0), min_size=3, max_size=3)),
        "std": st.one_of(PLAIN, st.lists(PLAIN, min_size=3, max_size=3)),
        "range": st.sampled_from([[0, 255], [0, 1], [-1, 1], [0, 65535], [0, 1e30]]),
    },
)
SPECS = st.one_of(HOSTILE_SPECS, PLAIN_SPECS)


def test_pipeline_specs_drawn_by_hypothesis_are_refused_naming_their_field_or_work(report):
    tally = Tally("input pipeline specs (InputPipeline.from_json)")

    @SETTINGS
    @given(SPECS)
    def one(spec):
        text = repr(spec)[:100]
        if spec_is_valid(spec):
            with tally.case(text, accept=True):
                check_accepted(InputPipeline.from_json(spec, source="spec"), spec)
        else:
            with tally.case(text, names="spec"):
                InputPipeline.from_json(spec, source="spec")

    one()
    report("hostile inputs", tally.line())
    tally.assert_clean()


# ---- the command line's texts --------------------------------------------------------------------------------
def number_text(text: str) -> float | None:
    """A number or a fraction as the options take it (Python's float syntax), finite, float32's size; else None."""
    num, slash, den = text.strip().partition("/")
    try:
        v = float(num) / float(den) if slash else float(text)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return v if a_number(v) else None


TOKENS = st.sampled_from(
    [
        "1",
        "0",
        "255",
        "1/255",
        "0.5",
        "-1",
        "1e-320",
        "1e300",
        "1/1e300",
        "nan",
        "inf",
        "",
        " ",
        "x",
        "1/0",
        "2/3/4",
    ]
)
TEXTS = st.one_of(
    st.lists(TOKENS, min_size=1, max_size=4).flatmap(
        lambda parts: st.sampled_from([",", ":", "x", "/"]).map(lambda sep: sep.join(parts))
    ),
    st.text(max_size=20),
    st.text(alphabet="0123456789,:x/.-e ", max_size=24),
)
PLAIN_TEXTS = st.one_of(
    st.floats(1e-40, 1e40).map(repr),
    st.tuples(st.integers(-300, 300), st.integers(1, 65535)).map(lambda t: f"{t[0]}/{t[1]}"),
    st.tuples(st.floats(-10, 10), st.floats(1e-40, 10)).map(lambda t: f"{t[0]!r},{t[1]!r}"),
    st.lists(st.floats(1e-3, 1), min_size=3, max_size=3).map(
        lambda v: ":".join(map(repr, v)) + ",0.2:0.2:0.2"
    ),
    st.tuples(st.integers(0, 20000), st.integers(0, 20000), st.sampled_from([",", "x", " , "])).map(
        lambda t: f"{t[0]}{t[2]}{t[1]}"
    ),
)
OPTION_VALUES = st.one_of(TEXTS, PLAIN_TEXTS)


def expected_scale(text: str) -> float | None:
    v = number_text(text)
    return v if v is not None and v > 0 else None


def expected_normalize(text: str):
    halves = text.split(",")
    if len(halves) != 2 or not all(h.strip() for h in halves):
        return None
    mean, std = ([number_text(v) for v in h.split(":")] for h in halves)
    if None in mean or None in std or any(s <= 0 for s in std):
        return None
    if len(mean) != len(std) and 1 not in (len(mean), len(std)):
        return None
    return tuple(mean), tuple(std)


def expected_range(text: str):
    parts = text.split(",")
    try:
        lo, hi = (float(p) for p in parts)
    except ValueError:
        return None
    return (lo, hi) if a_number(lo) and a_number(hi) and lo < hi else None


def expected_hw(text: str):
    """H,W or HxW or one size, ASCII digits with ASCII spaces around them, at most 40 characters in all."""
    parts = next((p for p in (text.split(","), text.split("x")) if len(p) == 2), [text])
    parts = [p.strip(" \t\n\r\f\v") for p in parts]
    if len(text) > 40 or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    h, w = int(parts[0]), int(parts[-1])
    return (h, w) if h >= 1 and w >= 1 else None


OPTION_TEXTS = {
    "--scale": (parse_scale, expected_scale),
    "--normalize": (parse_normalize, expected_normalize),
    "--input-range": (parse_range, expected_range),
}


def test_option_texts_drawn_by_hypothesis_are_refused_naming_the_option_or_read_exactly(report):
    tally = Tally("pipeline option texts (--scale, --normalize, --input-range, --resize/--crop)")

    @SETTINGS
    @given(st.sampled_from([*OPTION_TEXTS, "--resize"]), OPTION_VALUES)
    def one(option, text):
        if option == "--resize":
            want = expected_hw(text)
            ok = want is not None and want[0] * want[1] <= IMAGE_MAX_PIXELS
            with tally.case(f"{option} {text!r}", names="--resize", accept=ok):
                assert resize_option(text).size == want
            return
        parse, reference = OPTION_TEXTS[option]
        want = reference(text)
        with tally.case(f"{option} {text!r}", names=option, accept=want is not None):
            assert parse(text) == want

    one()
    report("hostile inputs", tally.line())
    tally.assert_clean()


def resize_option(text: str) -> InputPipeline:
    """convert --resize TEXT --crop 1,1, read as the command line reads it: argparse (a refusal exits 2 with one
    error line, raised here as the EdgeTrainError the user reads), then the pipeline the options declare."""
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            args = build_parser().parse_args(["convert", "m.onnx", "--resize", text, "--crop", "1,1"])
    except SystemExit as stop:
        lines = [line for line in err.getvalue().splitlines() if "error:" in line]
        assert stop.code == 2 and len(lines) == 1, err.getvalue()
        raise EdgeTrainError(lines[0]) from None
    return PipelineConfig.from_args(args).pipeline()


# ---- the issue's reproductions, end to end -------------------------------------------------------------------
def cli_error(*argv) -> str:
    """`edgetrain ARGV` in this process: it must exit 2 (a usage error) with one error line, no traceback; the
    line is returned."""
    err = io.StringIO()
    with redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse's own refusals (an option's type)
            code = e.code
    lines = [line for line in err.getvalue().splitlines() if "error:" in line]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err.getvalue(), (code, err.getvalue())
    raise EdgeTrainError(lines[0])


def graph_with_metadata(text: str | None, *, channels: int = 1, hw_: int | str = 28):
    """A one-input image model [N, C, H, W] as a Graph, with the pipeline metadata `text`."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, hw_, hw_])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", channels, 1, 1])
    g = helper.make_graph([helper.make_node("GlobalAveragePool", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if text is not None:
        onnx.helper.set_model_props(model, {PREPROCESSING_KEY: text})
    return from_onnx(model)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """(header, tensors) of a LeNet artifact with an image pipeline (channels last, resized, cropped, x / 255)."""
    d = tmp_path_factory.mktemp("pipe")
    art = et.convert(
        MODELS["lenet"][0](),
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.05),
        batch_size=2,
        preprocessing=InputPipeline(
            raw_dtype="uint8", layout="nhwc", size=(32, 32), crop=(28, 28), scale=1 / 255
        ),
    )
    art.save(d / "a.etrain")
    return read_container(d / "a.etrain"), d


def test_the_issues_reproductions_are_refused_naming_the_option(artifact, tmp_path, report):
    tally = Tally("input pipelines: the issue's reproductions")
    m = LENET
    for argv, option in [
        (("convert", m, "-o", tmp_path / "a.etrain", "--scale", "1e-320"), "--scale 1e-320"),
        (("convert", m, "-o", tmp_path / "a.etrain", "--scale", "1e300"), "--scale"),
        (("convert", m, "-o", tmp_path / "a.etrain", "--normalize", "0.5,1e-300"), "--normalize"),
        (("convert", m, "-o", tmp_path / "a.etrain", "--normalize", "1e300,1"), "--normalize"),
        (("convert", m, "-o", tmp_path / "a.etrain", "--input-range", "0,1e300"), "--input-range"),
        (
            ("convert", m, "-o", tmp_path / "a.etrain", "--resize", "100000,100000", "--crop", "8,8"),
            "--resize",
        ),
        (("convert", m, "-o", tmp_path / "a.etrain", "--resize", "8,16,3", "--crop", "8,8"), "--resize"),
        (("convert", m, "-o", tmp_path / "a.etrain", "--crop", "8x16x3"), "--crop"),
        (("train", tmp_path / "a.etrain", "--data", tmp_path, "--scale", "1e-320"), "--scale"),
        (("eval", tmp_path / "a.etrain", "--data", tmp_path, "--normalize", "0.5,1e-300"), "--normalize"),
    ]:
        with tally.case(" ".join(map(str, argv[:1] + argv[3:])), names=option):
            cli_error(*argv)
    for spec, field in [
        ({"scale": 1e-320}, "scale"),
        ({"std": 1e-300}, "std"),
        ({"mean": 1e300}, "mean"),
        ({"scale": 1e300}, "scale"),
        ({"mean": 0.5, "std": 1e-300}, "std"),
        ({"size": [100000, 100000], "crop": [8, 8]}, "size"),
        ({"scale": 1e37, "raw_dtype": "uint8"}, "scale"),
        ({"mean": 3e38, "std": 1e-37}, "std"),
    ]:
        with tally.case(f"pipeline {spec}", names=field):
            InputPipeline.from_json(spec)
        with tally.case(f"metadata {spec}", names=(PREPROCESSING_KEY, field)):
            declared_pipeline(graph_with_metadata(json.dumps(spec)), None)
    for depth in (65, 5000, 200_000):
        with tally.case(f"metadata nested {depth} deep", names=(PREPROCESSING_KEY, "deep")):
            declared_pipeline(graph_with_metadata("[" * depth + "]" * depth), None)
    _recorded_run_options(tally)
    _artifact_headers(tally, artifact, tmp_path)
    _resizes(tally, tmp_path)
    report("hostile inputs", tally.line())
    tally.assert_clean()


def _recorded_run_options(tally: Tally) -> None:
    """A checkpoint's recorded run options (what --resume restores) with the issue's numbers."""
    for recorded, option in [
        ({"scale": "1e-320"}, "--scale"),
        ({"normalize": "0.5,1e-300"}, "--normalize"),
        ({"scale": "1/1e300"}, "--scale"),
        ({"lr": 1e300}, "--lr"),
        ({"lr": 10**400}, "--lr"),
        ({"lr": float("nan")}, "--lr"),
        ({"val_split": 1e-320}, "--val-split"),
        ({"lr_schedule": "step:10:1e300"}, "--lr-schedule"),
    ]:
        with tally.case(f"run options {recorded}"[:80], names=option):
            RunConfig.from_json({"data": "d.npz", **recorded}, source="c.etck")
    with tally.case("run options 1/255, 0.5,0.25", accept=True):
        run = RunConfig.from_json({"data": "d.npz", "scale": "1/255", "normalize": "0.5,0.25", "lr": 0.01})
        assert run.data.reading.data_options().scale == 1 / 255


def _artifact_headers(tally: Tally, artifact, tmp_path: Path) -> None:
    """An artifact whose header's pipeline carries the issue's values: refused when it is loaded, naming it."""
    (header, tensors), _ = artifact
    for field, value in [
        ("scale", 1e-320),
        ("scale", 1e300),
        ("size", [100000, 100000]),
        ("size", [8, 16, 3]),
        ("crop", [10**400, 1]),
        ("version", True),
    ]:
        target = tmp_path / "crafted.etrain"
        target.write_bytes(encode(crafted(header, ("preprocessing", field), value), tensors))
        with tally.case(
            f"artifact header preprocessing.{field} = {value!r}"[:80], names=(str(target), field)
        ):
            et.TrainingSession(str(target))
    with tally.case("artifact header as written", accept=True):
        target.write_bytes(encode(header, tensors))
        assert et.TrainingSession(str(target)).preprocessing.size == (32, 32)


def _resizes(tally: Tally, tmp_path: Path) -> None:
    """The image side's resize: refused before it allocates; the model's input bounds --resize at convert."""
    image = np.zeros((4, 8192, 3), np.uint8)
    for size in [(100000, 100000), (65536, 1), (2**40, 2**40)]:
        with tally.case(f"resize to {size}", names=("resize", f"{size[0]} x {size[1]}")):
            resize(image, size)
    with tally.case("resize within max_bytes", accept=True):
        assert resize(image[:, :16], (6, 9)).shape == (6, 9, 3)
    with tally.case("--resize 8192,8192 of 64 channels", names=("--resize", "64 channels")):
        spec = {"size": [8192, 8192], "crop": [4, 4]}
        declared_pipeline(graph_with_metadata(None, channels=64, hw_=4), spec)
    with tally.case("preprocessing= a list", names="preprocessing="):
        declared_pipeline(graph_with_metadata(None), ["abc"])
    with tally.case("preprocessing= JSON text over the model's own", accept=True):
        spec, _ = declared_pipeline(graph_with_metadata('{"scale": 0.5}'), '{"mean": 0.5}')
        assert spec["scale"] == 0.5 and spec["mean"] == [0.5]
    with tally.case("export: a crop of a model whose height and width are open", names=("crop", "--resize")):
        with_preprocessing(graph_with_metadata(None, hw_="H"), InputPipeline(crop=(4, 4)))
    for kw in [
        {"std": 1e-300},
        {"scale": 1e300},
        {"scale": 10**400},
        {"scale": np.complex64(1)},
        {"mean": np.array([1 + 2j])},
        {"mean": "0.5"},
        {"mean": [[1], [2, 3]]},
        {"std": [10**400]},
    ]:
        with tally.case(f"Preprocess({kw})"[:80], names=next(iter(kw))):
            Preprocess(**kw)
    with tally.case("Preprocess of per-channel numpy values", accept=True):
        pre = Preprocess(scale=np.float64(1 / 255), mean=np.float32(0.5), std=(0.25, 0.5, 1.0))
        out, _ = pre(np.full((2, 3, 4, 4), 255, np.uint8), np.zeros(2))
        assert np.array_equal(out[:, 0], np.full((2, 4, 4), 2.0, np.float32))
    assert RESIZE_MAX_BYTES == 1 << 30


def test_a_resize_beyond_its_bytes_is_refused_before_allocating():
    with pytest.raises(LimitError, match=r"resize to 100000 x 100000 .* more than the 1073741824 bytes") as e:
        resize(np.zeros((2, 3, 3), np.uint8), (100000, 100000))
    assert e.value.needed == 100000 * 100000 * 3 * 4 and e.value.limit == RESIZE_MAX_BYTES
    assert resize(np.zeros((2, 3, 3)), (4, 4), max_bytes=4 * 4 * 3 * 8).shape == (4, 4, 3)
    with pytest.raises(LimitError):
        resize(np.zeros((2, 3, 3)), (4, 4), max_bytes=4 * 4 * 3 * 8 - 1)


def test_resize_and_crop_texts_are_refused_when_malformed_never_reread():
    assert hw("224,224") == (224, 224) and hw("224x200") == (224, 200) and hw(" 8 ") == (8, 8)
    for text in ("8,16,3", "8x16x3", "8,,16", "8,abc", "-8,8", "0,8", "8.5,8", "", "8_0"):
        with pytest.raises(Exception, match="HEIGHT,WIDTH|positive"):
            hw(text)
