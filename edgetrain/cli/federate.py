"""`edgetrain federate`: an artifact and a dataset -> a real Flower federation on 127.0.0.1 (one superlink, K
supernodes, each a device with its own share of the data and its own home), or with --simulate K simulated devices
on Flower's simulation engine (each drawing its own non-IID samples of the data), FedAvg rounds with optional
personal layers and central differential privacy, then DIR/summary.json, DIR/global.etck, DIR/global.onnx and
DIR/accuracy.png; a line per round while it runs (with the bytes each client sent and received against the full
model's), a readable summary at the end (a simulation's with its speed and peak memory); every process stopped
after. --adapters-only shares a LoRA artifact's adapters alone. (The options are in edgetrain.cli.options, their
configuration in edgetrain.cli.federate_config.)"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

from edgetrain.core.atomic import atomic_write
from edgetrain.core.errors import EdgeTrainError, UsageError
from edgetrain.federated.common import model_bytes, partition
from edgetrain.federated.deploy import APP_DIR, Deployment
from edgetrain.runtime.feeding import DataOptions, open_feed
from edgetrain.runtime.progress import duration, mb, percent
from edgetrain.runtime.trainer import session_batch

from .common import federation_apart, open_session
from .federate_config import FederateConfig


def _flower_installed() -> None:
    try:
        import flwr  # noqa: F401  (optional, the federated extra: only to say so when it is missing)
    except ImportError:
        raise EdgeTrainError(
            "edgetrain federate runs Flower, which is not installed: pip install 'edgetrain[federated]'"
        ) from None


def _clients(cfg: FederateConfig, sess, out: str) -> list[dict[str, Any]]:
    """Splits --data among the clients; each gets a home holding its share as an .npz of the samples as read
    (raw: each device applies the model's input pipeline itself, as it does to its own data; storing them
    transformed would have them scaled twice), as a device would hold its own data."""
    feed = open_feed(cfg.data, "train", sess, DataOptions())
    for note in feed.notices:
        print(f"note: {note}", file=sys.stderr)
    parts = partition(feed.view, cfg.clients, cfg.partition or "iid", seed=cfg.seed)
    nodes = []
    for k, idx in enumerate(parts):
        home = os.path.join(out, "clients", f"client-{k}")
        os.makedirs(home, exist_ok=True)
        x, y = feed.view.get_batch(idx)
        data = os.path.join(home, "data.npz")
        np.savez(data, x=x, y=y)
        nodes.append(
            {"partition-id": k, "artifact": os.path.abspath(cfg.artifact), "data": data, "home": home}
        )
    return nodes


def run_federate(args: argparse.Namespace) -> int:
    cfg = FederateConfig.from_args(args)
    federation_apart(cfg.artifact, cfg.data, cfg.val_data, cfg.out)
    _flower_installed()
    sess = open_session(cfg.artifact)
    cfg.shared(sess)  # what the devices share: refused here, before any process starts, when it is nothing
    out = os.path.abspath(cfg.out)
    if os.path.exists(os.path.join(out, "summary.json")):
        raise UsageError(f"{out} holds the results of an earlier federation: pick a new --out folder")
    os.makedirs(out, exist_ok=True)
    run_config = cfg.run_config(out)
    t0 = time.perf_counter()
    progress = _Progress(out, cfg.rounds, model_bytes(sess))
    if cfg.simulation.simulate:
        speed = _simulate(cfg, sess, out, run_config, progress)
    else:
        _deploy(cfg, sess, out, run_config, progress)
        speed = None
    progress.flush()
    seconds = time.perf_counter() - t0
    summary = json.load(open(os.path.join(out, "summary.json"), encoding="utf-8"))
    if speed is not None:  # the server app wrote the rest; the speed and memory are the launcher's to measure
        summary["simulation"] = {**speed, **_speed(summary, seconds)}
        atomic_write(
            os.path.join(out, "summary.json"), json.dumps(summary, indent=2, allow_nan=False).encode()
        )
    png = _plot(summary, out)
    _print_summary(summary, out, png, seconds)
    return 0


def run_config_of(cfg: FederateConfig | argparse.Namespace, out: str) -> dict[str, Any]:
    """The server's run config (the app's pyproject.toml declares every key) of a federation, or of a parsed
    `edgetrain federate` command line (read into its FederateConfig first)."""
    if isinstance(cfg, argparse.Namespace):
        cfg = FederateConfig.from_args(cfg)
    return cfg.run_config(out)


def _deploy(cfg: FederateConfig, sess, out: str, run_config: dict[str, Any], progress) -> None:
    nodes = _clients(cfg, sess, out)
    sizes = ", ".join(str(len(_samples(n["data"]))) for n in nodes)
    print(
        f"federating {cfg.artifact}: {cfg.clients} clients ({cfg.partition or 'iid'}; {sizes} samples), "
        f"{cfg.rounds} rounds on a Flower deployment on 127.0.0.1 (logs in {_shown(os.path.join(out, 'flower'))})",
        file=sys.stderr,
    )
    with Deployment(os.path.join(out, "flower"), nodes) as d:
        d.run(APP_DIR, run_config, on_line=progress)


def _simulate(cfg: FederateConfig, sess, out: str, run_config: dict[str, Any], progress) -> dict[str, Any]:
    """The run on Flower's simulation engine: each simulated device takes its own draw of --data (see
    edgetrain.federated.simulation) and its home in OUT/clients; returns how the run was set up and its peak
    memory."""
    from edgetrain.federated.simulation import Simulation, shard  # Ray is needed only here

    scheme = cfg.partition or "label-skew"
    feed = open_feed(cfg.data, "train", sess, DataOptions())
    for note in feed.notices:
        print(f"note: {note}", file=sys.stderr)
    n, samples = feed.view.size(), cfg.simulation.samples or 40
    if samples > n:
        raise UsageError(f"--sim-samples {samples} is more than the {n} samples of {cfg.data}")
    shard(
        feed.view.labels(), 0, samples=samples, scheme=scheme, seed=cfg.seed
    )  # refuses what cannot be drawn
    held_out = int(round(0.2 * samples))  # as each device splits its own data (client.py: val-fraction)
    batch = session_batch(sess) or 32
    if samples - held_out < batch:
        raise UsageError(
            f"--sim-samples {samples} leaves each device {samples - held_out} samples to train on after the fifth "
            f"it holds out, less than the artifact's batch of {batch}: ask for at least {-(-batch * 5 // 4)}"
        )
    workers = cfg.simulation.workers or max(1, min(os.cpu_count() or 1, 4))
    per_round = cfg.clients_per_round or cfg.clients
    run_config.update(
        {
            "sim-data": os.path.abspath(cfg.data),
            "sim-partition": scheme,
            "sim-samples": samples,
            "sim-home": os.path.join(out, "clients"),
        }
    )
    print(
        f"federating {cfg.artifact}: {cfg.clients:,} simulated clients ({scheme}; {samples} samples each, "
        f"drawn from {cfg.data}), {per_round:,} a round, {cfg.rounds} rounds on Flower's simulation engine "
        f"(Ray, {workers} workers; logs in {_shown(os.path.join(out, 'flower'))})",
        file=sys.stderr,
    )
    with Simulation(os.path.join(out, "flower"), clients=cfg.clients, workers=workers) as sim:
        sim.run(APP_DIR, run_config, on_line=progress)
    return {
        "engine": "Flower's simulation engine (Ray backend)",
        "clients": cfg.clients,
        "clients_per_round": per_round,
        "partition": scheme,
        "samples_per_client": samples,
        "workers": workers,
        "peak_rss_bytes": sim.peak_rss,
        "peak_pss_bytes": sim.peak_pss,
        "peak_processes": sim.memory.peak_processes,
        "cpu_seconds": round(sim.memory.cpu_seconds, 1),
    }


def _speed(summary: dict, seconds: float) -> dict[str, Any]:
    """Rounds and clients a minute, from the rounds' own times (the server's, round by round; the first round
    includes starting Ray's workers) and the replies each round had."""
    rounds = summary.get("rounds", [])
    replies: dict[int, int] = {}
    for c in summary.get("clients", []):
        for r in c.get("rounds", []):
            replies[int(r["round"])] = replies.get(int(r["round"]), 0) + 1
    busy = sum(float(r.get("seconds", 0.0)) for r in rounds)
    later = [r for r in rounds if r.get("round", 0) > 1]
    later_busy = sum(float(r.get("seconds", 0.0)) for r in later)
    return {
        "seconds": round(seconds, 3),
        "rounds_seconds": round(busy, 3),
        "replies_per_round": [replies.get(int(r["round"]), 0) for r in rounds],
        "rounds_per_minute": round(60 * len(rounds) / busy, 3) if busy else None,
        "clients_per_minute": round(60 * sum(replies.values()) / busy, 1) if busy else None,
        "rounds_per_minute_after_first": round(60 * len(later) / later_busy, 3) if later_busy else None,
        "clients_per_minute_after_first": (
            round(60 * sum(replies.get(int(r["round"]), 0) for r in later) / later_busy, 1)
            if later_busy
            else None
        ),
    }


def _samples(path: str):
    with np.load(path, allow_pickle=False) as z:  # numpy's default, said: an object array is refused
        return z["y"]


class _Progress:
    """Prints a line per round as the server app reports it (progress.jsonl), while `flwr run` streams."""

    def __init__(self, out: str, rounds: int, model: int = 0):
        self.path, self.rounds, self.seen = os.path.join(out, "progress.jsonl"), rounds, 0
        self.model = model  # the full model's weights, in bytes: each round's payload is said against it

    def __call__(self, line: str) -> None:
        if "refused a reply" in line or "skipped, the global model stays" in line:
            print("  " + line.split("INFO")[-1].strip(" :"), file=sys.stderr)
        self.flush()

    def flush(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                lines = f.readlines()
        except FileNotFoundError:
            return
        for text in lines[self.seen :]:
            r = json.loads(text)
            acc = r.get("val_accuracy")
            what = f"global validation accuracy {percent(acc)}" if acc is not None else "done"
            if r["round"] == 0:
                print(f"round 0/{self.rounds}: the initial model: {what}", file=sys.stderr)
            else:
                door = ""
                if r.get("refused") or r.get(
                    "skipped"
                ):  # the door's count: said only when it refused something
                    door = f"; {r.get('accepted', 0)} of {r.get('replies', 0)} replies accepted"
                    door += ", round skipped" if r.get("skipped") else ""
                print(
                    f"round {r['round']}/{self.rounds}: {what} ({duration(r['seconds'])}{door}"
                    f"{payload_text(r.get('payload_bytes'), self.model)})",
                    file=sys.stderr,
                )
        self.seen = len(lines)


def payload_text(p: dict | None, model: int) -> str:
    """A round's payload, said per client against the full model: '; 12.8 KiB sent, 12.8 KiB received per
    client (5.3% of the model's 241.0 KiB)'; "" when the round recorded none."""
    if not p:
        return ""
    text = f"; {mb(p['per_client_sent'])} sent, {mb(p['per_client_received'])} received per client"
    if model:
        share = 100 * max(p["per_client_sent"], p["per_client_received"]) / model
        text += f" ({share:.1f}% of the model's {mb(model)})"
    return text


# Clients: one color and one marker each (up to this many; more share one grey label), drawn above the global line
# and a little apart along x, so that clients with the same accuracy in a round stay visible side by side.
CLIENT_MARKERS = "os^vDP<>Xd"  # with matplotlib's ten colors C0..C9


def _plot(summary: dict, out: str) -> str | None:
    """accuracy.png: the global model on the server's validation data and each client's own held-out data, round
    by round (round 0: before any training); None without matplotlib or anything to draw."""
    glob = _global_series(summary)
    clients = _client_series(summary)
    if not glob and not any(clients.values()):
        return None
    try:
        import matplotlib  # optional: the plot is left out without matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # optional, as above
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    if glob:
        label = "global model, server's validation data"
        if summary.get("personal"):  # the server holds no personal layers: its model has the initial ones
            label = "global model (initial personal layers), server's validation data"
        xs, ys = zip(*glob)
        # a wide grey band under the clients: where they coincide with it, it shows around them
        ax.plot(xs, ys, color="0.3", lw=6, alpha=0.3, marker="s", ms=10, zorder=2, label=label)
    if len(clients) > len(CLIENT_MARKERS):  # a crowd: the spread of the round's clients, not a line each
        band = _client_band(summary)
        _draw_band(ax, band)
        rounds = sorted({x for x, _ in glob} | set(band))
    else:
        _draw_clients(ax, clients)
        rounds = sorted({x for x, _ in glob} | {x for s in clients.values() for x, _ in s})
    ax.set_xticks(rounds)
    ax.set_xlim(min(rounds) - 0.4, max(rounds) + 0.4)
    ax.set_ylim(0, 104)
    ax.set_yticks(range(0, 101, 20))
    ax.set_xlabel("round (0: before any training)")
    ax.set_ylabel("accuracy (%)")
    ax.grid(alpha=0.3)
    ax.set_title("federated training: accuracy by round", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    fig.tight_layout()
    path = os.path.join(out, "accuracy.png")
    fig.savefig(path)
    plt.close(fig)
    return path


def _global_series(summary: dict) -> list[tuple[int, float]]:
    if summary.get("initial_val_accuracy") is None:
        return []
    rounds = [r for r in summary["rounds"] if r.get("val_accuracy") is not None]
    return [(0, 100 * summary["initial_val_accuracy"])] + [
        (r["round"], 100 * r["val_accuracy"]) for r in rounds
    ]


def _client_series(summary: dict) -> dict[int, list[tuple[int, float]]]:
    """Client id -> (round, its accuracy on its own held-out data): round 0 is its first round's judgement before
    training (the initial model), round r what it holds after training in round r (rounds it missed left out)."""
    series = {}
    for c in summary["clients"]:
        points = []
        for r in sorted(c.get("rounds", []), key=lambda r: r.get("round", 0)):
            before, after = r.get("val-accuracy-before"), r.get("val-accuracy-after")
            if not points and before is not None and before >= 0:
                points.append((0, 100 * before))
            if (
                after is not None and after >= 0
            ):  # -1: the client could not judge (metric records hold numbers)
                points.append((int(r["round"]), 100 * after))
        series[c["id"]] = points
    return series


def _client_band(summary: dict) -> dict[int, list[float]]:
    """Round -> the accuracies (%) of the round's clients on their own held-out data after training in it; round 0:
    the first round's clients before it (the initial model on their data)."""
    band: dict[int, list[float]] = {}
    for c in summary["clients"]:
        for r in c.get("rounds", []):
            before, after = r.get("val-accuracy-before"), r.get("val-accuracy-after")
            if int(r.get("round", 0)) == 1 and before is not None and before >= 0:
                band.setdefault(0, []).append(100 * before)
            if after is not None and after >= 0:
                band.setdefault(int(r["round"]), []).append(100 * after)
    return dict(sorted(band.items()))


def _draw_band(ax, band: dict[int, list[float]]) -> None:
    if not band:
        return
    xs = list(band)
    q = {p: [float(np.percentile(band[x], p)) for x in xs] for p in (10, 25, 50, 75, 90)}
    n = max(len(v) for v in band.values())
    ax.fill_between(
        xs, q[10], q[90], color="C0", alpha=0.15, lw=0, zorder=3, label="clients: 10-90% of a round's"
    )
    ax.fill_between(xs, q[25], q[75], color="C0", alpha=0.3, lw=0, zorder=3, label="clients: 25-75%")
    ax.plot(
        xs, q[50], color="C0", lw=1.5, marker="o", ms=4, zorder=4,
        label=f"clients: median (their own held-out data, up to {n:,} a round)",
    )  # fmt: skip


def _draw_clients(ax, clients: dict[int, list[tuple[int, float]]]) -> None:
    shift = min(0.08, 0.5 / max(len(clients), 1))
    for k, (cid, points) in enumerate(sorted(clients.items())):
        if not points:
            continue
        xs = [x + (k - (len(clients) - 1) / 2) * shift for x, _ in points]
        ys = [y for _, y in points]
        ax.plot(
            xs, ys, color=f"C{k}", lw=1.3, marker=CLIENT_MARKERS[k], ms=5, zorder=3,
            label=f"client {cid}, its own held-out data",
        )  # fmt: skip


def _print_summary(s: dict, out: str, png: str | None, seconds: float) -> None:
    sim = s.get("simulation")
    who = f"{len(s['clients'])} clients"
    if sim:
        who = f"{len(s['clients']):,} of {sim['clients']:,} simulated clients"
    head = f"federated {len(s['rounds'])} rounds with {who} in {duration(seconds)}"
    if s.get("initial_val_accuracy") is not None:
        before, after = percent(s["initial_val_accuracy"]), percent(s["final_val_accuracy"])
        head += f": global validation accuracy {before} -> {after}"
    print(head)
    if sim:
        _print_speed(sim)
    shown = s["clients"] if len(s["clients"]) <= len(CLIENT_MARKERS) else s["clients"][:3]
    if len(shown) < len(s["clients"]):
        _print_spread(s)
    for c in shown:
        print(
            f"  client {c['id']}: {c['num_examples']:,} samples; its own validation "
            f"{percent(c['local_val_accuracy_before'])} -> {percent(c['local_val_accuracy_after'])}"
        )
    if len(shown) < len(s["clients"]):
        print(f"  ... and {len(s['clients']) - len(shown):,} more clients in summary.json")
    if s.get("personal"):
        print(
            f"  personal    {len(s['personal'])} parameters stayed on the devices: {', '.join(s['personal'][:6])}"
        )
    _print_payload(s)
    if s.get("privacy"):
        p = s["privacy"]
        print(
            f"  privacy     {p['mechanism']}: noise multiplier {p['noise_multiplier']:g}, clipping norm "
            f"{p['clipping_norm']:g} (noise stddev {p['noise_stddev']:g})"
        )
    if s.get("secure_aggregation"):
        q = s["secure_aggregation"]
        print(
            f"  secure      {q['protocol']}: the server saw only each round's sum; parameters clipped to "
            f"+-{q['clipping_range']:g} and quantized to {q['quantization_range']:,} levels"
        )
    if s.get("local_dp"):
        d = s["local_dp"]
        print(
            f"  local DP    {d['mechanism']}: epsilon {d['epsilon']:g}, delta {d['delta']:g} per round, updates "
            f"clipped to {d['clipping_norm']:g} (noise stddev {d['noise_stddev']:.3g})"
        )
    rule = s.get("aggregate") or {}
    if rule.get("rule", "fedavg") != "fedavg" or rule.get("max_update_norm"):
        what = f"{rule.get('rule')} ({rule.get('strategy')})"
        if rule.get("max_update_norm"):
            what += f"; updates of L2 norm above {rule['max_update_norm']:g} refused"
        print(f"  aggregate   {what}")
    refused = s.get("refused", [])
    for r in refused[:10]:
        print(f"  refused     round {r['round']}, node {r['node']}: {r['reason']}")
    if len(refused) > 10:
        print(f"  ... and {len(refused) - 10:,} more refused replies in summary.json")
    for r in s.get("skipped", []):
        print(f"  skipped     round {r['round']}: {r['reason']}")
    print(
        f"  global      {_shown(s['global_checkpoint'])}"
        + (f" and {_shown(s['global_onnx'])}" if s.get("global_onnx") else "")
    )
    print(
        f"  summary     {_shown(os.path.join(out, 'summary.json'))}"
        + (f"; plot {_shown(png)}" if png else "")
    )


def _print_payload(s: dict) -> None:
    """What crossed the network a round, per client, against the full model; with adapters, which and where the
    global ones are."""
    p, model = s.get("payload_bytes"), s.get("model_bytes")
    if p and model:
        rounds = len(s.get("rounds", []))
        what = "the LoRA adapters" if s.get("adapters_only") else "the shared parameters"
        print(
            f"  payload     {mb(p['per_client_sent'])} sent and {mb(p['per_client_received'])} received per client "
            f"a round ({what}: {100 * p['share_of_model']:.1f}% of the full model's {mb(model)}); "
            f"{mb(p['total'])} in all over {rounds} round{'s' * (rounds != 1)}"
        )
    a = s.get("adapters")
    if a:
        where = f"; global adapters {_shown(s['global_adapters'])}" if s.get("global_adapters") else ""
        only = "only they crossed the network, the base model never did" if s.get("adapters_only") else ""
        print(
            f"  adapters    LoRA rank {a['rank']} (alpha {a['alpha']:g}) on {len(a['layers'])} layer(s), "
            f"{mb(a['bytes'])}{'; ' + only if only else ''}{where}"
        )


def _print_speed(sim: dict) -> None:
    replies = sim.get("replies_per_round") or []
    each = f"{replies[0]:,}" if replies and len(set(replies)) == 1 else "/".join(map(str, replies))
    if sim.get("rounds_per_minute") is not None:
        print(
            f"  speed       {sim['rounds_per_minute']:.2f} rounds a minute, {sim['clients_per_minute']:,.0f} clients "
            f"a minute ({each} a round, {sim['workers']} Ray workers; the rounds {duration(sim['rounds_seconds'])} "
            f"of {duration(sim['seconds'])}, {sim['cpu_seconds']:,.0f} CPU seconds)"
        )
    print(
        f"  memory      peak {_mib(sim['peak_rss_bytes'])} RSS summed over {sim['peak_processes']} processes "
        f"({_mib(sim['peak_pss_bytes'])} PSS: shared pages counted once)"
    )


def _print_spread(s: dict) -> None:
    """The clients' own accuracies as quartiles: the first they had and the last."""
    before = [
        c["local_val_accuracy_before"] for c in s["clients"] if c["local_val_accuracy_before"] is not None
    ]
    after = [c["local_val_accuracy_after"] for c in s["clients"] if c["local_val_accuracy_after"] is not None]
    if not after:
        return

    def spread(v: list[float]) -> str:
        lo, mid, hi = np.percentile(v, [25, 50, 75])
        return f"median {percent(mid)} (quartiles {percent(lo)}-{percent(hi)})"

    print(
        f"  clients     {len(s['clients']):,} took part; their own validation before their first round "
        f"{spread(before) if before else '?'}, after their last {spread(after)}"
    )


def _mib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _shown(path: str) -> str:
    """A path as the user would type it: relative to the working folder when it lies inside it."""
    rel = os.path.relpath(path)
    return path if rel.startswith(os.pardir) else rel


__all__ = ["run_federate"]
