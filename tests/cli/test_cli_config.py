"""The command line's typed configurations: built from the parsed arguments in one place and checked there (a
usage error naming the option), what a checkpoint records of a run and --resume restores, and checkpoints written
before the configurations existed (their options recorded straight from the argparse Namespace) resuming as they
did: tests/data/namespace-run holds one, written by `edgetrain train` of that time:

    edgetrain convert cam.onnx -o cam.etrain --batch-size 8 --lr 0.05      # tests/cli/test_cli_userdata's camera model
    edgetrain train cam.etrain --data train.npz --epochs 2 --lr 0.1 --lr-schedule step:3:0.5 --warmup 2 --seed 7 \\
        --val-split 0.25 --layout nhwc --scale --normalize 0.5,0.25 --x-key x --y-key y --augment flip \\
        --early-stopping 5 --checkpoint-every 2 --log cam.jsonl

Also: each option is defined once in edgetrain/cli (the few that share a name are different options)."""

from __future__ import annotations

import ast
import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_cli import cli, ok
from test_cli_userdata import history, tensors

from edgetrain.cli.build_config import CheckConfig, ConvertConfig
from edgetrain.cli.config import RunConfig, TrainConfig
from edgetrain.cli.federate import run_config_of
from edgetrain.cli.federate_config import FederateConfig
from edgetrain.cli.parser import build_parser
from edgetrain.core.container import read_container
from edgetrain.core.errors import ArtifactError, UsageError

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE_RUN = ROOT / "tests" / "data" / "namespace-run"
RUN_OPTIONS = [
    "--lr", "0.1", "--lr-schedule", "step:3:0.5", "--warmup", "2", "--seed", "7", "--val-split", "0.25",
    "--layout", "nhwc", "--scale", "--normalize", "0.5,0.25", "--x-key", "x", "--y-key", "y", "--augment", "flip",
    "--early-stopping", "5", "--checkpoint-every", "2", "--log", "cam.jsonl",
]  # fmt: skip
# the run_options of tests/data/namespace-run/cam.etck, as the Namespace-era `edgetrain train` wrote them
NAMESPACE_RECORD = {
    "epochs": 2, "lr": 0.1, "lr_schedule": "step:3:0.5", "warmup": 2, "seed": 7, "val_split": 0.25,
    "val_data": None, "early_stopping": 5, "no_shuffle": False, "layout": "nhwc", "scale": "1/255",
    "normalize": "0.5,0.25", "cast": False, "x_key": "x", "y_key": "y", "augment": "flip", "checkpoint_every": 2,
    "data": "train.npz", "log": "cam.jsonl", "plot": None,
}  # fmt: skip
# what the first checkpoints that recorded a run's options held: no --cast, keys, --augment, data, log or plot
FIRST_RECORD = {
    "epochs": 3, "lr": None, "lr_schedule": "cosine", "warmup": 0, "seed": 0, "val_split": 0.2,
    "val_data": None, "early_stopping": None, "no_shuffle": True, "layout": None, "scale": None,
    "normalize": None, "checkpoint_every": None,
}  # fmt: skip


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def run_options(checkpoint: Path) -> dict:
    return read_container(checkpoint, kind="checkpoint")[0]["user_state"]["run_options"]


# ---- checkpoints of the Namespace era ----------------------------------------------------------------------
def test_the_fixture_holds_the_namespace_record():
    assert run_options(NAMESPACE_RUN / "cam.etck") == NAMESPACE_RECORD


def test_a_namespace_era_checkpoint_resumes_as_an_uninterrupted_run_of_today(tmp_path):
    """--resume alone, in the folder the run was started in: its data, settings and log come from the record, and
    the run ends bit for bit where a run of 3 epochs started today with the same options does."""
    old, new = tmp_path / "old", tmp_path / "new"
    shutil.copytree(NAMESPACE_RUN, old)
    new.mkdir()
    for name in ("cam.etrain", "train.npz"):
        shutil.copy(NAMESPACE_RUN / name, new / name)
    proc = ok(cli("train", "cam.etrain", "--resume", "--epochs", 3, cwd=old))
    assert "resuming from cam.etck: 2 epoch(s), 8 steps done" in proc.stderr
    assert "36 samples, 12 for validation" in proc.stderr and "times 0.5 every 3 steps" in proc.stderr
    ok(cli("train", "cam.etrain", "--data", "train.npz", "--epochs", 3, *RUN_OPTIONS, cwd=new))
    for name in ("cam.etck", "cam.best.etck"):
        got, want = tensors(old / name), tensors(new / name)
        assert sorted(got) == sorted(want)
        assert all(np.array_equal(got[k], want[k]) for k in want), name
    assert history(old / "cam.jsonl") == history(new / "cam.jsonl")
    # the record is written as it was read: the same keys and values, the run now 3 epochs long
    assert run_options(old / "cam.etck") == {**NAMESPACE_RECORD, "epochs": 3} == run_options(new / "cam.etck")


def test_a_namespace_era_checkpoint_still_refuses_a_contradicting_option(tmp_path):
    shutil.copytree(NAMESPACE_RUN, tmp_path / "run")
    proc = cli("train", "cam.etrain", "--resume", "--epochs", 3, "--scale", "0.5", cwd=tmp_path / "run")
    assert proc.returncode == 2, proc.stderr
    assert "--scale 0.5 conflicts with the run in cam.etck (--scale 1/255 there)" in proc.stderr


def test_records_of_every_age_read_into_the_config_and_back():
    run = RunConfig.from_json(NAMESPACE_RECORD)
    assert run.to_json() == NAMESPACE_RECORD
    assert (run.epochs, run.seed, run.shuffle, run.augment, run.early_stopping) == (2, 7, True, "flip", 5)
    assert (run.schedule.lr, run.schedule.lr_schedule, run.schedule.warmup) == (0.1, "step:3:0.5", 2)
    assert (run.data.data, run.data.val_split, run.data.reading.scale, run.data.reading.layout) == (
        "train.npz",
        0.25,
        "1/255",
        "nhwc",
    )
    first = RunConfig.from_json(FIRST_RECORD)  # the options it lacks take their defaults
    assert first.to_json() == {
        **FIRST_RECORD, "cast": False, "x_key": None, "y_key": None, "augment": None,
        "data": None, "log": None, "plot": None,
    }  # fmt: skip
    assert not first.shuffle and first.data.data is None
    later = RunConfig.from_json({**NAMESPACE_RECORD, "a_later_option": [1, 2]})  # unknown keys are left out
    assert later == run


def test_a_config_records_what_the_namespace_recorded():
    """A run configured from today's command line records the same dict the Namespace-era code did."""
    cfg = TrainConfig.from_args(
        parse("train", "cam.etrain", "--data", "train.npz", "--epochs", "2", *RUN_OPTIONS)
    )
    assert cfg.run.to_json() == NAMESPACE_RECORD
    assert RunConfig.from_json(cfg.run.to_json()) == cfg.run


@pytest.mark.parametrize(
    "record, error, needle",
    [
        ({"epochs": "three"}, ArtifactError, "--epochs is 'three'"),
        ({"seed": True}, ArtifactError, "--seed is True"),
        ({"val_split": float("nan")}, ArtifactError, "--val-split is nan"),
        ({"scale": 255}, ArtifactError, "--scale is 255"),
        ({"no_shuffle": "yes"}, ArtifactError, "--no-shuffle is 'yes'"),
        (["epochs", 2], ArtifactError, "not a JSON object"),
        ({"epochs": 0}, UsageError, "--epochs must be a positive integer, got 0"),
        ({"val_split": 0.25, "val_data": "v.npz"}, UsageError, "not both"),
        ({"lr_schedule": "wobbly"}, UsageError, "--lr-schedule wobbly"),
    ],
)
def test_a_record_no_run_writes_is_refused_naming_the_option(record, error, needle):
    with pytest.raises(error) as e:
        RunConfig.from_json(record, "run.etck")
    assert needle in str(e.value), e.value


# ---- from the command line, checked in one place -----------------------------------------------------------
def test_train_defaults_and_the_typed_parts():
    cfg = TrainConfig.from_args(parse("train", "a.etrain", "--data", "d.npz"))
    assert cfg.checkpoint == "a.etck" and not cfg.resume and cfg.feature_cache_mb == 64.0
    run = cfg.run
    assert (run.epochs, run.seed, run.shuffle, run.schedule.warmup, run.data.reading.cast) == (
        1,
        0,
        True,
        0,
        False,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.epochs = 5
    cfg = TrainConfig.from_args(
        parse("train", "a.etrain", "--data", "d.npz", "--scale", "--no-shuffle", "--cast")
    )
    assert cfg.run.data.reading.scale == "1/255" and not cfg.run.shuffle and cfg.run.data.reading.cast


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--val-split", "1.5"], "--val-split must lie between 0 and 1, got 1.5"),
        (["--warmup", "-1"], "--warmup must be 0 or more steps, got -1"),
        (["--epochs", "0"], "--epochs must be a positive integer, got 0"),
        (["--checkpoint-every", "0"], "--checkpoint-every must be a positive integer"),
        (["--threads", "0"], "--threads must be at least 1"),
        (["--feature-cache-mb", "-1"], "--feature-cache-mb must be 0 (off) or more"),
        (["--feature-cache-mb", "nan"], "--feature-cache-mb must be 0 (off) or more"),
        (["--lr-schedule", "step:0"], "--lr-schedule step:0"),
        (["--scale", "x"], "scale 'x'"),
        (["--normalize", "0.5"], "normalize '0.5'"),
        (["--early-stopping", "2"], "--early-stopping needs validation data"),
        (["--resume", "--init-from", "b.etck"], "--resume continues a run, --init-from starts a new one"),
    ],
)
def test_train_options_out_of_range_are_usage_errors_naming_them(tmp_path, argv, needle):
    with pytest.raises(UsageError) as e:
        TrainConfig.from_args(parse("train", str(tmp_path / "a.etrain"), "--data", "d.npz", *argv))
    assert needle in str(e.value), e.value


def test_federate_config_and_its_checks(tmp_path):
    argv = ["federate", "a.etrain", "--data", "d", "--clients", "3", "--rounds", "2", "--out", str(tmp_path)]
    cfg = FederateConfig.from_args(parse(*argv, "--personal", "fc3.*", "--trim", "0.1", "--local-dp", "2"))
    assert cfg.seed == 0 and cfg.personal == ("fc3.*",) and cfg.robustness.trim == 0.1
    assert cfg.privacy.local_dp == 2.0 and not cfg.simulation.simulate
    assert run_config_of(parse(*argv), str(tmp_path)) == FederateConfig.from_args(parse(*argv)).run_config(
        str(tmp_path)
    )
    assert run_config_of(cfg, "out")["personal"] == "fc3.*" and run_config_of(cfg, "out")["min-clients"] == 3
    for extra, needle in [
        (["--clients-per-round", "0"], "--clients-per-round must be a positive integer"),
        (["--trim", "0.7"], "--trim is the share cut off"),
        (["--sim-samples", "5"], "add --simulate"),
        (["--dp-noise", "1"], "needs both --dp-noise and --dp-clip"),
        (["--secure-aggregation", "--aggregate", "krum"], "--aggregate krum needs each client's update"),
    ]:
        with pytest.raises(UsageError) as e:
            FederateConfig.from_args(parse(*argv, *extra))
        assert needle in str(e.value), (extra, e.value)


def test_convert_and_check_configs():
    cfg = ConvertConfig.from_args(
        parse("convert", "m.onnx", "--untie", "--trainable", "fc.*", "--lora-rank", "4")
    )
    assert cfg.untie is True and cfg.trainable == ("fc.*",) and cfg.lora.rank == 4 and cfg.batch_size is None
    assert (
        cfg.optimizer.learning_rate == 0.01
        and cfg.loss.loss == "cross-entropy"
        and cfg.pipeline.pipeline() is None
    )
    cfg = ConvertConfig.from_args(
        parse("convert", "m.onnx", "--untie", "w", "--optimizer", "adamw", "--scale")
    )
    assert cfg.untie == ("w",) and cfg.optimizer.learning_rate == 0.001
    assert cfg.pipeline.pipeline().raw_dtype == "uint8"
    check = CheckConfig.from_args(parse("check", "m.onnx", "--memory-budget", "1MB", "--optimizer", "adam"))
    assert (
        check.optimizer.optimizer == "adam" and check.optimizer.momentum is None and check.batch_size is None
    )
    for argv, needle in [
        (["--optimizer", "adam", "--nesterov"], "--nesterov applies to --optimizer sgd only"),
        (["--loss", "mse", "--label-smoothing", "0.1"], "--label-smoothing applies to --loss"),
        (["--lora-alpha", "8"], "--lora-alpha and --lora-targets need --lora-rank R"),
        (["--normalize", "1,0"], "std must be > 0"),
    ]:
        with pytest.raises(UsageError) as e:
            ConvertConfig.from_args(parse("convert", "m.onnx", *argv))
        assert needle in str(e.value), (argv, e.value)


# ---- each option defined once ------------------------------------------------------------------------------
def test_each_option_is_defined_once():
    """One add_argument call per option string in edgetrain/cli; the names two commands share for different
    options (convert's -o artifact and export's -o ONNX file, inspect's --json flag and demo's --json FILE, train's
    --epochs and demo's, federate's --out folder and demo's) are the only repeats."""
    calls: dict[str, int] = {}
    for path in sorted((ROOT / "edgetrain" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                        calls[arg.value] = calls.get(arg.value, 0) + 1
    assert len(calls) > 80
    assert {k for k, n in calls.items() if n > 1} == {"--output", "--json", "--epochs", "--out"}
