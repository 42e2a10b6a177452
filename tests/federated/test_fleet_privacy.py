"""Secure aggregation (Flower's SecAgg+) and local differential privacy (Flower's LocalDpMod) for the fleet (issue
22). End to end, in a real Flower deployment on 127.0.0.1: the global model equals the FedAvg of what the devices
that stayed sent (each device records its last reply) within SecAgg+'s quantization, a device that drops out after
the key exchange leaves a round of the others, and the server keeps no client's update. In process, on Flower's own
mods: local DP clips the update to its norm and adds Gaussian noise of the stddev its (epsilon, delta) give, and a
round in Flower's older format reaches the ClientApp's train function by name and returns as a FitRes."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="the fleet needs the federated extra (flwr)")

from flwr.app import Context, Message, Metadata, MetricRecord, RecordDict  # noqa: E402
from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays  # noqa: E402
from flwr.compat.common import recorddict_compat as compat  # noqa: E402

from edgetrain.core.container import read_container  # noqa: E402
from edgetrain.federated.common import METRIC_KEYS, from_records, to_records  # noqa: E402
from edgetrain.federated.privacy import NAMES_KEY, legacy_mod, local_dp_mod, local_dp_stddev  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))


def sent(home: Path) -> dict[str, np.ndarray]:
    with np.load(home / "last_sent.npz") as z:
        return {k.replace("|", "/"): z[k] for k in z.files}


def secagg_run(folder: Path) -> dict:
    """The federation, in the background (tests/conftest.py): beside the other federated tests'."""
    from fleet_robustness import run_rule

    return run_rule(folder, "fedavg", 4, 1, "drop-out", 1, 20, tag="-secagg", **{"secure-aggregation": True})


@pytest.mark.slow
@pytest.mark.background(job=secagg_run)
def test_secure_aggregation_equals_fedavg_of_the_devices_that_stayed_and_the_server_keeps_no_update(
    background,
):
    s, folder = background
    q = s["secure_aggregation"]
    assert q["protocol"].startswith("SecAgg+") and not s["skipped"], s["skipped"]
    assert len(s["refused"]) == 1 and "dropped out of the round" in s["refused"][0]["reason"], s["refused"]
    assert s["rounds"][0]["accepted"] == 3 and s["rounds"][0]["refused"] == 1
    stayed = sorted(s["clients"], key=lambda c: c["id"])
    assert [c["id"] for c in stayed] == [0, 1, 2]

    sets = [sent(folder / "fleet" / f"client-{c['id']}") for c in stayed]
    counts = [c["num_examples"] for c in stayed]
    want = {k: sum(p[k].astype(np.float64) * n for p, n in zip(sets, counts)) / sum(counts) for k in sets[0]}
    out = folder / "out-fedavg-1-secagg"
    got = read_container(out / "global.etck", kind="checkpoint")[1]
    # a parameter's quantization step: the clipping range over the levels, over the client's weight samples / max
    step = 2 * q["clipping_range"] / q["quantization_range"] * q["max_weight"] / min(counts)
    for k in want:
        assert got[k].dtype == np.float32
        np.testing.assert_allclose(got[k], want[k], atol=4 * step, rtol=0, err_msg=k)
    # the server's record: the global model, the clients' metrics, never a client's parameters
    assert sorted(p.name for p in out.iterdir()) == [
        "global.etck",
        "global.onnx",
        "progress.jsonl",
        "summary.json",
    ]
    assert all(set(c["rounds"][0]) == set(METRIC_KEYS) | {"round"} for c in s["clients"])


# ---- Flower's mods, in process -------------------------------------------------------------------------------------
def legacy_message(arrays: list[np.ndarray], config: dict) -> Message:
    content = compat.fitins_to_recorddict(FitIns(ndarrays_to_parameters(arrays), config), keep_input=True)
    meta = Metadata(
        run_id=1, message_id="m", src_node_id=0, dst_node_id=7, reply_to_message_id="", group_id="1",
        created_at=time.time(), ttl=60.0, message_type="train",
    )  # fmt: skip
    return Message(content, metadata=meta)


def context(**run) -> Context:
    return Context(run_id=1, node_id=7, node_config={"partition-id": 0}, state=RecordDict(), run_config=run)


def metrics(n: int = 50) -> MetricRecord:
    return MetricRecord({k: 0.5 for k in METRIC_KEYS} | {"num-examples": n, "client": 0})


def test_a_round_in_flowers_older_format_reaches_train_by_name_and_returns_a_fitres():
    names = ["conv.weight", "fc.bias"]
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, np.float32)]
    msg = legacy_message(arrays, {NAMES_KEY: json.dumps(names), "lr": 0.1, "server-round": 2})
    seen = {}

    def train(m: Message, ctxt) -> Message:  # the ClientApp's function, as it sees a round
        seen.update(arrays=from_records(m.content["arrays"]), config=dict(m.content["config"]))
        out = {k: v + 1 for k, v in seen["arrays"].items()}
        return Message(RecordDict({"arrays": to_records(out), "metrics": metrics(50)}), reply_to=m)

    reply = legacy_mod(msg, context(), train)
    assert sorted(seen["arrays"]) == sorted(names) and seen["config"] == {"lr": 0.1, "server-round": 2}
    np.testing.assert_array_equal(seen["arrays"]["conv.weight"], arrays[0])
    fitres = compat.recorddict_to_fitres(reply.content, keep_input=True)
    assert fitres.num_examples == 50 and fitres.metrics["client"] == 0
    for got, a in zip(parameters_to_ndarrays(fitres.parameters), arrays):
        np.testing.assert_array_equal(got, a + 1)


def test_local_dp_clips_the_update_to_its_norm_and_adds_the_noise_its_epsilon_and_delta_give():
    rng = np.random.default_rng(0)
    start = [rng.standard_normal((100, 100)).astype(np.float32), rng.standard_normal(50).astype(np.float32)]
    update = [np.full((100, 100), 0.1, np.float32), np.full(50, 0.1, np.float32)]  # norm 10.02
    names = ["w", "b"]
    msg = legacy_message(start, {NAMES_KEY: json.dumps(names)})
    run = {"local-dp-epsilon": 2.0, "local-dp-delta": 1e-5, "local-dp-clip": 0.5}

    def trained(
        m: Message, ctxt
    ) -> Message:  # what the device trained, in the older format as legacy_mod gives
        from flwr.common import Code, FitRes, Status

        res = FitRes(
            Status(Code.OK, ""), ndarrays_to_parameters([s + u for s, u in zip(start, update)]), 50, {}
        )
        return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=m)

    reply = local_dp_mod(msg, context(**run), trained)
    got = parameters_to_ndarrays(compat.recorddict_to_fitres(reply.content, keep_input=True).parameters)
    norm = math.sqrt(sum(float((u.astype(np.float64) ** 2).sum()) for u in update))
    clipped = [s + u * (0.5 / norm) for s, u in zip(start, update)]  # FlatClip to 0.5, computed here
    noise = np.concatenate([(g - c).ravel() for g, c in zip(got, clipped)])
    want = 0.5 * math.sqrt(2 * math.log(1.25 / 1e-5)) / 2.0  # the Gaussian mechanism's stddev
    assert local_dp_stddev(run) == pytest.approx(want)
    assert abs(noise.std() / want - 1) < 0.03 and abs(noise.mean()) < 4 * want / math.sqrt(noise.size)

    off = local_dp_mod(msg, context(**{**run, "local-dp-epsilon": 0.0}), trained)  # epsilon 0: no local DP
    np.testing.assert_array_equal(
        parameters_to_ndarrays(compat.recorddict_to_fitres(off.content, keep_input=True).parameters)[1],
        start[1] + update[1],
    )


@pytest.mark.parametrize(
    "flags,says",
    [
        (["--aggregate", "krum", "--secure-aggregation"], "--aggregate krum needs each client's update"),
        (["--aggregate", "median", "--local-dp", "5"], "--aggregate median needs each client's update"),
        (
            ["--secure-aggregation", "--dp-noise", "1", "--dp-clip", "1"],
            "does not combine with --secure-aggregation",
        ),
        (["--local-dp", "0"], "--local-dp is epsilon: it must be positive, got 0"),
        (["--trim", "0.5", "--aggregate", "trimmed-mean"], "--trim is the share cut off at each end"),
        (["--max-update-norm", "-1"], "--max-update-norm must be positive, got -1"),
        (["--min-replies", "0"], "--min-replies must be a positive integer, got 0"),
    ],
)
def test_the_fleet_options_refuse_what_does_not_work_before_starting_anything(flags, says, tmp_path):
    from test_cli import cli

    data = ROOT / "edgetrain" / "data" / "digits"
    art = ROOT / "no-artifact-needed.etrain"  # refused before the artifact is opened
    proc = cli(
        "federate", art, "--data", data, "--clients", 3, "--rounds", 1, "--out", tmp_path / "o", *flags
    )
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists()
