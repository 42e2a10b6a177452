"""The command line's option groups (argparse only), each defined once and added to every command that takes it:
the model's input pipeline, the data, the loss, the optimizer, what trains, memory, LoRA, the learning rate and
seed, and federate's own (the federation, its simulation, the server's door, privacy). Where commands take an
option with another meaning or default (`check --batch-size` defaults to 1, `federate --seed` to 0, `train --lr`
defaults to the artifact's), the group takes the command's name and keeps each command's option as it was.

The options' values are read into typed configurations by edgetrain.cli.config; this module stays importable
with argparse alone (`edgetrain --help` loads nothing else)."""

from __future__ import annotations

import argparse
import re

from .names import DEFAULT_LR, LOSSES

DATA_FORMATS = "an MNIST directory or idx pair, .npz or .csv"


_SIZE = re.compile(r"\s*([0-9]+)\s*(?:[x,]\s*([0-9]+)\s*)?", re.ASCII)


def hw(text: str) -> tuple[int, int]:
    """--resize/--crop H,W (or HxW, or one size for both) -> (H, W); anything else (a third size, a sign, a
    fraction) is refused, never read as part of it."""
    if len(text) > 40:  # longer than any size an image has: refused before its digits are read
        raise argparse.ArgumentTypeError(f"'{text[:37]}...' is too long for HEIGHT,WIDTH (e.g. 224,224)")
    m = _SIZE.fullmatch(text)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not HEIGHT,WIDTH (e.g. 224,224 or 224x224) or one size for both (224)"
        )
    h = int(m[1])
    w = h if m[2] is None else int(m[2])
    if h < 1 or w < 1:
        raise argparse.ArgumentTypeError(f"'{text}': sizes must be positive")
    return h, w


def class_axis(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an axis number (1, -1, ...) or 'auto'") from None


def debug_option(p: argparse.ArgumentParser, *, default=False) -> None:
    """--debug, before or after the command's name: `edgetrain`'s shared parent parser passes SUPPRESS, so that a
    subcommand's parse does not reset what the main parser read."""
    p.add_argument("--debug", action="store_true", default=default, help="show the full traceback on errors")


# ---- the input pipeline: declared at convert, or stated for the data by train and eval -----------------------------
def pipeline_options(p: argparse.ArgumentParser, *, declared: bool) -> None:
    """--scale, --normalize, --layout: how raw data becomes the model's input. declared (convert): stored in the
    artifact with --input-range, --resize and --crop, applied by train, eval, the phone app and the fleet, and
    written into the exported ONNX; else (train, eval) how this data is read, for an artifact that declares no
    pipeline or the same one."""
    g = p
    if declared:
        g = p.add_argument_group(
            "input pipeline",
            "how raw data becomes the model's input, declared once: train, eval, the phone app and the fleet apply "
            "it, and the exported ONNX model contains it (default: the model's metadata_props "
            "'edgetrain.preprocessing', else none: data is fed as it is read)",
        )
    g.add_argument(
        "--scale",
        nargs="?",
        const="1/255",
        metavar="FACTOR",
        help="multiply raw values by FACTOR, e.g. 0.00392 or 1/255 (--scale alone: 1/255, 8-bit pixels to [0, 1]"
        + ("; the export takes uint8)" if declared else ")"),
    )
    g.add_argument(
        "--normalize",
        metavar="MEAN,STD",
        help="then (x - MEAN) / STD per channel: 0.5,0.25 or per channel 0.485:0.456:0.406,0.229:0.224:0.225",
    )
    g.add_argument(
        "--layout",
        choices=["nchw", "nhwc"],
        help="the raw images' layout: nhwc (channels last, as cameras give) is transposed to the model's channels "
        "first" + ("" if declared else "; default: decided from the shapes, refused when ambiguous"),
    )
    if not declared:
        return
    g.add_argument(
        "--input-range",
        metavar="LOW,HIGH",
        help="the raw values' range, e.g. 0,1 for a model fed [0, 1] floats: data outside it is refused "
        "(default: 0,255 with --scale 1/255, else unchecked)",
    )
    g.add_argument("--resize", type=hw, metavar="H,W", help="resize raw images to H,W first (bilinear)")
    g.add_argument(
        "--crop", type=hw, metavar="H,W", help="then center-crop them to H,W (the model's input size)"
    )


# ---- the data ----------------------------------------------------------------------------------------------------
_DATA_HELP = {
    "train": f"training data: {DATA_FORMATS} (required, but with --resume: the checkpoint knows it)",
    "eval": DATA_FORMATS,
    "federate": "the data to share out among the clients (as `train --data`); with --simulate, the data each "
    "simulated device draws its own samples from",
}
_VAL_DATA_HELP = {
    "train": "validation data (an MNIST directory gives its test split)",
    "federate": "server-side validation data for the global model (an MNIST folder: t10k)",
}


def data_option(p: argparse.ArgumentParser, command: str) -> None:
    """--data: train reads it from a resumed run's checkpoint when it is not given; eval and federate need it."""
    p.add_argument("--data", required=command != "train", help=_DATA_HELP[command])


def val_data_option(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("--val-data", help=_VAL_DATA_HELP[command])


def reading_options(p: argparse.ArgumentParser) -> None:
    """How train and eval fit the user's data to the model's input: the input pipeline as stated for this data,
    integer samples fed as they are, an .npz's arrays."""
    pipeline_options(p, declared=False)
    p.add_argument(
        "--cast",
        action="store_true",
        default=None,
        help="feed integer or boolean samples to a float model input as they are (uint8 0-255 becomes 0.0-255.0, "
        "unscaled); without it they are refused unless the model's input pipeline or --scale/--normalize "
        "scales them",
    )
    p.add_argument("--x-key", metavar="KEY", help="an .npz's array of samples (default x)")
    p.add_argument("--y-key", metavar="KEY", help="an .npz's array of labels or targets (default y)")


# ---- the training step: loss, optimizer, what trains, memory, LoRA -----------------------------------------------
def loss_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--loss", choices=list(LOSSES), default="cross-entropy", help="default cross-entropy")
    p.add_argument("--label-smoothing", type=float, help="cross-entropy label smoothing, e.g. 0.1")
    p.add_argument(
        "--class-axis",
        type=class_axis,
        help="cross-entropy: the output's axis of classes (default 1, as PyTorch; -1 for [batch, positions, "
        "vocabulary]; auto: read it from the model)",
    )
    p.add_argument(
        "--ignore-index",
        type=int,
        help="cross-entropy and next-token: a label that counts for nothing (next-token's default -100)",
    )


_LR_HELP = {
    "convert": "learning rate (default 0.01 for sgd, 0.001 for adam and adamw)",
    "train": "base learning rate (default: the one given to convert)",
    "federate": "the clients' learning rate (default: the artifact's)",
}


def lr_option(p: argparse.ArgumentParser, command: str) -> None:
    """--lr: convert's sets the artifact's learning rate; train's and federate's override it for a run."""
    p.add_argument("--lr", type=float, help=_LR_HELP[command])


def optimizer_options(p: argparse.ArgumentParser, *, command: str) -> None:
    """The optimizer of the step: convert's whole; check weighs a --memory-budget with its kind and weight decay
    (whose state is part of the step's memory)."""
    p.add_argument("--optimizer", choices=list(DEFAULT_LR), default="sgd", help="default sgd")
    if command == "convert":
        lr_option(p, command)
        p.add_argument("--momentum", type=float, help="sgd momentum (default 0.9)")
        p.add_argument("--nesterov", action="store_true", help="sgd with Nesterov momentum")
    p.add_argument("--weight-decay", type=float, help="default 0 (0.01 for adamw)")
    if command == "convert":
        p.add_argument("--clip-grad-norm", type=float, help="clip the global gradient norm to this value")


def trainable_options(p: argparse.ArgumentParser, *, command: str) -> None:
    """What trains: --trainable (convert, and check's --memory-budget); convert's --parameters and --untie."""
    p.add_argument(
        "--trainable",
        nargs="+",
        metavar="PATTERN",
        help="parameters to train: names or glob patterns (default: all), e.g. 'fc.*'; with --memory-budget, the "
        "most that may train",
    )
    if command != "convert":
        return
    p.add_argument(
        "--parameters",
        metavar="FILE",
        help='a parameter manifest (JSON: {"parameters": {ONNX name: name}}) that says what trains, for a model '
        "without its own (edgetrain.torch_export writes one into the model)",
    )
    p.add_argument(
        "--untie",
        nargs="*",
        metavar="NAME",
        help="keep apart the copies of one tensor that would train as one (all of them, or those named); "
        "`edgetrain check` lists the ties",
    )


_BATCH_HELP = {
    "convert": "the training batch (default 32): fixes a symbolic batch dimension, and re-batches a model exported "
    "with a fixed one (checked against the model as exported)",
    "check": "batch size to check shapes at (default 1; with --memory-budget, the training batch: default 32)",
}
_BUDGET_HELP = {
    "convert": "train what fits in SIZE (e.g. 24MB, 24MiB): every parameter, else every bias and the last layers, "
    "else the last layers, with activations recomputed where that fits more; the step's planned peak without "
    "the frozen weights (which stay in the file's pages) stays within SIZE (`edgetrain check --memory-budget` "
    "lists the options)",
    "check": "list the ways to train within SIZE (e.g. 24MB, 24MiB): what trains, what is recomputed, each one's "
    "planned peak and trainable count, and the one `convert --memory-budget` picks",
}


def batch_option(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("--batch-size", type=int, help=_BATCH_HELP[command])


def memory_options(p: argparse.ArgumentParser, *, command: str) -> None:
    """--memory-budget: convert trains what fits, check lists what would; convert's --recompute."""
    p.add_argument("--memory-budget", metavar="SIZE", help=_BUDGET_HELP[command])
    if command != "convert":
        return
    p.add_argument(
        "--recompute",
        choices=["none", "cheap", "segments"],
        default="none",
        help="recompute saved activations in the backward instead of keeping them: cheap (activations of cheap "
        "ops, from kept values), segments (all but every k-th layer's output); the same step, bit for bit, in "
        "less memory (default none; --memory-budget chooses for itself)",
    )


def lora_options(p: argparse.ArgumentParser) -> None:
    """--lora-rank R [--lora-alpha A] [--lora-targets PATTERN ...]: LoRA adapters, which then alone train."""
    p.add_argument(
        "--lora-rank",
        type=int,
        metavar="R",
        help="insert LoRA adapters of rank R into the MatMul/Gemm layers (--lora-targets chooses which); the base "
        "stays frozen and only the adapters train, with what --trainable adds",
    )
    p.add_argument(
        "--lora-alpha", type=float, metavar="A", help="LoRA's alpha: the update is scaled by A/R (default 2R)"
    )
    p.add_argument(
        "--lora-targets",
        nargs="+",
        metavar="PATTERN",
        help="the layers to adapt: glob patterns over weight names, node names and module paths, e.g. '*attn*' "
        "(default: every MatMul/Gemm with a constant weight)",
    )


# ---- a run: its checkpoint and seed ------------------------------------------------------------------------------
_CHECKPOINT_HELP = {
    "train": "checkpoint file (default: the artifact's name with .etck)",
    "eval": "trained parameters (default: the artifact's initial ones)",
}
_SEED_HELP = {
    "train": "shuffling, --val-split and --augment seed (default 0)",
    "federate": "the split of the data (default 0)",
}


def checkpoint_option(p: argparse.ArgumentParser, command: str) -> None:
    """--checkpoint: the file train writes (and --resume reads); the trained parameters eval and export read."""
    p.add_argument("--checkpoint", help=_CHECKPOINT_HELP["train" if command == "train" else "eval"])


def seed_option(p: argparse.ArgumentParser, command: str) -> None:
    """--seed: train's is recorded with its run (not given: the run's, else 0), so it stays None until the run's
    configuration is built; federate's splits the data."""
    p.add_argument("--seed", type=int, default=0 if command == "federate" else None, help=_SEED_HELP[command])


# ---- federate ------------------------------------------------------------------------------------------------------
def federation_options(p: argparse.ArgumentParser) -> None:
    """The devices, the rounds, how the data is shared out and what each round trains."""
    p.add_argument(
        "--clients", type=int, required=True, help="devices (Flower supernodes, or simulated ones) to start"
    )
    p.add_argument("--rounds", type=int, required=True, help="federated rounds")
    p.add_argument(
        "--clients-per-round",
        type=int,
        metavar="N",
        help="devices sampled each round (default: all of them)",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--local-epochs", type=int, help="local epochs per round (default 1)")
    g.add_argument("--local-steps", type=int, help="local steps per round, instead of epochs")
    p.add_argument(
        "--partition",
        choices=["iid", "label-skew"],
        help="iid, or label-skew: each client sees mostly a few classes, as real users do (default iid; with "
        "--simulate label-skew)",
    )


def sharing_options(p: argparse.ArgumentParser) -> None:
    """What stays on the devices, what crosses the network, and central differential privacy."""
    p.add_argument(
        "--personal",
        nargs="+",
        metavar="PATTERN",
        help="personal parameters (names or node-name patterns, e.g. 'fc3.*'): never sent, kept on each device",
    )
    p.add_argument(
        "--adapters-only",
        action="store_true",
        help="a LoRA artifact (convert --lora-rank R): only its adapters cross the network and are averaged; "
        "anything else it trains (a head, --trainable) stays on each device as a personal layer",
    )
    p.add_argument("--dp-noise", type=float, help="central differential privacy: the noise multiplier")
    p.add_argument("--dp-clip", type=float, help="... and the clipping norm of each client's update")


def simulation_options(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("simulation (Flower's simulation engine, its Ray backend, on this machine)")
    s.add_argument(
        "--simulate",
        action="store_true",
        help="simulate the --clients devices on this machine instead of starting a process for each: each draws "
        "--sim-samples samples of --data of its own (label-skew: its own class mix) and keeps its own folder",
    )
    s.add_argument("--sim-samples", type=int, metavar="N", help="samples per simulated device (default 40)")
    s.add_argument(
        "--sim-workers",
        type=int,
        metavar="N",
        help="simulated devices that train at once, one CPU each (default: this machine's CPUs, at most 4)",
    )


# edgetrain.federated.common.AGGREGATES, spelled out: the parser imports argparse alone
AGGREGATES = ["fedavg", "median", "trimmed-mean", "krum", "multi-krum", "bulyan"]


def robustness_options(p: argparse.ArgumentParser) -> None:
    """The server's door and its aggregation rule."""
    r = p.add_argument_group("robustness (the server's door and its aggregation rule)")
    r.add_argument(
        "--aggregate",
        choices=AGGREGATES,
        default="fedavg",
        help="how accepted replies become the global model (Flower's strategies): fedavg (weighted by samples); "
        "median and trimmed-mean, per coordinate; krum, the one reply closest to its neighbours; multi-krum, the "
        "mean of the closest n - f; bulyan (default fedavg)",
    )
    r.add_argument(
        "--byzantine",
        type=int,
        default=0,
        metavar="F",
        help="hostile clients a round the rule must withstand (krum, multi-krum, bulyan; default: as many as "
        "the round's replies allow)",
    )
    r.add_argument(
        "--trim", type=float, default=0.2, help="trimmed-mean: the share cut off at each end (default 0.2)"
    )
    r.add_argument(
        "--max-update-norm",
        type=float,
        metavar="NORM",
        help="refuse a reply whose update (its parameters minus the global model's) has a larger L2 norm",
    )
    r.add_argument(
        "--min-replies",
        type=int,
        metavar="N",
        help="skip a round (the global model stays) with fewer accepted replies (default 1)",
    )
    r.add_argument(
        "--round-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long a round waits for replies; a device that has not answered is left out (default 600)",
    )


def privacy_options(p: argparse.ArgumentParser) -> None:
    """The privacy of what the devices send."""
    q = p.add_argument_group("privacy (Flower's SecAgg+ and LocalDpMod)")
    q.add_argument(
        "--secure-aggregation",
        action="store_true",
        help="SecAgg+: each device masks its update, the server sees only the round's sum (with fedavg)",
    )
    q.add_argument(
        "--secagg-clip",
        type=float,
        default=8.0,
        help="SecAgg+: parameters are clipped to +-this before quantization (default 8)",
    )
    q.add_argument(
        "--local-dp",
        type=float,
        metavar="EPSILON",
        help="client-side differential privacy: each device clips its update and adds Gaussian noise for this "
        "epsilon (per round) before sending it",
    )
    q.add_argument(
        "--local-dp-clip", type=float, default=1.0, help="... the L2 norm updates are clipped to (default 1)"
    )
    q.add_argument("--local-dp-delta", type=float, default=1e-5, help="... and delta (default 1e-5)")
