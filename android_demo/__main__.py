"""`python -m android_demo --home DIR COMMAND`: the app's command line -> exit code (0 success, 1 a failure told in
one line, 2 a usage error). The thread count is set before numpy is imported, as BLAS reads it only then."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from edgetrain.core.errors import EdgeTrainError, UsageError  # imports nothing: numpy is not loaded yet

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
MAX_THREADS = 256  # settings.MAX_THREADS, the threads setting's bound (home imports numpy, which must wait)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m android_demo",
        description="On-device personalization: collect the user's samples, train in short bursts that are kept "
        "only when they help, serve a page for the phone's browser.",
    )
    p.add_argument(
        "--home", help="the app's folder: samples, model, versions, log (all commands but simulate)"
    )
    p.add_argument("--threads", type=int, help="threads for numpy's BLAS (default: the home's setting, 1)")
    p.add_argument("--debug", action="store_true", help="show the traceback on errors")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser(
        "init", help="set up a home from an artifact built on a workstation (edgetrain convert)"
    )
    c.add_argument("--artifact", help="a training artifact (.etrain); --text: default the embedded keyboard")
    c.add_argument(
        "--text",
        action="store_true",
        help="a text home: a keyboard that learns its user's words (the embedded LoRA language model)",
    )
    c.add_argument("--vocab", help="--text with your own --artifact: its word vocabulary (JSON)")
    c.add_argument("--policy", choices=["always", "charging", "charging-idle"], help="when bursts may run")
    c.add_argument("--max-steps", type=int, help="steps per burst at most (default 30)")
    c.add_argument("--max-seconds", type=float, help="seconds per burst at most (default 5)")

    c = sub.add_parser("add", help="add labelled samples from a file (MNIST idx, .npz, CSV) or sentences")
    c.add_argument("--data", help="anything loaders.open_data reads")
    c.add_argument("--sentences", help="a text home: a UTF-8 file of sentences, one a line")
    c.add_argument(
        "--layout", choices=["nchw", "nhwc"], help="the data's image layout (default: from the shapes)"
    )
    c.add_argument(
        "--scale",
        nargs="?",
        const="1/255",
        metavar="FACTOR",
        help="multiply the samples by FACTOR (--scale alone: 1/255) when the model declares no input pipeline; "
        "the home then scales every sample, the page's too",
    )
    c.add_argument("--normalize", metavar="MEAN,STD", help="then (x - MEAN) / STD per channel")

    c = sub.add_parser("personalize", help="one burst: train, validate, keep or roll back")
    c.add_argument("--max-steps", type=int, help="steps at most (default: the home's setting)")
    c.add_argument("--max-seconds", type=float, help="seconds at most (default: the home's setting)")
    c.add_argument("--lr", type=float, help="learning rate (default: the artifact's)")
    c.add_argument("--batch-size", type=int, help="samples per step (default and most: the artifact's batch)")
    c.add_argument(
        "--threads", type=int, dest="command_threads", help="threads for numpy's BLAS (as --threads)"
    )
    c.add_argument("--force", action="store_true", help="run even when the policy says not now")
    c.add_argument("--json", action="store_true", help="print one JSON line")

    c = sub.add_parser("evaluate", help="accuracy and loss of the current model on a data file")
    c.add_argument("--data")
    c.add_argument(
        "--sentences", help="a text home: held-out sentences, one a line (next-word top-1, perplexity)"
    )
    c.add_argument("--layout", choices=["nchw", "nhwc"])
    c.add_argument("--json", action="store_true")

    c = sub.add_parser("suggest", help="a text home: the three likeliest next words after TEXT")
    c.add_argument("words", help="the sentence so far")

    c = sub.add_parser("status", help="samples, model version, last bursts, policy")
    c.add_argument("--json", action="store_true")

    _add_serve(sub)

    c = sub.add_parser("simulate", help="the whole story on a desktop with the embedded data")
    c.add_argument("--every", type=int, default=10, help="a burst every N samples (default 10)")
    c.add_argument("--steps", type=int, default=25, help="steps per burst at most (default 25)")
    c.add_argument("--quick", action="store_true", help="a short run (20 samples, two bursts of 5 steps)")
    c.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
    c.add_argument(
        "--threads", type=int, dest="command_threads", help="threads for numpy's BLAS (as --threads)"
    )
    return p


def _add_serve(sub) -> None:
    c = sub.add_parser("serve", help="the page for the phone's browser, on 127.0.0.1")
    c.add_argument("--port", type=int, default=8765, help="default 8765 (0: any free port)")
    c.add_argument(
        "--request-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="a request (headers and body) must arrive whole within SECONDS, else its connection is closed "
        "(default 10)",
    )
    c.add_argument(
        "--max-connections",
        type=int,
        default=32,
        metavar="N",
        help="connections open at once (a thread each); beyond N a new one takes the place of the one that has "
        "waited longest for its request, or gets a 503 (default 32)",
    )


def _threads(args: argparse.Namespace) -> None:
    n = getattr(args, "command_threads", None)
    n = args.threads if n is None else n
    if n is not None and not 1 <= n <= MAX_THREADS:
        raise SystemExit(f"android_demo: error: --threads must be from 1 to {MAX_THREADS}, got {n}")
    if n is None and args.home:
        try:  # the home's setting, read without numpy (opening the home checks the file, and names a bad value)
            with open(os.path.join(args.home, "settings.json"), encoding="utf-8") as f:
                found = json.loads(f.read(1 << 20))
        except (OSError, ValueError, RecursionError):
            found = None
        n = found.get("threads") if isinstance(found, dict) else None
        n = n if type(n) is int and 1 <= n <= MAX_THREADS else None
    if n is not None:
        for var in THREAD_VARIABLES:
            os.environ[var] = str(n)


def _init(args: argparse.Namespace) -> int:
    from .app import Home  # numpy loads with it: after main() has set the BLAS thread count

    settings = dict(
        policy=args.policy, max_steps=args.max_steps, max_seconds=args.max_seconds, threads=args.threads
    )
    if args.text:
        from .text import TextHome  # the keyboard's vocabulary and suggestions

        home = TextHome.init(args.home, args.artifact, vocab=args.vocab, **settings)
        print(f"set up {home.path}: text mode (a keyboard), version 0, no sentences yet")
        print(f"next: python -m android_demo --home {args.home} add --sentences FILE   (or serve)")
        return 0
    if not args.artifact or args.vocab:
        raise UsageError("init needs --artifact MODEL.etrain (--vocab goes with --text)")
    home = Home.init(args.home, args.artifact, **settings)
    print(f"set up {home.path}: model {os.path.basename(args.artifact)}, version 0, no samples yet")
    if home.int8_form is not None:
        print(
            f"an int8 model ({home.int8_form.upper()} form): bursts train float master weights through its fake "
            "quantization; a kept version exports as int8 on a workstation:\n"
            "  edgetrain export model.etrain --checkpoint versions/vNNNNNN.etck -o model.onnx"
        )
    print(f"next: python -m android_demo --home {args.home} add --data PATH   (or serve)")
    return 0


def _inputs(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """The files a command reads, by the option that names them (embedded ones by what they are)."""
    from .text import KEYBOARD, KEYBOARD_VOCAB  # numpy loads with it: after the thread count is set

    if args.command == "simulate":
        from .simulate import ARTIFACT, NEW_USER  # only for simulate: the embedded data's story

        return [("the embedded artifact", ARTIFACT), ("the embedded digits", NEW_USER)]
    if args.command == "init" and args.text:
        return [("--artifact", args.artifact or KEYBOARD), ("--vocab", args.vocab or KEYBOARD_VOCAB)]
    names = ("artifact", "vocab") if args.command == "init" else ("data", "sentences")
    return [(f"--{name}", getattr(args, name, None)) for name in names]


def _paths_apart(args: argparse.Namespace) -> None:
    """The home's own files kept apart from what a command reads: no input may be the home folder, nor one of the
    files and folders the home writes in it (an input there would be written over); --home must be a folder or a
    new name. Checked before anything is read or written."""
    from edgetrain.core.paths import outputs_apart, replaceable  # numpy loads with it: as above

    from .settings import ARTIFACT, CURRENT, LOG, SETTINGS, STORE, VERSIONS  # as above
    from .text import VOCAB  # as above

    if not args.home:
        return
    own = (ARTIFACT, STORE, f"{STORE}-wal", f"{STORE}-shm", CURRENT, SETTINGS, LOG, VOCAB, VERSIONS)
    outputs_apart(
        inputs=_inputs(args),
        outputs=[("--home", args.home)],
        places=[("--home", os.path.join(args.home, name)) for name in own],
        command=args.command,
    )
    replaceable(args.home, "folder", option="--home", command=args.command)


def run(args: argparse.Namespace) -> int:
    from .text import open_home  # numpy loads with it: only now, after main() has set the BLAS thread count

    _paths_apart(args)
    if args.command == "simulate":
        from .simulate import simulate  # only for simulate: the embedded data's story

        result = simulate(
            home=args.home,
            every=args.every,
            steps=args.steps,
            quick=args.quick,
            out=None if args.json else sys.stdout,
        )
        if args.json:
            print(json.dumps(result, allow_nan=False))
        return 0
    if not args.home:
        raise UsageError(f"{args.command} needs --home DIR (the app's folder)")
    if args.command == "init":
        return _init(args)
    home = open_home(args.home)
    if getattr(args, "sentences", None) or args.command == "suggest":
        return _text_command(args, home)
    if args.command in ("add", "evaluate") and not args.data:
        raise UsageError(f"{args.command} needs --data PATH (a text home: --sentences FILE)")
    if args.command == "add":
        from edgetrain.runtime.feeding import (
            parse_options,
        )  # numpy loads with it: after the thread count is set

        try:
            options = parse_options(args.layout, args.scale, args.normalize)
        except ValueError as e:
            raise UsageError(str(e)) from None
        n, notices = home.add_data(args.data, options=options)
        for note in notices:
            print(f"note: {note}", file=sys.stderr)
        print(f"added {n:,} samples; the store holds {home.status()['samples']:,}")
    elif args.command == "personalize":
        r = home.personalize(
            max_steps=args.max_steps,
            max_seconds=args.max_seconds,
            lr=args.lr,
            batch_size=args.batch_size,
            force=args.force,
        )
        if args.json:
            keys = ("kept", "steps", "val_accuracy_before", "val_accuracy_after", "model_version", "seconds")
            print(json.dumps({k: getattr(r, k) for k in keys} | {"reason": r.reason}, allow_nan=False))
        else:
            print(_burst_text(r))
    elif args.command == "evaluate":
        result = home.evaluate_data(args.data, layout=args.layout)
        if args.json:
            print(json.dumps(result, allow_nan=False))
        else:
            acc = "-" if result["accuracy"] is None else f"{result['accuracy']:.1%}"
            print(
                f"version {home.version}: accuracy {acc}, loss {result['loss']:.4f} on {result['samples']:,} samples"
            )
    elif args.command == "status":
        st = home.status()
        print(json.dumps(st, allow_nan=False) if args.json else _status_text(st))
    elif args.command == "serve":
        from .server import serve  # only for serve: the HTTP server and the page

        serve(
            home,
            port=args.port,
            request_timeout=args.request_timeout,
            max_connections=args.max_connections,
        )
    return 0


def _text_command(args: argparse.Namespace, home) -> int:
    """add --sentences, evaluate --sentences and suggest, for a text home."""
    from loaders.text import read_sentences  # numpy loads with it: after main() has set the BLAS thread count

    from .app import AppError  # as above
    from .text import TextHome, heldout_figures  # as above

    if not isinstance(home, TextHome):
        raise AppError(f"{home.path} is not a text home (set one up with `init --text`)")
    if args.command == "suggest":
        print(" | ".join(home.suggest(args.words)))
        return 0
    if getattr(args, "data", None):
        raise UsageError("give --data or --sentences, not both")
    if args.command == "add":
        ids = home.add_sentence_file(args.sentences)  # bounded, and stored a chunk at a time
        print(f"added {len(ids):,} sentences; the store holds {home.status()['samples']:,}")
    elif args.command == "evaluate":
        fig = heldout_figures(home, read_sentences(args.sentences))
        if args.json:
            print(json.dumps(fig, allow_nan=False))
        else:
            print(
                f"version {home.version}: next-word top-1 {fig['top1']:.1%}, perplexity {fig['perplexity']:.1f} "
                f"on {fig['windows']:,} sentences"
            )
    else:
        raise UsageError(f"{args.command} takes no --sentences")
    return 0


def _burst_text(r) -> str:
    if not r.steps:
        return f"no burst: {r.reason}"
    acc = (
        f"validation accuracy {r.val_accuracy_before:.1%} -> {r.val_accuracy_after:.1%}"
        if r.val_accuracy_after is not None
        else f"validation loss {r.val_loss_before} -> {r.val_loss_after}"
    )
    verdict = (
        f"kept as version {r.model_version}" if r.kept else f"rolled back (version {r.model_version} stays)"
    )
    text = f"{r.steps} steps in {r.seconds:.2f} s; {acc}; {verdict}\n  {r.reason}"
    return text + (f"\n  feature cache {r.feature_cache}" if r.feature_cache.startswith("on") else "")


def _status_text(st: dict) -> str:
    lines = [
        f"home        {st['home']}",
        f"samples     {st['samples']:,} ({st['train_samples']:,} for training, {st['val_samples']:,} for validation)",
        f"model       version {st['model_version']} ({st['kept']} of {st['bursts']} bursts kept)",
        f"policy      {st['policy']}",
    ]
    for b in st["last_bursts"]:
        lines.append(f"  burst: {'kept' if b['kept'] else 'not kept'}, {b['steps']} steps; {b['reason']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _threads(args)
    try:
        return run(args)
    except UsageError as e:
        parser.print_usage(sys.stderr)
        print(f"android_demo: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("android_demo: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one clear line; --debug shows the traceback
        if args.debug:
            raise
        # messages written for users (loaders' DataError is an EdgeTrainError)
        text = str(e) if isinstance(e, (EdgeTrainError, ValueError)) else f"{type(e).__name__}: {e}"
        print(f"android_demo {args.command}: error: {text}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
