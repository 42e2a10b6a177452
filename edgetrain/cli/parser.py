"""The `edgetrain` command line's grammar (argparse only): a function per command adds its subparser, its own
arguments and the option groups it shares with other commands (edgetrain.cli.options), and the function that runs
the command, which imports the command's module only when the command runs; that module reads the arguments into
its typed configuration (edgetrain.cli.config, federate_config, build_config) first. So
`edgetrain --help` loads nothing of the runtime, and each command loads only what it needs: train and eval numpy,
loaders and the runtime; convert the converter; federate Flower's launcher."""

from __future__ import annotations

import argparse

from . import options as o


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
    from .build import demo_apart  # start-up: loaded only when the demo runs

    demo_apart(args)  # before any demo writes a file
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


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    o.debug_option(common, default=argparse.SUPPRESS)
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
    o.loss_options(c)
    o.optimizer_options(c, command="convert")
    o.trainable_options(c, command="convert")
    o.batch_option(c, "convert")
    c.add_argument("--model-output", help="the model output the loss reads (default: the first)")
    o.memory_options(c, command="convert")
    o.lora_options(c)
    o.pipeline_options(c, declared=True)
    c.add_argument("--emit-onnx", metavar="STEP.onnx", help="also write the training step as standard ONNX")
    c.set_defaults(run=_convert, parser=c)


def _add_check(sub, common: argparse.ArgumentParser) -> None:
    c = sub.add_parser(
        "check",
        parents=[common],
        help="trainability report: ops, gradient coverage, parameters, what fails and why",
    )
    c.add_argument("model", nargs="?", help="an ONNX inference model (.onnx)")
    o.batch_option(c, "check")
    o.memory_options(c, command="check")
    step = c.add_argument_group(
        "with --memory-budget", "the training step whose ways to fit in SIZE are weighed"
    )
    o.optimizer_options(step, command="check")
    o.trainable_options(step, command="check")
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
    o.data_option(t, "train")
    o.val_data_option(t, "train")
    t.add_argument(
        "--val-split", type=float, help="hold out this fraction of --data for validation, e.g. 0.1"
    )
    t.add_argument("--epochs", type=int, help="epochs to train (in all, when resuming; default 1)")
    o.lr_option(t, "train")
    t.add_argument("--lr-schedule", help="constant (default), step:STEPS[:GAMMA] or cosine[:MIN_LR]")
    t.add_argument("--warmup", type=int, help="steps of linear learning-rate warm-up (default 0)")
    o.checkpoint_option(t, "train")
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
    o.seed_option(t, "train")
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
    o.reading_options(t)
    t.set_defaults(run=_train, parser=t)


def _add_eval(sub, common: argparse.ArgumentParser) -> None:
    e = sub.add_parser(
        "eval", parents=[common], help="loss and accuracy of an artifact or checkpoint on data"
    )
    e.add_argument("artifact", help="a training artifact (.etrain)")
    o.data_option(e, "eval")
    o.checkpoint_option(e, "eval")
    e.add_argument("--split", default="test", choices=["train", "test"], help="split of an MNIST directory")
    o.reading_options(e)
    e.set_defaults(run=_eval, parser=e)


def _add_export(sub, common: argparse.ArgumentParser) -> None:
    x = sub.add_parser("export", parents=[common], help="personalized ONNX inference model from a checkpoint")
    x.add_argument("artifact", help="a training artifact (.etrain)")
    o.checkpoint_option(x, "export")
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
    o.data_option(p, "federate")
    o.federation_options(p)
    o.simulation_options(p)
    o.val_data_option(p, "federate")
    o.sharing_options(p)
    o.robustness_options(p)
    o.privacy_options(p)
    o.lr_option(p, "federate")
    o.seed_option(p, "federate")
    p.add_argument(
        "--out", required=True, help="the folder for the results, the clients' homes and Flower's logs"
    )
    p.set_defaults(run=_federate, parser=p)


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
