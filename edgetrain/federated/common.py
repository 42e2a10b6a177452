"""What the federated client and server agree on (numpy and the device side only; no flwr): the configuration keys,
which parameters are personal, how a dataset is split among clients, and named arrays <-> Flower's ArrayRecord.

Run config (the server's, from `flwr run --run-config`; declared in the app's pyproject.toml):
    artifact        the training artifact: the initial parameters and, with the server's onnx, the export
    rounds          federated rounds
    local-epochs    epochs of local training per round (0: use local-steps)
    local-steps     steps of local training per round (0: use local-epochs)
    lr              the clients' learning rate (0: the artifact's)
    personal        comma-separated patterns of personal parameters (FedPer): never sent, kept on each device
    dp-noise        central differential privacy: noise multiplier (0: off)
    dp-clip         ... and clipping norm of the clients' updates
    val-data        server-side validation data for the global model ("" : none)
    out             where the server writes summary.json, progress.jsonl, global.etck, global.onnx
    min-clients     clients a round needs
Node config (each device's, from `flower-supernode --node-config`):
    partition-id    the client's number
    artifact        the device's own copy of the artifact
    data            the device's data: any file loaders.open_data reads, the phone's SampleStore included
    home            the device's folder: its checkpoint (personal layers, optimizer state) and what it sent
    val-fraction    the share of its own data a client holds out to judge itself (default 0.2)
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from edgetrain.core.errors import ConfigError
from loaders import IDataView

RUN_DEFAULTS = {
    "artifact": "",
    "rounds": 3,
    "local-epochs": 1,
    "local-steps": 0,
    "lr": 0.0,
    "personal": "",
    "dp-noise": 0.0,
    "dp-clip": 0.0,
    "val-data": "",
    "out": "",
    "min-clients": 2,
    "seed": 0,
}
# What a client's reply holds besides the arrays (client.py writes them; the server's door accepts these and no other)
METRIC_KEYS = (
    "num-examples",
    "client",
    "steps",
    "train-loss",
    "val-loss-before",
    "val-loss-after",
    "val-accuracy-before",
    "val-accuracy-after",
    "personal",
)
MAX_NUM_EXAMPLES = 10_000_000  # a phone's sample count above this is not a count: the door refuses it
CHECK_KEY = "edgetrain.program_id"  # sent with every round: a client of another artifact refuses to train


def patterns(text: str) -> list[str]:
    return [p.strip() for p in str(text).split(",") if p.strip()]


def personal_names(
    names: Sequence[str], patterns_: Iterable[str], readers: Mapping[str, list[str]]
) -> list[str]:
    """The parameters a pattern selects by name, or by the name of a node that reads it (as trainable= does)."""
    pats = list(patterns_)
    return [
        n
        for n in names
        if any(
            fnmatch.fnmatchcase(n, p) or any(fnmatch.fnmatchcase(r, p) for r in readers.get(n, ()))
            for p in pats
        )
    ]


def readers_of(session) -> dict[str, list[str]]:
    """Parameter -> names of the nodes that read it, in the artifact's inference graph."""
    out: dict[str, list[str]] = {}
    for node in session.artifact.base.nodes:
        for i in node.inputs:
            if i:
                out.setdefault(i, []).append(node.name)
    return out


def partition(view: IDataView, clients: int, scheme: str = "iid", *, seed: int = 0) -> list[np.ndarray]:
    """Sample indices of each client's dataset: "iid" (shuffled, equal shares) or "label-skew" (as real users' data
    is: each class lives mostly with one client: 80% of class c's samples go to client c mod K, the other 20% are
    spread over the other clients)."""
    n = view.size()
    if clients < 1 or clients > n:
        raise ConfigError(f"cannot split {n} samples among {clients} clients")
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        return [np.sort(p) for p in np.array_split(rng.permutation(n), clients)]
    if scheme != "label-skew":
        raise ConfigError(f"unknown partition {scheme!r}; use iid or label-skew")
    labels = np.asarray(view.labels()).reshape(n, -1)[:, 0].astype(np.int64)
    parts: list[list[int]] = [[] for _ in range(clients)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        home = int(c) % clients
        cut = int(round(0.8 * len(idx))) if clients > 1 else len(idx)
        parts[home] += idx[:cut].tolist()
        others = [k for k in range(clients) if k != home]
        for j, i in enumerate(idx[cut:]):
            parts[others[j % len(others)]].append(int(i))
    return [np.sort(np.asarray(p, np.int64)) for p in parts]


def to_records(arrays: Mapping[str, np.ndarray]):
    """Named numpy arrays -> a Flower ArrayRecord (names kept: they are the ONNX initializer names)."""
    from flwr.app import Array, ArrayRecord  # optional (the federated extra): the rest works without flwr

    return ArrayRecord({k: Array.from_numpy_ndarray(np.ascontiguousarray(v)) for k, v in arrays.items()})


def from_records(record) -> dict[str, np.ndarray]:
    return {k: np.asarray(v.numpy()) for k, v in record.items()}
