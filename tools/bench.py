"""Benchmark: edgetrain's training step beside onnxruntime-training 1.19.2 and PyTorch eager (issue 25's judge).
Configurations (tools/bench/configs.py) -> docs/benchmarks.md, docs/benchmarks.json and docs/benchmarks.png.

    python tools/bench.py [--quick] [--configs NAME|GLOB ...] [--repeats N] [--runtimes ...] [--out DIR] [--name STEM]

Every runtime trains the same ONNX model from the same initial weights on the same batch, 1 thread each, every
(configuration, runtime) in its own fresh process (tools/bench/worker.py), the runtimes alternated over N rounds.
edgetrain runs twice, each in its own worker: with SGD momentum 0.9 and weight decay (as PyTorch runs) and with
plain SGD (as onnxruntime-training 1.19.2, which has nothing else, runs): the like-for-like ratio. onnxruntime-
training lives in its own virtual environment (.venv-ort-training, installed on demand: a ~800 MB wheel). --quick is
the CI smoke run: MLP and LeNet at batch 32, a few steps, edgetrain (both optimizers) and PyTorch only, written to a
temporary folder (or --out), never over docs/. The default run holds every row of issue 25's table: MLP, LeNet, the
torchvision CNNs, the recurrent classifiers (LSTM, GRU, 2-layer biLSTM), the ViT and the ConvNeXt-style net, full
and head-only; extras (lstm-b1-full) run when named:
    python tools/bench.py --configs 'vit*' --repeats 1"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # before numpy loads its BLAS
    os.environ[_var] = "1"

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import datetime  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "tools" / "bench"
sys.path.insert(0, str(HERE))

import configs  # noqa: E402
import report  # noqa: E402

WORKER_TIMEOUT_S = 1800


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    harness: dict[str, float] = {}
    runtimes = available_runtimes(args)
    chosen = without_torch_models(configs.select(args.configs, quick=args.quick))
    out = output_dir(args)
    stem = args.name or "benchmarks"
    print(
        f"bench: {len(chosen)} configurations x {'/'.join(runtimes)}, {args.repeats} rounds -> {out}/{stem}.*",
        flush=True,
    )
    t0 = time.perf_counter()
    gemm = gemm_peak_gflops()
    harness["gemm_peak_s"] = time.perf_counter() - t0
    pythons = {rt: Path(sys.executable) for rt in runtimes}
    with tempfile.TemporaryDirectory(prefix="edgetrain-bench-work-") as tmp:
        work = Path(tmp)
        cases = prepare_all(chosen, work, with_torch="torch" in runtimes, harness=harness)
        if "ort" in runtimes:
            pythons["ort"] = prepare_ort(args, cases, work, harness)
        t0 = time.perf_counter()
        runs = measure(chosen, cases, runtimes, pythons, rounds=args.repeats)
        harness["measure_s"] = time.perf_counter() - t0
    harness["total_s"] = time.perf_counter() - t_start
    doc = document(args, chosen, cases, runs, gemm, harness, runtimes, pythons)
    write_outputs(out, doc, stem)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="CI smoke run: MLP and LeNet at batch 32, few steps, no ORT"
    )
    ap.add_argument(
        "--configs",
        nargs="+",
        metavar="NAME",
        help="configuration names or globs (default: issue 25's rows; extras such as lstm-b1-full when named)",
    )
    ap.add_argument(
        "--repeats", type=int, default=None, help="rounds per (configuration, runtime); default 3, 1 quick"
    )
    ap.add_argument("--runtimes", nargs="+", choices=configs.RUNTIMES, help="default: all that are available")
    ap.add_argument(
        "--out", type=Path, help="output folder (default: docs/ for a full run, else a temporary one)"
    )
    ap.add_argument(
        "--name",
        metavar="STEM",
        help="output files' name without extension (default: benchmarks)",
    )
    ap.add_argument(
        "--ort-venv", type=Path, default=ROOT / ".venv-ort-training", help="onnxruntime-training's venv"
    )
    args = ap.parse_args(argv)
    if args.name is not None and (not args.name or "/" in args.name or args.name.startswith(".")):
        ap.error("--name is a file name stem, e.g. benchmarks-vit")
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    args.command = shlex.join(["python", "tools/bench.py", *(argv if argv is not None else sys.argv[1:])])
    return args


def available_runtimes(args: argparse.Namespace) -> list[str]:
    """edgetrain (with momentum) always, and with plain SGD unless --runtimes leaves it out; PyTorch when installed
    here; onnxruntime-training unless --quick (its venv is big)."""
    wanted = args.runtimes or [rt for rt in configs.RUNTIMES if not (args.quick and rt == "ort")]
    if "torch" in wanted and importlib.util.find_spec("torch") is None:
        print("bench: PyTorch is not installed here: no PyTorch column", flush=True)
        wanted = [rt for rt in wanted if rt != "torch"]
    return ["edgetrain", *[rt for rt in wanted if rt != "edgetrain"]]


def without_torch_models(chosen: list[configs.Config]) -> list[configs.Config]:
    """The torchvision, recurrent and image models come from torch.onnx.export: without PyTorch they cannot be made
    here."""
    if importlib.util.find_spec("torch") is not None:
        return chosen
    kept = [c for c in chosen if c.family in ("mlp", "lenet")]
    if len(kept) < len(chosen):
        print(
            "bench: PyTorch is not installed: only the MLP and LeNet configurations can run",
            flush=True,
        )
    return kept


def output_dir(args: argparse.Namespace) -> Path:
    """--out, else docs/ for a full run; a partial or quick run never writes over the full run's results."""
    if args.out is not None:
        out = args.out
    elif args.quick or args.configs or args.runtimes:
        out = Path(tempfile.mkdtemp(prefix="edgetrain-bench-"))
    else:
        out = ROOT / "docs"
    out.mkdir(parents=True, exist_ok=True)
    return out


def gemm_peak_gflops(n: int = 1024, repeats: int = 10) -> float:
    """This machine's single-thread FP32 matrix-multiply rate (numpy, best of `repeats`): the ceiling a step's
    convolutions and matrix products could reach."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, n, n)).astype(np.float32)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


# ---- preparing ------------------------------------------------------------------------------------------------
def prepare_all(
    chosen: list[configs.Config], work: Path, *, with_torch: bool, harness: dict
) -> dict[str, dict]:
    """Exports, converts and writes every configuration's files (build side); each case's spec goes to a file."""
    import prepare  # onnx, edgetrain's build side and torch: imported by the parent only

    t0 = time.perf_counter()
    cases = {}
    for c in chosen:
        t1 = time.perf_counter()
        cases[c.name] = prepare.prepare(c, work, with_torch=with_torch)
        print(f"bench: prepared {c.name} in {time.perf_counter() - t1:.1f} s", flush=True)
    harness["prepare_s"] = time.perf_counter() - t0
    return cases


def prepare_ort(args: argparse.Namespace, cases: dict[str, dict], work: Path, harness: dict) -> Path:
    """Installs onnxruntime-training when needed and generates its artifacts for the per-step configurations."""
    import ort_venv

    python, harness["ort_install_s"] = ort_venv.ensure_venv(args.ort_venv)
    t0 = time.perf_counter()
    ort_venv.generate(python, [c for c in cases.values() if c["kind"] == "step"], work)
    harness["ort_artifacts_s"] = time.perf_counter() - t0
    return python


# ---- measuring ------------------------------------------------------------------------------------------------
def measure(chosen, cases: dict, runtimes: list[str], pythons: dict, *, rounds: int) -> dict:
    """runs[config][runtime] = each round's worker result. Within a round every configuration's runtimes run
    back to back in an order that rotates, so that no runtime always follows another's cache footprint."""
    runs: dict[str, dict[str, list[dict]]] = {c.name: {} for c in chosen}
    for r in range(rounds):
        for i, c in enumerate(chosen):
            order = [rt for rt in runtimes if rt in c.runtimes]
            k = (r + i) % len(order)
            for rt in order[k:] + order[:k]:
                result = run_one(cases[c.name], rt, pythons[rt])
                runs[c.name].setdefault(rt, []).append(result)
                print(f"bench: [{r + 1}/{rounds}] {c.name:<22} {rt:<13} {_line(result)}", flush=True)
    return runs


def run_one(case: dict, runtime: str, python: Path) -> dict:
    """One fresh worker process; its JSON line, or {"error": ...}."""
    if runtime == "ort" and "ort" not in case:
        return {"error": case.get("ort_error", "no onnxruntime-training artifacts")}
    if runtime == "torch" and "torch" not in case:
        return {"error": "no PyTorch module"}
    if runtime == "edgetrain_sgd" and "edgetrain_sgd" not in case:
        return {"error": "no plain-SGD artifact"}
    spec = Path(case["x"]).parent / "spec.json"
    spec.write_text(json.dumps({k: v for k, v in case.items() if k != "facts"}))
    cmd = [str(python), str(HERE / "worker.py"), str(spec), runtime]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {WORKER_TIMEOUT_S} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        said = [ln.strip() for ln in _ANSI.sub("", done.stderr).splitlines() if ln.strip()]
        tail = (said or ["no output"])[-1]
        return {"error": f"worker exited with {done.returncode}: {tail[-300:]}"}
    return json.loads(lines[-1])


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # onnxruntime colours its log lines


def _line(result: dict) -> str:
    if "error" in result:
        return f"error: {result['error']}"
    extra = f"  epoch 2 {result['epoch2_s']:.3f} s" if "epoch2_s" in result else ""
    return (
        f"{result['step_ms']:9.3f} ms/step  loss {result['first_loss']:.5f}  rss {result['peak_rss_mb']:.0f} MB"
        f"  import {result['import_s']:.2f} s{extra}"
    )


# ---- the document -------------------------------------------------------------------------------------------
def document(
    args, chosen, cases, runs, gemm: float, harness: dict, runtimes: list[str], pythons: dict
) -> dict:
    rows = report.summarize(chosen, cases, runs, gemm)
    return {
        "schema": 2,  # 2: edgetrain with plain SGD (runtime "edgetrain_sgd"), issue 25's targets
        "command": args.command,
        "date": datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "quick": args.quick,
        "machine": machine(),
        "versions": versions(rows, runtimes, pythons),
        "settings": {
            "rounds": args.repeats,
            "threads": 1,
            "lr": configs.LR,
            "momentum": configs.MOMENTUM,
            "weight_decay": configs.WEIGHT_DECAY,
            "ort_optimizer": "plain SGD (no momentum, no weight decay in onnxruntime-training 1.19.2)",
            "edgetrain_sgd_optimizer": "plain SGD (momentum 0, weight decay 0): the like-for-like peer of ORT",
            "loss": "softmax cross-entropy, mean over the batch",
            "budget_s": configs.BUDGET_S,
            "epoch_samples": configs.EPOCH_SAMPLES,
            "steps": {c.name: {"warmup": c.warmup, "timed": c.steps} for c in chosen},
        },
        "gemm_peak_gflops": gemm,
        "harness": {k: round(v, 2) for k, v in harness.items()},
        "configs": rows,
        "targets": report.target_list(rows),
    }


def machine() -> dict:
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        text = Path("/proc/cpuinfo").read_text()
        names = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")]
        cpu = names[0] if names else cpu
        flags = {f for ln in text.splitlines() if ln.startswith("flags") for f in ln.split(":", 1)[1].split()}
    except OSError:
        pass
    simd = [f for f in ("avx2", "fma", "avx512f", "asimd") if f in flags]
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "simd": f", {' '.join(simd)}" if simd else "",
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
    }


def versions(rows: list[dict], runtimes: list[str], pythons: dict) -> dict:
    """numpy and its BLAS here, edgetrain's git commit (the runtime is being worked on: say whether the tree had
    uncommitted changes), and the versions the workers reported."""
    v = {"numpy": np.__version__, "blas": _blas(), "edgetrain_git": _git()}
    for rt in runtimes:
        reported = [r["runtimes"][rt]["version"] for r in rows if "version" in r["runtimes"].get(rt, {})]
        if reported:
            v[rt] = reported[0]
    if "ort" in pythons:
        done = subprocess.run(
            [str(pythons["ort"]), "-c", "import numpy; print(numpy.__version__)"],
            capture_output=True,
            text=True,
        )
        v["ort_numpy"] = done.stdout.strip() or "?"
    return v


def _blas() -> str:
    try:
        deps = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{deps.get('name', '?')} {deps.get('version', '')}".strip()
    except Exception:  # noqa: BLE001  (numpy < 2 has no dicts mode; the BLAS is a detail)
        return "BLAS unknown"


def _git() -> str:
    def git(*a: str) -> str:
        done = subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "no git"
    dirty = git("status", "--porcelain", "--", "edgetrain", "loaders")
    return f"git {commit}" + (" + uncommitted changes to edgetrain/loaders" if dirty else "")


def write_outputs(out: Path, doc: dict, stem: str = "benchmarks") -> None:
    report.write_json(out / f"{stem}.json", doc)
    report.write_markdown(out / f"{stem}.md", doc)
    png = report.write_png(out / f"{stem}.png", doc["configs"])
    print("\n".join(report.markdown(doc)))
    written = [f"{stem}.json", f"{stem}.md"] + ([f"{stem}.png"] if png else [])
    print(f"bench: wrote {', '.join(written)} to {out}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
