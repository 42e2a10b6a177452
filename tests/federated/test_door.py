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


# ---- the update-norm cap and the round's minimum --------------------------------------------------------------------
def test_an_update_above_the_norm_cap_is_refused_and_one_below_it_counts():
    door = Door(FedAvg(), SHAPES, max_update_norm=2.0)
    door.sent(to_records(params(1.0)))
    # 15 values: an update of 0.5 everywhere has norm 0.5 * sqrt(15) = 1.94; of 0.6, 2.32
    near, far = reply(1, params(1.5)), reply(2, params(1.6))
    arrays, _ = door.aggregate_train(1, [near, far])
    assert [r["node"] for r in door.refused] == [2]
    assert "L2 norm 2.324, above the cap of 2 (--max-update-norm)" in door.refused[0]["reason"]
    np.testing.assert_array_equal(from_records(arrays)["fc.bias"], np.full(3, 1.5, np.float32))
    assert door.rounds[1] == {"replies": 2, "accepted": 1, "refused": 1}


def test_a_round_with_too_few_accepted_replies_is_skipped_and_says_why(capsys):
    door = Door(FedAvg(), SHAPES, min_replies=2)
    assert door.aggregate_train(3, [reply(1, params(1.0)), reply(2, params(np.nan))]) == (None, None)
    assert door.skipped == [{"round": 3, "reason": "1 accepted reply; the round (--min-replies) needs 2"}]
    assert "round 3: skipped, the global model stays as it was" in capsys.readouterr().out


# ---- robust rules: Flower's strategies behind the door, against closed forms computed here -----------------------
def rule(name: str, **cfg):
    from edgetrain.federated.server import aggregation_rule

    return aggregation_rule(
        {"aggregate": name, **cfg}, {"fraction_train": 1.0, "min_train_nodes": 2, "min_available_nodes": 2}
    )


def spread(values: list[float], seed: int = 0) -> list[dict[str, np.ndarray]]:
    """One parameter set per client: value v plus a little noise of its own, so every coordinate differs."""
    rng = np.random.default_rng(seed)
    return [
        {k: (v + 0.1 * rng.standard_normal(shape)).astype(np.float32) for k, shape in SHAPES.items()}
        for v in values
    ]


def aggregate(name: str, sets: list[dict[str, np.ndarray]], counts=None, **cfg):
    door = Door(rule(name, **cfg), SHAPES)
    counts = counts or [100] * len(sets)
    msgs = [reply(i + 1, p, **{"num-examples": n}) for i, (p, n) in enumerate(zip(sets, counts))]
    arrays, _ = door.aggregate_train(1, msgs)
    return door, None if arrays is None else from_records(arrays)


def krum_scores(sets: list[dict[str, np.ndarray]], f: int) -> np.ndarray:
    """Krum's score by its definition: the sum of squared distances to the n - f - 2 nearest other clients."""
    flat = np.stack([np.concatenate([s[k].ravel() for k in SHAPES]).astype(np.float64) for s in sets])
    d = ((flat[:, None, :] - flat[None, :, :]) ** 2).sum(-1)
    m = len(sets) - f - 2
    return np.array([np.sort(np.delete(d[i], i))[:m].sum() for i in range(len(sets))])


def test_median_and_trimmed_mean_are_the_per_coordinate_statistics_and_ignore_sample_counts():
    sets = spread([1.0, 1.2, 0.9, 1.1, -40.0])
    stack = {k: np.stack([s[k] for s in sets]).astype(np.float64) for k in SHAPES}
    _, med = aggregate("median", sets, counts=[1, 1, 1, 1, 10**6])
    _, trim = aggregate("trimmed-mean", sets, trim=0.2)
    for k in SHAPES:
        np.testing.assert_allclose(med[k], np.median(stack[k], axis=0), rtol=1e-6)
        cut = np.sort(stack[k], axis=0)[1:-1]  # 20% of 5 clients: one cut at each end
        np.testing.assert_allclose(trim[k], cut.mean(axis=0), rtol=1e-6)
        assert (
            med[k].dtype == trim[k].dtype == np.float32
        )  # the global model's dtype, whatever the rule gives
        assert (
            np.abs(med[k] - 1.0).max() < 0.5 and np.abs(trim[k] - 1.0).max() < 0.5
        )  # the outlier left no mark


def test_krum_picks_the_client_its_definition_scores_best_and_multi_krum_averages_the_closest():
    sets = spread([1.0, 1.1, 0.95, 1.05, 30.0, -30.0, 1.02], seed=1)
    door, got = aggregate("krum", sets, byzantine=2)
    best = int(np.argmin(krum_scores(sets, 2)))
    assert best not in (4, 5)
    for k in SHAPES:
        np.testing.assert_array_equal(got[k], sets[best][k])
    _, multi = aggregate(
        "multi-krum", sets, byzantine=2
    )  # the mean of the n - f = 5 best, weighted by samples
    chosen = np.argsort(krum_scores(sets, 2))[:5]
    assert sorted(chosen) == [0, 1, 2, 3, 6]
    for k in SHAPES:
        want = np.mean([sets[i][k].astype(np.float64) for i in chosen], axis=0)
        np.testing.assert_allclose(multi[k], want, rtol=1e-6)


def test_a_rule_with_too_few_replies_for_its_hostile_clients_skips_the_round():
    door, got = aggregate("krum", spread([1.0, 1.1, 0.9, 1.0, 1.2]), byzantine=2)  # Krum against 2: 7 replies
    assert got is None and "Krum against 2 hostile clients needs 7" in door.skipped[0]["reason"]
    door, got = aggregate("bulyan", spread([1.0] * 7 + [50.0]), byzantine=0)  # 8 replies: Bulyan withstands 1
    assert got is not None and np.abs(got["fc.weight"] - 1.0).max() < 0.5


def test_under_a_sign_flipping_minority_fedavg_moves_against_the_honest_update_and_robust_rules_do_not():
    """One attacker of five sends the global model minus 4x its honest update (within the door's dtype and
    finiteness checks): FedAvg's step goes the wrong way; every robust rule keeps most of the honest step."""
    start = params(0.0)
    honest = spread([1.0, 1.1, 0.9, 1.05], seed=2)
    attacker = {k: (start[k] - 4 * honest[0][k]).astype(np.float32) for k in SHAPES}
    sets = [*honest, attacker]
    for name, lowest in [("fedavg", None), ("median", 0.7), ("trimmed-mean", 0.7), ("krum", 0.7)]:
        _, got = aggregate(name, sets, byzantine=1)
        step = float(np.mean(np.concatenate([got[k].ravel() for k in SHAPES])))
        if lowest is None:
            assert step < 0.2, step  # (1 + 1.1 + 0.9 + 1.05 - 4) / 5 = 0.01: the honest step cancelled
        else:
            assert step > lowest, (name, step)


def test_an_unknown_rule_or_trim_is_refused_in_plain_words():
    from edgetrain.core.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown aggregation rule 'mean'; use one of fedavg, median"):
        rule("mean")
    with pytest.raises(ConfigError, match="trim 0.5"):
        rule("trimmed-mean", trim=0.5)
