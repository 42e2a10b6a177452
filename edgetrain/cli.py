"""The `edgetrain` command line: argv -> exit code (0 success, 1 failure with one clear line, 2 usage error)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .errors import EdgeTrainError


def _check(args: argparse.Namespace) -> int:
    from .check import check

    report = check(args.model, batch_size=args.batch_size)
    print(report.text())
    return 0 if report.derivable else 1


def _inspect(args: argparse.Namespace) -> int:
    from .describe import describe

    print(describe(args.file))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgetrain", description="On-device training for ONNX models.")
    p.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    c = sub.add_parser(
        "check", help="trainability report: ops, gradient coverage, parameters, what fails and why"
    )
    c.add_argument("model", help="an ONNX inference model (.onnx)")
    c.add_argument("--batch-size", type=int, default=1, help="batch size to check shapes at (default 1)")
    c.set_defaults(run=_check)
    i = sub.add_parser("inspect", help="what is in an artifact (.etrain) or checkpoint (.etck)")
    i.add_argument("file", help="an artifact or checkpoint file")
    i.set_defaults(run=_inspect)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except EdgeTrainError as e:
        if args.debug:
            raise
        print(f"edgetrain {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
