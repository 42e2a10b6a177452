"""Federated training and personalization on a real Flower deployment on 127.0.0.1 (Flower's own superlink and
supernode processes, started by edgetrain and stopped after; no mocks): a fresh model on label-skewed data beats its
start, the global model is the sample-weighted mean of what the clients sent (their own records), personal layers
never reach the server and stay on each device across rounds, central DP runs and is reported, a mismatched client
is refused without failing the round, and no process outlives a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from interrupts import Lines, finish, python_m
from models import lenet

import edgetrain as et
from edgetrain.federated.common import partition
from loaders import ArrayDataView, open_data

flwr = pytest.importorskip(
    "flwr", reason="Flower is the extra 'federated': pip install 'edgetrain[federated]'"
)

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "edgetrain" / "data" / "digits"


def fresh_artifact(folder: Path) -> Path:
    """A LeNet with fresh (random, seeded) weights, as an artifact in `folder`: federated training has everything
    to learn. Each test's federation runs in the background (tests/conftest.py) and makes its own."""
    onnx.save(lenet(), folder / "lenet.onnx")
    art = et.convert(
        folder / "lenet.onnx",
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=0.05, momentum=0.9),
        batch_size=16,
    )
    art.save(folder / "lenet.etrain")
    return folder / "lenet.etrain"


def federate(*args) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "edgetrain.cli", "federate", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def live_flower_processes(folder: Path) -> list[str]:
    """Processes (not zombies) whose Flower home lies in `folder`: those this run started."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"FLWR_HOME={folder}".encode() in env and state != "Z":
            found.append(f"{pid} {cmd[:100]}")
    return found


def client_records(out: Path) -> list[tuple[int, dict[str, np.ndarray], list[dict]]]:
    """Each client's own record of what it sent: (samples, the last arrays, every round's names)."""
    records = []
    for home in sorted((out / "clients").iterdir()):
        log = [json.loads(line) for line in (home / "sent.jsonl").read_text().splitlines()]
        with np.load(home / "last_sent.npz") as z:
            arrays = {k.replace("|", "/"): z[k] for k in z.files}
        records.append((log[-1]["num_examples"], arrays, log))
    return records


def devices(tmp_path: Path, n: int, *, artifact, store=lambda k: False) -> list[dict]:
    """n devices' node configs, each with an iid share of the digits in its own folder: as an .npz file, or in
    the phone app's SampleStore where store(k) says so."""
    from loaders import SampleStore

    view = open_data(DIGITS)
    nodes = []
    for k, idx in enumerate(partition(view, n, "iid")):
        home = tmp_path / f"client-{k}"
        home.mkdir()
        x, y = view.get_batch(idx)
        if store(k):
            data = home / "samples.sqlite"
            with SampleStore(data) as s:
                s.add_many(list(x), list(y))
        else:
            data = home / "data.npz"
            np.savez(data, x=x, y=y)
        nodes.append({"partition-id": k, "artifact": str(artifact(k)), "data": str(data), "home": str(home)})
    return nodes


def fresh_model_run(folder: Path) -> subprocess.CompletedProcess:
    return federate(
        fresh_artifact(folder), "--data", DIGITS, "--clients", 2, "--rounds", 3, "--partition", "label-skew",
        "--val-data", DIGITS, "--out", folder / "run",
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.background(job=fresh_model_run)
def test_a_fresh_model_learns_from_label_skewed_clients(background):
    proc, folder = background
    fresh, out = folder / "lenet.etrain", folder / "run"
    s = json.loads((out / "summary.json").read_text())
    assert set(s) >= {"initial_val_accuracy", "final_val_accuracy", "rounds", "clients"}
    assert [r["round"] for r in s["rounds"]] == [1, 2, 3] and all(r["seconds"] > 0 for r in s["rounds"])
    assert s["final_val_accuracy"] > s["initial_val_accuracy"] + 0.3, s
    assert "round 3/3: global validation accuracy" in proc.stderr and "->" in proc.stdout
    # the aggregate is the sample-weighted mean of what each client says it sent in the last round
    records = client_records(out)
    total = sum(n for n, _, _ in records)
    glob = et.TrainingSession(fresh)
    glob.load_checkpoint(out / "global.etck")
    for name, value in glob.parameters().items():
        want = sum(n * arrays[name].astype(np.float64) for n, arrays, _ in records) / total
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6, err_msg=name)
    for c, (n, _, log) in zip(s["clients"], records):
        assert c["num_examples"] == n and len(c["sent"]) == 3 and c["sent"][0] == log[0]["names"]
        assert c["local_val_accuracy_after"] > c["local_val_accuracy_before"]
    # the exported global model runs in onnxruntime as the global checkpoint does
    x, _ = open_data(DIGITS, split="test").get_batch(np.arange(16))
    got = ort.InferenceSession(str(out / "global.onnx")).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, glob.run(x), rtol=1e-4, atol=1e-5)
    assert (out / "accuracy.png").stat().st_size > 1000
    assert not live_flower_processes(out / "flower")


def personal_layers_run(folder: Path) -> subprocess.CompletedProcess:
    return federate(
        fresh_artifact(folder), "--data", DIGITS, "--clients", 2, "--rounds", 3, "--partition", "label-skew",
        "--personal", "fc3.*", "--local-epochs", 2, "--out", folder / "run",
        "--aggregate", "median", "--max-update-norm", 1000,  # a robust rule composes with personal layers
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.background(job=personal_layers_run)
def test_personal_layers_stay_on_the_devices(background):
    proc, folder = background
    fresh, out = folder / "lenet.etrain", folder / "run"
    s = json.loads((out / "summary.json").read_text())
    assert s["personal"] == ["fc3.weight", "fc3.bias"]
    assert s["aggregate"]["strategy"] == "FedMedian" and s["aggregate"]["max_update_norm"] == 1000
    assert "aggregate   median (FedMedian); updates of L2 norm above 1000 refused" in proc.stdout
    for c in s["clients"]:  # what the server received, round by round
        assert all(not any(n.startswith("fc3.") for n in names) for names in c["sent"])
    for _, arrays, log in client_records(out):  # what each device says it sent
        assert (
            all(not any(n.startswith("fc3.") for n in r["names"]) for r in log) and "fc3.weight" not in arrays
        )
    initial = et.TrainingSession(fresh).parameters()
    glob = et.TrainingSession(fresh)
    glob.load_checkpoint(out / "global.etck")
    np.testing.assert_array_equal(
        glob.parameters()["fc3.weight"], initial["fc3.weight"]
    )  # never seen by the server
    heads = []
    for k, c in enumerate(s["clients"]):
        own = et.TrainingSession(fresh)
        state = own.load_checkpoint(out / "clients" / f"client-{k}" / "client.etck")
        assert state["round"] == 3
        heads.append(own.parameters()["fc3.weight"])
        # the head trained in a round is the head the next round starts from: each round starts better
        before = [r["val-accuracy-before"] for r in c["rounds"]]
        assert before[-1] > before[0] + 0.2, before
        assert c["local_val_accuracy_after"] > c["local_val_accuracy_before"] + 0.3
    assert not np.array_equal(heads[0], heads[1])  # each device has its own
    assert not live_flower_processes(out / "flower")


def dp_run(folder: Path) -> None:
    """Three devices under central DP; client 0's data is the phone app's SampleStore, client 2 holds another
    training program."""
    from edgetrain.federated.deploy import APP_DIR, Deployment

    fresh = fresh_artifact(folder)
    other = folder / "other.etrain"
    et.convert(
        folder / "lenet.onnx", loss=et.CrossEntropyLoss(), optimizer=et.Adam(lr=1e-3), batch_size=8
    ).save(other)
    nodes = devices(folder, 3, artifact=lambda k: other if k == 2 else fresh, store=lambda k: k == 0)
    config = {
        "artifact": str(fresh), "rounds": 2, "local-epochs": 0, "local-steps": 20, "dp-noise": 0.005,
        "dp-clip": 5.0, "val-data": str(DIGITS), "out": str(folder / "out"), "min-clients": 3,
    }  # fmt: skip
    with Deployment(str(folder / "flower"), nodes) as d:
        d.run(APP_DIR, config)


@pytest.mark.slow
@pytest.mark.background(job=dp_run)
def test_dp_runs_and_a_mismatched_client_is_refused_without_failing_the_round(background):
    """Three devices, one of which holds another model: it refuses every round (another training program), the
    server leaves it out and averages the other two, under central DP. One of those two keeps its data in the
    phone app's SampleStore: it trains like a file."""
    _, folder = background
    s = json.loads((folder / "out" / "summary.json").read_text())
    assert s["privacy"]["noise_multiplier"] == 0.005 and s["privacy"]["clipping_norm"] == 5.0
    assert len(s["refused"]) == 2 and all(
        "not the model the server trains" in r["reason"] for r in s["refused"]
    )
    assert sorted(c["id"] for c in s["clients"]) == [0, 1] and len(s["rounds"]) == 2  # the store's client too
    assert (folder / "client-0" / "samples.sqlite").exists()
    assert s["final_val_accuracy"] > s["initial_val_accuracy"]
    assert not (folder / "client-2" / "sent.jsonl").exists()  # the refusing device sent nothing
    assert not live_flower_processes(folder / "flower")


def test_label_skew_puts_most_of_each_class_on_one_client():
    y = np.repeat(np.arange(10), 30)
    view = ArrayDataView(np.zeros((300, 2), np.float32), y)
    parts = partition(view, 3, "label-skew", seed=1)
    assert sorted(np.concatenate(parts).tolist()) == list(range(300))  # a partition: every sample once
    for c in range(10):
        counts = [int(np.sum(y[p] == c)) for p in parts]
        assert counts[c % 3] == 24 and sum(counts) == 30  # 80% with its home client
    iid = partition(view, 3, "iid", seed=1)
    assert [len(p) for p in iid] == [100, 100, 100]


def interrupted_and_failing_runs(folder: Path) -> dict:
    """Ctrl-C after the first round of a federation; a run whose server cannot read its validation data."""
    import signal
    import time

    from edgetrain.federated.deploy import APP_DIR, Deployment, FederationError

    fresh = fresh_artifact(folder)
    proc = subprocess.Popen(
        python_m("edgetrain.cli", "federate", fresh, "--data", DIGITS, "--clients", 2, "--rounds", 50,
                 "--out", folder / "interrupted"),
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    stdout, stderr = Lines(proc.stdout), Lines(proc.stderr)
    try:
        stderr.wait_for(lambda line: line.startswith("round 1/50"), "round 1 ended", timeout=300)
        proc.send_signal(signal.SIGINT)
        finish(proc, 120, stdout, stderr)
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(1)
    interrupted = {
        "returncode": proc.returncode,
        "stderr": stderr.text(10),
        "left": live_flower_processes(folder / "interrupted" / "flower"),  # a second after it ended
    }
    config = {
        "artifact": str(fresh), "rounds": 1, "local-steps": 5, "local-epochs": 0,
        "val-data": str(folder / "no-such-data"), "out": str(folder / "bad"),
    }  # fmt: skip
    try:
        with Deployment(str(folder / "flower-bad"), devices(folder, 2, artifact=lambda k: fresh)) as d:
            d.run(APP_DIR, config, timeout=300)
    except FederationError as e:
        failed = e
    else:
        failed = None
    return {
        "interrupted": interrupted,
        "failed": failed,
        "left": live_flower_processes(folder / "flower-bad"),
    }


@pytest.mark.slow
@pytest.mark.background(job=interrupted_and_failing_runs)
def test_ctrl_c_and_a_failing_run_stop_every_process(background):
    """Ctrl-C after the first round, and a run whose server cannot read its validation data: both end with one
    clear line and leave no Flower process behind. (That a phone's SampleStore trains like a file, the DP test's
    federation shows.)"""
    runs, _ = background
    interrupted = runs["interrupted"]
    assert interrupted["returncode"] == 130 and "interrupted" in interrupted["stderr"]
    assert not interrupted["left"]
    assert runs["failed"] is not None and "the federated run failed" in str(runs["failed"])
    assert not runs["left"]
