"""Where each command writes (issue 33): no command writes over one of its own inputs, nor twice over one file, nor
inside a place it fills (the demo's and the fleet's --out, the phone app's home), and a file is replaced only by one
of its kind (a checkpoint by a checkpoint, --overwrite or not). Every command with an output x every output option x
every spelling of the same file (as given, ./, absolute, through ../, a symlink, a hard link, another case): each
refused with exit code 2 and one error line naming both paths, and no file changed (bytes and mtimes compared);
another file, or another case on a file system that keeps cases apart, passes the rule (the command is stopped
where its work would begin). Hypothesis draws file names (spaces, accents, a line break) for the same matrix.
Real runs still write where they are asked, and eval, inspect and check write nothing.

The issue's reproductions are among the cases, named: `convert m.onnx -o m.onnx`, `--emit-onnx m.onnx`,
`export a.etrain -o a.etrain`, `--adapter-file` naming the artifact or the checkpoint, `export -o a.etck`,
`train --log data.npz`, `train --checkpoint a.etrain` with and without --overwrite."""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import shutil
import stat
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import onnx
import pytest
from hostile import Tally
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from models import mlp

import android_demo.__main__ as app
import edgetrain as et
import edgetrain.cli.build as build
import edgetrain.cli.federate as federate
import edgetrain.cli.train as train
import edgetrain.derive.pipeline as pipeline
from android_demo import text
from edgetrain.cli import main
from edgetrain.cli.parser import build_parser
from edgetrain.core.container import file_kind
from edgetrain.core.errors import UsageError
from edgetrain.core.paths import found_kind, same_file, shown

FED = ["--clients", "2", "--rounds", "1"]
# (what, argv with "@" where the spelled path goes, the file "@" spells, what the line must name besides "@")
# An argv starting with "--home" is the phone app's (python -m android_demo), any other edgetrain's.
SAME = [
    ("issue: convert m.onnx -o m.onnx", ["convert", "m.onnx", "-o", "@"], "m.onnx", "m.onnx"),
    ("issue: convert --emit-onnx m.onnx", ["convert", "m.onnx", "--emit-onnx", "@"], "m.onnx", "m.onnx"),
    ("convert -o = --parameters", ["convert", "m.onnx", "--parameters", "p.json", "-o", "@"], "p.json", "p.json"),
    ("convert --emit-onnx = -o", ["convert", "m.onnx", "-o", "o.etrain", "--emit-onnx", "@"], "o.etrain", "o.etrain"),
    ("convert --emit-onnx = the default -o", ["convert", "m.onnx", "--emit-onnx", "@"], "m.etrain", "m.etrain"),
    ("issue: export a.etrain -o a.etrain", ["export", "a.etrain", "-o", "@"], "a.etrain", "a.etrain"),
    ("export -o = --checkpoint", ["export", "a.etrain", "--checkpoint", "c.etck", "-o", "@"], "c.etck", "c.etck"),
    ("issue: export --adapter-file = the artifact", ["export", "l.etrain", "-o", "e.onnx", "--adapter-file", "@"],
     "l.etrain", "l.etrain"),
    ("issue: export --adapter-file = the checkpoint",
     ["export", "a.etrain", "--checkpoint", "c.etck", "-o", "new.onnx", "--adapter-file", "@"], "c.etck", "c.etck"),
    ("export --adapter-file = -o", ["export", "a.etrain", "-o", "e.onnx", "--adapter-file", "@"], "e.onnx", "e.onnx"),
    ("issue: train --checkpoint a.etrain", ["train", "a.etrain", "--data", "d.npz", "--checkpoint", "@"],
     "a.etrain", "a.etrain"),
    ("issue: train --checkpoint a.etrain --overwrite",
     ["train", "a.etrain", "--data", "d.npz", "--checkpoint", "@", "--overwrite"], "a.etrain", "a.etrain"),
    ("train --checkpoint = --data", ["train", "a.etrain", "--data", "d.npz", "--checkpoint", "@", "--overwrite"],
     "d.npz", "d.npz"),
    ("train --checkpoint = --val-data",
     ["train", "a.etrain", "--data", "d.npz", "--val-data", "v.npz", "--checkpoint", "@"], "v.npz", "v.npz"),
    ("issue: train --log data.npz", ["train", "a.etrain", "--data", "d.npz", "--log", "@"], "d.npz", "d.npz"),
    ("train --log = the artifact", ["train", "a.etrain", "--data", "d.npz", "--log", "@"], "a.etrain", "a.etrain"),
    ("train --log = --val-data", ["train", "a.etrain", "--data", "d.npz", "--val-data", "v.npz", "--log", "@"],
     "v.npz", "v.npz"),
    ("train --log = --checkpoint",
     ["train", "a.etrain", "--data", "d.npz", "--checkpoint", "c.etck", "--overwrite", "--log", "@"], "c.etck",
     "c.etck"),
    ("train --log = --init-from",
     ["train", "a.etrain", "--data", "d.npz", "--init-from", "c.etck", "--checkpoint", "n.etck", "--log", "@"],
     "c.etck", "c.etck"),
    ("train --plot = --data", ["train", "a.etrain", "--data", "d.npz", "--plot", "@"], "d.npz", "d.npz"),
    ("train --plot = the artifact", ["train", "a.etrain", "--data", "d.npz", "--plot", "@"], "a.etrain", "a.etrain"),
    ("train --plot = --log", ["train", "a.etrain", "--data", "d.npz", "--log", "h.jsonl", "--plot", "@"],
     "h.jsonl", "h.jsonl"),
    ("demo --json in --out", ["demo", "--out", "dd", "--json", "@"], "dd/r.json", "--out"),
    ("demo --json = --out", ["demo", "--out", "dd", "--json", "@"], "dd", "--out"),
    ("federate --out = the artifact", ["federate", "a.etrain", "--data", "d.npz", *FED, "--out", "@"], "a.etrain",
     "a.etrain"),
    ("federate --out = --data", ["federate", "a.etrain", "--data", "d.npz", *FED, "--out", "@"], "d.npz", "d.npz"),
    ("federate --out = the --data folder", ["federate", "a.etrain", "--data", "dd", *FED, "--out", "@"], "dd", "dd"),
    ("federate --data = --out's summary.json", ["federate", "a.etrain", "--data", "@", *FED, "--out", "fo"],
     "fo/summary.json", "--out"),
    ("federate --val-data in --out's clients/",
     ["federate", "a.etrain", "--data", "d.npz", "--val-data", "@", *FED, "--out", "fo"],
     "fo/clients/client-0/data.npz", "--out"),
    ("app init --artifact = the home's model.etrain", ["--home", "hh", "init", "--artifact", "@"],
     "hh/model.etrain", "--home"),
    ("app init --home = --artifact", ["--home", "@", "init", "--artifact", "a.etrain"], "a.etrain", "a.etrain"),
    ("app init --text --vocab = the home's vocab.json", ["--home", "hh", "init", "--text", "--vocab", "@"],
     "hh/vocab.json", "--home"),
    ("app add --data = the home's samples", ["--home", "ah", "add", "--data", "@"], "ah/samples.sqlite", "--home"),
    ("app add --data in the home's versions/", ["--home", "ah", "add", "--data", "@"], "ah/versions/x.npz",
     "--home"),
    ("app add --data = the home", ["--home", "ah", "add", "--data", "@"], "ah", "ah"),
    ("app add --sentences = the home's log", ["--home", "ah", "add", "--sentences", "@"], "ah/log.jsonl", "--home"),
    ("app evaluate --data = the home's model", ["--home", "ah", "evaluate", "--data", "@"], "ah/model.etrain",
     "--home"),
]  # fmt: skip
# Outputs over files of another kind (none of them an input of the command): (what, argv, what the line names)
KINDS = [
    ("convert -o over a checkpoint", ["convert", "m.onnx", "-o", "c.etck"], ("-o c.etck", "a checkpoint")),
    ("convert -o over data", ["convert", "m.onnx", "-o", "d.npz"], ("-o d.npz", "zip")),
    ("convert -o over another ONNX model", ["convert", "m.onnx", "-o", "e.onnx"], ("-o e.onnx", "ONNX")),
    ("convert -o a folder", ["convert", "m.onnx", "-o", "dd"], ("-o dd", "folder")),
    ("convert --emit-onnx over an artifact", ["convert", "m.onnx", "--emit-onnx", "o.etrain"],
     ("--emit-onnx o.etrain", "artifact")),
    ("convert MODEL named .etrain: the default -o is the model", ["convert", "mo.etrain"],
     ("-o mo.etrain", "the model mo.etrain")),
    ("issue: export -o a.etck", ["export", "a.etrain", "-o", "c.etck"], ("-o c.etck", "checkpoint")),
    ("export -o over data", ["export", "a.etrain", "-o", "d.npz"], ("-o d.npz", "zip")),
    ("export -o over a history", ["export", "a.etrain", "-o", "h.jsonl"], ("-o h.jsonl", "JSON")),
    ("export --adapter-file over a checkpoint", ["export", "l.etrain", "-o", "new.onnx", "--adapter-file", "c.etck"],
     ("--adapter-file c.etck", "checkpoint")),
    ("export --adapter-file .onnx_adapter over an artifact",
     ["export", "l.etrain", "-o", "new.onnx", "--adapter-file", "x.onnx_adapter"],
     ("--adapter-file x.onnx_adapter", "artifact")),
    ("train --checkpoint over another artifact, --overwrite",
     ["train", "a.etrain", "--data", "d.npz", "--checkpoint", "o.etrain", "--overwrite"],
     ("--checkpoint o.etrain", "artifact", "--overwrite replaces only a checkpoint")),
    ("train --checkpoint over data, --overwrite",
     ["train", "a.etrain", "--data", "d.npz", "--checkpoint", "v.npz", "--overwrite"], ("--checkpoint v.npz", "zip")),
    ("train --checkpoint over an ONNX model", ["train", "a.etrain", "--data", "d.npz", "--checkpoint", "m.onnx"],
     ("--checkpoint m.onnx", "ONNX")),
    ("train --resume --checkpoint over an artifact",
     ["train", "a.etrain", "--resume", "--checkpoint", "o.etrain"], ("--checkpoint o.etrain", "artifact")),
    ("train the best checkpoint over an artifact",
     ["train", "a.etrain", "--data", "d.npz", "--val-data", "v.npz", "--early-stopping", "1", "--checkpoint",
      "q.etck"], ("--checkpoint's best checkpoint q.best.etck", "artifact", "give --checkpoint a new path")),
    ("train the best checkpoint = --data",
     ["train", "a.etrain", "--data", "r.best.etck", "--val-split", "0.5", "--early-stopping", "1", "--checkpoint",
      "r.etck"],
     ("--checkpoint's best checkpoint r.best.etck", "--data r.best.etck", "give --checkpoint another path")),
    ("train --log over a checkpoint", ["train", "a.etrain", "--data", "d.npz", "--checkpoint", "n.etck", "--log",
     "c.etck"], ("--log c.etck", "checkpoint")),
    ("train --log over an ONNX model", ["train", "a.etrain", "--data", "d.npz", "--log", "m.onnx"],
     ("--log m.onnx", "ONNX")),
    ("train --plot over an artifact", ["train", "a.etrain", "--data", "d.npz", "--plot", "o.etrain"],
     ("--plot o.etrain", "artifact")),
    ("train --plot over a history", ["train", "a.etrain", "--data", "d.npz", "--plot", "h.jsonl"],
     ("--plot h.jsonl", "JSON")),
    ("train --resume: --data = the run's recorded --log", ["train", "a.etrain", "--resume", "--checkpoint",
     "run.etck", "--epochs", "2", "--data", "run.jsonl"], ("--log run.jsonl", "--data run.jsonl")),
    ("demo --out a file", ["demo", "--out", "a.etrain"], ("--out a.etrain", "not a folder")),
    ("demo --json over an artifact", ["demo", "--out", "dd", "--json", "a.etrain"], ("--json a.etrain", "artifact")),
    ("federate --out a file", ["federate", "a.etrain", "--data", "d.npz", *FED, "--out", "c.etck"],
     ("--out c.etck", "not a folder")),
    ("app --home a file", ["--home", "o.etrain", "init", "--artifact", "a.etrain"], ("--home o.etrain", "folder")),
    ("app --home a data file", ["--home", "d.npz", "status"], ("--home d.npz", "not a folder")),
]  # fmt: skip
SPELLINGS = (
    "as given",
    "./",
    "absolute",
    "../ and back",
    "symlink",
    "hard link",
    "another case",
    "another file",
)


# ---- the files -----------------------------------------------------------------------------------------------------
def _data(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    np.savez(path, x=rng.random((n, 784)).astype(np.float32), y=rng.integers(0, 10, n))


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """Every file the cases name: a model, artifacts (one with LoRA adapters), a checkpoint, a run's checkpoint,
    data, an app home, and files of each kind under other names."""
    d = tmp_path_factory.mktemp("made")
    onnx.save(mlp(), d / "m.onnx")
    for name, adapters in (("a.etrain", None), ("l.etrain", et.LoRA(rank=2, alpha=4))):
        et.convert(
            str(d / "m.onnx"),
            loss=et.CrossEntropyLoss(),
            optimizer=et.SGD(lr=0.05),
            batch_size=4,
            adapters=adapters,
        ).save(d / name)
    et.TrainingSession(str(d / "a.etrain")).save_checkpoint(str(d / "c.etck"))
    _data(d / "d.npz", 16, 0)
    _data(d / "v.npz", 8, 1)
    for folder in ("dd", "hh", "fo/clients/client-0"):
        (d / folder).mkdir(parents=True)
    copies = {
        "o.etrain": "a.etrain", "m.etrain": "a.etrain", "x.onnx_adapter": "a.etrain", "q.best.etck": "a.etrain",
        "hh/model.etrain": "a.etrain", "e.onnx": "m.onnx", "mo.etrain": "m.onnx", "r.best.etck": "d.npz",
        "fo/summary.json": "d.npz", "fo/clients/client-0/data.npz": "d.npz",
    }  # fmt: skip
    for name, source in copies.items():
        shutil.copy(d / source, d / name)
    (d / "p.json").write_text('{"parameters": {}}')
    (d / "h.jsonl").write_text('{"epoch": 1, "train_loss": 2.3}\n')
    (d / "dd" / "r.json").write_text("{}\n")
    (d / "hh" / "vocab.json").write_text("{}\n")
    here = os.getcwd()
    os.chdir(d)  # the run and the home record the paths as given
    try:
        trained = run(
            ["train", "a.etrain", "--data", "d.npz", "--checkpoint", "run.etck", "--log", "run.jsonl"]
        )
        homed = run(["--home", "ah", "init", "--artifact", "a.etrain"])
        assert trained[0] == homed[0] == 0, (trained, homed)
    finally:
        os.chdir(here)
    shutil.copy(d / "d.npz", d / "ah" / "versions" / "x.npz")
    return d


@pytest.fixture
def work(made, tmp_path, monkeypatch) -> Path:
    """A copy of the files in a folder of its own, the current folder; the app's thread settings left as they were;
    the commands stopped where their work would begin (Reached), so that passing the rule costs nothing."""
    w = tmp_path / "work"
    shutil.copytree(made, w, symlinks=True)
    monkeypatch.chdir(w)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the app sets the BLAS variables for its process

    def reached(*args, **kwargs):
        raise Reached

    for module, name in (
        (pipeline, "convert"),
        (build, "open_session"),
        (build, "run_demo"),
        (train, "_train_session"),
        (federate, "_flower_installed"),
        (app, "_init"),
        (text, "open_home"),
    ):
        monkeypatch.setattr(module, name, reached)
    return w


class Reached(Exception):
    """A command got past its checks to its work."""


def run(argv: list[str]) -> tuple[int, list[str]]:
    """(exit code, stderr lines) of edgetrain's command line, or the app's for an argv starting with --home, in
    this process."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = app.main(argv) if argv[0] == "--home" else main(argv)
        except SystemExit as e:  # argparse's own usage errors
            code = e.code
    return code, err.getvalue().strip().splitlines()


def invoke(argv: list[str]) -> None:
    """The command's function itself, so that what it raises reaches the caller."""
    if argv[0] == "--home":
        app.run(app.build_parser().parse_args(argv))
    else:
        args = build_parser().parse_args(argv)
        args.run(args)


_DIGESTS: dict[tuple, str] = {}


def snapshot(root: Path) -> dict[str, tuple]:
    """Every file, folder and link under root: its bytes' digest (a link: its target), size and mtime. A file's
    digest is read again whenever its inode, size, mtime or ctime moved (no write leaves all four as they were)."""
    seen = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(folder, name)
            st_ = os.lstat(p)
            if stat.S_ISLNK(st_.st_mode):
                what = "-> " + os.readlink(p)
            elif stat.S_ISREG(st_.st_mode):
                key = (p, st_.st_ino, st_.st_size, st_.st_mtime_ns, st_.st_ctime_ns)
                if key not in _DIGESTS:
                    _DIGESTS[key] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
                what = _DIGESTS[key]
            else:
                what = "folder"
            seen[os.path.relpath(p, root)] = (what, st_.st_size, st_.st_mtime_ns)
    return seen


def refused(tally: Tally, what: str, argv: list[str], names: tuple[str, ...], root: Path) -> None:
    """One refusal: exit code 2, one error line (the last), naming `names`, and no file changed; the line, as the
    user reads it, is what the tally judges."""
    before = snapshot(root)
    with tally.case(what, names=names):
        code, lines = run(argv)
        errors = [line for line in lines if "error:" in line]
        assert code == 2, (code, lines)
        assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in "\n".join(lines), lines
        assert snapshot(root) == before, "a file changed"
        raise UsageError(errors[0])


def passes(tally: Tally, what: str, argv: list[str], root: Path) -> None:
    """One run the rule lets through: it reaches the command's work, having written nothing."""
    before = snapshot(root)
    with tally.case(what, accept=True):
        try:
            invoke(argv)
        except Reached:
            pass
        else:
            raise AssertionError("the command did not reach its work")
        assert snapshot(root) == before, "a file changed before the command's work began"


def case_blind(folder: Path) -> bool:
    probe = folder / "cAsE-probe"
    probe.write_text("")
    try:
        return (folder / "CaSe-PROBE").exists()
    finally:
        probe.unlink()


_count = itertools.count()


def spell(base: str, spelling: str, root: Path) -> str:
    """Another path to the file `base` (relative to root, the current folder), or another file for "another
    file" (and for "another case" on a file system that keeps cases apart)."""
    k = next(_count)
    name = os.path.basename(base)
    if spelling == "as given":
        return base
    if spelling == "./":
        return "./" + base
    if spelling == "absolute":
        return str(root / base)
    if spelling == "../ and back":
        return f"../{root.name}/{base}"
    if spelling == "symlink":
        link = f"link{k}-{name}"
        os.symlink(os.path.abspath(base), link)
        return link
    if spelling == "hard link":
        link = f"hard{k}-{name}"
        os.link(base, link)
        return link
    if spelling == "another case":  # the whole path: a folder of the place, in its case, would still be it
        return base.swapcase()
    return f"new{k}-{name}"


def expect_same(spelled: str, base: str, spelling: str) -> bool:
    """Whether the spelling names the file itself: all but another file, and another case where case is ignored."""
    return spelling != "another file" and (spelling != "another case" or same_file(spelled, base))


def check_case(tally: Tally, case, spelling: str, root: Path) -> None:
    what, argv, base, other = case
    if spelling == "hard link" and not os.path.isfile(base):
        return  # a folder has no hard links
    spelled = spell(base, spelling, root)
    filled = [spelled if a == "@" else a for a in argv]
    label = f"{what} [{spelling}: {spelled}]"
    if expect_same(spelled, base, spelling):
        refused(tally, label, filled, (shown(spelled), other), root)
    else:
        passes(tally, label, filled, root)


# ---- the matrix ----------------------------------------------------------------------------------------------------
def test_every_command_and_output_refuses_its_own_inputs_however_spelled(work, report):
    tally = Tally("output paths: every command x output option x spelling")
    for case in SAME:
        for spelling in SPELLINGS:
            check_case(tally, case, spelling, work)
    report("hostile inputs", tally.line())
    tally.assert_clean()
    assert tally.refused >= len(SAME) * 5


def test_outputs_replace_only_files_of_their_kind(work, report):
    tally = Tally("output paths: outputs over files of another kind")
    for what, argv, names in KINDS:
        refused(tally, what, argv, names, work)
    # ... and over a file of their own kind, or an empty one, they pass
    open("empty.etck", "w").close()
    for what, argv in [
        ("convert -o over an artifact", ["convert", "m.onnx", "-o", "o.etrain"]),
        ("export -o over an ONNX model", ["export", "a.etrain", "-o", "e.onnx"]),
        ("train --checkpoint over a checkpoint, --overwrite",
         ["train", "a.etrain", "--data", "d.npz", "--checkpoint", "c.etck", "--overwrite"]),
        ("train --checkpoint over an empty file", ["train", "a.etrain", "--data", "d.npz", "--checkpoint",
         "empty.etck", "--overwrite"]),
        ("train --log over a history", ["train", "a.etrain", "--data", "d.npz", "--log", "h.jsonl"]),
        ("train --init-from X --checkpoint ./X: a new run may replace its own start",
         ["train", "a.etrain", "--data", "d.npz", "--init-from", "c.etck", "--checkpoint", "./c.etck"]),
        ("train --resume: the checkpoint is read and written", ["train", "a.etrain", "--resume", "--checkpoint",
         "run.etck", "--epochs", "2"]),
        ("demo --json over a JSON file outside --out", ["demo", "--out", "new-demo", "--json", "dd/r.json"]),
        ("federate --out a folder holding the artifact",
         ["federate", "dd/../a.etrain", "--data", "d.npz", *FED, "--out", "."]),
        ("app add --data a file the home does not write", ["--home", "ah", "add", "--data", "d.npz"]),
    ]:  # fmt: skip
        passes(tally, what, argv, work)
    report("hostile inputs", tally.line())
    tally.assert_clean()


NAMES = st.text(st.sampled_from("abcXYZ019 _-.,()#~éßΩ漢\n"), min_size=1, max_size=12).filter(
    lambda s: not s.startswith("-") and s.strip(".") != ""
)
# the cases whose file has a name of its own, on the command line: it can be any name
FREE = [c for c in SAME if "/" not in c[2] and c[2] in c[1] and c[1][0] not in ("--home", "demo", "federate")]


def test_generated_names(work, report):
    """The matrix on files of names Hypothesis draws (each in a folder g/, so it meets no other file)."""
    tally = Tally("output paths: drawn names x command x output option x spelling")
    Path("g").mkdir()

    @settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=st.sampled_from(FREE), name=NAMES, spelling=st.sampled_from(SPELLINGS))
    def one(case, name, spelling):
        what, argv, base, _ = case
        new = os.path.join("g", name + os.path.splitext(base)[1])
        if not os.path.exists(new):
            shutil.copy(base, new)
        renamed = [new if a == base else a for a in argv]
        check_case(tally, (what, renamed, new, shown(new)), spelling, work)

    one()
    report("hostile inputs", tally.line())
    tally.assert_clean()


# ---- real runs -----------------------------------------------------------------------------------------------------
def ok(argv: list[str]) -> None:
    code, lines = run(argv)
    assert code == 0, lines


def test_real_runs_write_where_asked_and_readers_write_nothing(made, tmp_path, monkeypatch):
    w = tmp_path / "w"
    shutil.copytree(made, w, symlinks=True)
    monkeypatch.chdir(w)
    monkeypatch.setattr(os, "environ", dict(os.environ))
    model = Path("m.onnx").read_bytes()

    ok(["convert", "m.onnx", "-o", "a2.etrain", "--emit-onnx", "step.onnx", "--batch-size", "4"])
    ok(["convert", "./m.onnx", "-o", "a2.etrain", "--emit-onnx", "step.onnx", "--batch-size", "4"])  # again
    assert file_kind("a2.etrain") == "artifact" and found_kind("step.onnx") == "other"
    code, _ = run(["convert", "m.onnx", "-o", "M.onnx", "--batch-size", "4"])
    assert code == (2 if case_blind(w) else 0)  # another case: another file, unless case is ignored
    assert Path("m.onnx").read_bytes() == model

    ok(["export", "a.etrain", "--checkpoint", "c.etck", "-o", "e2.onnx", "--no-check"])
    for _ in range(2):  # the adapter file replaces its own kind
        ok(["export", "l.etrain", "-o", "le.onnx", "--adapter-file", "u.etad", "--no-check"])
    assert found_kind("e2.onnx") == "other" and file_kind("u.etad") == "adapters"

    run_files = ["--checkpoint", "t.etck", "--log", "t.jsonl", "--plot", "t.png"]
    best = ["--val-data", "v.npz", "--early-stopping", "1", "--epochs", "2"]
    ok(["train", "a.etrain", "--data", "d.npz", *run_files, *best])
    ok(["train", "a.etrain", "--data", "d.npz", *run_files, *best, "--overwrite"])  # its own files again
    assert (
        file_kind("t.etck")
        == file_kind("t.best.etck")
        == "checkpoint"
        == file_kind(train.best_beside("t.etck"))
    )
    assert found_kind("t.jsonl") == "json" and found_kind("t.png") in ("png", None)
    ok(["train", "a.etrain", "--data", "d.npz", "--init-from", "t.etck", "--checkpoint", str(w / "t.etck")])

    before = snapshot(w)
    ok(["eval", "a.etrain", "--data", "d.npz", "--checkpoint", "t.etck"])
    ok(["inspect", "t.etck", "--json"])
    ok(["inspect", "a.etrain"])
    ok(["check", "m.onnx"])
    assert snapshot(w) == before  # the readers wrote nothing

    ok(["--home", "nh", "init", "--artifact", "a.etrain"])
    ok(["--home", "nh", "add", "--data", "d.npz"])
    assert (
        file_kind("nh/model.etrain") == "artifact"
        and Path("a.etrain").read_bytes() == (made / "a.etrain").read_bytes()
    )


def test_the_trainer_names_the_best_checkpoint_as_train_checks_it(made, tmp_path):
    from edgetrain.runtime.trainer import Trainer
    from loaders import ArrayDataView, DataLoader

    data = np.load(made / "d.npz")
    loader = DataLoader(ArrayDataView(data["x"], data["y"]), 4)
    for name in ("run.etck", "run", "a.b.etck", "dir.x/run"):
        t = Trainer(
            et.TrainingSession(str(made / "a.etrain")),
            loader,
            val_loader=loader,
            checkpoint=str(tmp_path / name),
            early_stopping={"metric": "val_loss", "patience": 1},
        )
        assert t.best_checkpoint == train.best_beside(str(tmp_path / name))


# ---- the rule's parts ----------------------------------------------------------------------------------------------
def test_found_kind_tells_files_apart_without_reading_devices(made, tmp_path):
    (tmp_path / "e").write_bytes(b"")
    (tmp_path / "t.csv").write_text("1,2,3\n")
    (tmp_path / "j").write_text('  {"a": 1}')
    (tmp_path / "png").write_bytes(b"\x89PNG\r\n\x1a\n....")
    (tmp_path / "cut.etrain").write_bytes((made / "a.etrain").read_bytes()[:10])
    kinds = {
        made / "a.etrain": "artifact", made / "c.etck": "checkpoint", made / "m.onnx": "other",
        made / "d.npz": "zip", made / "h.jsonl": "json", made / "dd": "folder", tmp_path / "e": "empty",
        tmp_path / "t.csv": "text", tmp_path / "j": "json", tmp_path / "png": "png",
        tmp_path / "cut.etrain": "edgetrain", tmp_path / "none": None, "/dev/null": None, "a\0b": None,
    }  # fmt: skip
    for path, kind in kinds.items():
        assert found_kind(path) == kind, path


def test_same_file_compares_files_not_strings(made, tmp_path, monkeypatch):
    monkeypatch.chdir(made)
    os.symlink(made / "m.onnx", tmp_path / "link")
    os.link(made / "m.onnx", tmp_path / "hard")
    for other in ("m.onnx", "./m.onnx", str(made / "m.onnx"), f"../{made.name}/m.onnx", tmp_path / "link",
                  tmp_path / "hard", "dd/../m.onnx"):  # fmt: skip
        assert same_file("m.onnx", other), other
    assert not same_file("m.onnx", "e.onnx") and not same_file("m.onnx", "a\0b")
    assert same_file("no-such", "./no-such")  # a file not there yet is named alike too
