"""The `edgetrain` command line's grammar (argparse only): a function per command adds its subparser and arguments,
and the function that runs the command, which imports the command's module only when the command runs. So
`edgetrain --help` loads nothing of the runtime, and each command loads only what it needs: train and eval numpy,
loaders and the runtime; convert the converter; federate Flower's launcher."""

from __future__ import annotations

import argparse

from .names import DEFAULT_LR, LOSSES


# The commands, each importing its module when it runs: `import edgetrain.cli` then costs 20 ms, not 0.5 s.
def _convert(args: argparse.Namespace) -> int:
    from .build import run_convert  # start-up: the converter loads only when a command converts

    return run_convert(args)


def _check(args: argparse.Namespace) -> int:
    from .build import run_check  # start-up: loaded only when check runs

    return run_check(args)


def _inspect(args: argparse.Namespace) -> int:
    from .build import run_inspect  # start-up: loaded only when inspect runs

    return run_inspect(args)


def _export(args: argparse.Namespace) -> int:
    from .build import run_export  # start-up: loaded only when export runs

    return run_export(args)


def _demo(args: argparse.Namespace) -> int:
    if args.model == "keyboard" and not args.quantized:
        from edgetrain.demo import run_keyboard_command  # start-up: loaded only when the keyboard demo runs

        return run_keyboard_command(args)
    if args.epochs is None:
        args.epochs = 20
    if args.quantized:
        from edgetrain.demo import run_quantized_command  # start-up: loaded only when the int8 demo runs

        return run_quantized_command(args)
    from .build import run_demo  # start-up: loaded only when the demo runs

    return run_demo(args)


def _train(args: argparse.Namespace) -> int:
    from .train import run_train  # start-up: numpy, loaders and the runtime load only when a command trains

    return run_train(args)


def _eval(args: argparse.Namespace) -> int:
    from .train import run_eval  # start-up: numpy, loaders and the runtime load only when eval runs

    return run_eval(args)


def _federate(args: argparse.Namespace) -> int:
    from .federate import run_federate  # start-up: Flower's launcher loads only when federate runs

    return run_federate(args)


def _class_axis(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an axis number (1, -1, ...) or 'auto'") from None


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback on errors"
    )
    p = argparse.ArgumentParser(
        prog="edgetrain",
        parents=[common],
        description="On-device training for ONNX models: convert an inference model into a training program, "
        "train it on a device with numpy alone, export the personalized model.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = (
        _add_convert,
        _add_check,
        _add_inspect,
        _add_train,
        _add_eval,
        _add_export,
        _add_federate,
        _add_demo,
    )
    for add in commands:  # in this order in `edgetrain --help`
        add(sub, common)
    return p


def _add_convert(sub, common: argparse.ArgumentParser) -> None:
    c = sub.add_parser(
        "convert", parents=[common], help="ONNX inference model -> training artifact (.etrain)"
    )
    convert_arguments(c)


def convert_arguments(c: argparse.ArgumentParser) -> None:
    """`edgetrain convert`'s arguments, also those of `convert-inference-model`."""
    c.add_argument("model", help="an ONNX inference model (.onnx)")
    c.add_argument("-o", "--output", help="the artifact to write (default: the model's name with .etrain)")
    c.add_argument("--loss", choices=list(LOSSES), default="cross-entropy", help="default cross-entropy")
    c.add_argument("--label-smoothing", type=float, help="cross-entropy label smoothing, e.g. 0.1")
    c.add_argument(
        "--class-axis",
        type=_class_axis,
        help="cross-entropy: the output's axis of classes (default 1, as PyTorch; -1 for [batch, positions, "
        "vocabulary]; auto: read it from the model)",
    )
    c.add_argument(
        "--ignore-index",
        type=int,
        help="cross-entropy and next-token: a label that counts for nothing (next-token's default -100)",
    )
    c.add_argument("--optimizer", choices=list(DEFAULT_LR), default="sgd", help="default sgd")
    c.add_argument("--lr", type=float, help="learning rate (default 0.01 for sgd, 0.001 for adam and adamw)")
    c.add_argument("--momentum", type=float, help="sgd momentum (default 0.9)")
    c.add_argument("--nesterov", action="store_true", help="sgd with Nesterov momentum")
    c.add_argument("--weight-decay", type=float, help="default 0 (0.01 for adamw)")
    c.add_argument("--clip-grad-norm", type=float, help="clip the global gradient norm to this value")
    c.add_argument(
        "--trainable",
        nargs="+",
        metavar="PATTERN",
        help="parameters to train: names or glob patterns (default: all), e.g. 'fc.*'",
    )
    c.add_argument(
        "--parameters",
        metavar="FILE",
        help='a parameter manifest (JSON: {"parameters": {ONNX name: name}}) that says what trains, for a model '
        "without its own (edgetrain.torch_export writes one into the model)",
    )
    c.add_argument(
        "--untie",
        nargs="*",
        metavar="NAME",
        help="keep apart the copies of one tensor that would train as one (all of them, or those named); "
        "`edgetrain check` lists the ties",
    )
    c.add_argument(
        "--batch-size",
        type=int,
        help="the training batch (default 32): fixes a symbolic batch dimension, and re-batches a model exported "
        "with a fixed one (checked against the model as exported)",
    )
    c.add_argument("--model-output", help="the model output the loss reads (default: the first)")
    c.add_argument(
        "--memory-budget",
        metavar="SIZE",
        help="train what fits in SIZE (e.g. 24MB, 24MiB): every parameter, else every bias and the last layers, "
        "else the last layers, with activations recomputed where that fits more; the step's planned peak without "
        "the frozen weights (which stay in the file's pages) stays within SIZE (`edgetrain check --memory-budget` "
        "lists the options)",
    )
    c.add_argument(
        "--recompute",
        choices=["none", "cheap", "segments"],
        default="none",
        help="recompute saved activations in the backward instead of keeping them: cheap (activations of cheap "
        "ops, from kept values), segments (all but every k-th layer's output); the same step, bit for bit, in "
        "less memory (default none; --memory-budget chooses for itself)",
    )
    _lora_arguments(c)
    _preprocessing_arguments(c)
    c.add_argument("--emit-onnx", metavar="STEP.onnx", help="also write the training step as standard ONNX")
    c.set_defaults(run=_convert, parser=c)


def _lora_arguments(c: argparse.ArgumentParser) -> None:
    """--lora-rank R [--lora-alpha A] [--lora-targets PATTERN ...]: LoRA adapters, which then alone train."""
    c.add_argument(
        "--lora-rank",
        type=int,
        metavar="R",
        help="insert LoRA adapters of rank R into the MatMul/Gemm layers (--lora-targets chooses which); the base "
        "stays frozen and only the adapters train, with what --trainable adds",
    )
    c.add_argument(
        "--lora-alpha", type=float, metavar="A", help="LoRA's alpha: the update is scaled by A/R (default 2R)"
    )
    c.add_argument(
        "--lora-targets",
        nargs="+",
        metavar="PATTERN",
        help="the layers to adapt: glob patterns over weight names, node names and module paths, e.g. '*attn*' "
        "(default: every MatMul/Gemm with a constant weight)",
    )


def _hw(text: str) -> tuple[int, int]:
    parts = text.replace("x", ",").split(",")
    try:
        h, w = (int(p) for p in parts) if len(parts) == 2 else (int(parts[0]),) * 2
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not HEIGHT,WIDTH (e.g. 224,224) or one size") from None
    if h < 1 or w < 1:
        raise argparse.ArgumentTypeError(f"'{text}': sizes must be positive")
    return h, w


def _scale_argument(p, help_text: str) -> None:
    """--scale [FACTOR]: alone, 1/255 (8-bit pixels to [0, 1])."""
    p.add_argument("--scale", nargs="?", const="1/255", metavar="FACTOR", help=help_text)


def _preprocessing_arguments(c: argparse.ArgumentParser) -> None:
    """The model's input pipeline, declared once at convert: stored in the artifact, applied by train, eval, the
    phone app and the fleet, written into the exported ONNX."""
    g = c.add_argument_group(
        "input pipeline",
        "how raw data becomes the model's input, declared once: train, eval, the phone app and the fleet apply it, "
        "and the exported ONNX model contains it (default: the model's metadata_props 'edgetrain.preprocessing', "
        "else none: data is fed as it is read)",
    )
    _scale_argument(
        g,
        "multiply raw values by FACTOR (--scale alone: 1/255, 8-bit pixels to [0, 1]; the export takes uint8)",
    )
    g.add_argument("--normalize", metavar="MEAN,STD", help="then (x - MEAN) / STD per channel (as train's)")
    g.add_argument(
        "--layout",
        choices=["nchw", "nhwc"],
        help="the raw images' layout: nhwc (channels last, as cameras give)",
    )
    g.add_argument(
        "--input-range",
        metavar="LOW,HIGH",
        help="the raw values' range, e.g. 0,1 for a model fed [0, 1] floats: data outside it is refused "
        "(default: 0,255 with --scale 1/255, else unchecked)",
    )
    g.add_argument("--resize", type=_hw, metavar="H,W", help="resize raw images to H,W first (bilinear)")
    g.add_argument(
        "--crop", type=_hw, metavar="H,W", help="then center-crop them to H,W (the model's input size)"
    )


def _add_check(sub, common: argparse.ArgumentParser) -> None:
    c = sub.add_parser(
        "check",
        parents=[common],
        help="trainability report: ops, gradient coverage, parameters, what fails and why",
    )
    c.add_argument("model", nargs="?", help="an ONNX inference model (.onnx)")
    c.add_argument(
        "--batch-size",
        type=int,
        help="batch size to check shapes at (default 1; with --memory-budget, the training batch: default 32)",
    )
    c.add_argument(
        "--memory-budget",
        metavar="SIZE",
        help="list the ways to train within SIZE (e.g. 24MB, 24MiB): what trains, what is recomputed, each one's "
        "planned peak and trainable count, and the one `convert --memory-budget` picks",
    )
    c.add_argument(
        "--optimizer", choices=list(DEFAULT_LR), default="sgd", help="with --memory-budget (default sgd)"
    )
    c.add_argument("--weight-decay", type=float, help="with --memory-budget")
    c.add_argument(
        "--trainable", nargs="+", metavar="PATTERN", help="with --memory-budget: the most that may train"
    )
    c.add_argument(
        "--ops",
        action="store_true",
        help="list the ops edgetrain supports, grouped, and which have gradient rules (MODEL is then optional)",
    )
    c.set_defaults(run=_check, parser=c)


def _add_inspect(sub, common: argparse.ArgumentParser) -> None:
    i = sub.add_parser(
        "inspect", parents=[common], help="what is in an artifact (.etrain) or checkpoint (.etck)"
    )
    i.add_argument("file", help="an artifact or checkpoint file")
    i.add_argument(
        "--json",
        action="store_true",
        help='print the facts as JSON (the planned peak of a step under "memory")',
    )
    i.set_defaults(run=_inspect, parser=i)


def _add_train(sub, common: argparse.ArgumentParser) -> None:
    t = sub.add_parser("train", parents=[common], help="train an artifact on data, with checkpoints")
    t.add_argument("artifact", help="a training artifact (.etrain) from `edgetrain convert`")
    t.add_argument(
        "--data",
        help="training data: an MNIST directory or idx pair, .npz or .csv (required, but with --resume: the "
        "checkpoint knows it)",
    )
    t.add_argument("--val-data", help="validation data (an MNIST directory gives its test split)")
    t.add_argument(
        "--val-split", type=float, help="hold out this fraction of --data for validation, e.g. 0.1"
    )
    t.add_argument("--epochs", type=int, help="epochs to train (in all, when resuming; default 1)")
    t.add_argument("--lr", type=float, help="base learning rate (default: the one given to convert)")
    t.add_argument("--lr-schedule", help="constant (default), step:STEPS[:GAMMA] or cosine[:MIN_LR]")
    t.add_argument("--warmup", type=int, help="steps of linear learning-rate warm-up (default 0)")
    t.add_argument("--checkpoint", help="checkpoint file (default: the artifact's name with .etck)")
    t.add_argument("--checkpoint-every", type=int, help="also save a checkpoint every N steps")
    t.add_argument(
        "--resume",
        action="store_true",
        help="continue the run saved in the checkpoint, exactly, with its own data, settings and --log (they need "
        "not be repeated); Ctrl-C or SIGTERM saves a run's current step for this",
    )
    t.add_argument(
        "--init-from",
        metavar="CHECKPOINT",
        help="start a new run from a checkpoint's weights and optimizer state, e.g. on data that has grown",
    )
    t.add_argument("--overwrite", action="store_true", help="start over even if the checkpoint exists")
    t.add_argument(
        "--early-stopping",
        type=int,
        metavar="EPOCHS",
        help="stop after this many epochs without improvement of validation accuracy (loss for regression)",
    )
    t.add_argument("--log", help="write the history (one JSON line per epoch) to this file")
    t.add_argument(
        "--plot",
        metavar="PNG",
        help="draw the loss (and a classifier's validation accuracy) per epoch into this PNG (needs matplotlib)",
    )
    t.add_argument("--seed", type=int, help="shuffling, --val-split and --augment seed (default 0)")
    t.add_argument(
        "--augment",
        metavar="SPEC",
        help="random image augmentation of the training batches, e.g. crop:4,flip,rotate:10 (pad 4 and crop, "
        "mirror half of them, rotate by up to 10 degrees); seeded, so --resume repeats it; turns the feature cache off",
    )
    t.add_argument("--no-shuffle", action="store_true", default=None, help="keep the data's order")
    t.add_argument(
        "--feature-cache-mb",
        type=float,
        default=64.0,
        metavar="MB",
        help="memory for the frozen part's results per sample, reused every epoch when only part of the model "
        "trains (exact; default 64; 0 turns the cache off)",
    )
    t.add_argument(
        "--threads", type=int, help="threads for numpy's BLAS (default: as numpy starts, often all cores)"
    )
    _data_arguments(t)
    t.set_defaults(run=_train, parser=t)


def _add_eval(sub, common: argparse.ArgumentParser) -> None:
    e = sub.add_parser(
        "eval", parents=[common], help="loss and accuracy of an artifact or checkpoint on data"
    )
    e.add_argument("artifact", help="a training artifact (.etrain)")
    e.add_argument("--data", required=True, help="an MNIST directory or idx pair, .npz or .csv")
    e.add_argument("--checkpoint", help="trained parameters (default: the artifact's initial ones)")
    e.add_argument("--split", default="test", choices=["train", "test"], help="split of an MNIST directory")
    _data_arguments(e)
    e.set_defaults(run=_eval, parser=e)


def _data_arguments(p: argparse.ArgumentParser) -> None:
    """How train and eval fit the user's data to the model's input."""
    p.add_argument(
        "--layout",
        choices=["nchw", "nhwc"],
        help="the data's image layout: nhwc (channels last, as cameras give) is transposed to the model's "
        "channels first; default: decided from the shapes, refused when ambiguous",
    )
    _scale_argument(
        p,
        "multiply the samples by FACTOR (e.g. 0.00392 or 1/255; --scale alone: 1/255, 8-bit images to [0, 1])",
    )
    p.add_argument(
        "--normalize",
        metavar="MEAN,STD",
        help="then (x - MEAN) / STD per channel: 0.5,0.25 or per channel 0.485:0.456:0.406,0.229:0.224:0.225",
    )
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


def _add_export(sub, common: argparse.ArgumentParser) -> None:
    x = sub.add_parser("export", parents=[common], help="personalized ONNX inference model from a checkpoint")
    x.add_argument("artifact", help="a training artifact (.etrain)")
    x.add_argument("--checkpoint", help="trained parameters (default: the artifact's initial ones)")
    x.add_argument("-o", "--output", required=True, help="the ONNX file to write")
    x.add_argument("--no-check", action="store_true", help="skip the onnxruntime check")
    x.add_argument(
        "--no-preprocessing-in-export",
        action="store_true",
        help="leave the input pipeline out of the exported model (the app applies it; the model's metadata says how)",
    )
    q = x.add_mutually_exclusive_group()
    q.add_argument(
        "--requantize",
        action="store_true",
        help="an int8 model: fit new scales to the trained weights (per channel where the model's are) instead of "
        "keeping the model's",
    )
    x.add_argument(
        "--adapters",
        choices=["merged", "serving"],
        default="merged",
        help="a model with LoRA adapters: merged into the weights (default: the original graph), or served by "
        "onnxruntime's multi-LoRA (the adapters are inputs with defaults; --adapter-file writes a user's)",
    )
    x.add_argument(
        "--adapter-file",
        metavar="FILE",
        help="also write the trained adapters alone: onnxruntime's adapter format for a FILE ending in "
        ".onnx_adapter, else edgetrain's (.etad)",
    )
    q.add_argument(
        "--float",
        dest="float_model",
        action="store_true",
        help="an int8 model: write the float model (the trained float weights, no quantization) instead of int8",
    )
    x.set_defaults(run=_export, parser=x)


def _add_federate(sub, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "federate",
        parents=[common],
        help="federated training or personalization over K devices, on a real Flower deployment (127.0.0.1) "
        "or, with --simulate, on Flower's simulation engine (thousands of devices on one machine)",
    )
    p.add_argument("artifact", help="a training artifact (.etrain) from `edgetrain convert`")
    p.add_argument(
        "--data",
        required=True,
        help="the data to share out among the clients (as `train --data`); with --simulate, the data each "
        "simulated device draws its own samples from",
    )
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
    _federate_simulation_options(p)
    p.add_argument(
        "--val-data", help="server-side validation data for the global model (an MNIST folder: t10k)"
    )
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
    _federate_fleet_options(p)
    p.add_argument("--lr", type=float, help="the clients' learning rate (default: the artifact's)")
    p.add_argument("--seed", type=int, default=0, help="the split of the data (default 0)")
    p.add_argument(
        "--out", required=True, help="the folder for the results, the clients' homes and Flower's logs"
    )
    p.set_defaults(run=_federate, parser=p)


def _federate_simulation_options(p: argparse.ArgumentParser) -> None:
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


def _federate_fleet_options(p: argparse.ArgumentParser) -> None:
    """The server's door, its aggregation rule, and the privacy of what the devices send."""
    r = p.add_argument_group("robustness (the server's door and its aggregation rule)")
    r.add_argument(
        "--aggregate",
        choices=[
            "fedavg",
            "median",
            "trimmed-mean",
            "krum",
            "multi-krum",
            "bulyan",
        ],  # federated.common.AGGREGATES
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


def _add_demo(sub, common: argparse.ArgumentParser) -> None:
    d = sub.add_parser(
        "demo", parents=[common], help="personalize the embedded handwriting model (< 1 minute)"
    )
    d.add_argument(
        "--model",
        choices=["lenet", "lstm", "gru", "keyboard"],
        default="lenet",
        help="the base model: lenet (default), or a sequence model that reads each digit row by row: lstm, gru; "
        "keyboard: a next-word language model personalized with LoRA, head-only and full fine-tuning",
    )
    d.add_argument(
        "--out",
        help="directory for the files (default ./edgetrain-demo; ./edgetrain-demo-MODEL for another --model)",
    )
    d.add_argument("--epochs", type=int, help="fine-tuning epochs (default 20; keyboard: 5)")
    d.add_argument("--no-plot", action="store_true", help="do not write the training-curve plot")
    d.add_argument("--json", help="also write the results as JSON to this file")
    d.add_argument(
        "--quantized",
        action="store_true",
        help="the LeNet quantized to int8 by onnxruntime (needs onnxruntime): float and int8 personalized side by "
        "side, exported int8 and float, measured by onnxruntime (files in ./edgetrain-demo-int8)",
    )
    d.set_defaults(run=_demo, parser=d)
