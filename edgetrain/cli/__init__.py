"""The `edgetrain` command line: argv -> exit code (0 success, 1 failure with one clear line, 2 usage error).

    edgetrain convert | check | inspect | train | eval | export | federate | demo
    convert-inference-model  (the same as `edgetrain convert`)

convert, check, export and demo need onnx (the build side, edgetrain.cli.build); train, eval (edgetrain.cli.train)
and inspect (in edgetrain.cli.build, which imports the build side only when a command needs it) run with numpy alone.
The grammar is edgetrain.cli.parser, with the option groups of edgetrain.cli.options; a command's module is imported
only when the command runs, and reads the arguments into a typed configuration (edgetrain.cli.config, federate_config,
build_config) before anything else.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from edgetrain.core.errors import EdgeTrainError, UsageError

from .options import debug_option
from .parser import build_parser, convert_arguments


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
    if isinstance(e, (EdgeTrainError, ValueError)):  # messages written for users (loaders' DataError is one)
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
    debug_option(parser)
    convert_arguments(parser)
    args = parser.parse_args(argv)
    return _run(parser, args, "convert-inference-model")
