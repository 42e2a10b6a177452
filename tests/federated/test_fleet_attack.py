"""Robust aggregation against hostile devices in a real Flower deployment on 127.0.0.1 (issue 22): one client of
five sends the global model minus 4x its honest update each round (tools/fleet_hostile.py: finite float32 values,
the shared names and shapes, its true sample count: the door lets it through), the server aggregates with the
coordinate-wise median, and the global model still learns. The same attack makes FedAvg's step go backwards
(tests/federated/test_door.py shows it on the door alone; tools/fleet_robustness.py measures every rule end to end)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

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
