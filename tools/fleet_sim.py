"""A thousand phones on one machine: `edgetrain federate --simulate` (Flower's simulation engine, its Ray backend)
with the shipped fresh LeNet trained from scratch by 1,000 simulated devices, each on its own label-skewed draw of
40 of the shipped digits, 50 of them a round. Writes docs/fleet_simulation.md: clients and rounds a minute, the
peak memory of every process of the run, the accuracy, the machine and the date.

    python tools/fleet_sim.py [--clients 1000] [--clients-per-round 50] [--rounds 5] [--local-epochs 1]
        [--sim-samples 40] [--sim-workers N] [--out docs]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "edgetrain" / "data"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 2**20:.0f} GiB RAM, "
    except (OSError, ValueError, IndexError):
        mem = ""
    return (
        f"{cpu} ({os.cpu_count()} logical CPUs), {mem}{platform.system()} {platform.release()} "
        f"{platform.machine()}; Python {platform.python_version()}"
    )


def versions() -> str:
    import flwr
    import numpy
    import ray

    return f"Flower {flwr.__version__}, Ray {ray.__version__}, numpy {numpy.__version__}"


def git_head() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def run(args: argparse.Namespace, work: Path) -> tuple[dict, str, float, tuple[float, float]]:
    """(summary.json, what federate printed, seconds, load averages before and after) of one simulated run."""
    art = work / "fresh.etrain"
    cli = [sys.executable, "-m", "edgetrain.cli"]
    subprocess.run(
        [*cli, "convert", str(DATA / "digits_lenet_fresh.onnx"), "-o", str(art), "--lr", "0.05", "--batch-size", "16"],
        check=True, capture_output=True, cwd=ROOT,
    )  # fmt: skip
    command = [
        "federate", str(art), "--simulate", "--data", str(DATA / "digits"), "--val-data", str(DATA / "digits"),
        "--clients", str(args.clients), "--clients-per-round", str(args.clients_per_round),
        "--rounds", str(args.rounds), "--local-epochs", str(args.local_epochs),
        "--sim-samples", str(args.sim_samples), "--out", str(work / "sim"),
    ]  # fmt: skip
    if args.sim_workers:
        command += ["--sim-workers", str(args.sim_workers)]
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [*cli, *command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
    )
    said = []
    for line in proc.stdout:
        print(line, end="", file=sys.stderr)
        said.append(line)
    if proc.wait() != 0:
        raise SystemExit(f"edgetrain federate failed (exit {proc.returncode}); its work folder: {work}")
    seconds = time.monotonic() - t0
    summary = json.loads((work / "sim" / "summary.json").read_text())
    text = "".join(said).replace(str(work), "WORK").replace(str(ROOT) + os.sep, "")  # paths as in the README
    return summary, text, seconds, (load, os.getloadavg()[0])


def write_doc(path: Path, args: argparse.Namespace, s: dict, said: str, seconds: float, load) -> None:
    sim = s["simulation"]
    mib = 2**20
    rows = [
        ("simulated devices", f"{sim['clients']:,} ({sim['partition']}, {sim['samples_per_client']} samples each)"),
        ("a round", f"{sim['clients_per_round']:,} devices sampled, {args.local_epochs} local epoch(s) each"),
        ("rounds", f"{len(s['rounds'])}; replies per round: {', '.join(map(str, sim['replies_per_round']))}"),
        ("devices that took part", f"{len(s['clients']):,} of {sim['clients']:,}"),
        ("Ray workers", f"{sim['workers']} (one CPU each)"),
        ("**clients a minute**", f"**{sim['clients_per_minute']:,.0f}** over all rounds; "
         f"{sim['clients_per_minute_after_first']:,.0f} after the first"),
        ("**rounds a minute**", f"**{sim['rounds_per_minute']:.2f}** over all rounds; "
         f"{sim['rounds_per_minute_after_first']:.2f} after the first"),
        ("the rounds", f"{sim['rounds_seconds']:.1f} s; round by round: "
         + ", ".join(f"{r['seconds']:.1f} s" for r in s["rounds"])),
        ("the whole run", f"{sim['seconds']:.1f} s (Flower's superlink, Ray's start, the rounds, export, stop)"),
        ("CPU time", f"{sim['cpu_seconds']:,.0f} s over the run's processes: "
         f"{sim['cpu_seconds'] / max(1, sum(sim['replies_per_round'])):.2f} s per device's round, all included"),
        ("**peak memory**", f"**{sim['peak_rss_bytes'] / mib:,.0f} MiB RSS** summed over {sim['peak_processes']} "
         f"processes; {sim['peak_pss_bytes'] / mib:,.0f} MiB PSS (shared pages counted once)"),
        ("global validation accuracy", f"{100 * s['initial_val_accuracy']:.1f}% -> {100 * s['final_val_accuracy']:.1f}%"
         " (the digits' 297 test samples)"),
        ("machine load (1-minute average)", f"{load[0]:.1f} at the start, {load[1]:.1f} at the end "
         f"({os.cpu_count()} CPUs; other work shares them)"),
    ]  # fmt: skip
    command = " ".join(["python tools/fleet_sim.py", *sys.argv[1:]])
    when = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    text = f"""# A thousand phones on one machine

`{command}` on {when} (git {git_head()}).

- Machine: {machine()}; {versions()}.
- The run: `edgetrain federate fresh.etrain --simulate --clients {args.clients} --clients-per-round \
{args.clients_per_round} --rounds {args.rounds} --local-epochs {args.local_epochs} --sim-samples {args.sim_samples} \
--data edgetrain/data/digits --val-data edgetrain/data/digits` with the shipped fresh LeNet
  (`edgetrain/data/digits_lenet_fresh.onnx` converted with `--lr 0.05 --batch-size 16`). Flower's simulation engine runs
  edgetrain's own ServerApp and ClientApp, the ones a real deployment runs; each simulated device trains real numpy
  steps (edgetrain's interpreter) on its own draw of the digits (a Dirichlet(0.5) class mix), judges itself on the
  fifth it holds out, saves its checkpoint in its own folder and sends its update.
- Memory is sampled every 0.5 s over every process of the run (the launcher, Flower's superlink, the simulation
  process with the server app, Ray's services, agents and workers): RSS counts pages shared between processes in
  each of them, PSS splits them.
- Rates: a round's time is the server's, from the end of one round to the end of the next; the first round includes
  starting Ray's workers (each imports numpy, Flower and edgetrain), so the rate after it is the steady one. They
  are wall-clock rates on a machine that may be doing other work (its load is in the table); the CPU time of the
  run's processes is what the run itself cost.

| | |
|---|---|
{chr(10).join(f"| {k} | {v} |" for k, v in rows)}

What `edgetrain federate` printed:

```
{said.strip()}
```
"""
    path.write_text(text, encoding="utf-8")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--clients-per-round", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--local-epochs", type=int, default=1)
    p.add_argument("--sim-samples", type=int, default=40)
    p.add_argument("--sim-workers", type=int, help="default: federate's (this machine's CPUs, at most 4)")
    p.add_argument("--out", default=str(ROOT / "docs"), help="the folder of fleet_simulation.md")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleet-sim-") as work:
        summary, said, seconds, load = run(args, Path(work))
        doc = Path(args.out) / "fleet_simulation.md"
        write_doc(doc, args, summary, said, seconds, load)
    sim = summary["simulation"]
    print(
        f"{sim['clients']:,} simulated clients, {len(summary['rounds'])} rounds of {sim['clients_per_round']}: "
        f"{sim['clients_per_minute']:,.0f} clients a minute ({sim['clients_per_minute_after_first']:,.0f} after the "
        f"first round), {sim['rounds_per_minute']:.2f} rounds a minute, peak RSS "
        f"{sim['peak_rss_bytes'] / 2**20:,.0f} MiB; written to {doc}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
