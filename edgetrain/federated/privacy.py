"""Secure aggregation (Flower's SecAgg+) and client-side differential privacy (Flower's LocalDpMod) for the fleet.

Both of Flower's implementations speak its older message format (a round's parameters as an unnamed list, the
reply as a FitRes) and run on the server under its LegacyContext workflows. So a run with `secure-aggregation` or
`local-dp-epsilon` takes that path end to end:

- the server (`run_private`): Flower's DefaultWorkflow, with SecAggPlusWorkflow as its fit workflow under
  secure aggregation, over Flower's FedAvg; the shared parameters travel in the artifact's own order (both sides
  read it from the same artifact, which the program id checks), and are named again on arrival;
- the device (CLIENT_MODS, the mods of client.py's ClientApp): `legacy_mod` turns a round in the older format into
  the round the ClientApp always trains (the same train function) and its reply into a FitRes; `secure_mod` runs
  Flower's secaggplus_mod on SecAgg+ messages, `local_dp_mod` Flower's LocalDpMod (its epsilon, delta and clipping
  norm from the run config) on training replies.

Under SecAgg+ the server sees only the sum of the masked, quantized updates: the door cannot look at one reply's
parameters, so its per-reply checks give way to SecAgg+'s own bounds (each parameter clipped to +-secagg-clip, each
client's weight capped), and a reply whose metrics the door refuses cannot be taken out of the sum: the round is
skipped. Under local DP alone the server still sees each (noised) reply, and the door checks each as usual.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client.mod import LocalDpMod, secaggplus_mod
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat
from flwr.server import LegacyContext, ServerConfig
from flwr.server.strategy import (
    FedAvg as LegacyFedAvg,  # Flower's older API: its SecAgg+ and LocalDpMod need it
)
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

from edgetrain.core.errors import ConfigError

from .common import MAX_NUM_EXAMPLES, from_records, tensor_bytes, to_records
from .wire import RefusedReply

NAMES_KEY = (
    "edgetrain.shared-names"  # the older format's parameters are a list: the server sends their names (JSON)
)
FITINS_CONFIG = "fitins.config"  # how Flower's older format names a round's config record
# SecAgg+ sends each client's parameters times samples / this, quantized: a parameter's quantization step is
# 2 * secagg-clip / 2**22 * this / samples (Flower's default; above it a weight risks overflow with many clients)
SECAGG_MAX_WEIGHT = 1000


def wants_legacy(cfg: dict[str, Any]) -> bool:
    """Whether the run takes Flower's older path (SecAgg+ or local DP)."""
    return bool(cfg.get("secure-aggregation")) or float(cfg.get("local-dp-epsilon", 0) or 0) > 0


def is_legacy(msg: Message) -> bool:
    return FITINS_CONFIG in msg.content.config_records


# ---- the device --------------------------------------------------------------------------------------------------
def secure_mod(msg: Message, ctxt: Context, call_next: Callable) -> Message:
    """Flower's secaggplus_mod for the messages of a SecAgg+ round; every other message passes untouched."""
    if RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, ctxt, call_next)
    return call_next(msg, ctxt)


def local_dp_mod(msg: Message, ctxt: Context, call_next: Callable) -> Message:
    """Flower's LocalDpMod on a training reply when the run asks for local DP (local-dp-epsilon > 0): the update is
    clipped to local-dp-clip (L2) and Gaussian noise of that sensitivity added for (epsilon, delta)."""
    cfg = dict(ctxt.run_config)
    eps = float(cfg.get("local-dp-epsilon", 0) or 0)
    if eps <= 0 or not is_legacy(msg):
        return call_next(msg, ctxt)
    clip = float(cfg.get("local-dp-clip", 1.0))
    return LocalDpMod(clip, clip, eps, float(cfg.get("local-dp-delta", 1e-5)))(msg, ctxt, call_next)


def local_dp_stddev(cfg: dict[str, Any]) -> float:
    """The noise LocalDpMod adds to each parameter: sensitivity * sqrt(2 ln(1.25 / delta)) / epsilon."""
    eps, delta = float(cfg["local-dp-epsilon"]), float(cfg["local-dp-delta"])
    return float(cfg["local-dp-clip"]) * math.sqrt(2 * math.log(1.25 / delta)) / eps


def legacy_mod(msg: Message, ctxt: Context, call_next: Callable) -> Message:
    """A round in Flower's older format, for the ClientApp's own train function: the parameters are named from the
    config's NAMES_KEY (the server's shared names, in the artifact's order; the round checks they are exactly this
    device's), and the reply goes back as a FitRes: the parameters in the same order, the sample count, the
    metrics. Messages in the newer format pass untouched."""
    if not is_legacy(msg):
        return call_next(msg, ctxt)
    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    cfg = dict(fitins.config)
    names = json.loads(str(cfg.pop(NAMES_KEY, "[]")))
    arrays = parameters_to_ndarrays(fitins.parameters)
    if len(arrays) != len(names):
        raise ConfigError(
            f"a round of {len(arrays)} parameters and {len(names)} names: not an edgetrain server"
        )
    original = msg.content
    msg.content = RecordDict({"arrays": to_records(dict(zip(names, arrays))), "config": ConfigRecord(cfg)})
    try:
        out = call_next(msg, ctxt)
    finally:
        msg.content = original
    if out.has_error():
        return out
    sent = from_records(out.content["arrays"])
    metrics = dict(out.content["metrics"])
    fitres = FitRes(
        Status(Code.OK, ""),
        ndarrays_to_parameters([sent[n] for n in names]),
        int(metrics["num-examples"]),
        metrics,
    )
    out.content = compat.fitres_to_recorddict(fitres, keep_input=True)
    return out


# The mods of edgetrain's ClientApp, outermost first: SecAgg+ masks what local DP noised, in the older format.
CLIENT_MODS = [secure_mod, local_dp_mod, legacy_mod]


# ---- the server --------------------------------------------------------------------------------------------------
def run_private(
    grid, context: Context, cfg: dict[str, Any], shared: dict[str, np.ndarray], door, judge, train_config
):
    """The rounds of a SecAgg+ or local-DP run; the final shared parameters by name, and the privacy summary."""
    secure = bool(cfg.get("secure-aggregation"))
    if str(cfg.get("aggregate", "fedavg")) != "fedavg":
        raise ConfigError(
            f"aggregate {cfg['aggregate']!r} needs each client's update, which "
            + ("secure aggregation hides" if secure else "Flower's local-DP path aggregates with FedAvg only")
            + ": use fedavg with it"
        )
    if float(cfg.get("dp-noise", 0) or 0) > 0:
        raise ConfigError("central DP (dp-noise) is not combined with SecAgg+ or local DP here: pick one")
    names = list(shared)
    clients = int(cfg["min-clients"])
    per_round = int(cfg.get("clients-per-round", 0) or 0) or clients
    strategy = _PrivateFedAvg(
        door,
        names,
        secure,
        fraction_fit=per_round / clients,
        min_fit_clients=per_round,
        min_available_clients=clients,
        fraction_evaluate=0.0,
        min_evaluate_clients=0,
        initial_parameters=ndarrays_to_parameters([shared[n] for n in names]),
        on_fit_config_fn=lambda rnd: {
            **dict(train_config),
            "server-round": int(rnd),
            NAMES_KEY: json.dumps(names),
        },
        evaluate_fn=_legacy_judge(judge, names),
        accept_failures=True,
    )
    timeout = float(cfg.get("round-timeout", 600.0))  # a device that has not answered by then is left out
    rounds = ServerConfig(num_rounds=int(cfg["rounds"]), round_timeout=timeout)
    legacy = LegacyContext(context=context, config=rounds, strategy=strategy)
    summary: dict[str, Any] = {}
    fit = None
    if secure:
        shares = int(cfg.get("secagg-shares", 0) or 0)
        threshold = int(cfg.get("secagg-threshold", 0) or 0)
        fit = SecAggPlusWorkflow(
            num_shares=shares if shares > 2 else 1.0,  # 1.0: every client of the round holds a share
            reconstruction_threshold=threshold if threshold > 1 else 2 / 3,
            max_weight=SECAGG_MAX_WEIGHT,
            clipping_range=float(cfg.get("secagg-clip", 8.0)),
            timeout=timeout,  # each of SecAgg+'s four exchanges
        )
        summary["secure_aggregation"] = {
            "protocol": "SecAgg+ (Flower's SecAggPlusWorkflow and secaggplus_mod)",
            "shares": shares or "every client of the round",
            "threshold": threshold or "two thirds of the shares",
            "clipping_range": float(cfg.get("secagg-clip", 8.0)),
            "quantization_range": fit.quantization_range,
            "max_weight": SECAGG_MAX_WEIGHT,
        }
    if float(cfg.get("local-dp-epsilon", 0) or 0) > 0:
        summary["local_dp"] = {
            "mechanism": "local DP, client-side clipping and Gaussian noise (Flower's LocalDpMod)",
            "epsilon": float(cfg["local-dp-epsilon"]),
            "delta": float(cfg["local-dp-delta"]),
            "clipping_norm": float(cfg["local-dp-clip"]),
            "noise_stddev": local_dp_stddev(cfg),
        }
    DefaultWorkflow(fit_workflow=fit)(grid, legacy)
    final = strategy.latest if strategy.latest is not None else dict(shared)
    return final, summary


def _legacy_judge(judge, names: list[str]):
    def evaluate(server_round: int, arrays: list[np.ndarray], config: dict):
        metrics = judge(server_round, to_records(dict(zip(names, arrays))))
        if metrics is None:
            return None
        return float(metrics.get("val_loss", 0.0)), dict(metrics)

    return evaluate


class _PrivateFedAvg(LegacyFedAvg):
    """Flower's FedAvg (older API) behind the door: each reply's metrics checked (and, without SecAgg+, its
    parameters, as Door does for the newer path); the aggregate comes back in the global model's dtypes."""

    def __init__(self, door, names: list[str], secure: bool, **kwargs):
        super().__init__(**kwargs)
        self.door, self.names, self.secure = door, names, secure
        self.latest: dict[str, np.ndarray] | None = None

    def configure_fit(self, server_round, parameters, client_manager):
        chosen = super().configure_fit(server_round, parameters, client_manager)
        self.door.sent(to_records(dict(zip(self.names, parameters_to_ndarrays(parameters)))), len(chosen))
        self.sampled = [getattr(proxy, "node_id", -1) for proxy, _ in chosen]
        return chosen

    def aggregate_fit(self, server_round, results, failures):
        door, kept, sizes = self.door, [], []
        answered = {getattr(proxy, "node_id", -1) for proxy, _ in results}
        said = sorted({_failure_text(f) for f in failures})
        for node in [n for n in getattr(self, "sampled", []) if n not in answered]:
            door._refuse(
                server_round,
                node,
                "dropped out of the round" + (f" ({'; '.join(said)[:300]})" if said else ""),
            )
        for proxy, res in results:
            node = getattr(proxy, "node_id", -1)
            metrics, values, why = _admitted(door, self.names, res, self.secure)
            if why:
                door._refuse(server_round, node, why)
                if self.secure:
                    door.rounds[server_round] = _counts(
                        max(len(results), len(getattr(self, "sampled", []))), len(kept)
                    )
                    return door._skip(
                        server_round,
                        "a reply was refused, and under secure aggregation it cannot be taken out of the sum",
                    )
                continue
            door._record(server_round, metrics, list(self.names))
            if values is not None:  # FedAvg aggregates what the door decoded and checked
                res.parameters = ndarrays_to_parameters([values[n] for n in self.names])
            kept.append((proxy, res))
            # the reply's parameters; under SecAgg+ the server holds only the round's sum, so a reply counts as the
            # shared parameters' bytes (SecAgg+'s masked, quantized vectors and key exchanges are not counted)
            sizes.append(door._down if values is None else tensor_bytes(values))
        door.rounds[server_round] = _counts(max(len(results), len(getattr(self, "sampled", []))), len(kept))
        door.record_payload(server_round, sizes)
        need, rule = door._needed(len(kept))
        if len(kept) < need:
            return door._skip(server_round, f"{len(kept)} accepted replies; {rule} needs {need}")
        params, metrics = super().aggregate_fit(server_round, kept, [])
        if params is None:
            return door._skip(server_round, "the aggregation gave no model")
        out = {}
        for name, arr in zip(self.names, parameters_to_ndarrays(params)):
            out[name] = np.asarray(arr, door.dtypes.get(name, arr.dtype))
            if not np.isfinite(out[name]).all():
                return door._skip(server_round, f"the aggregate of '{name}' is not finite")
        self.latest = out
        return ndarrays_to_parameters([out[n] for n in self.names]), metrics


def _admitted(door, names: list[str], res: FitRes, secure: bool) -> tuple[MetricRecord | None, Any, str]:
    """(the reply's metrics, its parameters as the door decoded them (None under SecAgg+, where the server holds
    only the round's sum), why the door refuses it or "")."""
    metrics = None
    try:
        metrics = MetricRecord(dict(res.metrics))
        if secure:  # the parameters are the round's sum: only the metrics are the client's own
            return metrics, None, door._bad_metrics(metrics) or _count_mismatch(res.num_examples, metrics)
        tensors = list(res.parameters.tensors)
        values = door.admit_tensors(names, tensors, res.parameters.tensor_type, metrics)
        return metrics, values, _count_mismatch(res.num_examples, metrics)
    except RefusedReply as e:
        return metrics, None, str(e)
    except Exception as e:  # never raised from a client's reply
        return metrics, None, f"a malformed reply ({type(e).__name__}: {str(e)[:200]})"


def _failure_text(failure) -> str:
    """What a failed or dropped device left: Flower's error reason, or the exception's text."""
    error = failure[1] if isinstance(failure, tuple) else failure
    reason = (
        getattr(getattr(error, "args", [None])[0], "reason", None) if getattr(error, "args", None) else None
    )
    return str(reason or error)[:200]


def _count_mismatch(num_examples: int, metrics: MetricRecord) -> str:
    if int(num_examples) != metrics["num-examples"] or not 1 <= int(num_examples) <= MAX_NUM_EXAMPLES:
        return f"a sample count of {num_examples} beside num-examples {metrics['num-examples']!r}"
    return ""


def _counts(replies: int, accepted: int) -> dict[str, int]:
    return {"replies": replies, "accepted": accepted, "refused": replies - accepted}


__all__ = [
    "CLIENT_MODS",
    "is_legacy",
    "legacy_mod",
    "local_dp_mod",
    "local_dp_stddev",
    "run_private",
    "secure_mod",
    "wants_legacy",
]
