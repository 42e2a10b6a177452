"""The fleet server's door (edgetrain.federated.server.Door) against hostile replies, built by hand as Flower
Messages beside two honest ones (issue 22): each is refused with its reason, nothing raises, and the round's global
model is the honest clients' weighted mean, computed here with numpy."""

from __future__ import annotations

import time

import numpy as np
import pytest

flwr = pytest.importorskip("flwr", reason="the fleet needs the federated extra (flwr)")

from flwr.app import Message, Metadata, MetricRecord, RecordDict  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from edgetrain.federated.common import METRIC_KEYS, from_records, to_records  # noqa: E402
from edgetrain.federated.server import Door  # noqa: E402

SHAPES = {"fc.weight": (3, 4), "fc.bias": (3,)}


def params(value: float, dtype=np.float32) -> dict[str, np.ndarray]:
    return {k: np.full(shape, value, dtype) for k, shape in SHAPES.items()}


def reply(node: int, arrays: dict[str, np.ndarray], **metrics) -> Message:
    m = {k: 0.5 for k in METRIC_KEYS} | {"num-examples": 100, "client": node} | metrics
    meta = Metadata(
        run_id=1,
        message_id=f"reply-{node}",
        src_node_id=node,
        dst_node_id=0,
        reply_to_message_id="train",
        group_id="1",
        created_at=time.time(),
        ttl=60.0,
        message_type="train",
    )
    return Message(RecordDict({"arrays": to_records(arrays), "metrics": MetricRecord(m)}), metadata=meta)


def without(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


HOSTILE = {
    "all NaN": (params(np.nan), {}, "non-finite"),
    "all inf": (params(np.inf), {}, "non-finite"),
    "float64": (params(1.0, np.float64), {}, "dtype float64"),
    "float16": (params(1.0, np.float16), {}, "dtype float16"),
    "int32": (params(1, np.int32), {}, "dtype int32"),
    "bool": (params(1, np.bool_), {}, "dtype bool"),
    "wrong shape": (
        {"fc.weight": np.ones((4, 3), np.float32), "fc.bias": np.ones(3, np.float32)},
        {},
        "shape",
    ),
    "unknown name": (params(1.0) | {"extra": np.ones(2, np.float32)}, {}, "not the shared ones"),
    "missing name": (without(params(1.0), "fc.bias"), {}, "not the shared ones"),
    "negative count": (params(9.0), {"num-examples": -99}, "num-examples -99"),
    "zero count": (params(9.0), {"num-examples": 0}, "num-examples 0"),
    "fractional count": (params(9.0), {"num-examples": 2.5}, "num-examples 2.5"),
    "NaN count": (params(9.0), {"num-examples": float("nan")}, "'num-examples'"),
    "inf count": (params(9.0), {"num-examples": float("inf")}, "'num-examples'"),
    "huge count": (params(9.0), {"num-examples": 10**12}, "num-examples"),
    "NaN loss": (params(9.0), {"train-loss": float("nan")}, "'train-loss'"),
    "a list metric": (params(9.0), {"steps": [1.0, 2.0]}, "'steps'"),
    "an extra metric": (params(9.0), {"sneaky": 1.0}, "unknown ['sneaky']"),
    "negative client": (params(9.0), {"client": -3}, "client -3"),
}


def test_hostile_replies_are_refused_and_the_round_is_the_honest_mean():
    door = Door(FedAvg(), SHAPES, {k: "float32" for k in SHAPES})
    honest = [reply(1, params(1.0)), reply(2, params(3.0), **{"num-examples": 300})]
    hostile = [reply(10 + i, arrays, **m) for i, (arrays, m, _) in enumerate(HOSTILE.values())]
    missing = reply(99, params(9.0))
    del missing.content.metric_records["metrics"]
    arrays, _ = door.aggregate_train(1, [honest[0], *hostile, missing, honest[1]])
    got = from_records(arrays)
    for k, shape in SHAPES.items():  # (1 * 100 + 3 * 300) / 400
        np.testing.assert_array_equal(got[k], np.full(shape, 2.5, np.float32))
    reasons = {r["node"]: r["reason"] for r in door.refused}
    assert sorted(reasons) == [10 + i for i in range(len(HOSTILE))] + [99]
    for i, (name, (_, _, says)) in enumerate(HOSTILE.items()):
        assert says in reasons[10 + i], (name, reasons[10 + i])
    assert "without parameters or a sample count" in reasons[99]
    assert sorted(door.clients) == [1, 2]  # the summary names the honest clients only


def test_a_round_of_refused_replies_aggregates_nothing():
    door = Door(FedAvg(), SHAPES)
    assert door.aggregate_train(1, [reply(1, params(np.nan))]) == (None, None)
    assert len(door.refused) == 1
