"""A training artifact and the repository's digits -> one JSON line on stdout: what a device computes when it
personalizes the demo model (numpy only; tools/arm/job.py runs it natively and on an emulated aarch64 CPU, and
compares the numbers).

    python tools/arm/device_check.py ARTIFACT WORKDIR [--steps N]

Deterministic: a seeded shuffling DataLoader over the new user's 50 digits, `--steps` TrainingSession steps with
a checkpoint saved halfway and then loaded again (the steps after it are replayed and must repeat exactly), an
evaluation on the held-out digits, and one epoch of the Trainer (validation, checkpoint). onnx, onnxruntime and
torch are made unimportable first, as on a phone without them; the last check is that none was imported.
"""

from __future__ import annotations

import sys

BLOCKED = ("onnx", "onnxruntime", "torch")


class _Block:
    """A meta path finder that refuses the build side's packages (as tests/harness/device.py does)."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked on the device: {name}")


sys.meta_path.insert(0, _Block())

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(
    ROOT, "edgetrain", "data", "newuser"
)  # train: 50 digits to learn from; t10k: 400 held out
BATCH = 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact")
    ap.add_argument("workdir", help="checkpoints go here")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--held-out", type=int, default=400, help="held-out digits to evaluate on")
    args = ap.parse_args()
    t_start = time.perf_counter()
    os.makedirs(args.workdir, exist_ok=True)

    import edgetrain as et
    from edgetrain.runtime.trainer import evaluate
    from loaders import DataLoader, MnistDataView, SubsetView

    t_import = time.perf_counter() - t_start
    train = MnistDataView.from_dir(DATA, "train")
    held_all = MnistDataView.from_dir(DATA, "test")
    held = SubsetView(held_all, np.arange(min(args.held_out, held_all.size())))

    # -- TrainingSession over a DataLoader, a checkpoint halfway, then the rest replayed from it --------------
    t0 = time.perf_counter()
    sess = et.TrainingSession(args.artifact)
    loader = DataLoader(train, BATCH, shuffle=True, seed=0)
    half = args.steps // 2
    ckpt = os.path.join(args.workdir, "half.etck")
    losses, order = [], hashlib.sha256()
    for step in range(args.steps):
        if step == half:
            sess.save_checkpoint(ckpt, user_state={"loader": loader.state()})
        x, y = loader.next()
        order.update(np.ascontiguousarray(y, dtype="<i8").tobytes())
        losses.append(sess.train_step(x, y))
    user_state = sess.load_checkpoint(ckpt)
    loader.restore(user_state["loader"])
    replay = [sess.train_step(*loader.next()) for _ in range(half, args.steps)]
    replay_exact = replay == losses[half:]
    t_train = time.perf_counter() - t0

    # -- evaluation with inference semantics on held-out digits --------------------------------------------
    t0 = time.perf_counter()
    eval_loss, eval_acc = evaluate(sess, DataLoader(held, BATCH))
    probs = sess.run(held.get_batch(np.arange(BATCH))[0])
    t_eval = time.perf_counter() - t0

    # -- one epoch of the Trainer on a fresh session: validation, a checkpoint ------------------------------
    t0 = time.perf_counter()
    trainer = et.Trainer(
        et.TrainingSession(args.artifact),
        DataLoader(train, BATCH, shuffle=True, seed=1),
        val_loader=DataLoader(SubsetView(held_all, np.arange(50)), BATCH),
        epochs=1,
        checkpoint=os.path.join(args.workdir, "trainer.etck"),
    )
    result = trainer.fit()
    rec = result.history[-1]
    t_trainer = time.perf_counter() - t0

    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not leaked, f"the device side imported build-side packages: {leaked}"
    print(
        json.dumps(
            {
                "machine": platform.machine(),
                "python": platform.python_version(),
                "numpy": np.__version__,
                "losses": losses,
                "replay_losses": replay,
                "checkpoint_replay_exact": replay_exact,
                "batch_order_sha256": order.hexdigest()[:16],
                "eval": {"loss": eval_loss, "accuracy": eval_acc, "samples": held.size()},
                "first_probabilities": [float(v) for v in probs[0]],
                "trainer": {
                    "steps": result.steps,
                    "train_loss": rec.get("train_loss"),
                    "val_loss": rec.get("val_loss"),
                    "val_accuracy": rec.get("val_accuracy"),
                },
                "seconds": {
                    "import": round(t_import, 3),
                    "train": round(t_train, 3),
                    "eval": round(t_eval, 3),
                    "trainer": round(t_trainer, 3),
                    "total": round(time.perf_counter() - t_start, 3),
                },
            }
        )
    )
    if not replay_exact:
        sys.exit(f"the steps replayed from the checkpoint gave other losses: {replay} != {losses[half:]}")


if __name__ == "__main__":
    main()
