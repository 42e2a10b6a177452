"""Accuracy of the fleet under attack: a real Flower deployment on 127.0.0.1 (edgetrain's ServerApp; clients of
tools/fleet_hostile.py, honest but for the attackers), the shipped fresh LeNet trained from scratch on the shipped
digits split among the clients, one run per aggregation rule with the same attackers, and one without them.
Writes docs/fleet_robustness.md (a table: the global validation accuracy before and after, per rule).

    python tools/fleet_robustness.py [--clients 7] [--attackers 2] [--attack sign-flip:4] [--rounds 3]
        [--local-steps 10] [--rules fedavg median trimmed-mean krum multi-krum bulyan] [--out docs]

The attackers send the global model minus 4x their honest update: finite float32 values of the right names and
shapes, their true sample counts, so the door lets them through unless --max-update-norm catches them."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
DATA = ROOT / "edgetrain" / "data"

from fleet_hostile import hostile_app  # noqa: E402

from edgetrain.federated.common import partition  # noqa: E402
from edgetrain.federated.deploy import Deployment  # noqa: E402
from loaders import open_data  # noqa: E402


def fleet(work: Path, clients: int, attackers: int, attack: str, *, scheme: str = "iid", seed: int = 0):
    """(artifact, nodes): the fresh LeNet converted at batch 10, the digits split among the clients (as 8-bit
    pixels, which the model's input pipeline scales), the last `attackers` nodes hostile: each with the attack, or
    with the comma-separated attacks in turn ("lie-shape,lie-broadcast:1000")."""
    from edgetrain.cli import main as edgetrain

    art = work / "lenet.etrain"
    if not art.exists():
        work.mkdir(parents=True, exist_ok=True)
        code = edgetrain(
            ["convert", str(DATA / "digits_lenet_fresh.onnx"), "-o", str(art), "--batch-size", "10"]
        )
        assert code == 0, "edgetrain convert failed"
    view = open_data(str(DATA / "digits"), split="train").raw()
    nodes = []
    for k, idx in enumerate(partition(view, clients, scheme, seed=seed)):
        home = work / f"client-{k}"
        home.mkdir(parents=True, exist_ok=True)
        x, y = view.get_batch(idx)
        np.savez(home / "data.npz", x=x.astype(np.uint8), y=y)
        node = {"partition-id": k, "artifact": str(art), "data": str(home / "data.npz"), "home": str(home)}
        if k >= clients - attackers:
            attacks = attack.split(",")
            node["attack"] = attacks[(k - clients + attackers) % len(attacks)]
        nodes.append(node)
    return art, nodes


def run_rule(
    work: Path,
    rule: str,
    clients: int,
    attackers: int,
    attack: str,
    rounds: int,
    local_steps: int,
    tag: str = "",
    **extra,
) -> dict[str, Any]:
    """One federation with this aggregation rule; its summary.json, plus the wall time."""
    art, nodes = fleet(work / "fleet", clients, attackers, attack)
    for n in nodes:  # each run starts from the same devices: no checkpoint of an earlier run
        for f in ("client.etck", "sent.jsonl", "last_sent.npz"):
            Path(n["home"], f).unlink(missing_ok=True)
    name = f"{rule}-{attackers}{tag}"
    out = work / f"out-{name}"
    config = {
        "artifact": str(art),
        "rounds": rounds,
        "local-epochs": 0,
        "local-steps": local_steps,
        "val-data": str(DATA / "digits"),
        "out": str(out),
        "min-clients": clients,
        "aggregate": rule,
        "round-timeout": 300.0,  # Flower's superlink can lose a reply on a busy machine: the round goes on
        **extra,
    }
    t = time.perf_counter()
    with Deployment(str(work / f"flower-{name}"), nodes) as d:
        d.run(hostile_app(str(work / "app")), config, timeout=900)
    s = json.loads((out / "summary.json").read_text())
    s["seconds"] = time.perf_counter() - t
    return s


def overhead(args) -> None:
    """SecAgg+ and local DP beside plain FedAvg: the same clients and rounds, seconds per round, the accuracy."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="fleet-privacy-") as tmp:
        work = Path(tmp)
        for tag, extra in [
            ("fedavg", {}),
            ("SecAgg+", {"secure-aggregation": True}),
            ("local DP (epsilon 50, clip 5)", {"local-dp-epsilon": 50.0, "local-dp-clip": 5.0}),
        ]:
            print(f"{tag} ...", file=sys.stderr, flush=True)
            s = run_rule(
                work,
                "fedavg",
                args.clients,
                0,
                "",
                args.rounds,
                args.local_steps,
                tag=f"-{len(rows)}",
                **extra,
            )
            per_round = [r["seconds"] for r in s["rounds"]]
            rows.append((tag, s, float(np.median(per_round))))
            print(f"  {np.median(per_round):.1f} s a round, {s['final_val_accuracy']:.1%}", file=sys.stderr)
    base = rows[0][2]
    lines = [
        "# The fleet's privacy: what SecAgg+ and local DP cost a round",
        "",
        f"`python tools/fleet_robustness.py --overhead` on {datetime.now():%Y-%m-%d}, {platform.machine()}, "
        f"{os.cpu_count()} cores: a real Flower deployment on 127.0.0.1, {args.clients} clients (the shipped "
        f"digits, an IID split), the shipped fresh LeNet (61,706 parameters), {args.rounds} rounds of "
        f"{args.local_steps} local steps. A round's seconds include the clients' training and the server's "
        "validation; SecAgg+ adds its key exchange, masking and unmasking (four message exchanges instead of one).",
        "",
        "| run | median seconds a round | vs FedAvg | accuracy after |",
        "|---|---|---|---|",
    ]
    for tag, s, sec in rows:
        lines.append(f"| {tag} | {sec:.1f} | {sec / base:.2f}x | {s['final_val_accuracy']:.1%} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fleet_privacy.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=7)
    ap.add_argument("--attackers", type=int, default=2)
    ap.add_argument("--attack", default="sign-flip:4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--local-steps", type=int, default=20)
    ap.add_argument(
        "--rules",
        nargs="+",
        default=["fedavg", "median", "trimmed-mean", "trimmed-mean:0.3", "krum", "multi-krum", "bulyan"],
        help="rules to run under attack; trimmed-mean:T cuts the share T at each end (default 0.2)",
    )
    ap.add_argument("--out", default=str(ROOT / "docs"))
    ap.add_argument(
        "--overhead", action="store_true", help="SecAgg+ and local DP beside FedAvg (fleet_privacy.md)"
    )
    args = ap.parse_args()
    if args.overhead:
        return overhead(args)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fleet-robustness-") as tmp:
        work = Path(tmp)
        plan = [("fedavg", 0)] + [(r, args.attackers) for r in args.rules]
        for rule, attackers in plan:
            print(f"{rule} with {attackers} attacker(s) of {args.clients} ...", file=sys.stderr, flush=True)
            name, _, trim = rule.partition(":")  # trimmed-mean:0.3 - the share cut at each end
            extra = {"trim": float(trim)} if trim else {}
            s = run_rule(
                work,
                name,
                args.clients,
                attackers,
                args.attack,
                args.rounds,
                args.local_steps,
                tag=trim,
                **extra,
            )
            rows.append((rule, attackers, s))
            print(
                f"  {s['initial_val_accuracy']:.1%} -> {s['final_val_accuracy']:.1%} in {s['seconds']:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    lines = [
        "# The fleet under attack: global accuracy per aggregation rule",
        "",
        f"`python tools/fleet_robustness.py` on {datetime.now():%Y-%m-%d}, {platform.machine()}, "
        f"{os.cpu_count()} cores: a real Flower deployment on 127.0.0.1, {args.clients} clients (the shipped digits, "
        f"an IID split), the shipped fresh LeNet trained from scratch, {args.rounds} rounds of {args.local_steps} "
        f"local steps. Attackers send the global model minus 4x their honest update (`{args.attack}`): finite "
        "float32 values of the right names and shapes with their true sample counts, so the door lets them "
        "through. Global validation accuracy on the digits' test split.",
        "",
        "| rule | attackers | accuracy before | after | per round | refused | skipped | wall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rule, attackers, s in rows:
        per_round = " / ".join(f"{r['val_accuracy']:.1%}" for r in s["rounds"])
        lines.append(
            f"| {rule} | {attackers} of {args.clients} | {s['initial_val_accuracy']:.1%} | "
            f"**{s['final_val_accuracy']:.1%}** | {per_round} | {len(s['refused'])} | {len(s['skipped'])} | "
            f"{s['seconds']:.0f} s |"
        )
    lines += [
        "",
        "Krum keeps one client's model a round (the one closest to its neighbours), multi-krum the mean of the "
        "n - f closest, Bulyan multi-krum's choice then a trimmed mean; median and trimmed-mean work per "
        "coordinate. With f unset (`--byzantine 0`) the rules assume as many attackers as the round's replies "
        "allow (Krum: (n - 3) / 2, Bulyan: (n - 3) / 4). A trimmed mean withstands as many attackers as it cuts "
        "at each end: `--trim 0.2` cuts one value of seven, `--trim 0.3` two.",
        "",
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fleet_robustness.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
