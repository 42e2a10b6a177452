"""`edgetrain federate`'s options against hostile values (issue 33, surface "federate"): every number a user gives
is checked where it enters (loaders.values) and refused with a UsageError naming the option, or accepted into a run
config that Flower can carry (finite numbers, integers within TOML's 64 bits); and a federation that would share
nothing (`--adapters-only --personal '*'`, the issue's reproduction) is refused before any process starts, naming
both options, where it used to fail after 22 s with Flower's exit code alone."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest
from hostile import Tally
from hypothesis import given, settings
from hypothesis import strategies as st

import edgetrain as et
from edgetrain.cli import main
from edgetrain.cli.federate_config import FederateConfig
from edgetrain.cli.parser import build_parser
from edgetrain.core.errors import UsageError
from edgetrain.runtime import TrainingSession

ROOT = Path(__file__).resolve().parents[2]
LENET = ROOT / "edgetrain" / "data" / "digits_lenet.onnx"
BASE = ["federate", "a.etrain", "--data", "d", "--clients", "3", "--rounds", "2"]
F32_TINY, F32_MAX = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
WEEK = 7 * 24 * 3600.0


def f32(v: float) -> bool:
    return math.isfinite(v) and F32_TINY <= abs(v) <= F32_MAX


# What each option takes (the documented ranges, spelled out here as the oracle): the extra arguments it needs
# beside it, and whether a value is valid. --clients is 3, so a round has 3 clients.
INTS = {
    "--clients": ([], lambda v: 1 <= v <= 100_000),
    "--rounds": ([], lambda v: 1 <= v <= 100_000),
    "--local-epochs": ([], lambda v: 1 <= v <= 10_000),
    "--local-steps": ([], lambda v: 1 <= v <= 10_000_000),
    "--clients-per-round": ([], lambda v: 1 <= v <= 3),
    "--byzantine": ([], lambda v: 0 <= v <= 100_000),
    "--min-replies": ([], lambda v: 1 <= v <= 3),
    "--seed": ([], lambda v: 0 <= v <= 2**63 - 1),
    "--sim-samples": (["--simulate"], lambda v: 1 <= v <= 10_000_000),
    "--sim-workers": (["--simulate"], lambda v: 1 <= v <= 1024),
}
FLOATS = {
    "--trim": ([], lambda v: 0 <= v < 0.5),
    "--max-update-norm": ([], lambda v: v > 0 and f32(v)),
    "--round-timeout": ([], lambda v: 0 < v <= WEEK and f32(v)),
    "--lr": ([], lambda v: v > 0 and f32(v)),
    "--dp-noise": (["--dp-clip", "1"], lambda v: v > 0 and f32(v)),
    "--dp-clip": (["--dp-noise", "1"], lambda v: v > 0 and f32(v)),
    "--local-dp": ([], lambda v: v > 0 and f32(v)),
    "--local-dp-clip": ([], lambda v: v > 0 and f32(v)),
    "--local-dp-delta": ([], lambda v: 0 < v < 1 and f32(v)),
    "--secagg-clip": ([], lambda v: v > 0 and f32(v)),
}
SPECIAL = [
    "nan",
    "inf",
    "-inf",
    "1e-320",
    "1e39",
    "-0.0",
    "0",
    "1e-45",
    "604800",
    "604800.5",
    "0.49999",
    "0.5",
]


def carried(run_config: dict) -> None:
    """What Flower gets: every number finite, every integer within TOML's 64 bits."""
    for key, v in run_config.items():
        if isinstance(v, float):
            assert math.isfinite(v), (key, v)
        elif isinstance(v, int) and not isinstance(v, bool):
            assert -(2**63) <= v < 2**63, (key, v)


def option_case(tally: Tally, option: str, text: str, out: Path) -> None:
    extra, valid = {**INTS, **FLOATS}[option]
    value = int(text) if option in INTS else float(text)
    argv = [*BASE, "--out", str(out), *extra, f"{option}={text}"]
    if valid(value):
        with tally.case(f"{option} {text}", accept=True):
            carried(FederateConfig.from_args(build_parser().parse_args(argv)).run_config(str(out)))
    else:
        with tally.case(f"{option} {text}", names=option):
            FederateConfig.from_args(build_parser().parse_args(argv))


@pytest.fixture(scope="module")
def lora(tmp_path_factory) -> Path:
    """The digits LeNet with rank-4 adapters on fc1 and fc2, and its head fc3 trained beside them."""
    path = tmp_path_factory.mktemp("federate-hostile") / "lora.etrain"
    et.convert(
        str(LENET), loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.01), batch_size=8,
        adapters=et.LoRA(rank=4, alpha=8, targets=["fc1*", "fc2*"]), trainable=["fc3.*"],
    ).save(path)  # fmt: skip
    return path


def test_federate_options_generated_and_crafted(tmp_path, lora, report):
    tally = Tally("edgetrain federate's options")
    for option in {**INTS, **FLOATS}:
        for text in SPECIAL if option in FLOATS else ["0", "-1", "1", str(2**63), str(2**70), "100001"]:
            option_case(tally, option, text, tmp_path / "out")

    @settings(max_examples=200, deadline=None, database=None)
    @given(data=st.data())
    def generated(data):
        option = data.draw(st.sampled_from(sorted({**INTS, **FLOATS})))
        if option in INTS:
            text = str(data.draw(st.integers(-(2**70), 2**70) | st.integers(-5, 2000)))
        else:
            text = repr(data.draw(st.floats() | st.floats(0, 1) | st.floats(1e-40, 1e-36)))
        option_case(tally, option, text, tmp_path / "out")

    generated()
    sess = TrainingSession(str(lora))
    shares = {
        "--adapters-only --personal '*' (issue 33)": (
            ["--adapters-only", "--personal", "*"],
            ("--adapters-only", "--personal '*'"),
        ),
        "--adapters-only --personal 'fc*.lora_*'": (
            ["--adapters-only", "--personal", "fc*.lora_*"],
            ("--adapters-only", "--personal"),
        ),
        "--personal '*'": (["--personal", "*"], ("--personal '*'", "nothing is left to share")),
        "--personal 'fc3.*,fc1*,fc2*'": (
            ["--personal", "fc3.*,fc1*", "fc2*"],
            ("--personal", "nothing is left"),
        ),
        "--personal 'conv9.*'": (
            ["--personal", "fc3.*", "conv9.*"],
            ("--personal 'conv9.*'", "selects none"),
        ),
        "--krum --byzantine 1 of 3": (
            ["--aggregate", "krum", "--byzantine", "1"],
            ("--byzantine 1", "at most 0"),
        ),
    }
    for what, (extra, names) in shares.items():
        with tally.case(what, names=names):
            FederateConfig.from_args(build_parser().parse_args([*BASE, "--out", "o", *extra])).shared(sess)
    for extra, shared in [
        (["--adapters-only"], 4),
        (["--adapters-only", "--personal", "fc1.lora_*"], 2),
        ([], 6),
    ]:
        with tally.case(" ".join(extra) or "everything shared", accept=True):
            cfg = FederateConfig.from_args(build_parser().parse_args([*BASE, "--out", "o", *extra]))
            assert len(cfg.shared(sess)) == shared
    report("hostile inputs", tally.line())
    tally.assert_clean()
    assert tally.refused > 100 and tally.accepted > 50, tally.line()


def test_nothing_to_share_is_refused_before_any_process_starts(lora, tmp_path, capsys):
    """Issue 33's reproduction on the command line: exit code 2 within seconds, naming both options; no Flower
    process started, nothing written."""
    t0 = time.perf_counter()
    data = ROOT / "edgetrain" / "data" / "newuser"
    code = main(["federate", str(lora), "--adapters-only", "--personal", "*", "--data", str(data),
                 "--clients", "2", "--rounds", "1", "--out", str(tmp_path / "run")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and time.perf_counter() - t0 < 10
    assert "--adapters-only shares the LoRA adapters alone, and --personal '*' keeps every one of them" in err
    assert "nothing is left to share" in err and not (tmp_path / "run").exists()
    with pytest.raises(UsageError, match="--personal '\\*' keeps every one of the artifact's 6 trainable"):
        args = build_parser().parse_args([*BASE, "--out", "o", "--personal", "*"])
        FederateConfig.from_args(args).shared(TrainingSession(str(lora)))
