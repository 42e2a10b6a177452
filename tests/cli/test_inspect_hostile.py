"""`edgetrain inspect` on crafted headers with a valid checksum (issue 22, finding 5). Anyone can recompute a checksum,
so the container's own writer makes the files: a real artifact's and a real checkpoint's header, with every key
(nested ones too: the first entry of each list, the first few of each long map of names) deleted, set to None, to a
list, to a string, to a huge int (10**30) and to an int beyond any float (10**400). Each crafted file is either
described (the field is optional, or any value of it reads) or refused with an EdgeTrainError that names the file
and the field; nothing else may come out (the issue met bare KeyError, TypeError and AttributeError). The command
line exits 1 with one line and no traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from crafting import DELETE, crafted
from models import MODELS, batch_for

import edgetrain as et
from edgetrain.cli import main
from edgetrain.core.container import read_container, write_container
from edgetrain.core.errors import EdgeTrainError
from edgetrain.runtime.describe import describe, summary
from loaders import ArrayDataView, DataLoader, InputPipeline

ROOT = Path(__file__).resolve().parents[2]
MUTATIONS = {
    "deleted": DELETE,
    "None": None,
    "a list": [1, 2],
    "a string": "x",
    "a huge int": 10**30,
    "an int beyond any float": 10**400,
}
LONG_MAP = 16  # a map of more keys (values, offsets, zeros by tensor name) is crafted at its first 3 only


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A real artifact (an MLP with an input pipeline, SGD with momentum: fused step, zero state, batch plan) and
    a real checkpoint of a Trainer's run (its user_state: settings, loaders, history)."""
    d = tmp_path_factory.mktemp("inspect")
    art = et.convert(
        MODELS["mlp"][0](),
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.05, momentum=0.9),
        batch_size=4,
        preprocessing=InputPipeline(raw_dtype="uint8", scale=1 / 255),
    )
    art.save(d / "a.etrain")
    x, y = batch_for("mlp", 16)
    trainer = et.Trainer(
        et.TrainingSession(str(d / "a.etrain")),
        DataLoader(ArrayDataView(x, y), 4),
        val_loader=DataLoader(ArrayDataView(x, y), 4),
        epochs=2,
        checkpoint=str(d / "c.etck"),
        run_options={"lr": 0.05},
    )
    trainer.fit()
    return {"artifact": d / "a.etrain", "checkpoint": d / "c.etck"}


def key_paths(value, prefix=()):
    """Every path of keys and list positions into a JSON value (lists: their first item; long maps of names: their
    first 3 keys)."""
    if isinstance(value, dict):
        keys = list(value)
        for k in keys[:3] if prefix and len(keys) > LONG_MAP else keys:
            yield (*prefix, k)
            yield from key_paths(value[k], (*prefix, k))
    elif isinstance(value, list) and value:
        yield (*prefix, 0)
        yield from key_paths(value[0], (*prefix, 0))


# how messages name a header's parts in words
WORDS = {
    "base": "inference graph",
    "fused": "fused step",
    "plan": "memory plan",
    "zeros": "zero state",
    "lr": "learning rate",
}


def names_the_field(message: str, path: tuple) -> bool:
    """The message names the crafted key or one it lies in: as a word, quoted, or in a dotted path."""
    keys = [k for k in path if isinstance(k, str)]
    keys += [WORDS[k] for k in keys if k in WORDS]
    return any(re.search(rf"(?<!\w){re.escape(k)}(?!\w)", message) for k in keys)


def sweep(files, kind: str, tmp_path, report) -> Counter:
    src = files[kind]
    header, tensors = read_container(src)
    target = tmp_path / src.name
    counts: Counter = Counter()
    crashed, unnamed = [], []
    for path in key_paths(header):
        for how, value in MUTATIONS.items():
            write_container(target, kind=kind, header=crafted(header, path, value), tensors=tensors)
            counts["tried"] += 1
            case = f"{'.'.join(map(str, path))} {how}"
            try:
                text = describe(target)
            except EdgeTrainError as e:
                counts["refused"] += 1
                if str(target) not in str(e) or not names_the_field(str(e), path):
                    unnamed.append(f"{case}: {e}")
                continue
            except Exception as e:  # what the issue saw: a bare exception out of inspect
                counts["crashed"] += 1
                crashed.append(f"{case}: {type(e).__name__}: {e}")
                continue
            counts["described"] += 1
            assert str(target) in text
            try:  # `inspect --json` of a file that reads
                summary(target)
            except Exception as e:
                counts["crashed"] += 1
                crashed.append(f"{case} (--json): {type(e).__name__}: {e}")
    report(
        "hostile inputs",
        f"inspect, crafted {kind} headers (valid checksum): {counts['tried']} tried, {counts['refused']} refused, "
        f"{counts['described']} described, {counts['crashed']} crashed",
    )
    assert not crashed, "\n".join(crashed[:20])
    assert not unnamed, "\n".join(unnamed[:20])
    return counts


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch):
    """Thousands of crafted files: their durability is no concern here (the container's own tests check it)."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def test_crafted_artifact_headers_are_described_or_refused_naming_the_field(files, tmp_path, report):
    counts = sweep(files, "artifact", tmp_path, report)
    assert counts["tried"] > 500 and counts["refused"] > counts["tried"] // 2


def test_crafted_checkpoint_headers_are_described_or_refused_naming_the_field(files, tmp_path, report):
    counts = sweep(files, "checkpoint", tmp_path, report)
    assert counts["tried"] > 200 and counts["refused"] > 0


# The issue's cases by hand: each was a bare exception out of `edgetrain inspect`.
ISSUE_CASES = [
    ("artifact", ("io",), DELETE, "io"),
    ("artifact", ("base",), None, "inference graph"),
    ("artifact", ("program", "nodes"), {"k": 1}, "nodes"),
    ("artifact", ("plan", "arena_size"), "x", "arena_size"),
    ("artifact", ("zeros",), [1, 2], "zeros"),
    ("artifact", ("fused", "program", "values"), None, "values"),
    ("artifact", ("provenance",), [1, 2], "provenance"),
    ("artifact", ("optimizer", "lr"), 10**400, "lr"),
    ("checkpoint", ("step",), "x", "step"),
    ("checkpoint", ("lr",), None, "learning rate"),
    ("checkpoint", ("user_state",), [1, 2], "user_state"),
    ("checkpoint", ("user_state", "settings"), [1, 2], None),  # the run's record: shown as it is
    ("checkpoint", ("user_state", "run_options"), "x", None),
    ("checkpoint", ("user_state", "history", 0, "val_accuracy"), 10**30, None),
]


@pytest.mark.parametrize(
    "kind, path, value, says",
    ISSUE_CASES,
    ids=[
        f"{k}-{'.'.join(map(str, p))}-{'deleted' if v is DELETE else type(v).__name__}"
        for k, p, v, _ in ISSUE_CASES
    ],
)
def test_the_cli_says_one_line_and_exits_1(files, tmp_path, capsys, kind, path, value, says):
    header, tensors = read_container(files[kind])
    target = tmp_path / files[kind].name
    write_container(target, kind=kind, header=crafted(header, path, value), tensors=tensors)
    for argv in (["inspect", str(target)], ["inspect", str(target), "--json"]):
        code = main(argv)
        out, err = capsys.readouterr()
        if says is None:
            assert code == 0 and not err, err
            continue
        assert code == 1, (code, out, err)
        assert err.count("\n") == 1 and err.startswith("edgetrain inspect: error: "), err
        assert str(target) in err and says in err, err
        assert "Traceback" not in err and "--debug" not in err, err  # --debug is offered for unplanned errors


def test_a_crafted_file_through_the_real_command(files, tmp_path):
    """In a process of its own: exit code 1, one line on stderr, nothing on stdout, no traceback."""
    header, tensors = read_container(files["artifact"])
    target = tmp_path / "crafted.etrain"
    header = crafted(header, ("fused", "gradients"), None)
    write_container(target, kind="artifact", header=header, tensors=tensors)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "edgetrain.cli", "inspect", str(target)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 1 and proc.stdout == "", proc
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "gradients" in proc.stderr and str(target) in proc.stderr, proc.stderr


def test_real_files_are_still_described(files):
    for kind, path in files.items():
        assert describe(path).startswith(f"{kind:10s} {path}")
        assert summary(path)["kind"] == kind
    assert np.isfinite(summary(files["artifact"])["memory"]["peak_bytes"])
