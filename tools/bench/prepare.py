"""Build side of the benchmark (the parent process; needs onnx, and torch for the PyTorch peer and the torchvision
models): a Config -> a folder of files every runtime reads (the ONNX model, the batch, edgetrain's artifact, the
pickled PyTorch module) and a case dict: the workers' spec plus the facts the report needs (FLOPs per step,
parameter counts, artifact bytes, edgetrain's planned memory).

Every runtime starts from the same initial weights: the ONNX initializers. The PyTorch module gets them copied in,
and onnxruntime-training's artifacts are generated from the same ONNX file (tools/bench/ort_artifacts.py)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from configs import EPOCH_SAMPLES, LR, MOMENTUM, WEIGHT_DECAY, Config
from onnx import numpy_helper

import edgetrain as et

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(
    0, str(ROOT / "tests" / "harness")
)  # the test suite's models and exports are the benchmark's models


def prepare(c: Config, work: Path, *, with_torch: bool) -> dict[str, Any]:
    """Writes the files for configuration c under work/c.name; returns its case (spec + facts)."""
    d = work / c.name
    d.mkdir(parents=True, exist_ok=True)
    model_path, module, heads = _model(c, d, work, with_torch)
    x, y = _data(c)
    np.save(d / "x.npy", x)
    np.save(d / "y.npy", y)
    onnx_head, torch_head = heads
    trainable = sorted(onnx_head) if c.head_only else None
    etrain, art = _convert(model_path, d / "model.etrain", c, trainable, MOMENTUM, WEIGHT_DECAY)
    case = {
        "config": c.name,
        "kind": "epoch" if c.epoch else "step",
        "batch": c.batch,
        "warmup": c.warmup,
        "steps": c.steps,
        "lr": LR,
        "momentum": MOMENTUM,
        "weight_decay": WEIGHT_DECAY,
        "x": str(d / "x.npy"),
        "y": str(d / "y.npy"),
        "edgetrain": str(etrain),
        "torchvision": c.family == "torchvision",
        "onnx": str(model_path),
        "trainable": list(art.parameters),
        "frozen": list(art.frozen),
    }
    facts = {"edgetrain_bytes": etrain.stat().st_size}
    facts.update(_memory(etrain), **_counts(art))
    facts.update(step_flops(model_path, c.batch, set(art.parameters)))
    if "edgetrain_sgd" in c.runtimes:
        # the like-for-like peer of onnxruntime-training: same model and trained set, plain SGD (no state)
        sgd, _ = _convert(model_path, d / "model_sgd.etrain", c, trainable, 0.0, 0.0)
        case["edgetrain_sgd"] = str(sgd)
        facts["edgetrain_sgd_bytes"] = sgd.stat().st_size
        facts["edgetrain_sgd_planned_peak_bytes"] = _memory(sgd)["edgetrain_planned_peak_bytes"]
    if module is not None:
        case.update(_torch_files(c, d, module, sorted(torch_head) if c.head_only else None, x))
        facts["torch_bytes"] = Path(case["torch_state"]).stat().st_size
    case["facts"] = facts
    return case


def _convert(model_path: Path, out: Path, c: Config, trainable, momentum: float, weight_decay: float):
    """(the saved artifact's path, the artifact): cross-entropy and SGD at lr LR with the given momentum and weight
    decay, at the configuration's batch."""
    art = et.convert(
        str(model_path),
        loss=et.CrossEntropyLoss(),
        optimizer=et.SGD(lr=LR, momentum=momentum, weight_decay=weight_decay),
        trainable=trainable,
        batch_size=c.batch,
    )
    art.save(out)
    return out, art


# ---- models ---------------------------------------------------------------------------------------------------
def _model(c: Config, d: Path, work: Path, with_torch: bool):
    """(ONNX path, torch module holding the ONNX weights or None, (head ONNX names, head torch names))."""
    if c.family in ("mlp", "lenet"):
        import models

        proto = models.MODELS[c.model][0]()
        path = d / "model.onnx"
        onnx.save(proto, path)
        module = None
        if with_torch:
            from torch_models import torch_model

            weights = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
            module = torch_model(c.model, weights)
        return path, module, (set(), set())
    if c.family == "recurrent":
        return _recurrent(c, d)
    if c.family == "image":
        return _image(c, d)
    e = _export(c.model, str(work / "exports"), c.batch)
    head = e.head()
    torch_head = {t for t in e.names if t.startswith(head + ".")}
    return e.path, _with_onnx_weights(e), (e.onnx_names(head), torch_head)


@functools.cache
def _export(model: str, directory: str, batch: int):
    """The torchvision classifier exported as users export it: TorchScript exporter, TrainingMode.EVAL (BatchNorm
    folded into the convolutions), a fixed batch. Shared by the full and head-only configurations."""
    import exports

    Path(directory).mkdir(parents=True, exist_ok=True)
    return exports.export(model, directory, exporter="torchscript", mode="eval", batch=batch)


def _recurrent(c: Config, d: Path):
    """A sequence classifier of tools/bench/seqmodels.py exported as users export it (TorchScript exporter, a fixed
    batch): the ONNX holds the very module's weights, which PyTorch then trains. The export's LSTM/GRU W, R and B
    come from weight_ih, weight_hh and bias_ih + bias_hh with the gates reordered (torch LSTM i,f,g,o -> ONNX i,o,f,c;
    GRU r,z,n -> z,r,h); that the two compute the same logits is checked here, before any worker runs. The
    configuration's own batch: the full and head-only configurations export the same weights (same seed)."""
    import seqmodels

    return _export_module(c, d, seqmodels.build(c.model), "tokens", seqmodels.HEAD)


def _image(c: Config, d: Path):
    """The ViT or ConvNeXt-style net of tools/bench/imagemodels.py, exported like the recurrent classifiers (the
    exporter's default opset: Gelu and LayerNormalization are standard ops there)."""
    import imagemodels

    return _export_module(c, d, imagemodels.build(c.model), "input", imagemodels.HEAD)


def _export_module(c: Config, d: Path, module, input_name: str, head_module: str):
    """(ONNX path, the module, (head ONNX names, head torch names)): module exported at the configuration's batch
    with the TorchScript exporter, its classifier head_module's weight and bias named as in torch."""
    import warnings

    import torch

    x, _ = _data(c)
    path = d / "model.onnx"
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (torch.from_numpy(x),),
            str(path),
            input_names=[input_name],
            output_names=["logits"],
            dynamo=False,
            training=torch.onnx.TrainingMode.EVAL,
        )
    head = {f"{head_module}.weight", f"{head_module}.bias"}
    names = {t.name for t in onnx.load(str(path)).graph.initializer}
    assert head <= names, f"the export renamed the classifier's parameters: {sorted(names)}"
    _check_same_logits(module, path, x)
    return path, module, (head, head)


def _check_same_logits(module, path: Path, x: np.ndarray) -> None:
    """The exported ONNX (run by onnxruntime, when installed here) and the torch module give the same logits on the
    benchmark's batch: the weights reached the ONNX in the gate order it needs. (The workers' first losses are
    compared again in the report.)"""
    try:
        import onnxruntime
    except ImportError:
        return
    import torch

    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}
    err = float(np.max(np.abs(sess.run(["logits"], feed)[0] - expected)))
    assert err < 1e-4, f"{path}: the ONNX export and the torch module disagree by {err:.2e} on the logits"


def _with_onnx_weights(e):
    """The module whose parameters the export holds (the BatchNorm-folded fx GraphModule), in float32 with exactly
    the ONNX initial values (torch's own fold differs from the exporter's in the last bits)."""
    import torch

    inits = {t.name: numpy_helper.to_array(t) for t in e.onnx().graph.initializer}
    params = dict(e.reference.named_parameters())
    with torch.no_grad():
        for t_name, o_name in e.names.items():
            value = inits[o_name].T if t_name in e.transposed else inits[o_name]
            params[t_name].copy_(torch.from_numpy(np.array(value)))  # a writable copy
    return e.reference.eval()


def _data(c: Config) -> tuple[np.ndarray, np.ndarray]:
    """The batch every runtime trains on (the epoch: EPOCH_SAMPLES samples), seeded."""
    if c.family in ("mlp", "lenet"):
        from models import batch_for

        return batch_for(c.model, c.batch)
    if c.family == "recurrent":
        from configs import SEQ_LEN

        rng = np.random.default_rng(3)
        tokens = rng.integers(0, 1000, (c.batch, SEQ_LEN)).astype(np.int64)  # seqmodels.VOCAB token ids
        return tokens, rng.integers(0, 10, c.batch).astype(np.int64)
    if c.family == "image":
        from configs import IMAGE_SIZE

        rng = np.random.default_rng(4)
        x = rng.standard_normal((c.batch, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)
        return x, rng.integers(0, 10, c.batch).astype(np.int64)
    rng = np.random.default_rng(2 if c.epoch else 1)
    n = EPOCH_SAMPLES if c.epoch else c.batch
    return rng.standard_normal((n, 3, 64, 64)).astype(np.float32), rng.integers(0, 10, n).astype(np.int64)


# ---- PyTorch ------------------------------------------------------------------------------------------------
def _torch_files(c: Config, d: Path, module, trainable: list[str] | None, x: np.ndarray) -> dict[str, Any]:
    """Pickles the module (or, for the epoch, its frozen body and its head) for the worker, and its state_dict as a
    PyTorch user would ship it (the artifact-size comparison)."""
    import torch

    files = {"torch_trainable": trainable, "torch_state": str(d / "torch_state.pt")}
    torch.save(module.state_dict(), files["torch_state"])
    if c.epoch:
        body, head = split_head(module, trainable, torch.from_numpy(x[: c.batch]))
        files["torch"] = str(d / "torch_body_head.pt")
        torch.save((body, head), files["torch"])
    else:
        files["torch"] = str(d / "torch_module.pt")
        torch.save(module, files["torch"])
    return files


def split_head(net, trainable: list[str], x):
    """(body, head) of an fx GraphModule: the body is a copy whose head modules (those holding the trainable
    parameters) are identities, the head those modules in call order, so head(body(x)) == net(x). PyTorch's
    head-only epoch runs the body under no_grad, as a PyTorch user would."""
    import copy

    import torch

    heads = {
        name.split(".")[0] for name in trainable
    }  # "classifier.1.weight" -> the classifier and its Dropout
    leaves = [n.target for n in net.graph.nodes if n.op == "call_module" and n.target.split(".")[0] in heads]
    head = torch.nn.Sequential(*[copy.deepcopy(net.get_submodule(t)) for t in leaves])
    body = copy.deepcopy(net)
    for target in leaves:
        parent, _, leaf = target.rpartition(".")
        setattr(body.get_submodule(parent), leaf, torch.nn.Identity())
    with torch.no_grad():
        assert torch.allclose(head(body(x)), net(x), rtol=1e-5, atol=1e-6), (
            "the body/head split changed the model"
        )
    return body.eval(), head.eval()


# ---- facts --------------------------------------------------------------------------------------------------
def _memory(etrain: Path) -> dict[str, int]:
    """edgetrain's planned peak of a training step and its parts, as `edgetrain inspect` prints them (one function:
    edgetrain.runtime.describe.step_memory), set beside the measured RSS."""
    from edgetrain.runtime.describe import artifact_step_memory

    m = artifact_step_memory(etrain)
    return {
        "edgetrain_arena_bytes": m["arena_bytes"],
        "edgetrain_params_bytes": m["parameters_bytes"],
        "edgetrain_state_bytes": m["state_bytes"],
        "edgetrain_frozen_bytes": m["constants_bytes"],
        "edgetrain_optimizer_buffers_bytes": m["optimizer_buffers_bytes"],
        "edgetrain_outputs_bytes": m["outputs_bytes"],
        "edgetrain_planned_peak_bytes": m["peak_bytes"],
    }


def _counts(art) -> dict[str, int]:
    floats = [v for v in art.inference.initializers.values() if v.dtype.kind == "f"]
    return {
        "parameters": int(sum(v.size for v in floats)),
        "trainable_parameters": int(sum(art.initial[p].size for p in art.parameters)),
    }


_MATMUL_LIKE = {"Conv", "Gemm", "MatMul"}


def step_flops(model_path: Path, batch: int, trainable: set[str]) -> dict[str, int]:
    """FLOPs of the convolutions and matrix products of one forward pass, and of one training step: each product
    costs its forward once more for every operand that needs a gradient (a trainable parameter, or an activation
    downstream of one), so a full fine-tuning step is ~3x the forward and a frozen body costs its forward only."""
    g = et.import_model(str(model_path), batch_size=batch)
    tainted = set(trainable)  # values that depend on a trainable parameter
    forward = step = 0
    for n in g.nodes:
        if n.op_type in _RECURRENT:
            f, s = _recurrent_flops(g, n, tainted)
            forward, step = forward + f, step + s
        elif n.op_type in _MATMUL_LIKE:
            f = _node_flops(g, n)
            forward += f
            step += f * (1 + sum(1 for v in n.inputs[:2] if v in tainted))
        if any(v in tainted for v in n.inputs):
            tainted.update(n.outputs)
    return {"forward_flops": int(forward), "step_flops": int(step)}


_RECURRENT = {"LSTM", "GRU", "RNN"}


def _recurrent_flops(g, n, tainted: set[str]) -> tuple[int, int]:
    """(forward, step) FLOPs of an ONNX LSTM/GRU/RNN's gate products: X·W^T over every step (2·T·N·|W|) and
    H·R^T step by step (2·T·N·|R|). A step adds the input product once per operand needing a gradient (X, W),
    the recurrent one for R's gradient and for back-propagation through time (needed as soon as anything before or
    in the node trains). A backward that recomputes the forward (edgetrain's fused LSTMGrad) does more: not
    counted, this is the arithmetic the step needs."""
    x, w, r = n.inputs[:3]
    tn = int(np.prod(g.values[x].shape[:2]))  # T·N in either layout
    fi = 2 * tn * int(np.prod(g.values[w].shape))
    fr = 2 * tn * int(np.prod(g.values[r].shape))
    grads = [v in tainted for v in (x, w, r)]
    bptt = any(v in tainted for v in n.inputs if v)
    return fi + fr, fi * (1 + grads[0] + grads[1]) + fr * (1 + grads[2] + bptt)


def _node_flops(g, n) -> int:
    """2 x multiply-adds of one Conv, Gemm or MatMul."""
    out = g.values[n.outputs[0]].shape
    if n.op_type == "Conv":
        w = g.values[n.inputs[1]].shape
        return 2 * int(np.prod(out)) * int(np.prod(w[1:]))
    a = g.values[n.inputs[0]].shape
    k = a[-2] if n.op_type == "Gemm" and n.attrs.get("transA", 0) else a[-1]
    return 2 * int(np.prod(out)) * int(k)


def ort_model(model_path: Path, out: Path) -> Path:
    """The model as onnxruntime-training 1.19.2 can train it, the same computation in the same standard ops:
    - without a final Softmax: its cross-entropy takes logits. edgetrain's CrossEntropyLoss reads the logits under
      a final Softmax itself, and PyTorch's LeNet has none: the same loss.
    - LayerNormalization with its optional Mean and InvStdDev outputs named: its LayerNormalization gradient builder
      reads them and, when the exporter left them out (torch does), fails with "i < node_->OutputDefs().size() was
      false" (the ViT and the ConvNeXt-style net).
    model_path itself when neither applies."""
    proto = onnx.load(str(model_path))
    g = proto.graph
    changed = False
    last = next((n for n in g.node if g.output[0].name in n.output), None)
    if last is not None and last.op_type == "Softmax":
        g.node.remove(last)
        g.output[0].name = last.input[0]
        changed = True
    for n in g.node:
        if n.op_type == "LayerNormalization" and len(n.output) < 3:
            n.output.extend([f"{n.output[0]}__{k}" for k in ("mean", "inv_std_dev")][len(n.output) - 1 :])
            changed = True
    if not changed:
        return model_path
    onnx.save(proto, out)
    return out
