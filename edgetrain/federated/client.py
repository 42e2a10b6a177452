"""The Flower ClientApp: one device's round -> (its shared parameters by ONNX initializer name, its sample count, its
metrics). Device side plus flwr: numpy, loaders, edgetrain's runtime; no onnx.

Each round the device loads its artifact and its own checkpoint (its personal layers and optimizer state survive
rounds there), takes the shared parameters the server sent, judges them on the part of its own data it holds out,
trains locally for the epochs or steps asked, judges again, saves its checkpoint, and sends back only the shared
parameters. What left the device is recorded in its home (sent.jsonl: round, names, samples, bytes sent and
received; last_sent.npz: the arrays), so a person can audit it. With the run's adapters-only, the shared parameters
are the LoRA adapters alone (common.shared_and_personal): a head trained beside them stays here, like a personal
layer; a device whose artifact has adapters also keeps its own after each round in adapters.etad. A device whose
artifact is not the server's, or that receives parameters its artifact does not have, refuses the round with an
error reply, which the server counts and leaves out.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

# flwr, the federated extra, at module level: this module is Flower's ClientApp, run by Flower
from flwr.app import Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from edgetrain.core.errors import ConfigError, EdgeTrainError, NonFiniteError
from edgetrain.runtime import TrainingSession
from edgetrain.runtime.feeding import DataOptions, open_feed
from edgetrain.runtime.trainer import evaluate, session_batch
from loaders import DataError, DataLoader, SubsetView, split

from .common import (
    CHECK_KEY,
    adapter_names,
    from_records,
    run_numbers,
    shared_and_personal,
    tensor_bytes,
    to_records,
)
from .privacy import CLIENT_MODS
from .simulation import shard

app = ClientApp(mods=CLIENT_MODS)  # SecAgg+ and local DP, when the run asks for them (privacy.py)
REFUSED = 1  # Error code of a round this device refuses (another artifact, other parameters, unusable data)


class RoundRefused(ConfigError):
    """A round this device cannot take part in (another artifact, other parameters, unusable data); the reason goes
    back to the server."""


@app.train()
def train(msg: Message, context: Context) -> Message:
    try:
        content = run_round(msg.content, device_config(context.node_config, context.run_config))
    except (EdgeTrainError, DataError, ValueError, OSError) as e:  # the device's own faults: refuse, say why
        return Message(Error(code=REFUSED, reason=_reason(context, e)), reply_to=msg)
    return Message(content=content, reply_to=msg)


def _reason(context: Context, e: Exception) -> str:
    return f"client {context.node_config.get('partition-id', '?')}: {e}"


def device_config(node: Mapping[str, Any], run: Mapping[str, Any]) -> dict[str, Any]:
    """This device's settings. A real device's node config names its artifact, data and home. A node of Flower's
    simulation engine holds only partition-id and num-partitions: it takes the run's artifact, its own shard of the
    run's sim-data (edgetrain.federated.simulation.shard: sim-samples samples drawn by sim-partition, seeded by the
    run's seed and its partition id) and the home sim-home/client-K."""
    node = dict(node)
    if "artifact" in node or "data" in node or "home" in node:
        missing = [k for k in ("artifact", "data", "home") if k not in node]
        if missing:
            raise RoundRefused(f"this device's node config names no {' or '.join(missing)}")
        return node
    cfg = run_numbers(run)  # the defaults beneath, each number checked where it enters
    if not cfg["sim-data"] or "partition-id" not in node:
        raise RoundRefused(
            "this device's node config names no artifact, data or home, and the run is no simulation (its run "
            "config names no sim-data)"
        )
    pid = int(node["partition-id"])
    root = str(cfg["sim-home"]) or (os.path.join(str(cfg["out"]), "clients") if cfg["out"] else "")
    if not root or not cfg["artifact"]:
        raise RoundRefused("a simulated device needs the run config's artifact and sim-home")
    return {
        "partition-id": pid,
        "artifact": str(cfg["artifact"]),
        "data": str(cfg["sim-data"]),
        "home": os.path.join(root, f"client-{pid}"),
        "shard": {
            "scheme": str(cfg["sim-partition"]),
            "samples": int(cfg["sim-samples"]),
            "seed": int(cfg["seed"]),
        },
    }


def run_round(content: RecordDict, node: dict[str, Any]) -> RecordDict:
    """One round on this device; RoundRefused (or a data or artifact error) when it cannot take part."""
    cfg = dict(content["config"])
    sess = TrainingSession(str(node["artifact"]))
    home = str(node["home"])
    os.makedirs(home, exist_ok=True)
    if cfg.get(CHECK_KEY) != sess.artifact.program_id:
        raise RoundRefused(
            f"this device's artifact ({os.path.basename(str(node['artifact']))}) is not the model the server trains "
            f"(another training program); refused"
        )
    own = os.path.join(home, "client.etck")
    if os.path.exists(own):  # personal layers and optimizer state from the rounds before
        sess.load_checkpoint(own)
    adapters_only = bool(cfg.get("adapters-only", False))
    shared, personal = shared_and_personal(sess, str(cfg.get("personal", "")), adapters_only)
    received = from_records(content["arrays"])
    _check(received, shared, sess)
    sess.set_parameters(received)
    if cfg.get("lr", 0):
        sess.lr = float(cfg["lr"])
    rnd = int(cfg.get("server-round", 0))
    pid = int(node.get("partition-id", 0))
    train_view, val_view, transform = _data(sess, node, pid)
    batch = session_batch(sess) or 32
    classification = sess.num_classes is not None
    val = DataLoader(val_view, batch, batch_transform=transform)
    before = evaluate(sess, val, classification=classification)
    loader = DataLoader(
        train_view, batch, shuffle=True, seed=1000 * pid + rnd, drop_last=True, batch_transform=transform
    )
    steps = int(cfg.get("local-steps", 0)) or int(cfg.get("local-epochs", 1)) * len(loader)
    losses = []
    try:
        for _ in range(steps):
            losses.append(sess.train_step(*loader.next()))
    except NonFiniteError as e:
        raise RoundRefused(f"local training diverged ({e}); nothing of it is sent") from e
    after = evaluate(sess, val, classification=classification)
    sess.save_checkpoint(own, user_state={"round": rnd, "partition_id": pid})
    if adapter_names(sess):  # its own adapters, as it would serve them (load_adapters reads them)
        sess.export_adapters(os.path.join(home, "adapters.etad"))
    params = sess.parameters()
    sent = {n: params[n] for n in shared}
    _audit(home, rnd, sent, train_view.size(), tensor_bytes(received))
    metrics = {
        "num-examples": int(train_view.size()),
        "client": pid,
        "steps": len(losses),
        "train-loss": float(np.mean(losses)) if losses else 0.0,
        "val-loss-before": _num(before[0]),
        "val-loss-after": _num(after[0]),
        "val-accuracy-before": _num(before[1]),
        "val-accuracy-after": _num(after[1]),
        "personal": len(personal),
    }
    return RecordDict({"arrays": to_records(sent), "metrics": MetricRecord(metrics)})


def _num(v: float | None) -> float:
    return -1.0 if v is None or not math.isfinite(v) else float(v)  # metric records hold numbers only


def _check(received: dict[str, np.ndarray], shared: list[str], sess: TrainingSession) -> None:
    """The server must send exactly this device's shared parameters, with their shapes."""
    unknown = sorted(set(received) - set(shared))
    missing = sorted(set(shared) - set(received))
    if unknown or missing:
        what = []
        if unknown:
            what.append(f"{len(unknown)} this artifact does not share (e.g. '{unknown[0]}')")
        if missing:
            what.append(f"none of {len(missing)} it does (e.g. '{missing[0]}')")
        raise RoundRefused(
            f"the server sent parameters that do not fit this device's model: {'; '.join(what)}"
        )
    have = sess.parameters()
    for name, arr in received.items():
        if arr.shape != have[name].shape:
            raise RoundRefused(
                f"parameter '{name}' arrived with shape {list(arr.shape)}; this device's model has "
                f"{list(have[name].shape)}"
            )


def _data(sess: TrainingSession, node: dict[str, Any], pid: int):
    """(training part, held-out part, batch transform) of the device's own data (a file or its SampleStore)."""
    feed = open_feed(str(node["data"]), "train", sess, DataOptions())
    share = float(node.get("val-fraction", 0.2))
    view = feed.view
    if "shard" in node:  # a simulated device: its own draw from the run's dataset
        view = SubsetView(view, shard(view.labels(), pid, **node["shard"]))
    if view.size() < 2:
        raise RoundRefused(
            f"{node['data']}: {view.size()} sample(s); a device needs at least 2 to train and judge"
        )
    train_view, val_view = split(view, (1 - share, share), seed=pid)
    batch = session_batch(sess) or 32
    if train_view.size() < batch:
        raise RoundRefused(
            f"{node['data']}: {train_view.size()} training samples make no batch of {batch} (the artifact's batch)"
        )
    return train_view, val_view, feed.transform


def _audit(home: str, rnd: int, sent: dict[str, np.ndarray], n: int, received: int) -> None:
    """What left the device: the names, sample count and bytes (the arrays' values, sent and received), one JSON
    line a round, and the last arrays themselves."""
    line = {"round": rnd, "names": sorted(sent), "num_examples": n}
    line.update(bytes_sent=tensor_bytes(sent), bytes_received=received)
    with open(os.path.join(home, "sent.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    tmp = os.path.join(home, ".last_sent.npz")
    with open(tmp, "wb") as f:
        np.savez(f, **{k.replace("/", "|"): v for k, v in sent.items()})
    os.replace(tmp, os.path.join(home, "last_sent.npz"))
