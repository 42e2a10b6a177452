"""`simulate`: the whole on-phone story on a desktop, with data the packages carry -> a short table (or one JSON line).

A new user's handwritten digits (edgetrain's embedded "new user": rotated, slanted, a heavier pen) arrive one by
one in the app's sample store; every few samples a burst of personalization runs, and is kept or rolled back by the
app's own validation split; after each burst, the current model is measured on 400 more of the user's digits that
the app never sees. Deterministic: no time budget, fixed seeds, so two runs (or an emulated ARM run) agree.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
from typing import Any, TextIO

import numpy as np

import edgetrain
from edgetrain.runtime.feeding import feed_view
from edgetrain.runtime.trainer import evaluate, session_batch
from loaders import DataLoader, MnistDataView, SubsetView
from loaders.values import count

from .app import Home
from .home import remove_home
from .settings import MAX_STEPS

HERE = os.path.dirname(os.path.abspath(__file__))
ARTIFACT = os.path.join(HERE, "data", "digits.etrain")  # tools/build_android_assets.py builds it
NEW_USER = os.path.join(os.path.dirname(HERE), "edgetrain", "data", "newuser")


def _new_user() -> tuple[MnistDataView, MnistDataView]:
    folder = NEW_USER
    if not os.path.isdir(folder):  # installed as a wheel: edgetrain's package data
        folder = os.path.join(os.path.dirname(edgetrain.__file__), "data", "newuser")
    # the pixels as a phone holds them (0..255): the model's input pipeline scales them
    user = MnistDataView(
        os.path.join(folder, "train-images-idx3-ubyte.gz"),
        os.path.join(folder, "train-labels-idx1-ubyte.gz"),
        normalize=False,
    )
    held = MnistDataView(
        os.path.join(folder, "t10k-images-idx3-ubyte.gz"),
        os.path.join(folder, "t10k-labels-idx1-ubyte.gz"),
        normalize=False,
    )
    return user, held


def heldout_accuracy(home: Home, held) -> float:
    sess = home.session()
    loader = DataLoader(held, session_batch(sess) or 32, batch_transform=feed_view(held, sess).transform)
    _, acc = evaluate(sess, loader)
    return float(acc)


def simulate(
    *,
    home: str | None = None,
    every: int = 10,
    steps: int = 25,
    quick: bool = False,
    artifact: str = ARTIFACT,
    out: TextIO | None = sys.stdout,
) -> dict[str, Any]:
    """Runs the story and returns what it measured; prints the table to `out` (None: quiet)."""
    every = count(every, "every (--every)", lo=1, hi=MAX_STEPS, fix="give a burst every N samples, e.g. 10")
    steps = count(steps, "steps (--steps)", lo=1, hi=MAX_STEPS, fix="give steps per burst, e.g. 25")
    t0 = time.perf_counter()
    user, held = _new_user()
    order = np.random.default_rng(0).permutation(user.size())  # the user writes digits in no particular order
    if quick:  # a short run for emulated CPUs: 20 samples, two bursts of 5 steps, 100 held-out digits
        order, every, steps, held = order[:20], 10, 5, SubsetView(held, np.arange(100))
    own = home is None
    home = home or tempfile.mkdtemp(prefix="android_demo_sim_")
    try:
        app = Home.init(home, artifact, max_steps=steps, max_seconds=None)
        say = (lambda text: print(text, file=out)) if out is not None else (lambda text: None)
        base = heldout_accuracy(app, held)
        say(f"a new user's digits arrive one by one; a burst of up to {steps} steps every {every} samples")
        say(f"(accuracy measured on {held.size()} more of the user's digits that the app never sees)\n")
        say(
            f"{'samples':>8} {'burst':>6} {'steps':>6} {'val before':>11} {'val after':>10} {'kept':>5} "
            f"{'version':>8} {'user accuracy':>14} {'seconds':>8}"
        )
        say(f"{0:8d} {'-':>6} {'-':>6} {'-':>11} {'-':>10} {'-':>5} {0:8d} {base:14.1%} {'-':>8}")
        bursts, losses, accuracy = [], [], []
        for k, idx in enumerate(order, 1):
            x, y = user.get_item(int(idx))
            app.add(x, y)
            if k % every and k != len(order):
                continue
            r = app.personalize(force=True)
            acc = heldout_accuracy(app, held)
            bursts.append(
                {
                    **{key: getattr(r, key) for key in ("kept", "steps", "model_version", "seconds")},
                    "samples": k,
                    "val_accuracy_before": r.val_accuracy_before,
                    "val_accuracy_after": r.val_accuracy_after,
                    "user_accuracy": acc,
                    "reason": r.reason,
                }
            )
            losses += r.losses
            accuracy.append(acc)
            before = "-" if r.val_accuracy_before is None else f"{r.val_accuracy_before:.0%}"
            after = "-" if r.val_accuracy_after is None else f"{r.val_accuracy_after:.0%}"
            say(
                f"{k:8d} {len(bursts):6d} {r.steps:6d} {before:>11} {after:>10} {'yes' if r.kept else 'no':>5} "
                f"{r.model_version:8d} {acc:14.1%} {r.seconds:8.2f}"
            )
        seconds = time.perf_counter() - t0
        say(
            f"\nthe user's accuracy went from {base:.1%} to {accuracy[-1]:.1%} in {len(bursts)} bursts "
            f"({sum(b['kept'] for b in bursts)} kept), {seconds:.1f} s in all"
            + ("" if own else f"; the app's home is {home}")
        )
        return {
            "machine": platform.machine(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "base_accuracy": base,
            "accuracy": accuracy,
            "losses": losses,
            "bursts": bursts,
            "seconds": round(seconds, 3),
            "home": None if own else home,
        }
    finally:
        if own:
            remove_home(home)
