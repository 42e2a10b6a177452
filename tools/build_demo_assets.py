"""Builds the demo's embedded assets (run once by a developer; the outputs are committed):

    edgetrain/data/digits/    the UCI handwritten digits (scikit-learn's bundled copy) as MNIST idx files at 28x28:
                              train-* (base model's training set) and t10k-* (its test set)
    edgetrain/data/newuser/   a "new user": held-out digits under one fixed change of handwriting (slanted, rotated,
                              heavier strokes): train-* (a few dozen samples to personalize on), t10k-* (held out)
    edgetrain/data/digits_lenet.onnx
                              a LeNet-style base model trained from scratch on digits/train by edgetrain itself
    edgetrain/data/digits_lenet_fresh.onnx
                              the same LeNet untrained (its initial weights, seeded): what the README's federated
                              example starts from (`--only fresh`; no training, the same bytes on every machine)
    edgetrain/data/digits_lstm.onnx, digits_gru.onnx
                              sequence models of the same digits, read row by row (28 steps of 28 pixels) by an
                              ONNX LSTM or GRU node, trained from scratch the same way (`edgetrain demo --model lstm`)

Needs the build side and scikit-learn:  pip install -e ".[dev]" scikit-learn;  python tools/build_demo_assets.py
`--only lstm gru` rebuilds just those base models from the committed data files (no scikit-learn needed);
`--only fresh` writes the untrained LeNet alone.
Everything is seeded: running it again rebuilds the same data files (the model's bytes may vary with numpy's BLAS).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import struct
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "edgetrain", "data")
SEED = 20261122
PER_CLASS_FINETUNE = 5  # the new user's samples per digit to personalize on (50 in all)
USER_POOL = 450  # held-out digits given to the new user (the rest of them are the user's test set)
BASE_TEST = 297  # held-out digits in the base model's test set, in the original handwriting


# ---- images ---------------------------------------------------------------------------------------------------
def bilinear(img: np.ndarray, src_r: np.ndarray, src_c: np.ndarray) -> np.ndarray:
    """img sampled at fractional (row, col) positions, zero outside."""
    h, w = img.shape
    r0, c0 = np.floor(src_r).astype(int), np.floor(src_c).astype(int)
    fr, fc = src_r - r0, src_c - c0
    out = np.zeros(src_r.shape, np.float64)
    for dr, wr in ((0, 1 - fr), (1, fr)):
        for dc, wc in ((0, 1 - fc), (1, fc)):
            r, c = r0 + dr, c0 + dc
            ok = (r >= 0) & (r < h) & (c >= 0) & (c < w)
            out += np.where(ok, img[np.clip(r, 0, h - 1), np.clip(c, 0, w - 1)], 0.0) * wr * wc
    return out


def to_mnist(img8: np.ndarray) -> np.ndarray:
    """An 8x8 UCI digit (0..16) -> a 28x28 MNIST-style image (0..255): scaled into a 20x20 box, then centred by
    its centre of mass in the 28x28 frame, as MNIST was made."""
    # pixel centres of a 20x20 grid mapped onto the 8x8 grid's centres
    t = (np.arange(20) + 0.5) * 8 / 20 - 0.5
    rr, cc = np.meshgrid(t, t, indexing="ij")
    box = bilinear(np.pad(img8 / 16.0, 1, mode="edge")[1:-1, 1:-1], rr, cc)
    box = np.clip(box, 0, 1)
    ys, xs = np.mgrid[0:20, 0:20]
    m = box.sum()
    cy, cx = (ys * box).sum() / m, (xs * box).sum() / m
    out = np.zeros((28, 28))
    oy, ox = int(round(13.5 - cy)), int(round(13.5 - cx))
    oy, ox = min(max(oy, 0), 8), min(max(ox, 0), 8)
    out[oy : oy + 20, ox : ox + 20] = box
    return np.round(out * 255).astype(np.uint8)


def new_user_style(img: np.ndarray, *, angle_deg: float, shear: float, thicken: int) -> np.ndarray:
    """The new user's handwriting: the same digit rotated, slanted and written with a heavier pen."""
    x = img.astype(np.float64) / 255
    a = np.deg2rad(angle_deg)
    rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    sh = np.array([[1.0, 0.0], [-shear, 1.0]])  # (row, col): col shifts with row -> a slant
    m = rot @ sh
    inv = np.linalg.inv(m)
    rr, cc = np.mgrid[0:28, 0:28].astype(np.float64)
    p = np.stack([rr.ravel() - 13.5, cc.ravel() - 13.5])
    src = inv @ p
    y = bilinear(x, src[0].reshape(28, 28) + 13.5, src[1].reshape(28, 28) + 13.5)
    for _ in range(thicken):  # grey dilation with a 3x3 cross
        z = np.pad(y, 1)
        y = np.maximum.reduce([z[1:-1, 1:-1], z[:-2, 1:-1], z[2:, 1:-1], z[1:-1, :-2], z[1:-1, 2:]])
    return np.round(np.clip(y, 0, 1) * 255).astype(np.uint8)


USER_STYLE = {"angle_deg": -25.0, "shear": 0.35, "thicken": 1}


# ---- idx files --------------------------------------------------------------------------------------------------
def write_idx(path: str, array: np.ndarray) -> None:
    """MNIST's idx format, gzip-compressed, with a fixed mtime so that rebuilding gives identical bytes."""
    arr = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">HBB", 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    tmp = path + ".tmp"
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write(header + arr.tobytes())
    os.replace(tmp, path)


def write_split(directory: str, split: str, images: np.ndarray, labels: np.ndarray) -> None:
    os.makedirs(directory, exist_ok=True)
    write_idx(os.path.join(directory, f"{split}-images-idx3-ubyte.gz"), images)
    write_idx(os.path.join(directory, f"{split}-labels-idx1-ubyte.gz"), labels)


def build_data() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits

    d = load_digits()
    images = np.stack([to_mnist(im) for im in d.images])
    labels = d.target.astype(np.uint8)
    rng = np.random.default_rng(SEED)
    order = rng.permutation(len(labels))
    user, test, train = np.split(order, [USER_POOL, USER_POOL + BASE_TEST])
    # the user's few dozen training samples: PER_CLASS_FINETUNE of each digit, the rest held out
    fine = np.concatenate([user[labels[user] == k][:PER_CLASS_FINETUNE] for k in range(10)])
    fine = fine[rng.permutation(len(fine))]
    held = np.setdiff1d(user, fine)
    held = held[rng.permutation(len(held))]
    styled = {i: new_user_style(images[i], **USER_STYLE) for i in user}
    return {
        "digits/train": (images[train], labels[train]),
        "digits/t10k": (images[test], labels[test]),
        "newuser/train": (np.stack([styled[i] for i in fine]), labels[fine]),
        "newuser/t10k": (np.stack([styled[i] for i in held]), labels[held]),
    }


# ---- the base model ---------------------------------------------------------------------------------------------
def lenet_onnx(seed: int):
    """LeNet-5 style: Conv(1->6, 5x5, pad 2)+ReLU+MaxPool, Conv(6->16, 5x5)+ReLU+MaxPool, FC 400-120-84-10, Softmax;
    He-normal weights, zero biases."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def param(name, shape, fan_in):
        w = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in) if fan_in else np.zeros(shape)
        inits.append(numpy_helper.from_array(w.astype(np.float32), name))
        return name

    def conv(x, name, cin, cout, k, **attrs):
        w = param(f"{name}.weight", (cout, cin, k, k), cin * k * k)
        b = param(f"{name}.bias", (cout,), 0)
        nodes.append(helper.make_node("Conv", [x, w, b], [name], kernel_shape=[k, k], **attrs))
        return name

    def gemm(x, name, fin, fout):
        w = param(f"{name}.weight", (fout, fin), fin)
        b = param(f"{name}.bias", (fout,), 0)
        nodes.append(helper.make_node("Gemm", [x, w, b], [name], transB=1))
        return name

    def op(kind, x, out, **attrs):
        nodes.append(helper.make_node(kind, [x], [out], **attrs))
        return out

    h = op("Relu", conv("image", "conv1", 1, 6, 5, pads=[2, 2, 2, 2]), "relu1")
    h = op("MaxPool", h, "pool1", kernel_shape=[2, 2], strides=[2, 2])
    h = op("Relu", conv(h, "conv2", 6, 16, 5), "relu2")
    h = op("MaxPool", h, "pool2", kernel_shape=[2, 2], strides=[2, 2])
    h = op("Flatten", h, "flat")
    h = op("Relu", gemm(h, "fc1", 400, 120), "relu3")
    h = op("Relu", gemm(h, "fc2", 120, 84), "relu4")
    op("Softmax", gemm(h, "fc3", 84, 10), "probabilities", axis=1)
    return _digit_model(nodes, "digits_lenet", inits)


def recurrent_onnx(seed: int, op: str = "LSTM", hidden: int = 64):
    """A digit read as a sequence: image [N, 1, 28, 28] -> Reshape [N, 28, 28] -> Transpose [28, N, 28] (time first,
    layout 0: one image row a step) -> LSTM or GRU (forward, `hidden` units) -> its last hidden state Y_h [1, N, H]
    -> Squeeze [N, H] -> Gemm "fc" to 10 classes -> Softmax, the same input and output as lenet_onnx. Weights
    uniform in +-1/sqrt(hidden) (PyTorch's recurrent default), the LSTM's forget gate biased open (+1), He-normal
    classifier, zero biases."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(seed)
    gates = {"LSTM": 4, "GRU": 3}[op]
    k = 1 / np.sqrt(hidden)
    bias = np.zeros((1, 2 * gates * hidden))
    if op == "LSTM":
        bias[0, 2 * hidden : 3 * hidden] = 1.0  # gates in ONNX's order i, o, f, c: f is the third
    arrays = {
        "rows_shape": np.array([-1, 28, 28], np.int64),
        f"{op.lower()}.W": rng.uniform(-k, k, (1, gates * hidden, 28)),
        f"{op.lower()}.R": rng.uniform(-k, k, (1, gates * hidden, hidden)),
        f"{op.lower()}.B": bias,
        "direction_axis": np.array([0], np.int64),
        "fc.weight": rng.standard_normal((10, hidden)) * np.sqrt(2.0 / hidden),
        "fc.bias": np.zeros(10),
    }
    inits = [
        numpy_helper.from_array(a if a.dtype == np.int64 else a.astype(np.float32), name)
        for name, a in arrays.items()
    ]
    rnn = op.lower()
    nodes = [
        helper.make_node("Reshape", ["image", "rows_shape"], ["rows"]),
        helper.make_node("Transpose", ["rows"], ["steps"], perm=[1, 0, 2]),
        helper.make_node(
            op,
            ["steps", f"{rnn}.W", f"{rnn}.R", f"{rnn}.B"],
            ["", "last_hidden"],  # Y is not needed: the last step's hidden state only
            name=rnn,
            hidden_size=hidden,
            direction="forward",
        ),
        helper.make_node("Squeeze", ["last_hidden", "direction_axis"], ["features"]),
        helper.make_node("Gemm", ["features", "fc.weight", "fc.bias"], ["fc"], name="fc", transB=1),
        helper.make_node("Softmax", ["fc"], ["probabilities"], axis=1),
    ]
    return _digit_model(nodes, f"digits_{rnn}", inits)


def _digit_model(nodes, name: str, inits):
    """The base models' common frame: image [N, 1, 28, 28] in, probabilities [N, 10] out, opset 18, checked."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 28, 28])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="edgetrain")
    onnx.checker.check_model(model, full_check=True)
    return model


# name -> how to build and train it: SGD's learning rate, default epochs, BLAS threads (None: numpy's default).
# Measured on digits/t10k: lenet 99.3% after 15 epochs; lstm 97.0% and gru 96.3% after 30, about 0.5 s an epoch
# on a 2-core x86-64 with one BLAS thread (a recurrence's small products run 4 to 10 times slower on two busy
# cores than on one).
BASE_MODELS = {
    "lenet": {"build": lenet_onnx, "lr": 0.05, "epochs": 15, "threads": None},
    "lstm": {"build": lambda seed: recurrent_onnx(seed, "LSTM"), "lr": 0.1, "epochs": 30, "threads": 1},
    "gru": {"build": lambda seed: recurrent_onnx(seed, "GRU"), "lr": 0.1, "epochs": 30, "threads": 1},
}


def write_fresh(out_path: str, *, seed: int) -> None:
    """The LeNet as lenet_onnx(seed) makes it, untrained, with the trained models' input pipeline (x / 255 of 8-bit
    pixels) in its metadata_props, as edgetrain's export writes it: convert reads it from there."""
    import onnx

    from loaders import InputPipeline

    model = lenet_onnx(seed)
    model.graph.name = "digits_lenet_fresh"
    entry = model.metadata_props.add()
    entry.key = "edgetrain.preprocessing"
    entry.value = json.dumps(InputPipeline.from_options(scale="1/255").to_json())
    onnx.save(model, out_path)


def train_base(directory: str, out_path: str, *, epochs: int, seed: int, model: str = "lenet") -> None:
    """Trains BASE_MODELS[model] from scratch with edgetrain on directory's train split (cosine schedule, SGD with
    momentum) and exports it to out_path."""
    import tempfile

    import edgetrain as et
    from edgetrain.runtime.feeding import feed_view
    from loaders import DataLoader, InputPipeline, MnistDataView

    recipe = BASE_MODELS[model]
    # raw 0..255 pixels: the model's declared input pipeline divides them by 255 (and its export says so)
    train = MnistDataView.from_dir(directory, "train").raw()
    test = MnistDataView.from_dir(directory, "test").raw()
    batch = 32
    art = et.convert(
        recipe["build"](seed),
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=recipe["lr"], momentum=0.9, weight_decay=5e-4),
        batch_size=batch,
        preprocessing=InputPipeline.from_options(scale="1/255"),
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "base.etrain")
        art.save(path)
        sess = et.TrainingSession(path, threads=recipe["threads"])
        scale = feed_view(train, sess).transform
        loader = DataLoader(train, batch, shuffle=True, seed=seed, drop_last=True, batch_transform=scale)
        val = DataLoader(test, batch, batch_transform=scale)
        steps = epochs * len(loader)

        def show(info):
            if info["event"] == "epoch":
                print(
                    f"  epoch {info['epoch']:2d}  train loss {info['train_loss']:.4f}  test loss "
                    f"{info['val_loss']:.4f}  test accuracy {info['val_accuracy']:.2%}",
                    flush=True,
                )

        trainer = et.Trainer(
            sess, loader, val_loader=val, epochs=epochs, schedule=et.CosineLR(steps), progress=show
        )
        t0 = time.perf_counter()
        result = trainer.fit()
        print(f"  trained {result.steps} steps in {time.perf_counter() - t0:.1f} s")
        sess.export_onnx(out_path, preprocessing=False)  # the pipeline goes in its metadata_props


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--epochs",
        type=int,
        help="base model training epochs (default: each model's own, lenet 15, lstm and gru 30)",
    )
    p.add_argument("--data-only", action="store_true", help="rewrite the idx files only")
    p.add_argument(
        "--only",
        nargs="+",
        choices=[*BASE_MODELS, "fresh"],
        help="rebuild only these base models, from the committed data files (e.g. --only lstm); fresh: the "
        "untrained LeNet",
    )
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    if not args.only:
        for name, (x, y) in build_data().items():
            sub, split = name.split("/")
            write_split(os.path.join(DATA, sub), split, x, y)
            print(f"wrote {name}: {len(y)} images, {np.bincount(y, minlength=10).tolist()} per digit")
    if args.data_only:
        return 0
    for model in args.only or [*BASE_MODELS, "fresh"]:
        if model == "fresh":
            out = os.path.join(DATA, "digits_lenet_fresh.onnx")
            write_fresh(out, seed=SEED)
            print(f"wrote {os.path.relpath(out, ROOT)} ({os.path.getsize(out) / 1024:.0f} KiB), untrained")
            continue
        epochs = args.epochs or BASE_MODELS[model]["epochs"]
        print(f"training the {model} base model with edgetrain:")
        out = os.path.join(DATA, f"digits_{model}.onnx")
        train_base(os.path.join(DATA, "digits"), out, epochs=epochs, seed=SEED, model=model)
        print(f"wrote {os.path.relpath(out, ROOT)} ({os.path.getsize(out) / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
