"""The Flower ServerApp: run config -> FedAvg over named arrays from a converted artifact's initial parameters ->
the global model as a checkpoint (global.etck) and an ONNX inference model (global.onnx; with LoRA adapters merged,
and the global adapters alone as global.etad), progress.jsonl (a line a round, as it ends) and summary.json.
Personal parameters are never in what the server sends or accepts. With adapters-only the shared parameters are the
LoRA adapters alone: the frozen base is on every device already (the artifact) and never crosses the network, and
a head trained beside the adapters stays on each device as a personal layer. Every round's payload (bytes per
client, sent and received) is recorded against the full model's weights (model_bytes).

Every reply goes through a door before aggregation (Door, a strategy wrapper): a client's error reply (it refused
the round: another artifact, data it cannot use) and a reply whose names, or whose arrays as decoded (shape,
dtype, byte count, finiteness), are not the shared parameters' are left out and recorded, so one mismatched or
lying device can neither stall nor poison a round, with or without central differential privacy (Flower's
DifferentialPrivacyServerSideFixedClipping, wrapped inside the door).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

# flwr, the federated extra, at module level: this module is Flower's ServerApp, run by Flower
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import (
    Bulyan,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
    FedMedian,
    FedTrimmedAvg,
    Krum,
    MultiKrum,
)
from flwr.serverapp.strategy.strategy import Strategy

from edgetrain.core.atomic import atomic_write
from edgetrain.core.errors import ConfigError
from edgetrain.graph.sections import AdaptersSection
from edgetrain.runtime import TrainingSession
from edgetrain.runtime.feeding import DataOptions, open_feed
from edgetrain.runtime.trainer import evaluate, session_batch
from loaders import DataLoader

from .common import (
    AGGREGATES,
    CHECK_KEY,
    MAX_NUM_EXAMPLES,
    METRIC_KEYS,
    from_records,
    model_bytes,
    run_numbers,
    shared_and_personal,
    tensor_bytes,
    to_records,
)
from .privacy import run_private, wants_legacy
from .wire import NUMPY_STYPE, RefusedReply, carried, decode

app = ServerApp()


class Door(Strategy):
    """Wraps a strategy: records every reply (who sent what, how many samples, their metrics) and lets through only
    honest-looking ones: its parameters and metrics and no other record; exactly the shared parameters, each
    declaring and carrying the global model's shape and dtype (the bytes decoded and checked, not the shape the
    reply declares: edgetrain.federated.wire), every value finite; num-examples a whole number from 1 to
    max_examples; the metrics the client writes (METRIC_KEYS), every one a finite number; with max_update_norm, an
    update (the reply's parameters minus the global model the round sent) of at most that L2 norm. Anything else
    is refused with its reason, recorded and left out of the round; nothing a client sends can raise out of the
    door. What the rule aggregates is what the door decoded and checked.

    A round with fewer accepted replies than min_replies, or than the aggregation rule needs (Krum: 2f + 3 for f
    hostile clients, Bulyan: 4f + 3), is skipped: the global model stays as it was, and the round is recorded as
    skipped with its reason. What the inner strategy aggregates comes back in the global model's dtypes."""

    def __init__(
        self,
        inner: Strategy,
        shapes: dict[str, tuple[int, ...]],
        dtypes: dict[str, str] | None = None,
        *,
        max_examples: int = MAX_NUM_EXAMPLES,
        max_update_norm: float = 0.0,
        min_replies: int = 1,
    ):
        super().__init__()
        self.inner, self.shapes = inner, shapes
        self.dtypes = dtypes or {k: "float32" for k in shapes}
        self.max_examples = int(max_examples)
        self.max_update_norm = float(max_update_norm or 0.0)
        self.min_replies = max(1, int(min_replies or 1))
        self.clients: dict[int, dict[str, Any]] = {}  # client id -> what the summary says of it
        self.refused: list[dict[str, Any]] = []
        self.skipped: list[
            dict[str, Any]
        ] = []  # rounds left out: too few accepted replies, or the rule failed
        self.rounds: dict[int, dict[str, int]] = {}  # round -> {"replies", "accepted", "refused"}
        self._global: dict[str, np.ndarray] | None = (
            None  # what this round sent: updates are measured from it
        )
        self.payload: dict[int, dict[str, Any]] = {}  # round -> the bytes it carried (record_payload)
        self._down = self._down_serialized = self._fanout = 0  # what a round sends each client, to how many

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        self.sent(arrays)
        messages = list(self.inner.configure_train(server_round, arrays, config, grid))
        self._fanout = len(messages)
        return messages

    def sent(self, arrays: ArrayRecord, fanout: int | None = None) -> None:
        """The global model this round sends (to `fanout` clients): the replies' updates are measured from it, and
        the round's payload."""
        values = from_records(arrays)
        self._global = {k: np.asarray(v, np.float64) for k, v in values.items()}
        self._down, self._down_serialized = tensor_bytes(values), int(arrays.count_bytes())
        if fanout is not None:
            self._fanout = fanout

    def record_payload(self, server_round: int, replies: list[int]) -> None:
        """The round's bytes: per client, what it received (the shared parameters the round sent) and what it sent
        (its reply's parameters: the largest of the accepted replies'; the door lets through only the shared
        parameters' shapes, so they are all the same), the arrays' values (Flower's serialized record, with its
        headers and names, as per_client_serialized), and the round's total both ways."""
        self.payload[server_round] = {
            "per_client_sent": max(replies, default=0),
            "per_client_received": self._down,
            "per_client_serialized": self._down_serialized,
            "clients": self._fanout,
            "total": self._down * self._fanout + sum(replies),
        }

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        return self.inner.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]):
        return self.inner.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        self.inner.summary()

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        kept, seen, sizes = [], 0, []
        for msg in replies:
            seen += 1
            node = msg.metadata.src_node_id
            if msg.has_error():
                self._refuse(server_round, node, msg.error.reason or "an error without a reason")
                continue
            try:
                values = self.admit(msg.content)
            except RefusedReply as e:
                self._refuse(server_round, node, str(e))
                continue
            except Exception as e:  # a reply malformed in a way no check foresaw: refused, never raised
                self._refuse(server_round, node, f"a malformed reply ({type(e).__name__}: {str(e)[:200]})")
                continue
            metrics = msg.content.metric_records["metrics"]
            # the round aggregates what the door decoded and checked, not the bytes as they came
            msg.content = RecordDict({"arrays": to_records(values), "metrics": metrics})
            self._record(server_round, metrics, sorted(values))
            kept.append(msg)
            sizes.append(tensor_bytes(values))
        self.rounds[server_round] = {"replies": seen, "accepted": len(kept), "refused": seen - len(kept)}
        self.record_payload(server_round, sizes)
        need, rule = self._needed(len(kept))
        if len(kept) < need:
            return self._skip(
                server_round,
                f"{len(kept)} accepted repl{'y' if len(kept) == 1 else 'ies'}; {rule} needs {need}",
            )
        try:
            arrays, metrics = self.inner.aggregate_train(server_round, kept)
        except Exception as e:  # the rule could not aggregate these replies (Flower's AggregationError, ...)
            return self._skip(server_round, f"the aggregation failed ({type(e).__name__}: {str(e)[:200]})")
        if arrays is None:
            return self._skip(server_round, "the aggregation gave no model")
        out = {}
        for name, arr in from_records(arrays).items():
            out[name] = np.asarray(arr, self.dtypes.get(name, arr.dtype))
            if not np.isfinite(out[name]).all():
                return self._skip(server_round, f"the aggregate of '{name}' is not finite")
        return to_records(out), metrics

    def admit(self, content: RecordDict) -> dict[str, np.ndarray]:
        """A reply's parameters as the door decoded them (edgetrain.federated.wire), when the reply holds what an
        honest client sends: its parameters ("arrays") and its metrics ("metrics"), nothing else; RefusedReply
        naming what is at fault otherwise."""
        record = content.array_records.get("arrays")
        metrics = content.metric_records.get("metrics")
        if record is None or metrics is None or "num-examples" not in metrics:
            raise RefusedReply("a reply without parameters or a sample count")
        others = sorted(set(content.keys()) - {"arrays", "metrics"})
        if others:
            raise RefusedReply(
                f"records besides its parameters and metrics ({len(others)}, e.g. {[k[:40] for k in others[:2]]})"
            )
        self._same_names(record.keys())
        values = {
            name: carried(name, record[name], self.shapes[name], self.dtypes[name]) for name in self.shapes
        }
        self.check(values, metrics)
        return values

    def admit_tensors(
        self, names: list[str], tensors: list[bytes], tensor_type: str, metrics: MetricRecord
    ) -> dict[str, np.ndarray]:
        """Flower's older format (privacy.py): the parameters as a list of .npy bytes in the order of `names`,
        decoded and checked as admit does; RefusedReply naming what is at fault."""
        if tensor_type != NUMPY_STYPE:
            raise RefusedReply(f"parameters serialized as {str(tensor_type)[:40]!r}, not as {NUMPY_STYPE}")
        if len(tensors) != len(names):
            many = f"{len(tensors)} parameter{'s' * (len(tensors) != 1)}"
            raise RefusedReply(f"{many}, not the {len(names)} shared ones")
        self._same_names(names)
        values = {n: decode(n, t, self.shapes[n], self.dtypes[n]) for n, t in zip(names, tensors)}
        self.check(values, metrics)
        return values

    def check(self, values: dict[str, np.ndarray], metrics: MetricRecord) -> None:
        """The checks on a reply's decoded parameters beyond each one's own (wire.decode): its metrics, and with
        max_update_norm the L2 norm of its update; RefusedReply naming what is at fault."""
        why = self._bad_metrics(metrics)
        if why:
            raise RefusedReply(why)
        if not self.max_update_norm or self._global is None:
            return
        norm = update_norm(values, self._global)
        if not norm <= self.max_update_norm:
            raise RefusedReply(
                f"an update of L2 norm {norm:.4g}, above the cap of {self.max_update_norm:g} (--max-update-norm)"
            )

    def _needed(self, accepted: int) -> tuple[int, str]:
        """The accepted replies this round needs, and who asks for them (the door's minimum, or the rule's)."""
        need, rule = self.min_replies, "the round (--min-replies)"
        base = _rule_of(self.inner)
        if isinstance(base, (Krum, MultiKrum, Bulyan)):
            f = getattr(base, "edgetrain_byzantine", 0)
            if f <= 0:  # as many hostile clients as the rule can withstand with these replies
                f = max(0, (accepted - 3) // (4 if isinstance(base, Bulyan) else 2))
            base.num_malicious_nodes = f
            if isinstance(base, MultiKrum) and not isinstance(base, Krum):
                base.num_nodes_to_select = max(1, accepted - f)
            rule_need = 4 * f + 3 if isinstance(base, Bulyan) else 2 * f + 3
            if rule_need > need:
                name = type(base).__name__
                need, rule = rule_need, f"{name} against {f} hostile client{'s' * (f != 1)}"
        return need, rule

    def _skip(self, server_round: int, why: str):
        self.skipped.append({"round": server_round, "reason": why})
        print(f"round {server_round}: skipped, the global model stays as it was: {why}", flush=True)
        return None, None

    def _same_names(self, names: Iterable[str]) -> None:
        names = set(names)
        if names != set(self.shapes):
            extra, missing = sorted(names - set(self.shapes)), sorted(set(self.shapes) - names)
            raise RefusedReply(
                f"parameters that are not the shared ones ({len(extra)} unknown, e.g. {[n[:60] for n in extra[:2]]}; "
                f"{len(missing)} missing, e.g. {missing[:2]})"
            )

    def _bad_metrics(self, metrics: MetricRecord) -> str:
        """Why the reply's metrics are not what a client writes, or ""."""
        keys = set(metrics.keys())
        if keys != set(METRIC_KEYS):
            extra, missing = sorted(keys - set(METRIC_KEYS)), sorted(set(METRIC_KEYS) - keys)
            return f"metrics that are not a client's (unknown {extra[:3]}, missing {missing[:3]})"
        for key in METRIC_KEYS:
            v = metrics[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
                return f"metric '{key}' is {str(v)[:40]!r}, not a finite number"
        n = metrics["num-examples"]
        if n != int(n) or not 1 <= n <= self.max_examples:
            return f"num-examples {n!r} is not a whole number from 1 to {self.max_examples:,}"
        if metrics["client"] != int(metrics["client"]) or metrics["client"] < 0:
            return f"client {metrics['client']!r} is not a whole number >= 0"
        return ""

    def _refuse(self, server_round: int, node: int, why: str) -> None:
        self.refused.append({"round": server_round, "node": node, "reason": why})
        print(f"round {server_round}: refused a reply from node {node}: {why}", flush=True)

    def _record(self, server_round: int, metrics: MetricRecord, names: list[str]) -> None:
        cid = int(metrics.get("client", -1))
        c = self.clients.setdefault(cid, {"id": cid, "num_examples": 0, "sent": [], "rounds": []})
        c["num_examples"] = int(metrics["num-examples"])
        c["sent"].append(names)
        c["rounds"].append({"round": server_round, **{k: float(v) for k, v in metrics.items()}})


def update_norm(arrays: dict[str, np.ndarray], base: dict[str, np.ndarray]) -> float:
    """The L2 norm of (arrays - base) over every parameter together, in float64."""
    total = 0.0
    for name, b in base.items():
        d = np.asarray(arrays[name], np.float64) - b
        total += float(np.dot(d.ravel(), d.ravel()))
    return float(np.sqrt(total))


def _rule_of(strategy: Strategy) -> Strategy:
    """The aggregation rule under privacy wrappers (they keep theirs as .strategy)."""
    while hasattr(strategy, "strategy") and isinstance(strategy.strategy, Strategy):
        strategy = strategy.strategy
    return strategy


def aggregation_rule(cfg: dict[str, Any], sample: dict[str, Any]) -> Strategy:
    """The strategy that aggregates accepted replies, by the run config's `aggregate` (Flower's own strategies):
    fedavg (weighted by samples), median and trimmed-mean (per coordinate, unweighted), krum (the one reply closest
    to its neighbours), multi-krum (the mean of the closest n - f), bulyan (multi-krum's choice, then a trimmed
    mean). `sample`: Flower's fraction_train / min_train_nodes / min_available_nodes."""
    name = str(cfg.get("aggregate", "fedavg")).strip().lower()
    common = {**sample, "fraction_evaluate": 0.0}
    if name == "fedavg":
        return FedAvg(**common)
    if name == "median":
        return FedMedian(**common)
    if name == "trimmed-mean":
        trim = float(cfg.get("trim", 0.2))
        if not 0.0 <= trim < 0.5:
            raise ConfigError(f"trim {trim:g}: the share cut off at each end must be from 0 to below 0.5")
        return FedTrimmedAvg(**common, beta=trim)
    if name in ("krum", "multi-krum", "bulyan"):
        cls = {"krum": Krum, "multi-krum": MultiKrum, "bulyan": Bulyan}[name]
        rule = cls(**common)
        rule.edgetrain_byzantine = max(
            0, int(cfg.get("byzantine", 0))
        )  # 0: the most the round's replies allow
        return rule
    raise ConfigError(f"unknown aggregation rule {name!r}; use one of {', '.join(AGGREGATES)}")


@app.main()
def main(grid: Grid, context: Context) -> None:
    run(grid, dict(context.run_config), context)


def run(grid: Grid, cfg: dict[str, Any], context: Context | None = None) -> dict[str, Any]:
    cfg = run_numbers(cfg)  # the defaults beneath, each number checked where it enters
    out = str(cfg["out"]) or os.path.abspath("federated-out")
    os.makedirs(out, exist_ok=True)
    sess = TrainingSession(str(cfg["artifact"]))
    params = sess.parameters()
    adapters_only = bool(cfg.get("adapters-only", False))
    names, personal = shared_and_personal(sess, str(cfg["personal"]), adapters_only)
    shared = {n: params[n] for n in names}
    if not shared:
        raise ConfigError(
            f"every {'adapter' if adapters_only else 'parameter'} matches the personal patterns "
            f"{cfg['personal']!r}: nothing to share"
        )
    door, privacy = _door(cfg, shared)
    train_config = ConfigRecord(
        {
            "local-epochs": int(cfg["local-epochs"]),
            "local-steps": int(cfg["local-steps"]),
            "lr": float(cfg["lr"]),
            "personal": str(cfg["personal"]),
            "adapters-only": adapters_only,
            CHECK_KEY: sess.artifact.program_id,
        }
    )
    judge = _judge(sess, str(cfg["val-data"]), out)
    judge.door = door
    private: dict[str, Any] = {}
    if wants_legacy(cfg):  # SecAgg+ or local DP: Flower's older workflows (edgetrain.federated.privacy)
        if context is None:
            raise ConfigError(
                "secure aggregation and local DP run as Flower's ServerApp (they need its context)"
            )
        final, private = run_private(grid, context, cfg, shared, door, judge, train_config)
    else:
        result = door.start(
            grid=grid,
            initial_arrays=to_records(shared),
            num_rounds=int(cfg["rounds"]),
            train_config=train_config,
            evaluate_fn=judge,
            timeout=float(cfg.get("round-timeout", 600.0)),
        )
        final = from_records(result.arrays) if result.arrays is not None else shared
    sess.set_parameters(final)
    sess.save_checkpoint(
        os.path.join(out, "global.etck"), user_state={"federated_rounds": int(cfg["rounds"])}
    )
    exported = _export(sess, out)
    summary = {
        "initial_val_accuracy": judge.history[0].get("val_accuracy") if judge.history else None,
        "final_val_accuracy": judge.history[-1].get("val_accuracy") if judge.history else None,
        "rounds": [r for r in judge.history if r["round"] > 0],
        "clients": [_client_summary(c) for _, c in sorted(door.clients.items())],
        "refused": door.refused,
        "skipped": door.skipped,
        "aggregate": _rule_summary(cfg, door),
        "personal": personal,
        "shared": sorted(shared),
        "privacy": privacy if privacy["noise_multiplier"] > 0 else None,
        **private,
        "global_checkpoint": os.path.join(out, "global.etck"),
        "global_onnx": exported,
        **_payload_summary(sess, door, shared, adapters_only, out),
    }
    atomic_write(os.path.join(out, "summary.json"), json.dumps(summary, indent=2, allow_nan=False).encode())
    return summary


def _payload_summary(
    sess: TrainingSession, door: Door, shared: dict[str, np.ndarray], adapters_only: bool, out: str
) -> dict[str, Any]:
    """What crossed the network against the full model (summary.json's adapters_only, model_bytes, payload_bytes,
    adapters, global_adapters); writes the global adapters (global.etad) of an artifact with adapters."""
    rounds = [door.payload[r] for r in sorted(door.payload)]
    model, each = model_bytes(sess), tensor_bytes(shared)
    summary: dict[str, Any] = {
        "adapters_only": adapters_only,
        "model_bytes": model,
        "payload_bytes": {
            "per_client_sent": max((r["per_client_sent"] for r in rounds), default=0),
            "per_client_received": max((r["per_client_received"] for r in rounds), default=0),
            "shared_parameters": each,
            "share_of_model": round(each / model, 6) if model else None,
            "total": sum(r["total"] for r in rounds),
        },
        "adapters": None,
        "global_adapters": None,
    }
    a = sess.record.section(AdaptersSection)
    if a is not None:
        names = set(a.tensors)
        summary["adapters"] = {
            "rank": a.config.get("rank"),
            "alpha": a.config.get("alpha"),
            "layers": [m.weight for m in a.modules],
            "bytes": tensor_bytes({n: v for n, v in sess.parameters().items() if n in names}),
            "trained_beside": [n for n in sess.parameter_names if n not in names],
        }
        summary["global_adapters"] = os.path.join(out, "global.etad")
        sess.export_adapters(summary["global_adapters"])
    return summary


def _door(cfg: dict[str, Any], shared: dict[str, np.ndarray]) -> tuple[Door, dict[str, Any]]:
    """The door around the run's aggregation rule (and Flower's central DP, when asked), and the DP settings."""
    clients = int(cfg["min-clients"])
    per_round = int(cfg.get("clients-per-round", 0) or 0) or clients
    if not 1 <= per_round <= clients:
        raise ConfigError(f"clients-per-round {per_round}: pick 1 to the {clients} clients of the federation")
    sample = {
        "fraction_train": per_round / clients,
        "min_train_nodes": per_round,
        "min_available_nodes": clients,
    }
    inner = aggregation_rule(cfg, sample)
    privacy = {"noise_multiplier": float(cfg["dp-noise"]), "clipping_norm": float(cfg["dp-clip"])}
    if privacy["noise_multiplier"] > 0:
        inner = DifferentialPrivacyServerSideFixedClipping(
            inner, privacy["noise_multiplier"], privacy["clipping_norm"], num_sampled_clients=per_round
        )
        privacy["mechanism"] = "central DP, server-side fixed clipping (Flower)"
        privacy["noise_stddev"] = privacy["noise_multiplier"] * privacy["clipping_norm"] / per_round
    door = Door(
        inner,
        {k: tuple(v.shape) for k, v in shared.items()},
        {k: v.dtype.name for k, v in shared.items()},
        max_update_norm=float(cfg.get("max-update-norm", 0.0) or 0.0),
        min_replies=int(cfg.get("min-replies", 0) or 0),
    )
    return door, privacy


def _rule_summary(cfg: dict[str, Any], door: Door) -> dict[str, Any]:
    rule = _rule_of(door.inner)
    out: dict[str, Any] = {"rule": str(cfg.get("aggregate", "fedavg")), "strategy": type(rule).__name__}
    if isinstance(rule, FedTrimmedAvg):
        out["trim"] = rule.beta
    if isinstance(rule, (Krum, MultiKrum, Bulyan)):
        out["byzantine"] = int(getattr(rule, "edgetrain_byzantine", 0)) or "as many as each round allows"
    out["max_update_norm"] = door.max_update_norm or None
    out["min_replies"] = door.min_replies
    return out


def _client_summary(c: dict[str, Any]) -> dict[str, Any]:
    first, last = c["rounds"][0], c["rounds"][-1]
    return {
        "id": c["id"],
        "num_examples": c["num_examples"],
        "sent": c["sent"],
        "local_val_accuracy_before": _metric(first.get("val-accuracy-before")),
        "local_val_accuracy_after": _metric(last.get("val-accuracy-after")),
        "rounds": c["rounds"],
    }


def _metric(v: float | None) -> float | None:
    return None if v is None or v < 0 else v


class _Judge:
    """evaluate_fn: the global model (shared parameters from the round, the artifact's own personal ones) on the
    server's validation data, before the first round and after each; writes a progress line per round."""

    def __init__(self, sess: TrainingSession, view, transform, out: str):
        self.sess, self.view, self.transform, self.out = sess, view, transform, out
        self.initial = sess.parameters()
        self.history: list[dict[str, Any]] = []
        self.t = time.perf_counter()

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        now = time.perf_counter()
        line: dict[str, Any] = {"round": server_round, "seconds": round(now - self.t, 3)}
        self.t = now
        door = getattr(self, "door", None)
        if door is not None and server_round in door.rounds:
            line.update(door.rounds[server_round])
            line["skipped"] = any(r["round"] == server_round for r in door.skipped)
        if door is not None and server_round in door.payload:
            line["payload_bytes"] = door.payload[server_round]
        metrics = None
        if self.view is not None:
            self.sess.set_parameters({**self.initial, **from_records(arrays)})
            loader = DataLoader(self.view, session_batch(self.sess) or 32, batch_transform=self.transform)
            loss, acc = evaluate(self.sess, loader, classification=self.sess.num_classes is not None)
            line.update(val_loss=float(loss), val_accuracy=None if acc is None else float(acc))
            metrics = MetricRecord({k: v for k, v in line.items() if isinstance(v, float)})
        self.history.append(line)
        with open(os.path.join(self.out, "progress.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
        return metrics


def _judge(sess: TrainingSession, path: str, out: str) -> _Judge:
    if not path:
        return _Judge(sess, None, None, out)
    feed = open_feed(path, "test", sess, DataOptions())
    return _Judge(sess, feed.view, feed.transform, out)


def _export(sess: TrainingSession, out: str) -> str | None:
    try:
        sess.export_onnx(os.path.join(out, "global.onnx"))
    except Exception as e:  # the server may run without onnx: the checkpoint is the result, ONNX a courtesy
        print(f"global.onnx not written: {e}", flush=True)
        return None
    return os.path.join(out, "global.onnx")


__all__ = ["Door", "app", "main", "run"]
