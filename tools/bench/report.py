"""The benchmark's results: the workers' measurements of every round -> one summary (medians of the rounds' medians,
ratios measured in the same run, targets met or missed) -> benchmarks.json (every number), benchmarks.md (tables a
person reads) and benchmarks.png (the ratios against their targets, when matplotlib is installed)."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

from configs import IMPORT_TARGET_S, RSS_TARGET, RUNTIME_NAMES, Config, ratio_targets

LOSS_RTOL = 1e-4  # the runtimes' first losses (same weights, same batch) agree to float32 rounding
_MEDIAN_KEYS = ("step_ms", "peak_rss_mb", "import_s", "numpy_import_s", "load_s", "epoch1_s", "epoch2_s")


# ---- summary ------------------------------------------------------------------------------------------------
def summarize(configs: list[Config], cases: dict[str, dict], runs: dict, gemm_gflops: float) -> list[dict]:
    """One row per configuration. runs[config][runtime] is the list of the rounds' worker results."""
    return [_row(c, cases[c.name], runs.get(c.name, {}), gemm_gflops) for c in configs]


def _row(c: Config, case: dict, runs: dict[str, list[dict]], gemm_gflops: float) -> dict:
    facts = case.get("facts", {})
    row = {
        "config": c.name,
        "describe": c.describe,
        "model": c.model,
        "family": c.family,
        "issue12": c.issue12,  # False: measured for information, no target applies (the recurrent models)
        "batch": c.batch,
        "head_only": c.head_only,
        "kind": "epoch" if c.epoch else "step",
        "facts": facts,
        "runtimes": {rt: _runtime(rounds, case, rt) for rt, rounds in runs.items()},
    }
    for rt, r in row["runtimes"].items():
        if "step_ms" in r:
            r["artifact_bytes"] = facts.get(
                {"edgetrain": "edgetrain_bytes", "ort": "ort_bytes"}.get(rt, "torch_bytes")
            )
            if not c.epoch and facts.get("step_flops"):
                r["gemm_fraction"] = facts["step_flops"] / (r["step_ms"] / 1e3) / (gemm_gflops * 1e9)
    row["ratios"], row["round_ratios"] = _ratios(row["runtimes"], runs)
    row["targets"] = {
        k: {"target": t, "ratio": row["ratios"].get(k), "met": _met(row["ratios"].get(k), t)}
        for k, t in ratio_targets(c).items()
    }
    row["rss_ratio"] = _ratio(row["runtimes"], "peak_rss_mb", "edgetrain", "ort")
    row["first_loss"] = _first_losses(runs)
    return row


def _runtime(rounds: list[dict], case: dict, rt: str) -> dict:
    """Medians over the rounds that ran; the first round's error when none did."""
    ok = [r for r in rounds if "error" not in r]
    if not ok:
        error = rounds[0]["error"] if rounds else case.get(f"{rt}_error", "not run")
        return {"error": error}
    out = {k: statistics.median(r[k] for r in ok) for k in _MEDIAN_KEYS if all(k in r for r in ok)}
    out["round_step_ms"] = [r["step_ms"] for r in ok]
    out["rounds"] = len(ok)
    for k in ("first_loss", "version", "steps", "steps_per_epoch", "cache"):
        if k in ok[0]:
            out[k] = ok[0][k]
    return out


def _ratios(results: dict, runs: dict) -> tuple[dict, dict]:
    """edgetrain / peer of the medians, and of each round (the spread says how noisy the machine was)."""
    ratios, per_round = {}, {}
    for peer in ("ort", "torch"):
        r = _ratio(results, "step_ms", "edgetrain", peer)
        if r is not None:
            key = f"edgetrain/{peer}"
            ratios[key] = r
            pairs = zip(runs.get("edgetrain", []), runs.get(peer, []))
            per_round[key] = [
                a["step_ms"] / b["step_ms"] for a, b in pairs if "step_ms" in a and "step_ms" in b
            ]
    return ratios, per_round


def _ratio(results: dict, key: str, a: str, b: str) -> float | None:
    x, y = results.get(a, {}).get(key), results.get(b, {}).get(key)
    return x / y if x is not None and y else None


def _met(ratio: float | None, target: float) -> bool | None:
    return None if ratio is None else ratio <= target


def _first_losses(runs: dict) -> dict:
    """Every runtime's first loss (every round) should be the same number: same weights, batch and loss."""
    values = {rt: [r["first_loss"] for r in rounds if "first_loss" in r] for rt, rounds in runs.items()}
    flat = [v for vs in values.values() for v in vs]
    if not flat:
        return {"values": {}, "max_rel_diff": None, "match": None}
    ref = flat[0]
    diff = max(abs(v - ref) for v in flat) / max(abs(ref), 1e-12)
    finite = all(math.isfinite(v) for v in flat)
    return {
        "values": {rt: vs[0] for rt, vs in values.items() if vs},
        "max_rel_diff": diff,
        "match": finite and diff <= LOSS_RTOL,
    }


def target_list(rows: list[dict]) -> list[dict]:
    """Every target of issue 12 that was measured: ratios per configuration, peak RSS against
    onnxruntime-training's, and edgetrain's import time (the median over its workers)."""
    items = []

    def add(what: str, target: float, value: float) -> None:
        items.append({"what": what, "target": target, "value": value, "met": value <= target})

    rows = [r for r in rows if r.get("issue12", True)]
    for row in rows:
        for key, t in row["targets"].items():
            if t["ratio"] is not None:  # None: the peer did not run (quick run, or it cannot train the model)
                add(f"{key} {row['config']}", t["target"], t["ratio"])
        if row["rss_ratio"] is not None:
            add(f"peak RSS edgetrain/ort {row['config']}", RSS_TARGET, row["rss_ratio"])
    imports = [r["runtimes"]["edgetrain"].get("import_s") for r in rows if "edgetrain" in r["runtimes"]]
    imports = [v for v in imports if v is not None]
    if imports:
        add("import edgetrain (s, median)", IMPORT_TARGET_S, statistics.median(imports))
    return items


# ---- files --------------------------------------------------------------------------------------------------
def write_json(path: Path, doc: dict) -> None:
    path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8")


def write_markdown(path: Path, doc: dict) -> None:
    path.write_text("\n".join(markdown(doc)) + "\n", encoding="utf-8")


def markdown(doc: dict) -> list[str]:
    rows = doc["configs"]
    steps = [r for r in rows if r["kind"] == "step"]
    epochs = [r for r in rows if r["kind"] == "epoch"]
    lines = _header(doc)
    if steps:
        lines += _step_table(steps) + _memory_table(steps) + _flops_table(steps, doc["gemm_peak_gflops"])
    if epochs:
        lines += _epoch_table(epochs)
    lines += _targets(doc["targets"], rows) + _method(doc)
    return lines


def _header(doc: dict) -> list[str]:
    m, v, s = doc["machine"], doc["versions"], doc["settings"]
    peers = [f"edgetrain {v.get('edgetrain', '?')} ({v.get('edgetrain_git', 'no git')})"]
    if "ort" in v:
        peers.append(
            f"onnxruntime-training {v['ort']} in its own venv (numpy {v.get('ort_numpy', '?')}), driven through "
            "onnxruntime.capi without importing torch"
        )
    if "torch" in v:
        peers.append(f"PyTorch {v['torch']} eager")
    return [
        "# Training-step benchmark: edgetrain beside onnxruntime-training and PyTorch",
        "",
        f"`{doc['command']}` on {doc['date']} (the run took {doc['harness']['total_s'] / 60:.1f} min).",
        "",
        f"- Machine: {m['cpu']} ({m['logical_cpus']} logical CPUs{m['simd']}), {m['platform']}; Python "
        f"{m['python']}, numpy {v['numpy']} ({v.get('blas', 'BLAS unknown')}). "
        f"Single-thread FP32 GEMM peak (numpy 1024^3 matmul, best of 10): {doc['gemm_peak_gflops']:.1f} GFLOP/s.",
        f"- Runtimes: {'; '.join(peers)}.",
        "- Settings: " + _settings(s),
        "",
    ]


def _settings(s: dict) -> str:
    rounds = f"{s['rounds']} round{'s' if s['rounds'] > 1 else ''}"
    return (
        "1 thread everywhere (OMP/OPENBLAS/MKL_NUM_THREADS=1 before numpy loads, torch.set_num_threads(1), "
        f"onnxruntime intra/inter-op 1). Softmax cross-entropy; SGD lr {s['lr']} momentum {s['momentum']} weight "
        f"decay {s['weight_decay']} for edgetrain and PyTorch, plain SGD lr {s['lr']} for onnxruntime-training "
        "(1.19.2 has no momentum or weight decay). Same ONNX model, initial weights and batch for every runtime. "
        f"Each (configuration, runtime) in its own fresh process, {rounds} with the runtimes' order rotated; a "
        "round's number is the median over its timed steps after warm-up, the table's the median of the rounds'. "
        "Shared 2-vCPU machines are noisy: read differences under ~25% on millisecond steps as noise (the JSON "
        "has every round)."
    )


def _step_table(rows: list[dict]) -> list[str]:
    lines = [
        "## Per training step (median ms)",
        "",
        "| configuration | edgetrain | onnxruntime-training (plain SGD) | PyTorch eager | edgetrain / ORT "
        "(target) | edgetrain / PyTorch (target) |",
        "|---|--:|--:|--:|---|---|",
    ]
    for r in rows:
        rt = r["runtimes"]
        cells = [_ms(rt.get(k)) for k in ("edgetrain", "ort", "torch")]
        ratios = [_ratio_cell(r, k) for k in ("edgetrain/ort", "edgetrain/torch")]
        lines.append(f"| {r['describe']} | " + " | ".join(cells + ratios) + " |")
    notes = [
        f"- {r['describe']}, {RUNTIME_NAMES[k]}: {v['error']}"
        for r in rows
        for k, v in r["runtimes"].items()
        if "error" in v
    ]
    return lines + ([""] + ["Not measured:"] + notes if notes else []) + [""]


def _memory_table(rows: list[dict]) -> list[str]:
    rss_target = f" (target <= {RSS_TARGET})" if any(r.get("issue12", True) for r in rows) else ""
    lines = [
        "## Memory, import time and files",
        "",
        "Peak RSS is the worker process's own high-water mark after its steps (VmHWM: Linux carries ru_maxrss "
        "over from the parent that started it); edgetrain's planned peak is what `edgetrain inspect` reports "
        "(edgetrain.runtime.describe.step_memory): the memory plan's arena (activations, gradients, temporaries) "
        "plus the "
        "parameters, optimizer state and frozen weights the session holds, the fused optimizer's buffers (gradients "
        "and two chunk-sized scratch buffers: it updates parameters and state in place) and the step's outputs. "
        "Import: the runtime's module with numpy already imported (numpy itself: "
        f"{_median_numpy(rows)}). Files: edgetrain's one .etrain; onnxruntime-training's training, eval and "
        "optimizer models plus checkpoint; PyTorch's state_dict.",
        "",
        f"| configuration | peak RSS MB: edgetrain / ORT / PyTorch | edgetrain / ORT{rss_target} | "
        "edgetrain planned peak | import s: edgetrain / ORT / PyTorch | files: edgetrain / ORT / PyTorch |",
        "|---|---|---|--:|---|---|",
    ]
    for r in rows:
        rt, f = r["runtimes"], r["facts"]
        cells = [
            r["describe"],
            _three(rt, "peak_rss_mb", "{:.0f}"),
            "-"
            if r["rss_ratio"] is None
            else f"{r['rss_ratio']:.2f}"
            if not r.get("issue12", True)
            else f"{r['rss_ratio']:.2f} ({_verdict(r['rss_ratio'] <= RSS_TARGET)})",
            _mb(f.get("edgetrain_planned_peak_bytes")),
            _three(rt, "import_s", "{:.2f}"),
            " / ".join(_mb(f.get(k)) for k in ("edgetrain_bytes", "ort_bytes", "torch_bytes")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _flops_table(rows: list[dict], gemm: float) -> list[str]:
    lines = [
        "## Arithmetic and the first loss",
        "",
        f"FLOPs of a step count the convolutions and matrix products: the forward pass, plus once more for each "
        f"operand that needs a gradient (~3x the forward for full fine-tuning, the forward alone for a frozen body). "
        f"The share is of this machine's single-thread GEMM peak ({gemm:.0f} GFLOP/s). Every runtime's first loss "
        f"(from the same weights and batch) must agree to {LOSS_RTOL:g} relative.",
        "",
        "| configuration | parameters (trained) | MFLOP per step | GEMM peak: edgetrain / ORT / PyTorch | "
        "first loss | same start |",
        "|---|--:|--:|---|--:|---|",
    ]
    for r in rows:
        f, rt, fl = r["facts"], r["runtimes"], r["first_loss"]
        share = _three(rt, "gemm_fraction", "{:.1%}")
        loss = _num(next(iter(fl["values"].values()), None), "{:.5f}")
        same = (
            "-" if fl["match"] is None else ("yes" if fl["match"] else f"**NO** ({fl['max_rel_diff']:.1e})")
        )
        params = f"{f.get('parameters', 0):,} ({f.get('trainable_parameters', 0):,})"
        lines.append(
            f"| {r['describe']} | {params} | {f.get('step_flops', 0) / 1e6:,.1f} | {share} | {loss} | {same} |"
        )
    return lines + [""]


def _cache_text(c: dict | None) -> str:
    if not c:
        return "-"
    if not c.get("enabled"):
        return f"off: {c.get('reason')}"
    hits = c.get("hits_per_epoch") or []
    return (
        f"on: {c['prefix_nodes']} of {c['total_nodes']} step nodes frozen; samples from the cache per epoch "
        f"{'/'.join(map(str, hits))}; {c['samples']} cached in {c['bytes'] / 2**20:.1f} MiB"
    )


def _epoch_table(rows: list[dict]) -> list[str]:
    lines = [
        "## Head-only personalization epoch",
        "",
        "edgetrain: `edgetrain.Trainer` over a DataLoader, which caches the frozen prefix's features when it can; "
        "PyTorch: the frozen body under no_grad, then the head trained, as a PyTorch user writes it. The second "
        "epoch is timed (the first fills the cache).",
        "",
        "| configuration | edgetrain epoch 1 | edgetrain epoch 2 | PyTorch epoch 1 | PyTorch epoch 2 | "
        "edgetrain / PyTorch, epoch 2 (target) | feature cache | same start |",
        "|---|--:|--:|--:|--:|---|---|---|",
    ]
    for r in rows:
        e, t = r["runtimes"].get("edgetrain", {}), r["runtimes"].get("torch", {})
        said = _cache_text(e.get("cache"))
        same = "-" if r["first_loss"]["match"] is None else ("yes" if r["first_loss"]["match"] else "**NO**")
        lines.append(
            f"| {r['describe']} | {_s(e.get('epoch1_s'))} | {_s(e.get('epoch2_s'))} | {_s(t.get('epoch1_s'))} | "
            f"{_s(t.get('epoch2_s'))} | {_ratio_cell(r, 'edgetrain/torch')} | {said} | {same} |"
        )
    errors = [
        f"- {RUNTIME_NAMES[k]}: {v['error']}" for r in rows for k, v in r["runtimes"].items() if "error" in v
    ]
    return lines + ([""] + errors if errors else []) + [""]


def _targets(items: list[dict], rows: list[dict]) -> list[str]:
    met = sum(1 for i in items if i["met"])
    others = [r["describe"] for r in rows if not r.get("issue12", True)]
    lines = ["## Issue 12's targets", ""]
    if others and len(others) == len(rows):
        return lines + [
            "None: issue 12 sets no target for these recurrent configurations. Their ratios, peak RSS and first "
            "losses above are measured for information.",
            "",
        ]
    if others:
        lines += [
            f"None for the recurrent configurations ({'; '.join(others)}): measured for information.",
            "",
        ]
    lines += [f"{met} of {len(items)} met.", ""]
    for i in items:
        factor = i["value"] / i["target"]
        by = "" if i["met"] else f" by {factor - 1:.0%}" if factor < 2 else f", {factor:.1f}x the target"
        lines.append(f"- {i['what']}: {i['value']:.3g} against <= {i['target']:g}: {_verdict(i['met'])}{by}")
    return lines + [""]


def _method(doc: dict) -> list[str]:
    h = doc["harness"]
    parts = ", ".join(
        f"{k.removesuffix('_s').replace('_', ' ')} {v:.1f} s" for k, v in h.items() if k != "total_s"
    )
    families = {r.get("family") for r in doc["configs"]}
    models = []
    if families & {"mlp", "lenet"}:
        models.append(
            "MLP and LeNet from tests/models.py (seeded weights; LeNet ends in Softmax, under which edgetrain's "
            "cross-entropy reads the logits; onnxruntime-training gets the model without that Softmax, since its "
            "loss takes logits)."
        )
    if "torchvision" in families:
        models.append(
            "torchvision classifiers as users export them (tests/exports.py: TorchScript exporter, "
            "TrainingMode.EVAL, so BatchNorm is folded into the convolutions; fixed batch 8, 3x64x64, 10 classes); "
            "PyTorch trains that same folded module (an fx GraphModule) with the ONNX initial values copied in. "
            "Head-only trains the classifier only; BatchNorm (folded) and Dropout follow inference semantics "
            "everywhere."
        )
    if "recurrent" in families:
        models.append(
            "Recurrent sequence classifiers (tools/bench/seqmodels.py), like keyboard and keyword-spotting models: "
            "token ids [N, 32] -> nn.Embedding(1000, 64) -> nn.LSTM or nn.GRU, hidden 128, batch_first (1 layer, or "
            "2 bidirectional layers) -> nn.Linear(128 or 256, 10) on the last step's output; torch's default "
            "initialization, seed 0. Exported with the TorchScript exporter (dynamo=False) at the configuration's "
            "fixed batch from the very module PyTorch then trains (the export's LSTM/GRU W, R, B are its weight_ih, "
            "weight_hh, bias_ih + bias_hh in ONNX gate order; onnxruntime's logits of the ONNX are checked against "
            "the module's before the workers run). Full fine-tuning trains everything, the embedding included; "
            "head-only the Linear only. Batches: seeded random token ids and labels. MFLOP per step counts the "
            "gate products (X·W over all steps, H·R step by step) like the matrix products; edgetrain's fused "
            "recurrent backward recomputes the forward, which is not counted."
        )
    return [
        "## How it was measured",
        "",
        "- Models: " + " ".join(models),
        "- A worker (tools/bench/worker.py) measures one (configuration, runtime): the first step's loss, warm-up, "
        "then timed steps (up to the configuration's count, or fewer past a time budget); it reports the median, "
        "its import and load times and its peak RSS.",
        f"- The harness itself: {parts}; {h['total_s']:.0f} s in all.",
        "",
    ]


# ---- cells --------------------------------------------------------------------------------------------------
def _ms(r: dict | None) -> str:
    if not r:
        return "-"
    if "error" in r:
        return f"n/a: {plain_reason(r['error'])}"
    v = r["step_ms"]
    return (
        f"{v:.3f} ms" if v < 1 else f"{v:.2f} ms" if v < 10 else f"{v:.1f} ms" if v < 100 else f"{v:.0f} ms"
    )


_REASONS = (  # a runtime's own error message -> why, in a few words (the full message goes under the table)
    (r"gradient builder has not been registered: (\w+)", "no gradient for {0}"),
    (
        r"(\w+) and \w+Grad kernel only supports the forward direction",
        "its training {0} kernel is forward-only; this one is bidirectional",
    ),
    (r"timed out after", "timed out"),
)


def plain_reason(error: str) -> str:
    """Why a runtime did not run a configuration, short enough for a table cell."""
    for pattern, said in _REASONS:
        m = re.search(pattern, error)
        if m:
            return said.format(*m.groups())
    return error if len(error) <= 60 else error[:57] + "..."


def _ratio_cell(row: dict, key: str) -> str:
    v = row["ratios"].get(key)
    if v is None:
        return "-"
    t = row["targets"].get(key)
    return f"{v:.2f}" if t is None else f"{v:.2f} (<= {t['target']:g}: {_verdict(t['met'])})"


def _verdict(met: bool | None) -> str:
    return "-" if met is None else "met" if met else "**missed**"


def _num(v, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def _three(results: dict, key: str, fmt: str) -> str:
    """edgetrain / ORT / PyTorch values of one measurement."""
    return " / ".join(_num(results.get(k, {}).get(key), fmt) for k in ("edgetrain", "ort", "torch"))


def _mb(v) -> str:
    return "-" if v is None else f"{v / 2**20:.2f} MB"


def _s(v) -> str:
    return "-" if v is None else f"{v:.3f} s"


def _median_numpy(rows: list[dict]) -> str:
    vals = [
        r["runtimes"][k]["numpy_import_s"]
        for r in rows
        for k in r["runtimes"]
        if "numpy_import_s" in r["runtimes"][k]
    ]
    return f"{statistics.median(vals):.2f} s" if vals else "-"


# ---- chart --------------------------------------------------------------------------------------------------
def write_png(path: Path, rows: list[dict]) -> bool:
    """Bars of edgetrain / onnxruntime-training and edgetrain / PyTorch per configuration (log scale) with each
    configuration's target as a red tick; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
        from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullLocator
    except ImportError:
        return False
    keys = [
        ("edgetrain/ort", "edgetrain / onnxruntime-training"),
        ("edgetrain/torch", "edgetrain / PyTorch eager"),
    ]
    values = [v for r in rows for v in r["ratios"].values()] + [
        t["target"] for r in rows for t in r["targets"].values()
    ]
    lo, hi = min(values + [0.5]) / 1.5, max(values + [2.0]) * 1.8
    ticks = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if lo <= t <= hi]
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.42 * len(rows) + 1.9), sharey=True)
    colors = {None: "#9a9a9a", True: "#2a9d4b", False: "#d1603d"}
    for ax, (key, title) in zip(axes, keys):
        for i, r in enumerate(rows):
            v, t = r["ratios"].get(key), r["targets"].get(key)
            if v is None:
                peer = r["runtimes"].get(key.split("/")[1], {})
                said = f"n/a: {plain_reason(peer['error'])}" if "error" in peer else "not measured"
                ax.text(lo * 1.1, i, said, va="center", fontsize=8, color="#777777")
                continue
            ax.barh(i, v, color=colors[None if t is None else t["met"]], height=0.7)
            ax.text(max(v, t["target"] if t else v) * 1.06, i, f"{v:.2f}", va="center", fontsize=8)
            if t is not None:
                ax.plot([t["target"]] * 2, [i - 0.45, i + 0.45], color="#b00020", linewidth=2.5)
        ax.axvline(1.0, color="black", linewidth=0.8, linestyle=":")
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.set_title(f"{title} (lower is better)", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(rows)), [r["describe"] for r in rows], fontsize=8)
    axes[0].invert_yaxis()  # the axes share y: invert once
    names = {True: "target met", False: "target missed", None: "no target"}
    if any(r["targets"] for r in rows):
        legend = [Patch(color=colors[k], label=v) for k, v in names.items()]
        legend.append(Patch(color="#b00020", label="target (issue 12)"))
    else:  # the recurrent configurations: no issue-12 target at all
        legend = [Patch(color=colors[None], label="no target (measured for information)")]
    fig.legend(handles=legend, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
