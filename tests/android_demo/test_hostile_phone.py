"""Hostile inputs to the phone app (android_demo), issue 33: the numbers a user gives it (settings, personalize's
arguments, add --scale/--normalize, --threads, serve's options, simulate's), files of sentences, vocabulary files,
model version files (a text home's adapters, a digits home's checkpoints) crafted byte by byte, and requests to the
page's server with numbers, long sentences and nested JSON in their bodies. Each surface's inputs, from Hypothesis
and crafted (the issue's reproductions among them), are tallied (tests/harness/hostile.py): refused with an
EdgeTrainError naming what is at fault, or accepted with a result checked here; anything else is a defect. In one
process: the command line runs as main(["--debug", ...]), which raises what it would print."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shutil
import socket
from pathlib import Path

import numpy as np
import onnx
import pytest
from crafting import DELETE, crafted, encode
from hostile import Tally
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from models import mlp
from test_android_page import Running, call

import edgetrain as et
from android_demo import api_json
from android_demo.__main__ import MAX_THREADS, THREAD_VARIABLES, main
from android_demo.app import Home
from android_demo.policy import POLICIES
from android_demo.server import make_server
from android_demo.settings import MAX_THREADS as HOME_MAX_THREADS
from android_demo.simulate import simulate
from android_demo.text import KEYBOARD_VOCAB, TextHome
from edgetrain.core.container import read_container
from loaders.text import SPECIALS, TokenWindowView, WordVocab, read_sentences, words
from loaders.values import FLOAT32_MAX, FLOAT32_TINY

ROOT = Path(__file__).resolve().parents[2]
TRAIN = (ROOT / "edgetrain" / "data" / "keyboard" / "user_train.txt").read_text(encoding="utf-8").splitlines()
EXAMPLES = settings(
    max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
FEWER = settings(EXAMPLES, max_examples=15)  # for inputs that cost a home or a model each
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from([0, 1e-320, -1e-320, 1e-45, 1e-38, 1.2e-38, 3.5e38, 1e39, 1e308, math.inf, math.nan]),
    st.integers(-(2**70), 2**70),
    st.integers(-3, 300),
    st.booleans(),
    st.text(max_size=6),
    st.none(),
    st.lists(st.integers(0, 3), max_size=2),
)


class Refused(et.EdgeTrainError):
    """A clean refusal outside the process's exceptions (an exit code 1 or 2 with one line, an HTTP 4xx with its
    one-line error), raised so that the tally counts it as one."""


def cli(*argv: str) -> str:
    """main(["--debug", *argv]) in this process -> its stdout. --debug re-raises what main would print as one
    line, so an exception escapes as itself; a usage error (exit 2, argparse's or the app's) is raised as Refused."""
    out, err = io.StringIO(), io.StringIO()
    saved = {v: os.environ.get(v) for v in THREAD_VARIABLES}
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["--debug", *argv])
    except SystemExit as e:  # argparse's usage errors, --threads out of range
        rc = e.code if isinstance(e.code, int) else 1
        err.write(str(e.code))
    finally:
        for v, value in saved.items():
            os.environ.pop(v, None) if value is None else os.environ.__setitem__(v, value)
    lines = err.getvalue().strip().splitlines()
    if rc == 0:
        return out.getvalue()
    assert lines and "Traceback" not in err.getvalue(), err.getvalue()
    raise Refused(lines[-1])


def f32(v, *, lo: float | None = None, hi: float | None = None, positive: bool = False) -> bool:
    """What loaders/values.number accepts: a finite real (not a bool), 0 or within float32's normal range."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return False
    if v != 0 and not FLOAT32_TINY <= abs(v) <= FLOAT32_MAX:
        return False
    return not ((positive and v <= 0) or (lo is not None and v < lo) or (hi is not None and v > hi))


def whole(v, lo: int, hi: int) -> bool:
    return type(v) is int and lo <= v <= hi


# a setting -> whether a value is one it takes (the phone app's bounds, android_demo/home.py)
SETTINGS = {
    "max_steps": lambda v: whole(v, 1, 1_000_000),
    "threads": lambda v: whole(v, 1, 256),
    "batch_size": lambda v: v is None or whole(v, 1, 1 << 20),
    "max_seconds": lambda v: v is None or f32(v, positive=True, hi=86_400),
    "lr": lambda v: v is None or f32(v, positive=True),
    "val_fraction": lambda v: f32(v, lo=0, hi=1),
    "feature_cache_mb": lambda v: f32(v, lo=0, hi=1 << 16),
    "policy": lambda v: isinstance(v, str) and v in POLICIES,
}


# ---- fixtures ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """An MLP artifact that declares no input pipeline (so add --scale applies), uint8 data for it, and a text home
    with two kept versions of adapters (v1, v2: current)."""
    d = tmp_path_factory.mktemp("phone")
    onnx.save(mlp(), d / "mlp.onnx")
    art = et.convert(str(d / "mlp.onnx"), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.01), batch_size=8)
    art.save(str(d / "mlp.etrain"))
    rng = np.random.default_rng(0)
    np.savez(d / "d.npz", x=rng.integers(0, 256, (40, 784)).astype(np.uint8), y=rng.integers(0, 10, 40))
    home = TextHome.init(d / "kb", max_seconds=None)
    home.add_sentences(TRAIN[:120])
    for _ in range(2):
        assert home.personalize(force=True, max_steps=2).kept
    assert home.version == 2
    return d


def fresh(files: Path, tmp_path: Path, name: str) -> Path:
    """A copy of the fixture's text home (a case may damage it)."""
    dst = tmp_path / name
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(files / "kb", dst)
    return dst


# ---- 1. the app's argument values ----------------------------------------------------------------------------------
def test_settings_and_burst_arguments_are_checked_where_they_enter(files, tmp_path, report):
    tally = Tally("the phone app's settings and burst arguments")
    home = Home.init(tmp_path / "d", files / "mlp.etrain")
    bursts = Home.init(tmp_path / "b", files / "mlp.etrain")  # its settings stay the defaults

    @EXAMPLES
    @given(st.sampled_from(sorted(SETTINGS)), NUMBERS.filter(lambda v: v is not None))  # None: left as it is
    def one_setting(name, value):
        with tally.case(f"update_settings({name}={value!r})", names=name, accept=SETTINGS[name](value)):
            home.update_settings(**{name: value})
            again = Home(home.path).settings[name]  # written, and read back as it was given
            assert again == value and type(again) in (type(value), float), (again, value)  # a number: a float

    @EXAMPLES
    @given(st.sampled_from(["max_steps", "max_seconds", "lr"]), NUMBERS)
    def one_argument(name, value):
        ok = value is None or SETTINGS[name](value)  # None: the setting's value
        with tally.case(f"personalize({name}={value!r})", names=name, accept=ok):
            r = bursts.personalize(force=True, **{name: value})
            assert r.steps == 0 and r.reason.startswith("not enough samples"), r.reason

    one_setting()
    one_argument()
    for name, value in [("mode", "text"), ("policy", "sometimes"), ("max_steps", 10**400), ("lr", 1e-320)]:
        with tally.case(f"update_settings({name}={value!r})", names=name):
            home.update_settings(**{name: value})
    with tally.case("reset_settings('mode') of a text home", names="mode"):
        TextHome(fresh(files, tmp_path, "kb")).reset_settings("mode")
    # settings.json damaged by hand: named with the file when the home opens, before anything uses it
    for text, names in [
        ('{"max_steps": -5}', ("settings.json", "max_steps")),
        ('{"lr": NaN}', ("settings.json", "lr")),
        ('{"threads": "8"}', ("settings.json", "threads")),
        ("[" * 100_000, ("settings.json", "nests")),
        ('{"max_seconds": 1e400}', ("settings.json", "max_seconds")),
        ("[1, 2]", ("settings.json", "list")),
    ]:
        damaged = tmp_path / "damaged"
        shutil.rmtree(damaged, ignore_errors=True)
        shutil.copytree(home.path, damaged)
        (damaged / "settings.json").write_text(text)
        with tally.case(f"settings.json {text[:20]}", names=names):
            Home(damaged)
        with tally.case(f"status with settings.json {text[:20]}", names=names):
            cli("--home", str(damaged), "status")
    # the log's damaged lines are skipped: status and the page's history go on
    log = Path(home.path) / "log.jsonl"
    for line in [
        "[" * 100_000,
        "[1]",
        '{"event": "burst", "kept": true}',
        '{"event": "burst", "kept": 1e400}',
    ]:
        with tally.case(f"log.jsonl line {line[:20]}", accept=True):
            log.write_text(log.read_text() + line + "\n")
            assert type(home.status()["bursts"]) is int and home.accuracy_by_version() == []
    report("hostile inputs", tally.line())
    tally.assert_clean()


def test_command_line_numbers_are_checked_where_they_enter(files, tmp_path, report):
    tally = Tally("the phone app's command-line numbers (--threads, serve, simulate)")
    home = Home.init(tmp_path / "d", files / "mlp.etrain")
    assert MAX_THREADS == HOME_MAX_THREADS  # __main__ checks before numpy loads, with home's bound

    @EXAMPLES
    @given(st.one_of(st.integers(-3, 300), st.integers(-(2**70), 2**70)))
    def threads(n):
        with tally.case(f"--threads {n}", names="--threads", accept=1 <= n <= MAX_THREADS):
            assert (
                json.loads(cli("--home", home.path, "--threads", str(n), "status", "--json"))["samples"] == 0
            )

    @EXAMPLES
    @given(NUMBERS, st.one_of(st.integers(-3, 20_000), NUMBERS))
    def serve_options(timeout, cap):
        ok = f32(timeout, lo=0.001, hi=3600) and whole(cap, 1, 10_000)
        names = "request timeout" if not f32(timeout, lo=0.001, hi=3600) else "max connections"
        with tally.case(f"serve timeout {timeout!r} cap {cap!r}", names=names, accept=ok):
            server = make_server(home, port=0, request_timeout=timeout, max_connections=cap)
            assert server.port > 0 and server.request_timeout == timeout
            server.server_close()

    threads()
    serve_options()
    for port in [-1, 65536, 10**20, True, 80.0, "8765", None]:
        with tally.case(f"serve port {port!r}", names="port"):
            make_server(home, port=port).server_close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with tally.case(f"serve --port {busy}, a port in use", names=(f"port {busy}", "--port")):
            make_server(home, port=busy).server_close()  # (serve would then serve forever, were it taken)
    for options, names in [
        ({"request_timeout": float("1e-320")}, "request timeout"),
        ({"request_timeout": math.inf}, "request timeout"),
        ({"max_connections": -1}, "max connections"),
    ]:
        with tally.case(f"serve {options}", names=names):
            make_server(home, port=0, **options).server_close()
    for every, steps, names in [(0, 25, "every"), (-3, 25, "every"), (10, 0, "steps"), (10**20, 25, "every")]:
        with tally.case(f"simulate --every {every} --steps {steps}", names=names):
            simulate(every=every, steps=steps, quick=True, out=None)
    with tally.case("simulate --every 0 (a ZeroDivisionError)", names="--every"):
        cli("simulate", "--every", "0", "--json")
    with tally.case("simulate --quick", accept=True):
        assert len(simulate(quick=True, out=None)["bursts"]) == 2
    report("hostile inputs", tally.line())
    tally.assert_clean()


def scale_value(text: str) -> float | None:
    """What --scale TEXT means (a number or a fraction), None when it is not one."""
    num, slash, den = text.partition("/")
    try:
        return float(num) / float(den) if slash else float(text)
    except (ValueError, ZeroDivisionError):
        return None


def test_add_scale_and_normalize_are_checked_and_a_refused_file_changes_nothing(files, tmp_path, report):
    tally = Tally("the phone's add --scale/--normalize")
    data = str(files / "d.npz")  # uint8, 0..255
    homes = iter(range(10**6))

    def add(*options: str) -> tuple[str, Home]:
        home = Home.init(tmp_path / f"h{next(homes)}", files / "mlp.etrain")
        try:
            return cli("--home", home.path, "add", "--data", data, *options), home
        except BaseException:  # a refused file: the home is as it was
            assert home.sample_count() == 0 and Home(home.path).settings["preprocessing"] is None
            raise

    @FEWER
    @given(st.one_of(NUMBERS.map(repr), st.tuples(NUMBERS, NUMBERS).map(lambda t: f"{t[0]!r}/{t[1]!r}")))
    def scale(text):
        v = scale_value(text)
        if v is not None and f32(v, positive=True) and 0.99 < 255 * v / FLOAT32_MAX < 1.01:
            return  # float32's rounding at the edge decides: either outcome is right
        ok = v is not None and f32(v, positive=True) and 255 * v < FLOAT32_MAX
        names = "not finite" if v is not None and f32(v, positive=True) else "scale"
        with tally.case(f"--scale {text}", names=names, accept=ok):
            out, home = add(f"--scale={text}")  # (=: a value that starts with - is not an option)
            assert out.startswith("added 40 samples") and home.sample_count() == 40

    @FEWER
    @given(NUMBERS, NUMBERS)
    def normalize(mean, std):
        numbers = f32(mean) and f32(std, positive=True)
        reach = max(abs(mean), abs(1 - mean)) / std if numbers else 0  # after x / 255: x in [0, 1]
        if numbers and 0.99 < reach / FLOAT32_MAX < 1.01:
            return
        names = "normalize" if not numbers else "not finite"
        with tally.case(f"--normalize {mean!r},{std!r}", names=names, accept=numbers and reach < FLOAT32_MAX):
            out, home = add("--scale", "1/255", f"--normalize={mean!r},{std!r}")
            assert home.sample_count() == 40

    scale()
    normalize()
    for options, names in [
        (["--scale", "1e-320"], "--scale 1e-320"),  # the reproduction: an OverflowError
        (["--scale", "1e-300/1e10"], "--scale"),
        (["--scale", "1e37"], ("d.npz", "sample 0", "not finite")),  # inf stored before
        (["--scale", "1/255", "--normalize", "0,1e-320"], ("--normalize", "std", "1e-320")),
    ]:
        with tally.case(f"add {' '.join(options)}", names=names):
            add(*options)
    report("hostile inputs", tally.line())
    tally.assert_clean()


# ---- 2. files of sentences -----------------------------------------------------------------------------------------
LINES = st.lists(
    st.one_of(
        st.text(st.characters(blacklist_categories=("Cs",)), max_size=30),
        st.sampled_from(
            ["you will go far", "  ", "\u00e9t\u00e9 na\u00efve", "a" * 21, "don't. stop!", "\r"]
        ),
    ),
    max_size=8,
)


def expected_lines(raw: bytes) -> list[str] | None:
    """read_sentences with max_bytes=200, max_sentences=5, max_chars=20, as its docstring says; None: refused."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    lines = [line.strip() for line in text.split("\n")]
    if len(raw) > 200 or any(len(line) > 20 for line in lines):
        return None
    kept = [line for line in lines if line]
    return kept if len(kept) <= 5 else None


def test_sentence_files_are_bounded_and_all_or_nothing(files, tmp_path, report):
    tally = Tally("the phone's sentence files (add/evaluate --sentences, read_sentences)")
    home = TextHome(fresh(files, tmp_path, "kb"))
    path = tmp_path / "sentences.txt"

    @EXAMPLES
    @given(st.one_of(LINES.map(lambda ls: "\n".join(ls).encode()), st.binary(max_size=250)))
    def small_limits(raw):
        path.write_bytes(raw)
        want = expected_lines(raw)
        with tally.case(f"{raw[:30]!r} ({len(raw)} bytes)", names="sentences.txt", accept=want is not None):
            assert read_sentences(path, max_bytes=200, max_sentences=5, max_chars=20) == want

    @EXAMPLES
    @given(LINES.map(lambda ls: "\n".join(ls)), st.booleans())
    def into_the_home(text, damaged):
        raw = text.encode() + (b"\n\xff\xfe" if damaged else b"")
        path.write_bytes(raw)
        before = home.sample_count()
        kept = [line.strip() for line in text.split("\n") if words(line.strip())]
        ok = not damaged and all(len(line.strip()) <= 2000 for line in text.split("\n"))
        with tally.case(f"add --sentences {raw[:30]!r}", names=("sentences.txt", "line"), accept=ok):
            try:
                ids = home.add_sentence_file(path)
            except et.EdgeTrainError:
                assert home.sample_count() == before  # all or nothing
                raise
            assert home.sample_count() == before + len(ids)
            want = TokenWindowView.from_texts(home.vocab, kept, home.length).size() if kept else 0
            assert len(ids) == want

    small_limits()
    into_the_home()
    crafted_sentence_files(tally, home, tmp_path)
    report("hostile inputs", tally.line())
    tally.assert_clean()


def crafted_sentence_files(tally: Tally, home: TextHome, tmp_path: Path) -> None:
    # the reproduction: 12 MB of short lines took 2.1 GB and 66 s; now refused before it is read
    big = tmp_path / "12MB.txt"
    big.write_bytes(b"you will\n" * (12_000_000 // 9))
    cases = {
        "a 12 MB file of 1.3 million sentences": (big, ("12MB.txt", "split")),
        "/dev/zero": (Path("/dev/zero"), ("/dev/zero", "split")),
        "50,001 sentences": (b"go\n" * 50_001, ("50,000 sentences", "split")),
        "a line of 2,001 characters": (b"go\n" + b"a" * 2001, ("line 2", "2,000")),
        "a line of 4 MiB of letters": (b"a" * (4 << 20), ("line 1", "split")),
        "Latin-1 on line 3": ("go\nyou\ncaf\u00e9\n".encode("latin-1"), ("line 3", "UTF-8")),
        "a missing file": (tmp_path / "missing.txt", ("missing.txt", "cannot read")),
    }
    before = home.sample_count()
    for what, (content, names) in cases.items():
        path = content if isinstance(content, Path) else tmp_path / "crafted.txt"
        if not isinstance(content, Path):
            path.write_bytes(content)
        for command in ("add", "evaluate"):
            with tally.case(f"{command} --sentences: {what}", names=names):
                cli("--home", str(home.path), command, "--sentences", str(path))
    assert home.sample_count() == before
    (tmp_path / "many.txt").write_bytes(b"go\n" * 50_000)
    with tally.case("50,000 one-word sentences", accept=True):
        assert "added 50,000 sentences" in cli(
            "--home", str(home.path), "add", "--sentences", str(tmp_path / "many.txt")
        )
    with tally.case("an empty file", accept=True):
        (tmp_path / "empty.txt").write_bytes(b"")
        assert home.add_sentence_file(tmp_path / "empty.txt") == []
    with tally.case("add_sentences of a 2,001-character text", names=("sentence 1", "2000")):
        home.add_sentences(["go", "a " * 1000 + "b"])
    with tally.case("add_sentences of a number", names="sentence 0"):
        home.add_sentences([7])


# ---- 3. vocabulary files -------------------------------------------------------------------------------------------
SHIPPED = json.loads(Path(KEYBOARD_VOCAB).read_text(encoding="utf-8"))
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = ("format", "version", "tokenizer", "specials", "words")


def valid_vocabulary(doc) -> bool:
    """The vocabulary file's contract (loaders/text.py's docstring), written out independently."""
    if not isinstance(doc, dict) or any(doc.get(k, "-") != SHIPPED[k] for k in FIELDS[:4] if k != "version"):
        return False
    ws = doc.get("words")
    return (
        type(doc.get("version")) is int
        and doc["version"] == 1
        and isinstance(ws, list)
        and len(ws) > 0
        and all(isinstance(w, str) and re.fullmatch(r"[a-z0-9]+(?:'[a-z0-9]+)*", w) for w in ws)
        and len(set(ws)) == len(ws)
    )


def test_vocabulary_files_are_read_within_bounds(files, tmp_path, report):
    tally = Tally("the phone's vocabulary files (init --text --vocab, WordVocab.load)")
    path = tmp_path / "vocab.json"
    small = {**SHIPPED, "words": ["go", "you", "will"]}

    @EXAMPLES
    @given(
        st.sampled_from(FIELDS), st.one_of(JSON, st.lists(st.sampled_from(["go", "Go", "don't", "a b", ""])))
    )
    def one_field(field, value):
        doc = {**small, field: value}
        path.write_text(json.dumps(doc))
        with tally.case(
            f"{field}: {json.dumps(value)[:40]}", names="vocab.json", accept=valid_vocabulary(doc)
        ):
            assert WordVocab.load(path).tokens == (*SPECIALS, *doc["words"])

    @EXAMPLES
    @given(st.one_of(JSON.map(json.dumps).map(str.encode), st.binary(max_size=64)))
    def any_bytes(raw):
        path.write_bytes(raw)
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            doc = None
        with tally.case(f"{raw[:40]!r}", names="vocab.json", accept=valid_vocabulary(doc)):
            WordVocab.load(path)

    one_field()
    any_bytes()
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)  # the reproduction: a RecursionError
    sparse = tmp_path / "huge.json"
    with open(sparse, "wb") as f:
        f.truncate(17 << 20)
    for what, vocab, names in [
        ("100,000 nested [", deep, ("deep.json", "nests")),
        ('{"a": {"a": ... 10,000 deep', tmp_path / "objects.json", ("objects.json", "nests")),
        ("17 MiB", sparse, ("huge.json", "limit")),
        ("/dev/zero", Path("/dev/zero"), ("/dev/zero", "limit")),
        ("3 words for a 3,004-token model", tmp_path / "small.json", ("small.json", "7 tokens")),
    ]:
        (tmp_path / "objects.json").write_text('{"a": ' * 10_000 + "1" + "}" * 10_000)
        (tmp_path / "small.json").write_text(json.dumps(small))
        with tally.case(f"init --text --vocab {what}", names=names):
            cli("--home", str(tmp_path / "kb"), "init", "--text", "--vocab", str(vocab))
        assert not (tmp_path / "kb" / "current.json").exists()
    with tally.case("a vocabulary of 3 words", accept=True):
        path.write_text(json.dumps(small))
        assert WordVocab.load(path).tokens == (*SPECIALS, "go", "you", "will")
    with tally.case("version true (not 1)", names="version"):
        path.write_text(json.dumps({**small, "version": True}))
        WordVocab.load(path)
    with tally.case("the shipped vocabulary, given as --vocab", accept=True):
        assert "text mode" in cli("--home", str(tmp_path / "kb"), "init", "--text", "--vocab", KEYBOARD_VOCAB)
        assert TextHome(tmp_path / "kb").vocab.tokens == WordVocab.load(KEYBOARD_VOCAB).tokens
    report("hostile inputs", tally.line())
    tally.assert_clean()


# ---- 4. model version files ----------------------------------------------------------------------------------------
def version_file(home: Path) -> tuple[Path, dict, dict[str, np.ndarray]]:
    """The current version's adapters file: (path, header, tensors copied out of the mapped file)."""
    name = json.loads((home / "current.json").read_text())["checkpoint"]
    header, tensors = read_container(home / name, kind="adapters")
    return home / name, header, {k: np.array(v) for k, v in tensors.items()}


MUTATIONS = st.one_of(
    st.tuples(st.just("value"), st.sampled_from([math.nan, math.inf, -math.inf]), st.integers(0, 10**6)),
    st.tuples(st.just("shape"), st.lists(st.integers(0, 70), max_size=3), st.just(0)),
    st.tuples(st.just("dtype"), st.sampled_from(["f8", "f2", "i4", "i8", "u1", "?", "c8"]), st.just(0)),
    st.tuples(st.just("missing"), st.none(), st.just(0)),
    st.tuples(st.just("extra"), st.text(min_size=1, max_size=20), st.just(0)),
    st.tuples(st.just("program_id"), st.text(max_size=64), st.just(0)),
    st.tuples(st.just("header"), st.sampled_from(["modules", "config"]), st.just(0)),
    st.tuples(st.just("truncated"), st.none(), st.integers(0, 40_000)),
    st.tuples(st.just("flipped"), st.none(), st.integers(0, 40_000)),
)


def mutate(path: Path, header: dict, tensors: dict, tensor: str, how: tuple) -> bytes:
    """The version file's bytes with one fault: a NaN or infinity, another shape or dtype, a tensor missing or one
    more, another program's id, a header part deleted, the file cut short or one byte flipped."""
    kind, arg, at = how
    t = dict(tensors)
    a = t[tensor]
    if kind == "value":
        a = a.copy()
        a.flat[at % a.size] = arg
    elif kind == "shape":
        a = np.resize(a, arg) if tuple(arg) != a.shape else a[..., :-1]
    elif kind == "dtype":
        a = a.astype(arg)
    elif kind == "missing":
        del t[tensor]
    elif kind == "extra":
        t[f"{tensor}.{arg}"] = a
    elif kind in ("truncated", "flipped"):
        raw = bytearray(path.read_bytes())
        if kind == "truncated":
            return bytes(raw[: at % len(raw)])
        raw[at % len(raw)] ^= 0x01
        return bytes(raw)
    if kind != "missing":
        t[tensor] = a
    if kind == "program_id":
        header = crafted(header, ("program_id",), arg if arg != header["program_id"] else arg + "x")
    if kind == "header":
        header = crafted(header, (arg,), DELETE)
    return encode(header, t, kind="adapters")


def test_a_version_file_that_cannot_be_used_is_refused_and_changes_nothing(
    files, tmp_path, report, monkeypatch
):
    tally = Tally("the phone's model version files (adapters, checkpoints)")
    home = fresh(files, tmp_path, "kb")
    path, header, tensors = version_file(home)
    good, current = path.read_bytes(), (home / "current.json").read_bytes()
    before = TextHome(home).suggest("you will")

    @FEWER
    @given(st.sampled_from(sorted(tensors)), MUTATIONS)
    def one_fault(tensor, how):
        path.write_bytes(mutate(path, header, tensors, tensor, how))
        h = TextHome(home)
        with tally.case(f"v2 with {how[0]} {how[1]!r} in {tensor}", names=("version 2", "v000002.etad")):
            h.suggest("you will")
        with tally.case(f"use_version(2) with {how[0]} {how[1]!r}", names=("version 2", "v000002.etad")):
            h.use_version(2)
        assert (home / "current.json").read_bytes() == current  # refused: the home is as it was
        path.write_bytes(good)

    one_fault()
    with tally.case("the same tensors, written again", accept=True):
        path.write_bytes(encode(header, tensors, kind="adapters"))
        assert TextHome(home).suggest("you will") == before
    path.write_bytes(mutate(path, header, tensors, sorted(tensors)[0], ("value", math.nan, 0)))
    # the reproduction: NaN adapters, current, suggested words from NaN logits
    with tally.case("suggest on NaN adapters (the command line)", names=("version 2", "use_version(1)")):
        cli("--home", str(home), "suggest", "you will")
    with tally.case("a burst from NaN adapters", names="version 2"):
        TextHome(home).personalize(force=True, max_steps=1)
    with tally.case("serve on NaN adapters", names="version 2"):
        make_server(TextHome(home), port=0).server_close()
    with tally.case("going back to version 1", accept=True):
        h = TextHome(home)
        assert h.use_version(1) == 1 and h.version == 1 and len(h.suggest("you will")) == 3
    huge = {**tensors, **{k: np.full_like(v, 3e38) for k, v in tensors.items()}}
    with tally.case("finite adapters that overflow the scores", names=("version 2", "NaN or infinity")):
        path.write_bytes(encode(header, huge, kind="adapters"))
        TextHome(home).use_version(2)
        TextHome(home).suggest("you will")
    path.write_bytes(good)
    crafted_versions(tally, files, home, tmp_path, monkeypatch)
    report("hostile inputs", tally.line())
    tally.assert_clean()


def crafted_versions(tally: Tally, files: Path, home: Path, tmp_path: Path, monkeypatch) -> None:
    h = TextHome(home)
    h.use_version(2)
    current = (home / "current.json").read_bytes()
    for what, text in [
        ("a path outside the home", '{"version": 3, "checkpoint": "../../etc/passwd"}'),
        ("another version's file", '{"version": 3, "checkpoint": "versions/v000002.etad"}'),
        ("a version of text", '{"version": "2", "checkpoint": "versions/v000002.etad"}'),
        ("version 1e400", '{"version": 1e400, "checkpoint": null}'),
        ("a list", "[2]"),
        ("100,000 nested [", "[" * 100_000),
    ]:
        (home / "current.json").write_text(text)
        with tally.case(f"current.json names {what}", names="current.json"):
            TextHome(home).suggest("you will")
    (home / "current.json").write_bytes(current)
    # a burst whose new version does not read back whole is not kept: the current version stays, its file goes
    real = TextHome._save_version

    def damaged(self, sess, version, result):
        name = real(self, sess, version, result)
        p, hd, t = version_file_named(home / name)
        p.write_bytes(encode(hd, {k: np.full_like(v, np.nan) for k, v in t.items()}, kind="adapters"))
        return name

    with tally.case("a burst's version that does not read back", accept=True), monkeypatch.context() as m:
        m.setattr(TextHome, "_save_version", damaged)
        m.setattr(TextHome, "_verdict", staticmethod(lambda r, classification: None))  # kept, were it whole
        r = TextHome(home).personalize(force=True, max_steps=2)
        assert not r.kept and "version 3" in r.reason and TextHome(home).version == 2, r.reason
        assert not (home / "versions" / "v000003.etad").exists()
    # a digits home's checkpoint with NaN: load_checkpoint refuses it, the app says which version and what works
    d = Home.init(tmp_path / "digits", files / "mlp.etrain")
    sess = d.session()
    sess.save_checkpoint(d._file("versions/v000001.etck"))
    (Path(d.path) / "current.json").write_text('{"version": 1, "checkpoint": "versions/v000001.etck"}')
    header, tensors = read_container(d._file("versions/v000001.etck"), kind="checkpoint")
    bad = {k: np.array(v) for k, v in tensors.items()}
    del tensors  # the file is mapped: unmapped before it is written again
    k = next(k for k, v in bad.items() if v.dtype.kind == "f")
    bad[k] = np.full_like(bad[k], np.nan)
    Path(d._file("versions/v000001.etck")).write_bytes(encode(header, bad, kind="checkpoint"))
    with tally.case("a digits version with NaN", names=("version 1", "v000001.etck", "use_version")):
        Home(d.path).predict(np.zeros((1, 784), np.float32))


def version_file_named(path: Path) -> tuple[Path, dict, dict[str, np.ndarray]]:
    header, tensors = read_container(path, kind="adapters")
    return path, header, {k: np.array(v) for k, v in tensors.items()}


# ---- 5. the page's requests ----------------------------------------------------------------------------------------
def page(url: str, body: bytes) -> dict:
    """A request's JSON answer; a 4xx with one line of error is raised as Refused, anything else fails."""
    status, answer = call(url, raw=body)
    if 400 <= status < 500:
        error = answer.get("error", "")
        assert error and "\n" not in error and "Traceback" not in error, answer
        raise Refused(error)
    assert status in (200, 202), (status, answer)
    return answer


def test_the_page_takes_numbers_long_sentences_and_nested_json(files, tmp_path, report):
    tally = Tally("the page server's requests (text and digits homes)")
    text_home = TextHome(fresh(files, tmp_path, "kb"))
    digits = Home.init(tmp_path / "digits", files / "mlp.etrain")
    with Running(text_home) as srv, Running(digits) as dsrv:

        @EXAMPLES
        @given(st.text(max_size=60).map(lambda t: t * 40), st.sampled_from(["suggest", "send"]))
        def sentences(text, route):
            ok = len(text) <= 2000 and (route == "suggest" or bool(words(text)))
            body = json.dumps({"text": text}).encode()
            names = '"text"' if len(text) > 2000 else "no word"
            with tally.case(f"{route} {len(text)} characters", names=names, accept=ok):
                answer = page(srv.url + f"api/{route}", body)
                assert len(answer["words"]) == 3 if route == "suggest" else len(answer["ids"]) >= 1

        @EXAMPLES
        @given(NUMBERS.filter(lambda v: not isinstance(v, (list, str))).map(json.dumps), st.integers(0, 27))
        def pixels(number, at):
            row = ["0"] * 784
            row[at] = number.replace("Infinity", "1e400")
            v = json.loads(row[at]) if row[at] not in ("NaN", "-1e400", "1e400") else None
            ok = type(v) in (int, float) and math.isfinite(v) and 0 <= v <= 1 and len(row[at]) < 30
            body = ('{"pixels": [' + ",".join(row) + '], "label": 3}').encode()
            with tally.case(f"pixel {row[at]}", names="pixels", accept=ok):
                assert page(dsrv.url + "api/add", body)["label"] == 3

        sentences()
        pixels()
        crafted_requests(tally, srv.url, dsrv.url, digits)
    report("hostile inputs", tally.line())
    tally.assert_clean()


def crafted_requests(tally: Tally, url: str, durl: str, digits: Home) -> None:
    cases = [
        ("2,000 characters of one-letter words", "send", {"text": "a " * 999 + "b"}, ""),
        ("250 sentences in one text", "send", {"text": "Go far. " * 250}, ""),
        ("2,000 accented letters", "suggest", {"text": "\u00e9" * 2000}, ""),
        ("a lone surrogate", "suggest", {"text": "you \ud800 will"}, ""),
        ("2,001 characters", "send", {"text": "a" * 2001}, ('"text"', "2000")),
        ("text nested 33 deep", "suggest", {"text": json.loads("[" * 33 + "]" * 33)}, "nests"),
        ("text nested 20 deep", "send", {"text": json.loads("[" * 20 + "]" * 20)}, '"text"'),
        ("a number for text", "suggest", {"text": 1e308}, '"text"'),
        ("force 1e400", "personalize", None, '"force"'),
    ]
    for what, route, body, names in cases:
        raw = json.dumps(body).encode() if body is not None else b'{"force": 1e400}'
        with tally.case(what, names=names, accept=names == ""):
            answer = page(url + f"api/{route}", raw)
            assert answer.get("words") or answer.get("ids"), answer
    for label, names in [("3.5", '"label"'), ("1e400", '"label"'), ("10", '"label"'), ("true", '"label"')]:
        with tally.case(f"label {label}", names=names):
            page(
                durl + "api/add",
                ('{"pixels": [' + ",".join(["0"] * 784) + '], "label": ' + label + "}").encode(),
            )
    for value, names in [("1e300", '"label"'), ("1e-320", '"label"'), ('"2"', '"label"')]:
        with tally.case(f"a regression label {value}", names=names):
            api(api_json.label, api_json.parse(f'{{"label": {value}}}'.encode(), max_items=10), None)
    with tally.case("a regression label 0.5", accept=True):
        assert api(api_json.label, {"label": 0.5}, None) == 0.5
    for label in ["3", True, [3, 4], np.nan, 1e300]:
        with tally.case(f"Home.add with label {label!r}", names="label"):
            digits.add(np.zeros(784, np.float32), label)


def api(check, *args):
    """An api_json check in this process: its ApiError (the server answers it with a 4xx) raised as Refused."""
    try:
        return check(*args)
    except api_json.ApiError as e:
        raise Refused(str(e)) from None
