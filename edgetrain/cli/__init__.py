"""The `edgetrain` command line: argv -> exit code (0 success, 1 failure with one clear line, 2 usage error).

    edgetrain convert | check | inspect | train | eval | export | federate | demo
    convert-inference-model  (the same as `edgetrain convert`)

convert, check, export and demo need onnx (the build side, edgetrain.cli.build); train, eval and inspect run with
numpy alone (the device side, edgetrain.cli.train).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from edgetrain.core.errors import EdgeTrainError

from .build import DEFAULT_LR, LOSSES, run_check, run_convert, run_demo, run_export, run_inspect
from .common import UsageError
from .federate import add_arguments as add_federate_arguments
from .federate import run_federate
from .train import run_eval, run_train


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

    c = sub.add_parser(
        "convert", parents=[common], help="ONNX inference model -> training artifact (.etrain)"
    )
    _convert_arguments(c)

    c = sub.add_parser(
        "check",
        parents=[common],
        help="trainability report: ops, gradient coverage, parameters, what fails and why",
    )
    c.add_argument("model", nargs="?", help="an ONNX inference model (.onnx)")
    c.add_argument("--batch-size", type=int, default=1, help="batch size to check shapes at (default 1)")
    c.add_argument(
        "--ops",
        action="store_true",
        help="list the ops edgetrain supports, grouped, and which have gradient rules (MODEL is then optional)",
    )
    c.set_defaults(run=run_check, parser=c)

    i = sub.add_parser(
        "inspect", parents=[common], help="what is in an artifact (.etrain) or checkpoint (.etck)"
    )
    i.add_argument("file", help="an artifact or checkpoint file")
    i.add_argument(
        "--json",
        action="store_true",
        help='print the facts as JSON (the planned peak of a step under "memory")',
    )
    i.set_defaults(run=run_inspect, parser=i)

    t = sub.add_parser("train", parents=[common], help="train an artifact on data, with checkpoints")
    t.add_argument("artifact", help="a training artifact (.etrain) from `edgetrain convert`")
    t.add_argument(
        "--data", required=True, help="training data: an MNIST directory or idx pair, .npz or .csv"
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
        help="continue the run saved in the checkpoint, exactly, with its own settings (they need not be repeated)",
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
    t.add_argument("--seed", type=int, help="shuffling and --val-split seed (default 0)")
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
    t.set_defaults(run=run_train, parser=t)

    e = sub.add_parser(
        "eval", parents=[common], help="loss and accuracy of an artifact or checkpoint on data"
    )
    e.add_argument("artifact", help="a training artifact (.etrain)")
    e.add_argument("--data", required=True, help="an MNIST directory or idx pair, .npz or .csv")
    e.add_argument("--checkpoint", help="trained parameters (default: the artifact's initial ones)")
    e.add_argument("--split", default="test", choices=["train", "test"], help="split of an MNIST directory")
    _data_arguments(e)
    e.set_defaults(run=run_eval, parser=e)

    x = sub.add_parser("export", parents=[common], help="personalized ONNX inference model from a checkpoint")
    x.add_argument("artifact", help="a training artifact (.etrain)")
    x.add_argument("--checkpoint", help="trained parameters (default: the artifact's initial ones)")
    x.add_argument("-o", "--output", required=True, help="the ONNX file to write")
    x.add_argument("--no-check", action="store_true", help="skip the onnxruntime check")
    x.set_defaults(run=run_export, parser=x)

    f = sub.add_parser(
        "federate",
        parents=[common],
        help="federated training or personalization over K devices, on a real Flower deployment (127.0.0.1)",
    )
    add_federate_arguments(f)
    f.set_defaults(run=run_federate, parser=f)

    d = sub.add_parser(
        "demo", parents=[common], help="personalize the embedded handwriting model (< 1 minute)"
    )
    d.add_argument(
        "--model",
        choices=["lenet", "lstm", "gru"],
        default="lenet",
        help="the base model: lenet (default), or a sequence model that reads each digit row by row: lstm, gru",
    )
    d.add_argument(
        "--out",
        help="directory for the files (default ./edgetrain-demo; ./edgetrain-demo-lstm for --model lstm)",
    )
    d.add_argument("--epochs", type=int, default=20, help="fine-tuning epochs (default 20)")
    d.add_argument("--no-plot", action="store_true", help="do not write the training-curve plot")
    d.add_argument("--json", help="also write the results as JSON to this file")
    d.set_defaults(run=run_demo, parser=d)
    return p


def _data_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--layout",
        choices=["nchw", "nhwc"],
        help="the data's image layout: nhwc (channels last, as cameras give) is transposed to the model's "
        "channels first; default: decided from the shapes, refused when ambiguous",
    )
    p.add_argument(
        "--scale",
        nargs="?",
        const="1/255",
        metavar="FACTOR",
        help="multiply the samples by FACTOR (e.g. 0.00392 or 1/255; --scale alone: 1/255, 8-bit images to [0, 1])",
    )
    p.add_argument(
        "--normalize",
        metavar="MEAN,STD",
        help="then (x - MEAN) / STD per channel: 0.5,0.25 or per channel 0.485:0.456:0.406,0.229:0.224:0.225",
    )


def _convert_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("model", help="an ONNX inference model (.onnx)")
    c.add_argument("-o", "--output", help="the artifact to write (default: the model's name with .etrain)")
    c.add_argument("--loss", choices=list(LOSSES), default="cross-entropy", help="default cross-entropy")
    c.add_argument("--label-smoothing", type=float, help="cross-entropy label smoothing, e.g. 0.1")
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
        "--batch-size",
        type=int,
        help="the training batch (default 32): fixes a symbolic batch dimension, and re-batches a model exported "
        "with a fixed one (checked against the model as exported)",
    )
    c.add_argument("--model-output", help="the model output the loss reads (default: the first)")
    c.add_argument("--emit-onnx", metavar="STEP.onnx", help="also write the training step as standard ONNX")
    c.set_defaults(run=run_convert, parser=c)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, where: str) -> int:
    debug = getattr(args, "debug", False)
    try:
        code = args.run(args)
        sys.stdout.flush()  # inside the try: a reader that went away must not be reported at exit
        return code
    except BrokenPipeError:
        # the reader went away (`edgetrain check MODEL | head`): what it wanted is written; end quietly, and keep
        # Python from reporting the same broken pipe again when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UsageError as e:
        if debug:
            raise
        getattr(args, "parser", parser).print_usage(sys.stderr)
        print(f"{where}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{where}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # every failure is one clear line; --debug shows the traceback
        if debug:
            raise
        print(f"{where}: error: {_plain(e)}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return _run(parser, args, f"edgetrain {args.command}")


def _plain(e: BaseException) -> str:
    from loaders import DataError

    if isinstance(e, (EdgeTrainError, DataError, ValueError)):  # messages written for users
        return str(e)
    if isinstance(e, OSError) and e.filename:
        return f"{e.filename}: {e.strerror or e}"
    if isinstance(e, ImportError) and e.name:
        return f"this needs the {e.name} package, which is not installed (pip install 'edgetrain[dev]')"
    return f"{type(e).__name__}: {e} (run with --debug for the traceback)"


def convert_main(argv: Sequence[str] | None = None) -> int:
    """`convert-inference-model`: the same as `edgetrain convert`."""
    parser = argparse.ArgumentParser(
        prog="convert-inference-model",
        description="ONNX inference model -> training artifact (.etrain); the same as `edgetrain convert`.",
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    _convert_arguments(parser)
    args = parser.parse_args(argv)
    return _run(parser, args, "convert-inference-model")
