"""The benchmark's results: the workers' measurements of every round -> one summary (medians of the rounds' medians,
ratios measured in the same run, targets met or missed) -> benchmarks.json (every number), benchmarks.md (tables a
person reads) and benchmarks.png (the ratios against their targets, when matplotlib is installed)."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

from configs import IMPORT_TARGET_S, LIKE_FOR_LIKE, RUNTIME_NAMES, RUNTIMES, Config, ratio_targets, rss_target

LOSS_RTOL = 1e-4  # the runtimes' first losses (same weights, same batch) agree to float32 rounding
# edgetrain / peer ratios the summary holds: like for like against onnxruntime-training (both plain SGD), edgetrain
# with momentum against it (today's, for the record) and against PyTorch (both with momentum and weight decay)
RATIOS = (("edgetrain_sgd", "ort"), ("edgetrain", "ort"), ("edgetrain", "torch"))
_BYTES = {rt: f"{rt}_bytes" for rt in RUNTIMES}  # each runtime's files, in the case's facts
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
        "default": c.default,  # False: an extra, measured when named
        "batch": c.batch,
        "head_only": c.head_only,
        "kind": "epoch" if c.epoch else "step",
        "facts": facts,
        "runtimes": {rt: _runtime(rounds, case, rt) for rt, rounds in runs.items()},
    }
    for rt, r in row["runtimes"].items():
        if "step_ms" in r:
            r["artifact_bytes"] = facts.get(_BYTES[rt])
            if not c.epoch and facts.get("step_flops"):
                r["gemm_fraction"] = facts["step_flops"] / (r["step_ms"] / 1e3) / (gemm_gflops * 1e9)
    row["ratios"], row["round_ratios"] = _ratios(row["runtimes"], runs)
    row["targets"] = {
        k: {"target": t, "ratio": row["ratios"].get(k), "met": _met(row["ratios"].get(k), t)}
        for k, t in ratio_targets(c).items()
    }
    row["rss_ratio"] = _ratio(row["runtimes"], "peak_rss_mb", "edgetrain", "ort")
    row["rss_ratio_sgd"] = _ratio(row["runtimes"], "peak_rss_mb", "edgetrain_sgd", "ort")
    t = rss_target(c)
    row["rss_target"] = None if t is None else {"target": t, "met": _met(row["rss_ratio"], t)}
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
    for mine, peer in RATIOS:
        r = _ratio(results, "step_ms", mine, peer)
        if r is not None:
            key = f"{mine}/{peer}"
            ratios[key] = r
            pairs = zip(runs.get(mine, []), runs.get(peer, []))
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
    """Every target of issue 25 that was measured: step-time ratios per configuration, peak RSS against
    onnxruntime-training's, and edgetrain's import time (the median over its workers)."""
    items = []

    def add(what: str, target: float, value: float) -> None:
        items.append({"what": what, "target": target, "value": value, "met": value <= target})

    for row in rows:
        for key, t in row["targets"].items():
            if t["ratio"] is not None:  # None: the peer did not run (quick run, or it cannot train the model)
                add(f"{key} {row['config']}", t["target"], t["ratio"])
        if row["rss_ratio"] is not None and row.get("rss_target"):
            add(f"peak RSS edgetrain/ort {row['config']}", row["rss_target"]["target"], row["rss_ratio"])
    imports = [
        r["runtimes"][k].get("import_s")
        for r in rows
        for k in ("edgetrain", "edgetrain_sgd")
        if k in r["runtimes"]
    ]
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
    peers = [
        f"edgetrain {v.get('edgetrain', '?')} ({v.get('edgetrain_git', 'no git')}), with SGD momentum and weight "
        "decay and, in workers of its own, with plain SGD"
    ]
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
        f"decay {s['weight_decay']} for edgetrain (momentum) and PyTorch; plain SGD lr {s['lr']} for "
        "onnxruntime-training (1.19.2 has no momentum or weight decay) and for edgetrain (plain SGD), the "
        "like-for-like ratio. Same ONNX model, initial weights and batch for every runtime. "
        f"Each (configuration, runtime) in its own fresh process, {rounds} with the runtimes' order rotated; a "
        "round's number is the median over its timed steps after warm-up, the table's the median of the rounds'. "
        "Shared 2-vCPU machines are noisy: read differences under ~25% on millisecond steps as noise (the JSON "
        "has every round)."
    )


def _step_table(rows: list[dict]) -> list[str]:
    lines = [
        "## Per training step (median ms)",
        "",
        "edgetrain / ORT like for like: edgetrain with plain SGD against onnxruntime-training with plain SGD (the "
        "only optimizer it has); edgetrain / PyTorch: both with SGD momentum and weight decay.",
        "",
        "| configuration | edgetrain (momentum) | edgetrain (plain SGD) | ORT-training (plain SGD) | PyTorch | "
        "et/ORT like for like (target) | et/PyTorch (target) |",
        "|---|--:|--:|--:|--:|---|---|",
    ]
    for r in rows:
        rt = r["runtimes"]
        cells = [_ms(rt.get(k)) for k in RUNTIMES]
        ratios = [_ratio_cell(r, k) for k in (LIKE_FOR_LIKE, "edgetrain/torch")]
        lines.append(f"| {r['describe']} | " + " | ".join(cells + ratios) + " |")
    notes = [
        f"- {r['describe']}, {RUNTIME_NAMES[k]}: {v['error']}"
        for r in rows
        for k, v in r["runtimes"].items()
        if "error" in v
    ]
    return lines + ([""] + ["Not measured:"] + notes if notes else []) + [""]


def _rss_cell(r: dict) -> str:
    if r["rss_ratio"] is None:
        return "-"
    t = r.get("rss_target")
    return f"{r['rss_ratio']:.2f}" + ("" if t is None else f" (<= {t['target']:g}: {_verdict(t['met'])})")


def _memory_table(rows: list[dict]) -> list[str]:
    lines = [
        "## Memory, import time and files",
        "",
        "Peak RSS is the worker process's own high-water mark after its steps (VmHWM: Linux carries ru_maxrss "
        "over from the parent that started it). Its target (issue 25: full fine-tuning <= 0.8x "
        "onnxruntime-training's, head-only <= 0.6x) judges edgetrain with momentum, which holds a velocity per "
        "trained parameter that onnxruntime-training's plain SGD does not; edgetrain with plain SGD is beside it. "
        "edgetrain's planned peak is what `edgetrain inspect` reports "
        "(edgetrain.runtime.describe.step_memory): the memory plan's arena (activations, gradients, temporaries) "
        "plus the parameters, optimizer state and frozen weights the session holds, the fused optimizer's buffers "
        "and the step's outputs (momentum / plain SGD). Import: the runtime's module with numpy already imported "
        f"(numpy itself: {_median_numpy(rows)}). Files: edgetrain's one .etrain (momentum); "
        "onnxruntime-training's training, eval and optimizer models plus checkpoint; PyTorch's state_dict.",
        "",
        "| configuration | peak RSS MB: edgetrain / plain SGD / ORT / PyTorch | edgetrain / ORT (target) | "
        "plain SGD / ORT | edgetrain planned peak | import s: edgetrain / ORT / PyTorch | "
        "files: edgetrain / ORT / PyTorch |",
        "|---|---|---|---|--:|---|---|",
    ]
    for r in rows:
        rt, f = r["runtimes"], r["facts"]
        planned = _mb(f.get("edgetrain_planned_peak_bytes"))
        if f.get("edgetrain_sgd_planned_peak_bytes") is not None:
            planned += f" / {_mb(f['edgetrain_sgd_planned_peak_bytes'])}"
        cells = [
            r["describe"],
            _values(rt, "peak_rss_mb", "{:.0f}"),
            _rss_cell(r),
            _num(r.get("rss_ratio_sgd"), "{:.2f}"),
            planned,
            _values(rt, "import_s", "{:.2f}", THREE),
            " / ".join(_mb(f.get(_BYTES[k])) for k in THREE),
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
        "| configuration | parameters (trained) | MFLOP per step | GEMM peak: edgetrain / plain SGD / ORT / "
        "PyTorch | first loss | same start |",
        "|---|--:|--:|---|--:|---|",
    ]
    for r in rows:
        f, rt, fl = r["facts"], r["runtimes"], r["first_loss"]
        share = _values(rt, "gemm_fraction", "{:.1%}")
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
    lines = ["## Issue 25's targets", ""]
    lines += [
        "Step time: edgetrain / onnxruntime-training like for like (both plain SGD): MLP b1 <= 1.5, b32 and b64 "
        "<= 1.0, LeNet <= 0.7; edgetrain / PyTorch (both with momentum and weight decay): MLP and LeNet <= 0.6, the "
        "torchvision CNNs (full) <= 0.8, LSTM and GRU (full, b32) <= 1.0, the 2-layer biLSTM <= 1.2, the ViT and "
        "the ConvNeXt-style net (full) <= 0.9; the head-only epoch (issue 12's) <= 0.1. Peak RSS against "
        "onnxruntime-training's: full <= 0.8, head-only <= 0.6. Import <= 0.15 s.",
        "",
        f"{met} of {len(items)} met.",
        "",
    ]
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
            "MLP and LeNet from tests/harness/models.py (seeded weights; LeNet ends in Softmax, under which "
            "edgetrain's cross-entropy reads the logits; onnxruntime-training gets the model without that Softmax, "
            "since its loss takes logits)."
        )
    if "torchvision" in families:
        models.append(
            "torchvision classifiers as users export them (tests/harness/exports.py: TorchScript exporter, "
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
    if "image" in families:
        models.append(
            "A small ViT and a ConvNeXt-style net (tools/bench/imagemodels.py) on 3x32x32 images, 10 classes: the "
            "ViT with patch 4 (64 patches and a class token), dim 128, depth 4, 4 heads, MLP 256, exact GELU, "
            "pre-LayerNorm blocks and timm's qkv attention, batch 32; the ConvNeXt-style net with a 4x4 stride-4 stem "
            "to 64 channels and LayerNorm, 2 blocks at 64 (depthwise 7x7, channels-last LayerNorm, Linear 64->256, "
            "GELU, Linear 256->64, layer scale from 1e-6, residual), LayerNorm and a 2x2 stride-2 convolution to 128, "
            "2 blocks at 128, global average pool, LayerNorm and Linear, batch 16. Seed 0; exported with the "
            "TorchScript exporter at the exporter's default opset (Gelu and LayerNormalization as standard ops) from "
            "the very module PyTorch then trains, onnxruntime's logits checked against the module's. Head-only "
            "trains the final Linear only. Batches: seeded random images and labels."
        )
    return [
        "## How it was measured",
        "",
        "- Models: " + " ".join(models),
        "- A worker (tools/bench/worker.py) measures one (configuration, runtime): the first step's loss, warm-up, "
        "then timed steps (up to the configuration's count, or fewer past a time budget); it reports the median, "
        "its import and load times and its peak RSS. edgetrain runs twice, with momentum and with plain SGD, each "
        "in its own worker from its own artifact of the same model.",
        "- onnxruntime-training's artifacts (generated in its venv from the same ONNX file, the same parameters "
        "trained and frozen) take the model with two edits that keep its computation and standard ops: no final "
        "Softmax (its loss takes logits), and LayerNormalization's optional Mean and InvStdDev outputs named (its "
        "gradient builder reads them and fails without). Its first loss is checked against the others'.",
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


THREE = ("edgetrain", "ort", "torch")


def _values(results: dict, key: str, fmt: str, runtimes: tuple[str, ...] = RUNTIMES) -> str:
    """The runtimes' values of one measurement, " / "-separated."""
    return " / ".join(_num(results.get(k, {}).get(key), fmt) for k in runtimes)


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
    """Three panels, one bar per configuration (log scale): edgetrain / onnxruntime-training like for like,
    edgetrain / PyTorch, and peak RSS edgetrain / onnxruntime-training; green where the target (a red tick) is met,
    orange where missed, grey where none applies; the families separated. False when matplotlib is not
    installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        return False
    panels = [
        ("like", "step time: edgetrain / ORT-training\n(both plain SGD)"),
        ("torch", "step time: edgetrain / PyTorch\n(both momentum + weight decay)"),
        ("rss", "peak RSS: edgetrain / ORT-training\n(edgetrain with momentum)"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(17, 0.3 * len(rows) + 1.9), sharey=True)
    for ax, (which, title) in zip(axes, panels):
        _panel(ax, rows, which)
        ax.set_title(f"{title}; lower is better", fontsize=9)
    judged = [
        t["met"] for r in rows for t in [*r["targets"].values(), r.get("rss_target") or {}] if "met" in t
    ]
    judged = [m for m in judged if m is not None]
    fig.suptitle(
        f"edgetrain beside onnxruntime-training 1.19.2 and PyTorch: {sum(judged)} of the {len(judged)} "
        "targets of issue 25 shown met (red ticks: the targets)",
        fontsize=10,
    )
    axes[0].set_yticks(range(len(rows)), [r["describe"] for r in rows], fontsize=8)
    axes[0].set_ylim(len(rows) - 0.5, -0.5)  # the first configuration on top (the axes share y)
    legend = [Patch(color=_COLORS[k], label=v) for k, v in _LEGEND.items()]
    legend.append(Patch(color=_TARGET, label="target (issue 25)"))
    fig.legend(handles=legend, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 0.98))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


_COLORS = {None: "#9a9a9a", True: "#2a9d4b", False: "#d1603d"}
_LEGEND = {True: "target met", False: "target missed", None: "no target"}
_TARGET = "#b00020"


def _panel_value(row: dict, which: str) -> tuple[float | None, dict | None, str]:
    """(ratio, its target record or None, why there is no ratio) of one row in one panel."""
    if which == "rss":
        return row["rss_ratio"], row.get("rss_target"), _why(row, "edgetrain", "ort")
    key = LIKE_FOR_LIKE if which == "like" else "edgetrain/torch"
    mine, peer = key.split("/")
    return row["ratios"].get(key), row["targets"].get(key), _why(row, mine, peer)


def _why(row: dict, mine: str, peer: str) -> str:
    if peer == "ort" and row["kind"] == "epoch":
        return "no epoch loop in onnxruntime-training"
    for rt in (peer, mine):
        r = row["runtimes"].get(rt)
        if r and "error" in r:
            return f"n/a: {plain_reason(r['error'])}"
    return "not measured"


def _panel(ax, rows: list[dict], which: str) -> None:
    from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullLocator

    cells = [_panel_value(r, which) for r in rows]
    values = [v for v, _, _ in cells if v is not None] + [t["target"] for _, t, _ in cells if t]
    lo, hi = min(values + [0.5]) / 1.6, max(values + [2.0]) * 2.2
    for i, (v, t, why) in enumerate(cells):
        if v is None:
            ax.text(
                lo * 1.1,
                i,
                why if len(why) <= 72 else why[:69] + "...",
                va="center",
                fontsize=7,
                color="#777777",
            )
            continue
        ax.barh(i, v, color=_COLORS[None if t is None else t["met"]], height=0.7)
        ax.text(max(v, t["target"] if t else v) * 1.08, i, f"{v:.2f}", va="center", fontsize=7)
        if t is not None:
            ax.plot([t["target"]] * 2, [i - 0.45, i + 0.45], color=_TARGET, linewidth=2.2)
    for i in range(1, len(rows)):  # a line between families (MLP, LeNet, torchvision, recurrent, image)
        if rows[i].get("family") != rows[i - 1].get("family"):
            ax.axhline(i - 0.5, color="#444444", linewidth=0.6)
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle=":")
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ticks = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if lo <= t <= hi]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.grid(axis="x", alpha=0.3)
