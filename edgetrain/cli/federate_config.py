"""`edgetrain federate`'s typed configuration: the federation (devices, rounds, the data and how it is shared out),
what stays on the devices, the simulation, the server's door and aggregation rule, and privacy; frozen dataclasses
built from the parsed arguments in one place and checked there (a UsageError naming the option), and the server
app's run config (`run_config`, whose keys the app's pyproject.toml declares)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any

from edgetrain.core.errors import ConfigError, UsageError
from edgetrain.federated.common import (
    MAX_CLIENTS,
    MAX_LOCAL_EPOCHS,
    MAX_LOCAL_STEPS,
    MAX_ROUND_TIMEOUT,
    MAX_ROUNDS,
    MAX_SEED,
    MAX_SIM_SAMPLES,
    patterns,
    personal_names,
    readers_of,
    shared_and_personal,
)
from loaders.values import count, number

from .names import flag

MAX_SIM_WORKERS = 1024  # simulated devices training at once, a CPU each
# replies a round needs per hostile client it withstands (Krum and multi-Krum: 2f + 3, Bulyan: 4f + 3)
BYZANTINE_REPLIES = {"krum": 2, "multi-krum": 2, "bulyan": 4}


@dataclass(frozen=True)
class SimulationConfig:
    """--simulate on Flower's simulation engine: samples per simulated device, devices that train at once."""

    simulate: bool = False
    samples: int | None = None  # None: 40
    workers: int | None = None  # None: this machine's CPUs, at most 4


@dataclass(frozen=True)
class RobustnessConfig:
    """The server's door (--max-update-norm, --min-replies, --round-timeout) and its aggregation rule."""

    aggregate: str = "fedavg"
    byzantine: int = 0
    trim: float = 0.2
    max_update_norm: float | None = None
    min_replies: int | None = None
    round_timeout: float = 600.0


@dataclass(frozen=True)
class PrivacyConfig:
    """Central DP (--dp-noise, --dp-clip), SecAgg+ and client-side DP."""

    dp_noise: float | None = None
    dp_clip: float | None = None
    secure_aggregation: bool = False
    secagg_clip: float = 8.0
    local_dp: float | None = None  # epsilon
    local_dp_clip: float = 1.0
    local_dp_delta: float = 1e-5


@dataclass(frozen=True)
class FederateConfig:
    artifact: str
    data: str
    clients: int
    rounds: int
    out: str
    clients_per_round: int | None = None
    local_epochs: int | None = None
    local_steps: int | None = None
    partition: str | None = None  # None: iid, with --simulate label-skew
    val_data: str | None = None
    personal: tuple[str, ...] = ()
    adapters_only: bool = False
    lr: float | None = None  # None: the artifact's
    seed: int = 0
    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    robustness: RobustnessConfig = field(default_factory=RobustnessConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> FederateConfig:
        a = args
        cfg = cls(
            artifact=a.artifact,
            data=a.data,
            clients=a.clients,
            rounds=a.rounds,
            out=a.out,
            clients_per_round=a.clients_per_round,
            local_epochs=a.local_epochs,
            local_steps=a.local_steps,
            partition=a.partition,
            val_data=a.val_data,
            personal=tuple(a.personal or ()),
            adapters_only=bool(getattr(a, "adapters_only", False)),
            lr=a.lr,
            seed=a.seed,
            simulation=SimulationConfig(bool(a.simulate), a.sim_samples, a.sim_workers),
            robustness=RobustnessConfig(
                a.aggregate, a.byzantine, a.trim, a.max_update_norm, a.min_replies, a.round_timeout
            ),
            privacy=PrivacyConfig(
                a.dp_noise,
                a.dp_clip,
                bool(a.secure_aggregation),
                a.secagg_clip,
                a.local_dp,
                a.local_dp_clip,
                a.local_dp_delta,
            ),
        )
        cfg._check()
        return cfg

    def _check(self) -> None:
        sim = self.simulation
        counts = {
            "clients": (self.clients, MAX_CLIENTS),
            "rounds": (self.rounds, MAX_ROUNDS),
            "local_epochs": (self.local_epochs, MAX_LOCAL_EPOCHS),
            "local_steps": (self.local_steps, MAX_LOCAL_STEPS),
            "clients_per_round": (self.clients_per_round, MAX_CLIENTS),
            "sim_samples": (sim.samples, MAX_SIM_SAMPLES),
            "sim_workers": (sim.workers, MAX_SIM_WORKERS),
        }
        for dest, (v, hi) in counts.items():
            if v is not None and v < 1:
                raise UsageError(f"{flag(dest)} must be a positive integer, got {v}")
            _whole(v, dest, lo=1, hi=hi)
        if self.clients_per_round is not None and self.clients_per_round > self.clients:
            raise UsageError(
                f"--clients-per-round {self.clients_per_round} is more than --clients {self.clients}"
            )
        self._check_robustness()
        if self.seed < 0:
            raise UsageError(f"--seed must be >= 0, got {self.seed}")
        _whole(self.seed, "seed", hi=MAX_SEED, fix="the run config carries it as a 64-bit integer")
        _real(self.lr, "lr", positive=True, fix="leave --lr out to train with the artifact's learning rate")
        if not sim.simulate and (sim.samples is not None or sim.workers is not None):
            raise UsageError("--sim-samples and --sim-workers set up a simulated run: add --simulate")
        p = self.privacy
        if (p.dp_noise is None) != (p.dp_clip is None):
            raise UsageError("differential privacy needs both --dp-noise and --dp-clip")
        if p.dp_noise is not None and (p.dp_noise <= 0 or p.dp_clip <= 0):
            raise UsageError("--dp-noise and --dp-clip must be positive")
        _real(p.dp_noise, "dp_noise", positive=True)
        _real(p.dp_clip, "dp_clip", positive=True)

    def _check_robustness(self) -> None:
        """The door's and the rule's options: each in its range, and only in combinations that work."""
        r = self.robustness
        per_round = self.clients_per_round or self.clients
        if r.byzantine < 0:
            raise UsageError(f"--byzantine must be 0 or more, got {r.byzantine}")
        _whole(r.byzantine, "byzantine", hi=MAX_CLIENTS)
        times = BYZANTINE_REPLIES.get(r.aggregate, 0)
        if times and times * r.byzantine + 3 > per_round and r.byzantine:
            raise UsageError(
                f"--byzantine {r.byzantine}: --aggregate {r.aggregate} needs {times}f + 3 replies a round to "
                f"withstand f hostile clients ({times * r.byzantine + 3} here), and a round has at most "
                f"{per_round} (--clients, --clients-per-round): ask for at most {max(0, (per_round - 3) // times)}, "
                "or 0 for as many as each round allows"
            )
        if not 0.0 <= r.trim < 0.5:
            raise UsageError(f"--trim is the share cut off at each end: from 0 to below 0.5, got {r.trim:g}")
        if r.max_update_norm is not None and not r.max_update_norm > 0:
            raise UsageError(f"--max-update-norm must be positive, got {r.max_update_norm:g}")
        _real(r.max_update_norm, "max_update_norm", positive=True)
        if not r.round_timeout > 0:
            raise UsageError(f"--round-timeout must be a positive number of seconds, got {r.round_timeout:g}")
        _real(
            r.round_timeout,
            "round_timeout",
            positive=True,
            hi=MAX_ROUND_TIMEOUT,
            fix=f"give seconds, at most a week ({MAX_ROUND_TIMEOUT:.0f})",
        )
        if r.min_replies is not None and r.min_replies < 1:
            raise UsageError(f"--min-replies must be a positive integer, got {r.min_replies}")
        if r.min_replies is not None and r.min_replies > per_round:
            raise UsageError(
                f"--min-replies {r.min_replies} is more than the {per_round} clients of a round (--clients, "
                "--clients-per-round): every round would be skipped"
            )
        self._check_private()

    def _check_private(self) -> None:
        """SecAgg+ and local DP: their values in range; only with fedavg, without central DP, SecAgg+ with 3 clients
        a round or more."""
        r, p = self.robustness, self.privacy
        if p.local_dp is not None and not p.local_dp > 0:
            raise UsageError(f"--local-dp is epsilon: it must be positive, got {p.local_dp:g}")
        if not p.local_dp_clip > 0 or not 0 < p.local_dp_delta < 1 or not p.secagg_clip > 0:
            raise UsageError(
                "--local-dp-clip and --secagg-clip must be positive, --local-dp-delta from 0 to 1"
            )
        for dest in ("local_dp", "local_dp_clip", "secagg_clip"):
            _real(getattr(p, dest), dest, positive=True)
        _real(p.local_dp_delta, "local_dp_delta", positive=True, hi=1.0)
        private = p.secure_aggregation or p.local_dp is not None
        if private and r.aggregate != "fedavg":
            raise UsageError(
                f"--aggregate {r.aggregate} needs each client's update, which "
                + (
                    "--secure-aggregation hides"
                    if p.secure_aggregation
                    else "Flower's local-DP path does not keep"
                )
                + ": use it without them, or --aggregate fedavg"
            )
        if private and p.dp_noise is not None:
            raise UsageError(
                "central DP (--dp-noise) does not combine with --secure-aggregation or --local-dp: pick one"
            )
        if p.secure_aggregation and (self.clients_per_round or self.clients) < 3:
            raise UsageError(
                "--secure-aggregation needs at least 3 clients a round (SecAgg+ shares keys among them)"
            )

    def shared(self, session) -> list[str]:
        """The parameters the devices share (edgetrain.federated.common.shared_and_personal), checked against the
        artifact before any process starts: a UsageError for --adapters-only on an artifact without adapters, for a
        --personal pattern that selects no parameter, and when nothing is left to share."""
        joined = ",".join(self.personal)
        try:
            shared, personal = shared_and_personal(session, joined, self.adapters_only)
        except ConfigError as e:
            raise UsageError(str(e)) from None
        names, readers = list(session.parameter_names), readers_of(session)
        for pattern in patterns(joined):
            if not personal_names(names, [pattern], readers):
                raise UsageError(
                    f"--personal {pattern!r} selects none of the artifact's {len(names)} trainable parameters "
                    f"({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}): name parameters, or the nodes "
                    "that read them, e.g. 'fc3.*'"
                )
        if shared:
            return shared
        shown = " ".join(repr(p) for p in self.personal)
        if self.adapters_only:
            raise UsageError(
                f"--adapters-only shares the LoRA adapters alone, and --personal {shown} keeps "
                f"every one of them on the devices ({', '.join(personal[:4])}{', ...' if len(personal) > 4 else ''}):"
                " nothing is left to share; narrow --personal (e.g. 'fc1.lora_*' keeps one layer's adapters), or "
                "leave out --adapters-only to share the rest of the model"
            )
        raise UsageError(
            f"--personal {shown} keeps every one of the artifact's {len(names)} trainable "
            "parameters on the devices: nothing is left to share; narrow it (e.g. 'fc3.*' keeps the layer fc3)"
        )

    def run_config(self, out: str) -> dict[str, Any]:
        """The server's run config (the app's pyproject.toml declares every key); `out` is the results' folder."""
        r, p = self.robustness, self.privacy
        run_config = {
            "artifact": os.path.abspath(self.artifact),
            "rounds": self.rounds,
            "local-epochs": self.local_epochs or (0 if self.local_steps else 1),
            "local-steps": self.local_steps or 0,
            "lr": float(self.lr or 0.0),
            "personal": ",".join(self.personal),
            "adapters-only": self.adapters_only,
            "dp-noise": float(p.dp_noise or 0.0),
            "dp-clip": float(p.dp_clip or 0.0),
            "val-data": os.path.abspath(self.val_data) if self.val_data else "",
            "out": out,
            "min-clients": self.clients,
            "seed": self.seed,
        }
        if self.clients_per_round:
            run_config["clients-per-round"] = self.clients_per_round
        run_config.update(
            {
                "aggregate": r.aggregate,
                "byzantine": r.byzantine,
                "trim": float(r.trim),
                "max-update-norm": float(r.max_update_norm or 0.0),
                "min-replies": r.min_replies or 0,
                "round-timeout": float(r.round_timeout),
                "secure-aggregation": p.secure_aggregation,
                "secagg-clip": float(p.secagg_clip),
                "local-dp-epsilon": float(p.local_dp or 0.0),
                "local-dp-clip": float(p.local_dp_clip),
                "local-dp-delta": float(p.local_dp_delta),
            }
        )
        return run_config


def _whole(value: Any, dest: str, *, lo: int = 0, hi: int | None = None, fix: str = "") -> None:
    """loaders.values.count on an option (None: not given), refused as a UsageError naming it."""
    if value is not None:
        try:
            count(value, flag(dest), lo=lo, hi=hi, fix=fix)
        except ConfigError as e:
            raise UsageError(str(e)) from None


def _real(value: Any, dest: str, *, fix: str = "", **limits: Any) -> None:
    """loaders.values.number on an option (None: not given), refused as a UsageError naming it."""
    if value is not None:
        try:
            number(value, flag(dest), fix=fix, **limits)
        except ConfigError as e:
            raise UsageError(str(e)) from None
