"""What the federated client and server agree on (numpy and the device side only; no flwr): the configuration keys,
which parameters are personal, how a dataset is split among clients, and named arrays <-> Flower's ArrayRecord.

Run config (the server's, from `flwr run --run-config`; declared in the app's pyproject.toml):
    artifact        the training artifact: the initial parameters and, with the server's onnx, the export
    rounds          federated rounds
    local-epochs    epochs of local training per round (0: use local-steps)
    local-steps     steps of local training per round (0: use local-epochs)
    lr              the clients' learning rate (0: the artifact's)
    personal        comma-separated patterns of personal parameters (FedPer): never sent, kept on each device
    adapters-only   only the LoRA adapters (each adapted layer's A and B) cross the network; every other trainable
                    parameter (a head trained beside the adapters) is personal: trained and kept on each device
                    (shared_and_personal). The artifact must have adapters (edgetrain convert --lora-rank R)
    dp-noise        central differential privacy: noise multiplier (0: off)
    dp-clip         ... and clipping norm of the clients' updates
    val-data        server-side validation data for the global model ("" : none)
    out             where the server writes summary.json, progress.jsonl, global.etck, global.onnx
    min-clients     clients a round needs
    seed            the run's seed (client sampling, partitions)
  Robustness (the server's door and aggregation rule):
    aggregate       fedavg | median | trimmed-mean | krum | multi-krum | bulyan (Flower's strategies)
    byzantine       hostile clients per round the rule must withstand (krum, multi-krum, bulyan; 0: as many as
                    the rule allows for the round's clients)
    trim            trimmed-mean: the share of values cut off at each end, per coordinate (Flower's beta)
    max-update-norm the door refuses a reply whose update (its parameters minus the global ones) has a larger L2
                    norm (0: no cap)
    min-replies     a round with fewer accepted replies is skipped: the global model stays as it was (0: 1)
    round-timeout   seconds a round waits for replies; a device that has not answered by then is left out of it
  Privacy:
    secure-aggregation  SecAgg+ (Flower's SecAggPlusWorkflow and secaggplus_mod): the server sees only the sum
    secagg-shares   SecAgg+: the shares each client's secret is split into (0: every client of the round)
    secagg-threshold SecAgg+: the shares needed to rebuild a secret, so the dropouts a round survives are
                    shares - threshold (0: two thirds of the shares, rounded up)
    secagg-clip     SecAgg+: updates are clipped to +-this before quantization
    local-dp-epsilon  client-side differential privacy (Flower's LocalDpMod): the epsilon of each reply (0: off)
    local-dp-delta  ... its delta
    local-dp-clip   ... the L2 norm each reply's parameters are clipped to before the noise
  Simulation (Flower's simulation engine: each simulated node has only partition-id and num-partitions):
    sim-data        the dataset the simulated clients take their shards from
    sim-partition   how: "label-skew" (non-IID) or "iid"
    sim-samples     samples per simulated client
    sim-home        the folder of the simulated devices' homes (sim-home/client-K)
    clients-per-round  clients sampled each round (0: all)
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
from edgetrain.graph.adapters import unadapted
from edgetrain.graph.sections import AdaptersSection
from loaders import IDataView
from loaders.values import count, number

RUN_DEFAULTS = {
    "artifact": "",
    "rounds": 3,
    "local-epochs": 1,
    "local-steps": 0,
    "lr": 0.0,
    "personal": "",
    "adapters-only": False,
    "dp-noise": 0.0,
    "dp-clip": 0.0,
    "val-data": "",
    "out": "",
    "min-clients": 2,
    "seed": 0,
    "aggregate": "fedavg",
    "byzantine": 0,
    "trim": 0.2,
    "max-update-norm": 0.0,
    "min-replies": 0,
    "round-timeout": 600.0,
    "secure-aggregation": False,
    "secagg-shares": 0,
    "secagg-threshold": 0,
    "secagg-clip": 8.0,
    "local-dp-epsilon": 0.0,
    "local-dp-delta": 1e-5,
    "local-dp-clip": 1.0,
    "sim-data": "",
    "sim-partition": "label-skew",
    "sim-samples": 40,
    "sim-home": "",
    "clients-per-round": 0,
}
# The most each count may be: beyond, a run is a typo or would not end (the run config carries them as TOML's 64-bit
# integers; Flower's simulation engine has run 1,000 devices here, docs/fleet_simulation.md)
MAX_CLIENTS = 100_000
MAX_ROUNDS = 100_000
MAX_LOCAL_EPOCHS = 10_000
MAX_LOCAL_STEPS = 10_000_000
MAX_SIM_SAMPLES = 10_000_000
MAX_SEED = 2**63 - 1
MAX_ROUND_TIMEOUT = 7 * 24 * 3600.0  # seconds: a week
# The run config's numbers, as checked where they enter (run_numbers): ("count" | "number", loaders.values' limits)
RUN_NUMBERS = {
    "rounds": ("count", {"lo": 1, "hi": MAX_ROUNDS}),
    "local-epochs": ("count", {"hi": MAX_LOCAL_EPOCHS}),
    "local-steps": ("count", {"hi": MAX_LOCAL_STEPS}),
    "lr": ("number", {"lo": 0}),
    "dp-noise": ("number", {"lo": 0}),
    "dp-clip": ("number", {"lo": 0}),
    "min-clients": ("count", {"lo": 1, "hi": MAX_CLIENTS}),
    "seed": ("count", {"hi": MAX_SEED}),
    "byzantine": ("count", {"hi": MAX_CLIENTS}),
    "trim": ("number", {"lo": 0, "hi": 0.5}),
    "max-update-norm": ("number", {"lo": 0}),
    "min-replies": ("count", {"hi": MAX_CLIENTS}),
    "round-timeout": ("number", {"positive": True, "hi": MAX_ROUND_TIMEOUT}),
    "secagg-shares": ("count", {"hi": MAX_CLIENTS}),
    "secagg-threshold": ("count", {"hi": MAX_CLIENTS}),
    "secagg-clip": ("number", {"positive": True}),
    "local-dp-epsilon": ("number", {"lo": 0}),
    "local-dp-delta": ("number", {"lo": 0, "hi": 1}),
    "local-dp-clip": ("number", {"positive": True}),
    "sim-samples": ("count", {"lo": 1, "hi": MAX_SIM_SAMPLES}),
    "clients-per-round": ("count", {"hi": MAX_CLIENTS}),
}
AGGREGATES = ("fedavg", "median", "trimmed-mean", "krum", "multi-krum", "bulyan")
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


def run_numbers(cfg: Mapping[str, object]) -> dict[str, object]:
    """The run config (the defaults beneath what it gives) with each of its numbers checked where it enters
    (RUN_NUMBERS): a ConfigError naming the key and its value when one is not a number of its kind and range (a
    string, a bool, NaN, a negative count, ...), as `flwr run --run-config` can give any."""
    out = {**RUN_DEFAULTS, **dict(cfg)}
    for key, (kind, limits) in RUN_NUMBERS.items():
        what = f"the run config's {key}"
        out[key] = count(out[key], what, **limits) if kind == "count" else number(out[key], what, **limits)
    return out


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


def adapter_names(session) -> list[str]:
    """The LoRA adapters of a session's artifact (each adapted layer's A and B), in its parameter order; [] for an
    artifact without adapters."""
    a = session.record.section(AdaptersSection)
    names = set(a.tensors if a is not None else ())
    return [n for n in session.parameter_names if n in names]


def no_adapters(artifact: str) -> str:
    """Why --adapters-only cannot federate this artifact, and what would."""
    return (
        f"--adapters-only shares a model's LoRA adapters alone, and '{artifact}' has none: convert the model with "
        "adapters (edgetrain convert MODEL --lora-rank R, e.g. --lora-rank 4) and federate that artifact"
    )


def shared_and_personal(session, personal: str, adapters_only: bool = False) -> tuple[list[str], list[str]]:
    """(shared, personal) parameters, each in the artifact's order: the shared ones cross the network every round,
    the personal ones never leave a device (each trains its own and keeps it in its checkpoint). Personal: those
    the comma-separated patterns select (by name or by a node that reads them); with adapters_only also every
    trainable parameter that is not a LoRA adapter (a head trained beside the adapters), so that only adapters
    are shared. ConfigError for adapters_only on an artifact without adapters."""
    names = session.parameter_names
    chosen = set(personal_names(names, patterns(personal), readers_of(session)))
    if adapters_only:
        adapters = adapter_names(session)
        if not adapters:
            raise ConfigError(no_adapters(str(session.artifact.path)))
        chosen |= set(names) - set(adapters)
    return [n for n in names if n not in chosen], [n for n in names if n in chosen]


def tensor_bytes(arrays: Mapping[str, np.ndarray]) -> int:
    """The bytes the arrays' values take: a message's payload (Flower adds a small header per array)."""
    return int(sum(np.asarray(v).nbytes for v in arrays.values()))


def model_bytes(session) -> int:
    """The bytes of the full model's weights: every initializer of the inference graph, without LoRA adapters
    (and their scales): what one client would send, and receive, each round if the whole model were federated."""
    graph = session.artifact.base
    adapters = session.record.section(AdaptersSection)
    if adapters is not None:
        graph = unadapted(graph, adapters.modules)
    return tensor_bytes(graph.initializers)


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
