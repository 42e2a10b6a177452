"""Many phones on one machine, on Flower's own simulation engine (its Ray backend): `edgetrain federate --simulate`
runs the deployment's own ServerApp and ClientApp, each simulated device training numpy steps on its own non-IID
draw of the shipped digits in its own home; a fresh model beats its start, every round has the replies it asked
for, the run reports its speed and peak memory, and no Flower or Ray process outlives it (also after Ctrl-C). The
draw of a device's samples is checked without Flower: deterministic, the size asked, skewed by label."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from interrupts import Lines, finish, python_m
from models import lenet

import edgetrain as et
from edgetrain.core.errors import ConfigError
from edgetrain.federated.simulation import shard

try:
    import tomllib
except ImportError:  # Python 3.10: tomli, a dependency of Flower
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "edgetrain" / "data" / "digits"
LABELS = np.repeat(np.arange(10), 105)  # the shipped digits' 1,050, roughly: ~105 of each class


def top_share(idx: np.ndarray, labels: np.ndarray = LABELS, top: int = 1) -> float:
    """The share of a device's samples in its `top` most frequent classes."""
    return np.sort(np.bincount(labels[idx], minlength=10))[::-1][:top].sum() / len(idx)


def test_a_devices_draw_is_deterministic_sized_and_its_own():
    a = shard(LABELS, 7, samples=40, seed=3)
    assert np.array_equal(a, shard(LABELS, 7, samples=40, seed=3))  # the same device, every round, every run
    assert len(a) == 40 and np.all(np.diff(a) >= 0) and 0 <= a.min() and a.max() < len(LABELS)
    assert len(np.unique(a)) == 40  # without replacement while the classes have enough samples
    assert not np.array_equal(a, shard(LABELS, 8, samples=40, seed=3))  # another device
    assert not np.array_equal(a, shard(LABELS, 7, samples=40, seed=4))  # another run's seed
    assert len(shard(LABELS, 0, samples=1, seed=0)) == 1 and len(shard(LABELS, 0, samples=1050)) == 1050
    iid = shard(LABELS, 7, samples=40, scheme="iid", seed=3)
    assert len(iid) == len(np.unique(iid)) == 40


def test_label_skew_gives_each_device_its_own_class_mix():
    """Over 1,000 devices: label-skew's devices hold mostly a few classes (a Dirichlet(0.5) mix), iid's look like
    the dataset; the devices' main classes spread over all ten, and every sample is on some device."""
    skew = [shard(LABELS, k, samples=40) for k in range(1000)]
    iid = [shard(LABELS, k, samples=40, scheme="iid") for k in range(1000)]
    assert np.mean([top_share(i) for i in skew]) > 0.35  # measured: 0.40 (top three classes: 0.77)
    assert np.mean([top_share(i, top=3) for i in skew]) > 0.7
    assert np.mean([top_share(i) for i in iid]) < 0.25
    assert (
        np.mean([(np.bincount(LABELS[i], minlength=10) > 0).sum() for i in skew]) < 7
    )  # classes a device has
    mains = {int(np.bincount(LABELS[i], minlength=10).argmax()) for i in skew}
    assert mains == set(range(10))
    assert len(np.unique(np.concatenate(skew))) == len(LABELS)


def test_a_draw_that_cannot_be_made_is_refused():
    with pytest.raises(ConfigError, match="cannot draw 2000 samples"):
        shard(LABELS, 0, samples=2000)
    with pytest.raises(ConfigError, match="unknown simulated partition"):
        shard(LABELS, 0, samples=4, scheme="dirichlet")
    with pytest.raises(ConfigError, match="not classes: use iid"):
        shard(np.linspace(0, 1, 50, dtype=np.float32), 0, samples=4)
    assert len(shard(np.linspace(0, 1, 50, dtype=np.float32), 0, samples=4, scheme="iid")) == 4
    small = np.array([0] * 3 + [1] * 100)  # a class with fewer samples than a device may ask of it
    for k in range(50):
        assert len(shard(small, k, samples=40)) == 40


def test_a_simulated_node_takes_its_settings_from_the_run():
    """A node of the simulation engine has only partition-id and num-partitions: the run config gives its
    artifact, its shard of sim-data and its home; a real device's node config is its own."""
    pytest.importorskip("flwr")
    from edgetrain.federated.client import RoundRefused, device_config

    run = {"artifact": "/a/m.etrain", "sim-data": "/d", "sim-home": "/h", "sim-samples": 24, "seed": 5}
    node = device_config({"partition-id": 17, "num-partitions": 1000}, run)
    assert node["artifact"] == "/a/m.etrain" and node["data"] == "/d" and node["home"] == "/h/client-17"
    assert node["shard"] == {"scheme": "label-skew", "samples": 24, "seed": 5}
    real = {"partition-id": 2, "artifact": "x.etrain", "data": "s.sqlite", "home": "fl"}
    assert device_config(real, run) == real
    with pytest.raises(RoundRefused, match="no home"):
        device_config({"partition-id": 2, "artifact": "x.etrain", "data": "s.sqlite"}, run)
    with pytest.raises(RoundRefused, match="no simulation"):
        device_config({"partition-id": 2, "num-partitions": 3}, {"artifact": "/a/m.etrain"})


def test_the_simulation_runs_the_deployments_app():
    """One Flower app for both engines: the simulation runs the deployment's app folder, whose components are
    edgetrain.federated.server:app and client:app."""
    pytest.importorskip("flwr")
    from edgetrain.federated import client, deploy, server, simulation

    app = tomllib.loads((Path(deploy.APP_DIR) / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert app["components"] == {
        "serverapp": "edgetrain.federated.server:app",
        "clientapp": "edgetrain.federated.client:app",
    }
    assert isinstance(server.app, __import__("flwr.serverapp").serverapp.ServerApp)
    assert isinstance(client.app, __import__("flwr.clientapp").clientapp.ClientApp)
    assert issubclass(simulation.Simulation, deploy.Deployment)


# ---- real runs on Flower's simulation engine ----


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A LeNet with fresh (random) weights, batch 16: a device's 32 training samples make two steps an epoch."""
    d = tmp_path_factory.mktemp("simulation")
    onnx.save(lenet(), d / "lenet.onnx")
    art = et.convert(
        d / "lenet.onnx", loss=et.CrossEntropyLoss(), optimizer=et.SGD(lr=0.05, momentum=0.9), batch_size=16
    )
    art.save(d / "lenet.etrain")
    return d / "lenet.etrain"


def needs_ray() -> None:
    pytest.importorskip("flwr")
    pytest.importorskip("ray", reason="the simulation engine: pip install 'edgetrain[simulation]'")


def ray_processes() -> dict[int, str]:
    """Live processes of Flower's simulation or Ray (its services, agents and workers), by pid."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(
            m in cmd for m in ("ray::", "raylet", "gcs_server", "/ray/", "flwr-simulation")
        ):
            found[int(pid)] = cmd[:120]
    return found


def new_leftovers(before: dict[int, str], wait: float = 15.0) -> dict[int, str]:
    """Ray or simulation processes that were not there before and are still there after `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        left = {p: c for p, c in ray_processes().items() if p not in before}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


@pytest.mark.slow
def test_two_hundred_phones_on_one_machine(fresh, tmp_path):
    """200 simulated devices, 20 a round, 4 rounds: the global model beats its start, each round has its 20
    replies, every device that took part has its home (its checkpoint and its record of what it sent), the run
    reports rounds and clients a minute and its peak memory, and no Ray process is left."""
    needs_ray()
    before, temps = ray_processes(), set(Path("/tmp").glob("etsim-*"))
    out = tmp_path / "sim"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "edgetrain.cli", *map(str, ("federate", fresh, "--simulate", "--data", DIGITS,
         "--clients", 200, "--clients-per-round", 20, "--rounds", 4, "--local-epochs", 3,
         "--val-data", DIGITS, "--sim-workers", 2, "--out", out))],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "200 simulated clients (label-skew; 40 samples each" in proc.stderr
    s = json.loads((out / "summary.json").read_text())
    # 4 rounds, not 3: Flower samples each round's 20 of the 200 label-skewed devices at random, and after 3 rounds
    # the fresh LeNet was as low as 0.09 (from 0.08) in about one run of six; after 4, 0.28 or more in six of six
    assert s["final_val_accuracy"] > s["initial_val_accuracy"] + 0.05, s["rounds"]
    sim = s["simulation"]
    assert sim["replies_per_round"] == [20, 20, 20, 20] and not s["refused"]
    assert sim["clients"] == 200 and sim["clients_per_round"] == 20 and sim["workers"] == 2
    assert sim["rounds_per_minute"] > 0 and sim["clients_per_minute"] > 0
    assert 100 * 2**20 < sim["peak_pss_bytes"] <= sim["peak_rss_bytes"] < 8 * 2**30
    took_part = {c["id"] for c in s["clients"]}
    assert 20 <= len(took_part) <= 80 and took_part <= set(range(200))  # 4 rounds of 20
    homes = {int(p.name.split("-")[1]) for p in (out / "clients").iterdir()}
    assert homes == took_part  # a device that was never sampled never ran
    for c in s["clients"]:
        home = out / "clients" / f"client-{c['id']}"
        assert (home / "client.etck").stat().st_size > 0
        sent = [json.loads(line) for line in (home / "sent.jsonl").read_text().splitlines()]
        assert [r["round"] for r in sent] == [r["round"] for r in c["rounds"]]
        assert all(r["num_examples"] == 32 for r in sent)  # 40 drawn, a fifth held out
    installed = list((out / "flower" / "flower-home" / "apps").glob("*/pyproject.toml"))
    from edgetrain.federated.deploy import APP_DIR

    ours = tomllib.loads((Path(APP_DIR) / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert [tomllib.loads(p.read_text())["tool"]["flwr"]["app"] for p in installed] == [ours]
    text = proc.stdout
    assert "rounds a minute" in text and "clients a minute" in text and "RSS summed over" in text
    assert "... and " in text and (out / "accuracy.png").exists()
    assert not new_leftovers(before), "Ray processes outlived the run"
    assert set(Path("/tmp").glob("etsim-*")) <= temps  # Ray's temp folder went with it
    print(f"200 clients x 4 rounds took {took:.0f} s: {sim}")


@pytest.mark.slow
def test_ctrl_c_stops_the_simulation_and_ray(fresh, tmp_path):
    """Ctrl-C in the middle of a simulated run: exit 130, and neither Flower's processes nor Ray's are left."""
    needs_ray()
    before, temps = ray_processes(), set(Path("/tmp").glob("etsim-*"))
    out = tmp_path / "interrupted"
    proc = subprocess.Popen(
        python_m("edgetrain.cli", "federate", fresh, "--simulate", "--data", DIGITS, "--clients", 100,
                 "--clients-per-round", 10, "--rounds", 50, "--sim-workers", 2, "--out", out),
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    stdout, stderr = Lines(proc.stdout), Lines(proc.stderr)
    try:
        stderr.wait_for(lambda line: line.startswith("round 1/50"), "round 1 ended", timeout=300)
        assert {p for p in ray_processes() if p not in before}, "no Ray process ran"
        proc.send_signal(signal.SIGINT)
        finish(proc, 120, stdout, stderr)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted" in stderr.text(10)
    assert not new_leftovers(before), "Ray processes outlived the interrupted run"
    assert set(Path("/tmp").glob("etsim-*")) <= temps


def test_simulation_options_are_checked_before_anything_starts(fresh, tmp_path):
    """Mistakes in the options are refused at once, with what to do (exit 2), before Flower or Ray start."""
    pytest.importorskip("flwr")

    def federate(*args):
        return subprocess.run(
            [sys.executable, "-m", "edgetrain.cli", *map(str, ("federate", fresh, "--data", DIGITS, "--rounds", 1,
             "--out", tmp_path / "o", *args))],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
        )  # fmt: skip

    p = federate("--simulate", "--clients", 10, "--clients-per-round", 20)
    assert p.returncode == 2 and "--clients-per-round 20 is more than --clients 10" in p.stderr
    p = federate("--simulate", "--clients", 10, "--sim-samples", 0)
    assert p.returncode == 2 and "--sim-samples must be a positive integer" in p.stderr
    p = federate("--simulate", "--clients", 10, "--sim-samples", 5000)
    assert p.returncode == 2 and "is more than the 1050 samples" in p.stderr
    p = federate("--simulate", "--clients", 10, "--sim-samples", 3)
    assert p.returncode == 2 and "less than the artifact's batch" in p.stderr
    p = federate("--clients", 10, "--sim-samples", 30)
    assert p.returncode == 2 and "add --simulate" in p.stderr
    assert not (tmp_path / "o" / "flower").exists()
