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
    """Splits --data among the clients; each gets a home holding its share as an .npz (in the model's input
    form), as a device would hold its own data."""
    feed = open_feed(args.data, "train", sess, DataOptions())
    for note in feed.notices:
        print(f"note: {note}", file=sys.stderr)
    parts = partition(feed.view, args.clients, args.partition, seed=args.seed)
    nodes = []
    for k, idx in enumerate(parts):
        home = os.path.join(out, "clients", f"client-{k}")
        os.makedirs(home, exist_ok=True)
        x, y = feed.transform(*feed.view.get_batch(idx))
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
        f"{args.rounds} rounds on a Flower deployment on 127.0.0.1 (logs in {out}/flower)",
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


def _plot(summary: dict, out: str) -> str | None:
    rounds = [r for r in summary["rounds"] if r.get("val_accuracy") is not None]
    if not rounds or summary.get("initial_val_accuracy") is None:
        return None
    try:
        import matplotlib  # optional: the plot is left out without matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # optional, as above
    except ImportError:
        return None
    xs = [0] + [r["round"] for r in rounds]
    ys = [100 * summary["initial_val_accuracy"]] + [100 * r["val_accuracy"] for r in rounds]
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
    label = "global model, server's validation data"
    if summary.get("personal"):  # the server holds no personal layers: its model has the initial ones
        label = "global model (with the initial personal layers), server's validation data"
    ax.plot(xs, ys, marker="o", label=label)
    for c in summary["clients"]:
        per = [r.get("val-accuracy-after") for r in c.get("rounds", [])]
        if per and all(v is not None and v >= 0 for v in per):
            ax.plot(
                range(1, len(per) + 1),
                [100 * v for v in per],
                alpha=0.5,
                lw=1,
                label=f"client {c['id']}, own",
            )
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy (%)")
    ax.set_xticks(xs)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = os.path.join(out, "accuracy.png")
    fig.savefig(path)
    plt.close(fig)
    return path


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
        f"  global      {s['global_checkpoint']}"
        + (f" and {s['global_onnx']}" if s.get("global_onnx") else "")
    )
    print(f"  summary     {os.path.join(out, 'summary.json')}" + (f"; plot {png}" if png else ""))


__all__ = ["run_federate"]
