"""The on-phone loop (android_demo): a normal burst is kept and raises the new user's held-out accuracy; a
destructive one is rolled back bit for bit; a kill mid-burst leaves the previous version working and the next burst
starts from it; the step bound holds; a padded small batch is exactly the step on the real samples; the training
policy reads a real `termux-battery-status` on PATH; the command line's JSON contracts; simulate tells the story;
and all of it runs with numpy alone (numpy 1.24 too)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from device import PYTHONS, run_on_device
from interrupts import Lines

import edgetrain as et
from android_demo.app import Home
from android_demo.policy import may_train
from android_demo.simulate import ARTIFACT, _new_user, heldout_accuracy
from edgetrain.core.container import read_container

ROOT = Path(__file__).resolve().parents[2]
USER, HELD = _new_user()


def home_with(tmp_path, n: int, **settings) -> Home:
    """A home on the embedded artifact holding the user's first n samples."""
    home = Home.init(tmp_path / "home", ARTIFACT, max_seconds=None, **settings)
    for i in range(n):
        home.add(*USER.get_item(i))
    return home


def app(*args, home=None, **kw) -> subprocess.CompletedProcess:
    cmd = (
        [sys.executable, "-m", "android_demo"]
        + (["--home", str(home)] if home else [])
        + [str(a) for a in args]
    )
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, **kw)


def current_parameters(home: Home) -> dict[str, np.ndarray]:
    return home.session().parameters()


def test_a_normal_burst_is_kept_and_helps_the_user(tmp_path):
    home = home_with(tmp_path, 50, max_steps=40)
    before = heldout_accuracy(home, HELD)
    r = home.personalize(force=True)
    assert r.kept and r.steps == 40 and r.model_version == home.version == 1
    assert r.val_accuracy_after >= r.val_accuracy_before
    after = heldout_accuracy(home, HELD)
    assert after > before + 0.1, (before, after)  # 400 digits the app never saw
    # the kept version is a whole checkpoint whose parameters are the session's
    ckpt = read_container(tmp_path / "home" / "versions" / "v000001.etck", kind="checkpoint")
    assert ckpt[0]["user_state"]["version"] == 1


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("lr", [30.0, 1e30], ids=["worse", "overflow"])
def test_a_destructive_burst_is_rolled_back_bit_for_bit(tmp_path, lr):
    home = home_with(tmp_path, 30, max_steps=10)
    assert home.personalize(force=True).kept  # a first version to roll back to
    before = current_parameters(home)
    pointer = (tmp_path / "home" / "current.json").read_bytes()
    r = home.personalize(force=True, lr=lr)
    assert not r.kept and r.model_version == 1 and "rolled back" in r.reason
    assert (tmp_path / "home" / "current.json").read_bytes() == pointer
    for name, value in current_parameters(home).items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    assert sorted(os.listdir(tmp_path / "home" / "versions")) == ["v000001.etck"]


def test_the_step_and_time_bounds_hold(tmp_path):
    home = home_with(tmp_path, 30)
    assert home.personalize(force=True, max_steps=7).steps == 7
    r = home.personalize(force=True, max_steps=10_000, max_seconds=0.2)
    assert 1 <= r.steps < 10_000 and r.seconds < 5


def test_too_few_samples_trains_nothing_and_says_why(tmp_path):
    home = home_with(tmp_path, 1)
    r = home.personalize(force=True)
    assert not r.kept and r.steps == 0 and "not enough samples" in r.reason and home.version == 0


def test_a_small_batch_is_padded_exactly(tmp_path):
    """--batch-size 3 on an artifact of batch 10: the 7 padded rows carry the label the loss ignores, so the step is
    the step of a batch-3 artifact on the same 3 samples (converted independently here, on the build side)."""
    x, y = USER.get_batch(np.arange(3))
    x = x / np.float32(255)  # the user's raw pixels as the model's input pipeline gives them to the model
    art3 = et.convert(
        ROOT / "edgetrain" / "data" / "digits_lenet.onnx",
        loss=et.CrossEntropyLoss(ignore_index=-100),
        optimizer=et.SGD(lr=0.01, momentum=0.9),
        batch_size=3,
    )
    art3.save(tmp_path / "b3.etrain")
    ref = et.TrainingSession(tmp_path / "b3.etrain")
    ref_loss = ref.train_step(x, y)
    sess = et.TrainingSession(ARTIFACT)
    xp = np.concatenate([x, np.repeat(x[:1], 7, axis=0)])
    yp = np.concatenate([y, np.full(7, -100)])
    assert sess.train_step(xp, yp) == pytest.approx(ref_loss, rel=1e-6)
    for name, value in sess.parameters().items():
        np.testing.assert_allclose(value, ref.parameters()[name], rtol=1e-5, atol=1e-7, err_msg=name)
    home = home_with(tmp_path, 12)
    r = home.personalize(force=True, batch_size=3, max_steps=4)
    assert r.steps == 4
    with pytest.raises(et.EdgeTrainError, match="batch size 11: this artifact trains batches of 10"):
        home.personalize(force=True, batch_size=11)


KILLER = """
import sys
from android_demo.app import Home
home = Home(sys.argv[1])
def progress(info):
    print("step", info["step"], flush=True)
home.personalize(force=True, max_steps=100000, max_seconds=None, progress=progress)
"""


def _kill_mid_burst(home_path: Path, after_steps: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLER, str(home_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        Lines(proc.stdout).wait_for(lambda line: line.split()[-1] == str(after_steps), f"step {after_steps}")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)


def test_a_kill_mid_burst_leaves_the_previous_version_and_the_next_burst_starts_from_it(tmp_path):
    home = home_with(tmp_path, 30, max_steps=10)
    assert home.personalize(force=True).kept
    before = current_parameters(home)
    _kill_mid_burst(tmp_path / "home", after_steps=5)
    again = Home(tmp_path / "home")
    assert again.version == 1
    for name, value in current_parameters(again).items():  # the previous version, whole and working
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    r = again.personalize(force=True)
    assert r.steps == 10 and r.model_version in (1, 2)
    assert again.events("burst")[-1]["steps"] == 10  # the killed burst logged nothing; this one did


@pytest.mark.slow
def test_kills_at_random_instants_of_bursts_never_break_the_home(tmp_path):
    """Kills anywhere in a burst, the keep included (checkpoint written, pointer replaced): the home always has a
    current version whose checkpoint loads, and it is the previous one or the next one."""
    home = home_with(tmp_path, 30, max_steps=3)
    rng = np.random.default_rng(0)
    script = (
        "import sys\nfrom android_demo.app import Home\nh = Home(sys.argv[1])\n"
        "while True:\n    h.personalize(force=True)\n"
    )
    for _ in range(12):
        v0 = Home(tmp_path / "home").version
        proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "home")], cwd=ROOT)
        time.sleep(0.8 + rng.uniform(0, 1.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        h = Home(tmp_path / "home")
        assert h.version >= v0
        h.session()  # loads: the current checkpoint is whole
        assert h.personalize(force=True).steps == 3
    assert home.status()["samples"] == 30


FAKE_BATTERY = """#!/bin/sh
cat <<'JSON'
{"health": "GOOD", "percentage": 64, "plugged": "%s", "status": "%s", "temperature": 30.1}
JSON
"""


@pytest.mark.parametrize(
    "plugged,status,allowed", [("UNPLUGGED", "DISCHARGING", False), ("PLUGGED_AC", "CHARGING", True)]
)
def test_the_charging_policy_reads_termux_battery_status(tmp_path, monkeypatch, plugged, status, allowed):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "termux-battery-status"
    tool.write_text(FAKE_BATTERY % (plugged, status))
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    ok, why = may_train("charging")
    assert ok is allowed and (("not charging" in why) != allowed)
    assert may_train("always") == (True, "always allowed")
    home = home_with(tmp_path, 30, policy="charging")
    r = home.personalize()
    assert (r.steps > 0) == allowed and (allowed or "charger" in r.reason)


def test_the_command_line_end_to_end(tmp_path):
    home = tmp_path / "phone"
    user = ROOT / "edgetrain" / "data" / "newuser"
    assert app("init", "--artifact", ARTIFACT, home=home).returncode == 0
    proc = app("add", "--data", user, home=home)
    assert proc.returncode == 0 and "added 50 samples" in proc.stdout, proc.stderr
    proc = app("personalize", "--json", "--max-steps", 12, "--max-seconds", 60, "--threads", 2, home=home)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    for key in ("kept", "steps", "val_accuracy_before", "val_accuracy_after", "model_version", "seconds"):
        assert key in r
    assert r["steps"] == 12 and isinstance(r["kept"], bool) and r["model_version"] == int(r["kept"])
    proc = app("evaluate", "--data", user, "--json", home=home)  # the MNIST folder's t10k split: held out
    e = json.loads(proc.stdout)
    assert e["samples"] == 400 and 0 <= e["accuracy"] <= 1 and e["loss"] > 0
    st = json.loads(app("status", "--json", home=home).stdout)
    assert st["samples"] == 50 and st["model_version"] == r["model_version"]
    assert st["train_samples"] + st["val_samples"] == 50 and st["bursts"] == 1
    text = app("status", home=home).stdout
    assert "50 (" in text and "version" in text
    bad = app("personalize", "--max-steps", 0, home=home)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "max_steps" in bad.stderr
    assert app("personalize", home=tmp_path / "nothing").returncode == 1
    assert app("status").returncode == 2  # no --home


def test_simulate_tells_the_story(tmp_path):
    proc = app("simulate")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "samples" in lines[3] and "user accuracy" in lines[3]
    assert "the user's accuracy went from 38.2% to" in proc.stdout
    result = json.loads(app("simulate", "--json").stdout)
    assert result["accuracy"][-1] > result["base_accuracy"] + 0.2
    assert len(result["bursts"]) == 5 and any(b["kept"] for b in result["bursts"])
    quick = [json.loads(app("simulate", "--quick", "--json").stdout) for _ in range(2)]
    assert quick[0]["losses"] == quick[1]["losses"] and len(quick[0]["losses"]) == 10  # deterministic


def test_the_embedded_artifact_is_up_to_date():
    proc = subprocess.run(
        [sys.executable, "tools/build_android_assets.py", "--check"], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


DEVICE = """
import json, sys, tempfile
import numpy as np
import android_demo.app, android_demo.policy, android_demo.simulate, android_demo.server  # the whole device side
import android_demo.__main__, android_demo.text  # the text mode's keyboard too
import edgetrain.runtime, edgetrain.runtime.trainer, edgetrain.runtime.feeding, loaders
from android_demo.simulate import simulate
r = simulate(quick=True, out=None)
assert r["losses"] and r["accuracy"][-1] >= r["base_accuracy"]
print("android_demo numpy-only OK", np.__version__, json.dumps(r["losses"][:3]))
"""


@pytest.mark.parametrize("python", PYTHONS)
def test_the_app_runs_with_numpy_alone(python):
    proc = run_on_device(python, DEVICE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "android_demo numpy-only OK" in proc.stdout
