"""Builds android_demo's embedded training artifact from the demo's base model (build side: needs onnx):
edgetrain/data/digits_lenet.onnx -> android_demo/data/digits.etrain. Deterministic: the same inputs give the same
bytes, which tests/test_android_demo.py checks, so the committed file cannot go stale unnoticed.

    python tools/build_android_assets.py [--check]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import edgetrain as et

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "edgetrain", "data", "digits_lenet.onnx")
TARGET = os.path.join(ROOT, "android_demo", "data", "digits.etrain")
BATCH = 10  # the user's samples per step; ignore_index lets a burst with fewer samples pad its batches


def build(path: str) -> int:
    """Full fine-tuning of the LeNet digits model, SGD with momentum at the rate the demo measured for it."""
    art = et.convert(
        SOURCE,
        loss=et.CrossEntropyLoss(ignore_index=-100),
        optimizer=et.SGD(lr=0.01, momentum=0.9),
        batch_size=BATCH,
    )
    return art.save(path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--check", action="store_true", help="only check that the committed artifact is up to date"
    )
    args = p.parse_args()
    if not args.check:
        size = build(TARGET)
        print(f"wrote {TARGET} ({size / 1024:.1f} KiB)")
        return 0
    with tempfile.TemporaryDirectory() as d:
        fresh = os.path.join(d, "digits.etrain")
        build(fresh)
        same = open(fresh, "rb").read() == open(TARGET, "rb").read()
    print(f"{TARGET}: {'up to date' if same else 'STALE: run python tools/build_android_assets.py'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
