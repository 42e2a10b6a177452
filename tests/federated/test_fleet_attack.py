"""Robust aggregation against hostile devices in a real Flower deployment on 127.0.0.1 (issue 22): one client of
five sends the global model minus 4x its honest update each round (tools/fleet_hostile.py: finite float32 values,
the shared names and shapes, its true sample count: the door lets it through), the server aggregates with the
coordinate-wise median, and the global model still learns. The same attack makes FedAvg's step go backwards
(tests/federated/test_door.py shows it on the door alone; tools/fleet_robustness.py measures every rule end to end).
Devices that lie about their arrays (issue 33: the declared shape beside bytes of another) are refused by the door,
and the round goes on with the honest replies."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import edgetrain as et

pytest.importorskip("flwr", reason="the fleet needs the federated extra (flwr)")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from fleet_robustness import run_rule  # noqa: E402


def median_run(folder: Path) -> dict:
    """The federation, in the background (tests/conftest.py): beside the other federated tests'."""
    return run_rule(folder, "median", clients=5, attackers=1, attack="sign-flip:4", rounds=2, local_steps=20)


@pytest.mark.slow
@pytest.mark.background(job=median_run)
def test_the_median_learns_while_a_sign_flipping_client_gets_through_the_door(background):
    s, _ = background
    assert s["aggregate"]["strategy"] == "FedMedian" and not s["skipped"]
    assert not s["refused"]  # the attack is within the door's limits: only the rule can stop it
    assert sorted(c["id"] for c in s["clients"]) == [0, 1, 2, 3, 4]  # the attacker's replies were aggregated
    accuracy = [s["initial_val_accuracy"]] + [r["val_accuracy"] for r in s["rounds"]]
    assert accuracy[-1] > accuracy[0] + 0.1, accuracy
    assert all(r["accepted"] == 5 and r["refused"] == 0 for r in s["rounds"])


def lying_run(folder: Path) -> dict:
    """Two honest clients and two liars (issue 33): one declares each parameter's shape but carries the array
    twice over (once, every round failed and was skipped), one carries a single value, 1000 (once, broadcast into
    the global model)."""
    return run_rule(
        folder,
        "fedavg",
        clients=4,
        attackers=2,
        attack="lie-shape,lie-broadcast:1000",
        rounds=2,
        local_steps=20,
    )


@pytest.mark.slow
@pytest.mark.background(job=lying_run)
def test_devices_lying_about_their_arrays_neither_stall_nor_poison_the_fleet(background):
    s, folder = background
    assert not s["skipped"], s["skipped"]  # no round stalled
    assert all(r["accepted"] == 2 and r["refused"] == 2 for r in s["rounds"]), s["rounds"]
    assert len(s["refused"]) == 4 and {r["round"] for r in s["refused"]} == {1, 2}
    for r in s["refused"]:
        assert "(the global model's) but carries values of shape [" in r["reason"], r
        assert ("shape [1]" in r["reason"]) != ("shape [2, " in r["reason"]), r  # one value, or twice over
    assert sorted(c["id"] for c in s["clients"]) == [0, 1]  # only the honest ones were aggregated
    # not poisoned: the global model is the honest clients' sample-weighted mean of what they sent last
    art, records = folder / "fleet" / "lenet.etrain", []
    for k in (0, 1):
        home = folder / "fleet" / f"client-{k}"
        n = json.loads((home / "sent.jsonl").read_text().splitlines()[-1])["num_examples"]
        with np.load(home / "last_sent.npz") as z:
            records.append((n, {key.replace("|", "/"): z[key] for key in z.files}))
    glob = et.TrainingSession(str(art))
    glob.load_checkpoint(s["global_checkpoint"])
    total = sum(n for n, _ in records)
    for name, value in glob.parameters().items():
        want = sum(n * arrays[name].astype(np.float64) for n, arrays in records) / total
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6, err_msg=name)
    assert s["final_val_accuracy"] > s["initial_val_accuracy"] + 0.1, s["rounds"]
