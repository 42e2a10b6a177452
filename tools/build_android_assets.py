"""Builds android_demo's embedded training artifacts from the demos' base models (build side: needs onnx):
edgetrain/data/digits_lenet.onnx -> android_demo/data/digits.etrain, and the keyboard's language model
edgetrain/data/keyboard/keyboard_lm.onnx -> android_demo/data/keyboard.etrain (NextTokenLoss, LoRA on the attention
and MLP MatMuls, the base frozen) with its vocabulary (keyboard_vocab.json). Deterministic: the same inputs give the
same bytes, which tests/android_demo/test_android_demo.py checks, so the committed files cannot go stale unnoticed.

    python tools/build_android_assets.py [--check] [--target digits|keyboard]
"""

from __future__ import annotations

import argparse
import os
import shutil
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


KEYBOARD = os.path.join(ROOT, "edgetrain", "data", "keyboard")
KEYBOARD_TARGET = os.path.join(ROOT, "android_demo", "data", "keyboard.etrain")
KEYBOARD_VOCAB = os.path.join(ROOT, "android_demo", "data", "keyboard_vocab.json")
KEYBOARD_BATCH = 8  # sentences per step (one window each); fewer are padded with targets the loss ignores
LORA_RANK, LORA_ALPHA, LORA_LR = (
    4,
    8.0,
    1e-2,
)  # 12 adapted MatMuls: 9,216 trainable parameters, a version of 38 KB


def build_keyboard(path: str) -> int:
    """The keyboard LM with next-token loss and LoRA (rank 4) on its attention and MLP MatMuls; only the adapters
    train (Adam at the rate measured on the new user's sentences)."""
    art = et.convert(
        os.path.join(KEYBOARD, "keyboard_lm.onnx"),
        loss=et.NextTokenLoss(),
        optimizer=et.Adam(lr=LORA_LR),
        batch_size=KEYBOARD_BATCH,
        adapters=et.LoRA(rank=LORA_RANK, alpha=LORA_ALPHA, targets=["*attn*", "*mlp*"]),
    )
    return art.save(path)


TARGETS = {"digits": (build, TARGET), "keyboard": (build_keyboard, KEYBOARD_TARGET)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--check", action="store_true", help="only check that the committed artifacts are up to date"
    )
    p.add_argument(
        "--target", choices=sorted(TARGETS), action="append", help="build only these (default: all)"
    )
    args = p.parse_args()
    names = args.target or sorted(TARGETS)
    if not args.check:
        for name in names:
            make, target = TARGETS[name]
            size = make(target)
            print(f"wrote {target} ({size / 1024:.1f} KiB)")
            if name == "keyboard":
                shutil.copyfile(os.path.join(KEYBOARD, "vocab.json"), KEYBOARD_VOCAB)
                print(f"wrote {KEYBOARD_VOCAB}")
        return 0
    stale = 0
    for name in names:
        make, target = TARGETS[name]
        with tempfile.TemporaryDirectory() as d:
            fresh = os.path.join(d, os.path.basename(target))
            make(fresh)
            same = open(fresh, "rb").read() == open(target, "rb").read()
        if name == "keyboard":
            same = (
                same
                and open(os.path.join(KEYBOARD, "vocab.json"), "rb").read()
                == open(KEYBOARD_VOCAB, "rb").read()
            )
        print(f"{target}: {'up to date' if same else 'STALE: run python tools/build_android_assets.py'}")
        stale += not same
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
