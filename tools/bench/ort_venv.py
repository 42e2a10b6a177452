"""onnxruntime-training 1.19.2 as a peer, from the parent: a venv path -> its python, with onnxruntime-training
installed on demand (its own environment: it conflicts with the plain onnxruntime package), and cases -> their
onnxruntime-training artifacts generated from the same ONNX models (see ort_artifacts.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from prepare import ort_model

VERSION = "1.19.2"  # the last release: the on-device training packages were deprecated in 1.20
HERE = Path(__file__).resolve().parent


def ensure_venv(venv: Path) -> tuple[Path, float]:
    """(the venv's python, seconds spent installing); creates the venv and installs onnxruntime-training and onnx
    (the artifact generator needs it) unless it is there already."""
    python = venv / "bin" / "python"
    if installed_version(python) == VERSION:
        return python, 0.0
    t0 = time.perf_counter()
    print(
        f"bench: installing onnxruntime-training=={VERSION} into {venv} (a ~800 MB CUDA build; once)",
        flush=True,
    )
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"onnxruntime-training=={VERSION}", "onnx"], check=True
    )
    if installed_version(python) != VERSION:
        raise SystemExit(f"bench: onnxruntime-training {VERSION} did not install into {venv}")
    return python, time.perf_counter() - t0


def installed_version(python: Path) -> str | None:
    if not python.exists():
        return None
    code = "import importlib.metadata as m; print(m.version('onnxruntime-training'))"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def generate(python: Path, cases: list[dict], work: Path) -> None:
    """Adds to each case its onnxruntime-training artifact folder ("ort") and files' bytes, or "ort_error"."""
    jobs = []
    for case in cases:
        d = Path(case["x"]).parent
        model = ort_model(Path(case["onnx"]), d / "model_ort.onnx")
        jobs.append(
            {
                "config": case["config"],
                "onnx": str(model),
                "requires_grad": case["trainable"],  # the parameters edgetrain trains, by ONNX name
                "frozen": case["frozen"],
                "out": str(d / "ort"),
            }
        )
    path = work / "ort_jobs.json"
    path.write_text(json.dumps(jobs))
    done = subprocess.run(
        [str(python), str(HERE / "ort_artifacts.py"), str(path)], capture_output=True, text=True
    )
    results = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):  # the generator's own prints are not ours
            r = json.loads(line)
            results[r["config"]] = r
    for case, job in zip(cases, jobs):
        r = results.get(case["config"], {"error": f"the generator stopped: {done.stderr.strip()[-300:]}"})
        if "error" in r:
            case["ort_error"] = r["error"]
            continue
        case["ort"] = job["out"]
        case["ort_label_dtype"] = r["label_dtype"]
        case["facts"]["ort_files"] = r["files"]
        case["facts"]["ort_bytes"] = sum(r["files"].values())
