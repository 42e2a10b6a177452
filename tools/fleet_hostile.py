"""A hostile device for measuring a fleet's robustness: Flower's ClientApp that trains exactly as edgetrain's honest
client does (edgetrain.federated.client), then, when its node config says `attack = "sign-flip:K"` or
`"scale:K"`, sends the global model it received minus K times its honest update (sign-flip) or plus K times it
(scale); `"drop-out"` trains and then answers with an error, as a phone that went away. Such a reply stays within
the door's checks (the shared names, shapes and dtype, finite values, its true sample count and metrics), which is
what a careful attacker sends. Two attacks lie about their arrays instead (issue 33): each Array declares the
parameter's true shape and dtype beside bytes of another shape, the array twice over (`"lie-shape"`: once, the round
failed and was skipped) or a single value K (`"lie-broadcast:K"`: once, broadcast into the global model); the door
decodes the bytes and refuses both. Nodes without `attack` are honest.

Used by tools/fleet_robustness.py, tests/federated/test_fleet_attack.py and
tests/federated/test_fleet_privacy.py through
`hostile_app(folder)`, which writes a Flower app folder: edgetrain's own app (its ServerApp and run config) with
this ClientApp instead."""

from __future__ import annotations

import os
import re
import shutil

import numpy as np
from flwr.app import Array, ArrayRecord, Error, Message, RecordDict
from flwr.clientapp import ClientApp

from edgetrain.federated import client as honest
from edgetrain.federated.common import from_records, to_records
from edgetrain.federated.privacy import CLIENT_MODS

app = ClientApp(mods=CLIENT_MODS)  # SecAgg+ and local DP, when the run asks for them (privacy.py)


@app.train()
def train(msg: Message, context) -> Message:
    reply = honest.train(msg, context)
    attack = str(context.node_config.get("attack", ""))
    if not attack or reply.has_error():
        return reply
    kind, _, k = attack.partition(":")
    # drop-out: gone after training, no reply (in SecAgg+: after the key exchange, before unmasking)
    if kind == "drop-out":
        return Message(Error(code=2, reason="the device dropped out"), reply_to=msg)
    k = float(k or 1.0)
    got, sent = from_records(msg.content["arrays"]), from_records(reply.content["arrays"])
    if kind in ("lie-shape", "lie-broadcast"):
        return Message(
            RecordDict({"arrays": lying(sent, kind, k), "metrics": reply.content["metrics"]}), reply_to=msg
        )
    sign = {"sign-flip": -k, "scale": k}[kind]
    bad = {n: (got[n] + sign * (sent[n] - got[n])).astype(sent[n].dtype) for n in sent}
    content = RecordDict({"arrays": to_records(bad), "metrics": reply.content["metrics"]})
    return Message(content=content, reply_to=msg)


def lying(sent: dict[str, np.ndarray], kind: str, value: float) -> ArrayRecord:
    """Each parameter's Array declaring its true dtype and shape beside the bytes of another: the array twice over
    (lie-shape) or the one value `value` (lie-broadcast)."""
    out = {}
    for name, v in sent.items():
        carried = np.stack([v, v]) if kind == "lie-shape" else np.full(1, value, v.dtype)
        honest = Array.from_numpy_ndarray(carried)
        out[name] = Array(
            dtype=str(v.dtype), shape=tuple(int(d) for d in v.shape), stype=honest.stype, data=honest.data
        )
    return ArrayRecord(out)


def hostile_app(folder: str) -> str:
    """A Flower app folder: edgetrain's app with this module as its ClientApp; returns the folder."""
    from edgetrain.federated.deploy import APP_DIR

    os.makedirs(folder, exist_ok=True)
    shutil.copy(__file__, os.path.join(folder, "fleet_hostile.py"))
    with open(os.path.join(APP_DIR, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    text, n = re.subn(r'(?m)^clientapp = ".*"$', 'clientapp = "fleet_hostile:app"', text)
    assert n == 1, "edgetrain's app names no clientapp"
    text = text.replace('name = "edgetrain-federated"', 'name = "edgetrain-federated-hostile"')
    with open(os.path.join(folder, "pyproject.toml"), "w", encoding="utf-8") as f:
        f.write(text)
    return folder
