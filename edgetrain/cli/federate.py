"""`edgetrain federate`: an artifact and a dataset -> a real Flower federation on 127.0.0.1 (one superlink, K
supernodes, each a device with its own share of the data and its own home), FedAvg rounds with optional personal
layers and central differential privacy, then DIR/summary.json, DIR/global.etck, DIR/global.onnx and
DIR/accuracy.png; a line per round while it runs, a readable summary at the end; every process stopped after.
(The command's arguments are in edgetrain.cli.parser.)"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

from edgetrain.core.errors import EdgeTrainError, UsageError
from edgetrain.federated.common import partition
from edgetrain.federated.deploy import APP_DIR, Deployment
from edgetrain.runtime.feeding import DataOptions, open_feed
from edgetrain.runtime.progress import duration, percent

from .common import open_session


def _check(args: argparse.Namespace) -> None:
    for flag in ("clients", "rounds", "local_epochs", "local_steps"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be a positive integer, got {v}")
    if (args.dp_noise is None) != (args.dp_clip is None):
        raise UsageError("differential privacy needs both --dp-noise and --dp-clip")
    if args.dp_noise is not None and (args.dp_noise <= 0 or args.dp_clip <= 0):
        raise UsageError("--dp-noise and --dp-clip must be positive")
    try:
        import flwr  # noqa: F401  (optional, the federated extra: only to say so when it is missing)
    except ImportError:
        raise EdgeTrainError(
            "edgetrain federate runs Flower, which is not installed: pip install 'edgetrain[federated]'"
        ) from None


def _clients(args: argparse.Namespace, sess, out: str) -> list[dict[str, Any]]:
    """Splits --data among the clients; each gets a home holding its share as an .npz of the samples as read
    (raw: each device applies the model's input pipeline itself, as it does to its own data; storing them
    transformed would have them scaled twice), as a device would hold its own data."""
    feed = open_feed(args.data, "train", sess, DataOptions())
    for note in feed.notices:
        print(f"note: {note}", file=sys.stderr)
    parts = partition(feed.view, args.clients, args.partition, seed=args.seed)
    nodes = []
    for k, idx in enumerate(parts):
        home = os.path.join(out, "clients", f"client-{k}")
        os.makedirs(home, exist_ok=True)
        x, y = feed.view.get_batch(idx)
        data = os.path.join(home, "data.npz")
        np.savez(data, x=x, y=y)
        nodes.append(
            {"partition-id": k, "artifact": os.path.abspath(args.artifact), "data": data, "home": home}
        )
    return nodes


def run_federate(args: argparse.Namespace) -> int:
    _check(args)
    sess = open_session(args.artifact)
    out = os.path.abspath(args.out)
    if os.path.exists(os.path.join(out, "summary.json")):
        raise UsageError(f"{out} holds the results of an earlier federation: pick a new --out folder")
    os.makedirs(out, exist_ok=True)
    nodes = _clients(args, sess, out)
    run_config = {
        "artifact": os.path.abspath(args.artifact),
        "rounds": args.rounds,
        "local-epochs": args.local_epochs or (0 if args.local_steps else 1),
        "local-steps": args.local_steps or 0,
        "lr": float(args.lr or 0.0),
        "personal": ",".join(args.personal or []),
        "dp-noise": float(args.dp_noise or 0.0),
        "dp-clip": float(args.dp_clip or 0.0),
        "val-data": os.path.abspath(args.val_data) if args.val_data else "",
        "out": out,
        "min-clients": args.clients,
        "seed": args.seed,
    }
    sizes = ", ".join(str(len(_samples(n["data"]))) for n in nodes)
    print(
        f"federating {args.artifact}: {args.clients} clients ({args.partition}; {sizes} samples), "
        f"{args.rounds} rounds on a Flower deployment on 127.0.0.1 (logs in {_shown(os.path.join(out, 'flower'))})",
        file=sys.stderr,
    )
    t0 = time.perf_counter()
    progress = _Progress(out, args.rounds)
    with Deployment(os.path.join(out, "flower"), nodes) as d:
        d.run(APP_DIR, run_config, on_line=progress)
    progress.flush()
    summary = json.load(open(os.path.join(out, "summary.json"), encoding="utf-8"))
    png = _plot(summary, out)
    _print_summary(summary, out, png, time.perf_counter() - t0)
    return 0


def _samples(path: str):
    with np.load(path, allow_pickle=False) as z:  # numpy's default, said: an object array is refused
        return z["y"]


class _Progress:
    """Prints a line per round as the server app reports it (progress.jsonl), while `flwr run` streams."""

    def __init__(self, out: str, rounds: int):
        self.path, self.rounds, self.seen = os.path.join(out, "progress.jsonl"), rounds, 0

    def __call__(self, line: str) -> None:
        if "refused a reply" in line:
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
                print(f"round {r['round']}/{self.rounds}: {what} ({duration(r['seconds'])})", file=sys.stderr)
        self.seen = len(lines)


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


def _draw_clients(ax, clients: dict[int, list[tuple[int, float]]]) -> None:
    many = len(clients) > len(CLIENT_MARKERS)
    shift = 0.0 if many else min(0.08, 0.5 / max(len(clients), 1))
    for k, (cid, points) in enumerate(sorted(clients.items())):
        if not points:
            continue
        xs = [x + (k - (len(clients) - 1) / 2) * shift for x, _ in points]
        ys = [y for _, y in points]
        if many:  # a crowd: one grey label for all of them
            ax.plot(
                xs,
                ys,
                color="0.6",
                lw=0.8,
                alpha=0.6,
                zorder=3,
                label="clients, their own held-out data" if k == 0 else None,
            )
            continue
        ax.plot(
            xs, ys, color=f"C{k}", lw=1.3, marker=CLIENT_MARKERS[k], ms=5, zorder=3,
            label=f"client {cid}, its own held-out data",
        )  # fmt: skip


def _print_summary(s: dict, out: str, png: str | None, seconds: float) -> None:
    head = f"federated {len(s['rounds'])} rounds with {len(s['clients'])} clients in {duration(seconds)}"
    if s.get("initial_val_accuracy") is not None:
        before, after = percent(s["initial_val_accuracy"]), percent(s["final_val_accuracy"])
        head += f": global validation accuracy {before} -> {after}"
    print(head)
    for c in s["clients"]:
        print(
            f"  client {c['id']}: {c['num_examples']:,} samples; its own validation "
            f"{percent(c['local_val_accuracy_before'])} -> {percent(c['local_val_accuracy_after'])}"
        )
    if s.get("personal"):
        print(
            f"  personal    {len(s['personal'])} parameters stayed on the devices: {', '.join(s['personal'][:6])}"
        )
    if s.get("privacy"):
        p = s["privacy"]
        print(
            f"  privacy     {p['mechanism']}: noise multiplier {p['noise_multiplier']:g}, clipping norm "
            f"{p['clipping_norm']:g} (noise stddev {p['noise_stddev']:g})"
        )
    for r in s.get("refused", []):
        print(f"  refused     round {r['round']}, node {r['node']}: {r['reason']}")
    print(
        f"  global      {_shown(s['global_checkpoint'])}"
        + (f" and {_shown(s['global_onnx'])}" if s.get("global_onnx") else "")
    )
    print(
        f"  summary     {_shown(os.path.join(out, 'summary.json'))}"
        + (f"; plot {_shown(png)}" if png else "")
    )


def _shown(path: str) -> str:
    """A path as the user would type it: relative to the working folder when it lies inside it."""
    rel = os.path.relpath(path)
    return path if rel.startswith(os.pardir) else rel


__all__ = ["run_federate"]
