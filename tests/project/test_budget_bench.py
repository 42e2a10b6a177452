"""tools/budget_bench.py cannot rot: its quick run (the demo's digits LeNet, 1 epoch, a temporary folder, no torch)
writes the report's files, every budgeted variant's step fits its budget as `edgetrain inspect` counts it (or the
budget is refused with the smallest option named), each variant was trained by a worker that imported the device
side alone and measured its own peak RSS, and full fine-tuning and head-only train what they say. No assertion
here depends on how fast anything is or on the accuracy reached in one epoch."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("budget")
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "budget_bench.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.mark.slow
def test_quick_run_writes_the_report_and_every_budget_is_kept(quick):
    assert (quick / "memory_budget.md").is_file() and (quick / "memory_budget.json").is_file()
    assert (quick / "memory_budget.png").is_file() == HAS_MATPLOTLIB
    doc = json.loads((quick / "memory_budget.json").read_text())
    assert doc["settings"]["quick"] is True and doc["settings"]["epochs"] == 1
    assert list(doc["models"]) == ["digits"]  # no torch needed
    m = doc["models"]["digits"]
    rows = {r["variant"]: r for r in m["rows"]}
    assert list(rows) == ["full", "head-only", "budget 1/2", "budget 1/4", "budget 1/8"]
    full = m["full_budgeted_bytes"]
    assert full == rows["full"]["budgeted_bytes"] > 0
    assert 0 <= m["base"]["user_accuracy"] <= 1 and m["base"]["original_accuracy"] > 0.9
    for frac in (2, 4, 8):
        r = rows[f"budget 1/{frac}"]
        assert r["budget_bytes"] == full // frac
        if "refused" in r:
            assert r["smallest"] and "smallest planned peak" in r["refused"]
            continue
        assert 0 < r["budgeted_bytes"] <= r["budget_bytes"], r
        assert r["planned_peak_bytes"] >= r["budgeted_bytes"]
        last = re.search(r"the last (\d+) of", r["option"])
        deep = r["option"].startswith("every parameter") or (last is not None and int(last.group(1)) > 1)
        assert r["lr"] == (0.01 if deep else 0.05), r  # weights deeper than the head train at full's rate
    assert rows["full"]["option"] == "every parameter" and rows["full"]["lr"] == 0.01
    head = rows["head-only"]
    assert head["trainable_values"] == 84 * 10 + 10 and head["lr"] == 0.05  # fc3, the demo's head
    for r in rows.values():
        if "refused" in r:
            continue
        assert r["leaked"] == [], r["variant"]  # the worker trained with the device side alone
        assert r["steps"] == 5 and len(r["curve"]) == 1  # 1 epoch of the user's 50 digits at batch 10
        assert r["peak_hwm_kib"] >= r["start_hwm_kib"] > 0 and r["growth_kib"] >= 0
        assert 0 <= r["user_accuracy"] <= 1 and 0 <= r["original_accuracy"] <= 1
    text = (quick / "memory_budget.md").read_text()
    assert "| base model |" in text and "| budget 1/8 |" in text
