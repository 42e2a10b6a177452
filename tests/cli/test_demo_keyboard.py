"""`edgetrain demo --model keyboard` on a small budget (1 epoch, 200 Bible sentences): the next-word model learns
the new user's sentences (held-out top-1 up, perplexity down) with LoRA, head-only and full fine-tuning; LoRA's
adapter files are a few percent of the model; the merged export is the original graph and equals the personalized
session in onnxruntime; one served base model with the user's onnxruntime adapter file equals the merged model and,
without it, is the base model; the printed table is the JSON's. The command line runs it and refuses what it must.
That the README's table is the default run's, tests/project/test_readme_commands.py checks on the README's
own command."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import edgetrain as et
from edgetrain.demo import keyboard as kb
from loaders.text import TokenWindowView, WordVocab

ROOT = Path(__file__).resolve().parents[2]
MODEL = Path(kb.KEYBOARD_MODEL)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("keyboard")
    screen = io.StringIO()
    result = kb.run_keyboard_demo(
        str(out), epochs=1, base_sentences=200, stream=screen, progress_stream=io.StringIO()
    )
    return result, screen.getvalue(), out


def _held() -> TokenWindowView:
    vocab = WordVocab.load(Path(kb.KEYBOARD) / "vocab.json")
    return TokenWindowView.from_texts(vocab, kb._read_lines("user_heldout.txt"), 32)


def _ort(path, x, adapter=None) -> np.ndarray:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    options = None
    if adapter is not None:
        lora = ort.LoraAdapter()
        lora.Load(str(adapter))
        options = ort.RunOptions()
        options.add_active_adapter(lora)
    return sess.run(None, {"ids": x}, options)[0]


def test_every_variant_learns_the_users_words(run, report):
    r, screen, _ = run
    assert list(r.variants) == ["LoRA", "head-only", "full"]
    assert r.base_user.top1 < 0.10 and r.base_user.perplexity > 150  # the KJV model does not know this user
    lora = r.variants["LoRA"]
    assert lora.user.top1 >= r.base_user.top1 + 0.05, (r.base_user, lora.user)
    assert lora.user.perplexity < 0.6 * r.base_user.perplexity
    for v in r.variants.values():
        assert v.user.top1 > r.base_user.top1 and v.user.top3 > r.base_user.top3, v.name
        assert v.steps == 18 and v.median_step_ms > 0  # 1 epoch of 300 sentences in batches of 16
    assert lora.trainable == 2 * 8 * (4 * (64 + 64) + (64 + 256) + (256 + 64))  # 2 blocks, rank 8
    assert r.variants["full"].trainable == r.parameters == 489_660
    report(
        "keyboard demo (1 epoch)",
        ", ".join(f"{n} top-1 {v.user.top1:.1%} ppl {v.user.perplexity:.0f}" for n, v in r.variants.items())
        + f"; base {r.base_user.top1:.1%} ppl {r.base_user.perplexity:.0f}",
    )
    assert "[5/5]" in screen and "with the same top-1" in screen


def test_the_adapter_files_are_small_and_the_base_is_untouched(run):
    r, _, out = run
    lora = r.variants["LoRA"]
    assert lora.adapter_bytes == os.path.getsize(lora.adapter_path)
    assert lora.trainable_bytes <= lora.adapter_bytes < lora.trainable_bytes + 4096
    assert lora.adapter_bytes < 0.05 * r.model_bytes and lora.etad_bytes < 0.05 * r.model_bytes
    served = {t.name: numpy_helper.to_array(t) for t in onnx.load(lora.served_path).graph.initializer}
    for t in onnx.load(str(MODEL)).graph.initializer:  # the frozen base, bit for bit
        assert served[t.name].tobytes() == numpy_helper.to_array(t).tobytes(), t.name
    fresh = et.TrainingSession(str(out / "lora.etrain"))
    fresh.load_adapters(out / "user.etad")  # the adapters alone bring the personalization back
    x = _held().x[:16]
    np.testing.assert_allclose(_ort(lora.onnx_path, x), fresh.run(x), rtol=1e-4, atol=1e-4)


def test_the_merged_and_served_exports_equal_the_session_in_onnxruntime(run):
    r, _, out = run
    held = _held()
    lora = r.variants["LoRA"]
    session = et.TrainingSession(str(out / "lora.etrain"))
    session.load_adapters(out / "user.etad")
    merged = _ort(lora.onnx_path, held.x)
    np.testing.assert_allclose(merged, kb._chunked(session.run, held.x), rtol=1e-4, atol=1e-4)
    assert kb.lm_figures(merged, held.y).top1 == lora.user.top1 == lora.onnxruntime_top1

    def ops(path) -> list[str]:  # the computing nodes (edgetrain's exports hold constants as initializers)
        return sorted(n.op_type for n in onnx.load(str(path)).graph.node if n.op_type != "Constant")

    assert ops(lora.onnx_path) == ops(MODEL)  # the original graph, W + (alpha/rank) A B folded in
    served = _ort(lora.served_path, held.x, lora.adapter_path)
    np.testing.assert_allclose(served, merged, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(_ort(lora.served_path, held.x), _ort(MODEL, held.x))  # no adapter: the base
    for v in r.variants.values():
        assert v.onnxruntime_max_diff < 1e-3 and v.onnxruntime_top1 == v.user.top1, v.name


def test_the_table_is_the_json_and_memory_was_measured(run):
    r, screen, out = run
    saved = json.loads((out / "summary.json").read_text())
    assert saved["variants"]["LoRA"]["user"]["top1"] == r.variants["LoRA"].user.top1
    for name, v in r.variants.items():
        label = "LoRA r8 (attn, MLP)" if name == "LoRA" else name
        line = next(line for line in screen.splitlines() if line.startswith(f"  {label} "))
        cells = line[len(label) + 2 :].split()
        assert cells[:3] == [
            f"{100 * v.user.top1:.1f}%",
            f"{100 * v.user.top3:.1f}%",
            f"{v.user.perplexity:.1f}",
        ]
        assert cells[5] == f"{v.trainable_bytes:,}"
        assert v.start_rss_mib is not None and v.start_rss_mib < v.peak_rss_mib < 1024, v
    assert (
        r.variants["full"].peak_rss_mib > r.variants["LoRA"].peak_rss_mib
    )  # gradients and Adam state of all


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgetrain.cli", "demo", "--model", "keyboard", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )


def test_the_command_line_refuses_what_it_must(tmp_path):
    bad = cli("--epochs", "0", cwd=tmp_path)
    assert bad.returncode != 0 and "--epochs must be a positive integer" in bad.stderr
    q = cli("--quantized", cwd=tmp_path)
    assert q.returncode != 0 and "--model lenet" in q.stderr
    assert not (tmp_path / "edgetrain-demo-keyboard").exists()
