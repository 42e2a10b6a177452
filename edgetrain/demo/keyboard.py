"""`edgetrain demo --model keyboard`: a next-word language model (data/keyboard/, tools/build_keyboard.py) and a
new user's sentences: LoRA, head-only and full fine-tuning side by side, next-word figures before and after, step
time and peak RSS, the exports checked by onnxruntime and the adapters exported for its multi-LoRA serving."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from loaders import DataLoader
from loaders.text import TokenWindowView, WordVocab

from ..core.errors import ConfigError, UsageError
from ..derive.adapters import LoRA
from ..derive.losses import NextTokenLoss
from ..derive.optimizers import Adam
from ..derive.pipeline import convert
from ..runtime import InferenceSession, TrainingSession
from ..runtime.progress import TrainProgress, duration, percent
from ..runtime.schedules import CosineLR
from ..runtime.trainer import Trainer
from .common import DATA, Summary, _blas_threads, _onnxruntime, _Teller, _timed, write_json

# tools/build_keyboard.py's assets: the model, its vocabulary, the texts, SOURCES.md (their licenses)
KEYBOARD = os.path.join(DATA, "keyboard")
KEYBOARD_MODEL = os.path.join(KEYBOARD, "keyboard_lm.onnx")
# over the user's 300 sentences, 18 steps an epoch: more overfits (the held-out perplexity rises again)
KEYBOARD_EPOCHS = 5
KEYBOARD_BATCH = 16
EVAL_BATCH = 64  # windows per run() when measuring: one compiled program for every chunk (the last is padded)
SPECIALS = 4  # <pad> <unk> <bos> <eos>: never suggested, and not counted as words
LORA = {"rank": 8, "alpha": 16.0, "targets": ["*attn*", "*mlp*"]}  # q, k, v, proj, fc, proj of both blocks
# The three ways to personalize, each with Adam at the step size that suits it (measured on the user's held-out
# sentences, 5 epochs with a cosine decay; LoRA's B starts at zero, so it takes the largest step)
KEYBOARD_VARIANTS = {
    "LoRA": {"lr": 1e-2, "lora": True, "trainable": None},
    "head-only": {"lr": 5e-3, "lora": False, "trainable": ["head.*"]},
    "full": {"lr": 1e-3, "lora": False, "trainable": None},
}
RSS_STEPS = 10  # training steps of the fresh process that measures a variant's peak RSS

# The peak-RSS probe: a fresh interpreter with the device side alone (numpy, edgetrain.runtime) loads a variant's
# artifact and trains RSS_STEPS steps on one batch, one BLAS thread; its own VmHWM (ru_maxrss would carry the
# parent's over exec).
_RSS_WORKER = r"""
import json, sys
import numpy as np
from edgetrain.runtime import TrainingSession
def kib(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))
batch = np.load(sys.argv[2])
start = kib("VmRSS")
sess = TrainingSession(sys.argv[1], threads=1)
for _ in range(int(sys.argv[3])):
    sess.train_step(batch["x"], batch["y"])
print(json.dumps({"start_kib": start, "peak_kib": kib("VmHWM")}))
"""


@dataclass
class LMFigures:
    """A model's next-word figures on a set of sentences: perplexity over every target token (the next token after
    each position, <unk> and <eos> included); top-1 and top-3 accuracy over the targets that are words, ranked among
    the words (a keyboard suggests no special token)."""

    perplexity: float
    top1: float
    top3: float
    targets: int
    word_targets: int


@dataclass
class KeyboardVariant:
    name: str
    trainable: int  # trainable values (LoRA: the adapters')
    trainable_bytes: int  # their float32 bytes: what one user's personalization changes
    artifact_bytes: int
    steps: int
    train_seconds: float
    median_step_ms: float
    user: LMFigures  # on the user's held-out sentences, after
    base: LMFigures  # on the base corpus's held-out sentences, after
    peak_rss_mib: float | None = None  # VmHWM of a fresh process training the artifact RSS_STEPS steps
    start_rss_mib: float | None = (
        None  # ... its RSS before loading the artifact (the interpreter, numpy, edgetrain)
    )
    onnx_path: str = ""
    onnx_bytes: int = 0
    onnxruntime_max_diff: float | None = None  # largest |logit difference|, onnxruntime against the session
    onnxruntime_top1: float | None = None  # onnxruntime's top-1 on the user's held-out sentences
    adapter_path: str | None = None  # LoRA: the onnxruntime adapter file served with served_path
    adapter_bytes: int | None = None
    etad_bytes: int | None = None  # LoRA: the adapters in edgetrain's own container
    served_path: str | None = None
    served_max_diff: float | None = None  # onnxruntime: served base + adapter file against the merged model
    curve: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class KeyboardDemoResult(Summary):
    base_user: LMFigures
    base_base: LMFigures  # the base model on its own held-out sentences (what it learned)
    parameters: int
    model_bytes: int
    vocabulary: int
    user_known_words: float  # share of the user's held-out words in the vocabulary
    user_train_sentences: int
    user_heldout_sentences: int
    base_heldout_sentences: int
    epochs: int
    batch: int
    lora: dict[str, Any]
    variants: dict[str, KeyboardVariant]
    seconds: float
    out_dir: str
    model: str = "keyboard"


def lm_figures(logits: np.ndarray, labels: np.ndarray) -> LMFigures:
    """LMFigures of logits [N, T, V] against NextTokenLoss's labels [N, T] (position t scores token t + 1; -100:
    nothing to score)."""
    z = logits[:, :-1].reshape(-1, logits.shape[-1]).astype(np.float64)
    t = labels[:, 1:].reshape(-1)
    keep = t >= 0
    z, t = z[keep], t[keep]
    z -= z.max(axis=1, keepdims=True)
    logp = z[np.arange(t.size), t] - np.log(np.exp(z).sum(axis=1))
    wordy = t >= SPECIALS
    w = z[wordy][:, SPECIALS:]
    rank = (w > w[np.arange(w.shape[0]), t[wordy] - SPECIALS][:, None]).sum(axis=1)
    return LMFigures(
        perplexity=float(np.exp(-logp.mean())),
        top1=float(np.mean(rank < 1)),
        top3=float(np.mean(rank < 3)),
        targets=int(t.size),
        word_targets=int(wordy.sum()),
    )


def _chunked(run, x: np.ndarray, batch: int = EVAL_BATCH) -> np.ndarray:
    """run(x) over x in chunks of `batch` rows, the last padded (one program, one shape), concatenated."""
    out = []
    for a in range(0, len(x), batch):
        part = x[a : a + batch]
        n = len(part)
        if n < batch:
            part = np.concatenate([part, np.zeros((batch - n, *part.shape[1:]), part.dtype)])
        out.append(run(part)[:n])
    return np.concatenate(out)


def _ort_logits(path: str, x: np.ndarray, adapter: str | None = None) -> np.ndarray:
    """The model's logits under onnxruntime (one thread), with an onnxruntime adapter file active if given."""
    ort = _onnxruntime("keyboard")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    run_options = None
    if adapter is not None:
        lora = ort.LoraAdapter()
        lora.Load(adapter)
        run_options = ort.RunOptions()
        run_options.add_active_adapter(lora)
    return _chunked(lambda part: sess.run(None, {"ids": part}, run_options)[0], x)


def _read_lines(name: str) -> list[str]:
    with open(os.path.join(KEYBOARD, name), encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def _mib(kib: int) -> float:
    return kib / 1024


def run_keyboard_demo(
    out_dir: str | None = None,
    *,
    epochs: int = KEYBOARD_EPOCHS,
    stream: TextIO | None = None,
    progress_stream: TextIO | None = None,
    seed: int = 0,
    base_sentences: int | None = None,
    measure_memory: bool = True,
) -> KeyboardDemoResult:
    """A keyboard's next-word model personalized on the device: the embedded GPT-style LM (trained on the KJV)
    learns a new user's sentences (fortune cookies) with LoRA, head-only and full fine-tuning; held-out top-1/top-3
    and perplexity before and after, trainable and adapter bytes, step time, peak RSS (measure_memory), the exports
    checked in onnxruntime (merged LoRA, and the served base with the user's onnxruntime adapter file). Writes into
    out_dir (default ./edgetrain-demo-keyboard) the artifacts, checkpoints, exported models, adapter files and
    summary.json. base_sentences: measure the base corpus on its first so many held-out sentences (all 1,000 by
    default; fewer for a quick run)."""
    _onnxruntime("keyboard")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ConfigError(f"epochs must be a positive integer, got {epochs!r}")
    out_dir = out_dir or "edgetrain-demo-keyboard"
    # one BLAS thread, as a phone's training thread would run: on a busy 2-core x86-64 a step ran 4 times slower
    # with two (530 ms against 125 for LoRA's); the process's setting is restored after
    with _blas_threads(1):
        return _tell_keyboard_story(
            out_dir, epochs, seed, stream, progress_stream, base_sentences, measure_memory
        )


def _tell_keyboard_story(
    out_dir, epochs, seed, stream, progress_stream, base_sentences, measure_memory
) -> KeyboardDemoResult:
    """The keyboard demo's scenes in order -> the result, also written to out_dir/summary.json."""
    t_start = time.perf_counter()
    story = _KeyboardStory(out_dir, epochs, seed, stream, progress_stream, base_sentences)
    story.introduce()
    base_user, base_base = story.measure_base()
    paths = story.convert_variants()
    variants, sessions = story.fine_tune(paths, base_user)
    if measure_memory:
        story.memory(variants, paths)
    story.export(variants, sessions, paths)
    demo = KeyboardDemoResult(
        base_user=base_user,
        base_base=base_base,
        parameters=story.parameters,
        model_bytes=os.path.getsize(KEYBOARD_MODEL),
        vocabulary=len(story.vocab),
        user_known_words=story.known,
        user_train_sentences=len(story.user_train_text),
        user_heldout_sentences=len(story.user_held_text),
        base_heldout_sentences=len(story.base_held_text),
        epochs=epochs,
        batch=KEYBOARD_BATCH,
        lora=dict(LORA),
        variants=variants,
        seconds=0.0,
        out_dir=out_dir,
    )
    story.keyboard_table(demo)
    demo.seconds = time.perf_counter() - t_start
    story.keyboard_finish(demo)
    return demo


class _KeyboardStory(_Teller):
    """The keyboard demo's telling: the vocabulary, the user's and the base corpus's sentences as token windows, a
    method per scene."""

    def __init__(self, out_dir, epochs, seed, stream, progress_stream, base_sentences):
        super().__init__(out_dir, epochs=epochs, seed=seed, stream=stream, progress_stream=progress_stream)
        self.vocab = WordVocab.load(os.path.join(KEYBOARD, "vocab.json"))
        self.user_train_text = _read_lines("user_train.txt")
        self.user_held_text = _read_lines("user_heldout.txt")
        self.base_held_text = _read_lines("base_heldout.txt")[:base_sentences]
        self.length = int(InferenceSession(KEYBOARD_MODEL).get_inputs()[0].shape[1])

        def windows(texts):
            return TokenWindowView.from_texts(self.vocab, texts, self.length)

        self.user_train = windows(self.user_train_text)
        self.user_held, self.base_held = windows(self.user_held_text), windows(self.base_held_text)
        ids = np.concatenate([self.vocab.encode(t) for t in self.user_held_text])
        self.known = float(np.mean(ids != self.vocab.unk_id))

    def introduce(self, title: str = "personalizing a keyboard's next-word model on the device") -> None:
        self.say(f"edgetrain demo: {title}")
        self.say("")
        self.say(
            f"  base model  keyboard_lm.onnx: a GPT-style language model (2 decoder blocks, d 64, 4 heads), a "
            f"{len(self.vocab):,}-word"
        )
        self.say(
            "              vocabulary, trained on the King James Bible (public domain; tools/build_keyboard.py)"
        )
        self.say(
            "  new user    writes fortune cookies (fortune-mod's `fortunes`, BSD license): modern, short, "
            "second person;"
        )
        self.say(
            f"              {len(self.user_train_text)} sentences to learn from, {len(self.user_held_text)} held out "
            f"to measure ({percent(self.known)} of their words in the vocabulary)"
        )
        self.say("")

    def _figures(self, run) -> tuple[LMFigures, LMFigures]:
        """(on the user's held-out sentences, on the base corpus's) of a model's run(ids) -> logits."""
        user = lm_figures(_chunked(run, self.user_held.x), self.user_held.y)
        base = lm_figures(_chunked(run, self.base_held.x), self.base_held.y)
        return user, base

    def measure_base(self) -> tuple[LMFigures, LMFigures]:
        """[1/5] the base model on the user's held-out sentences and on the base corpus's."""
        base = InferenceSession(KEYBOARD_MODEL)
        user, kjv = self._figures(lambda x: base.run(None, {"ids": x})[0])
        self.say(
            f"[1/5] the base model guesses the new user's next word {percent(user.top1)} of the time (top 3: "
            f"{percent(user.top3)}, perplexity {user.perplexity:.0f});"
        )
        self.say(
            f"      on the Bible verses it never saw: {percent(kjv.top1)} (top 3: {percent(kjv.top3)}, perplexity "
            f"{kjv.perplexity:.0f})"
        )
        return user, kjv

    def convert_variants(self) -> dict[str, str]:
        """[2/5] the base model -> a training artifact per variant, NextTokenLoss and Adam -> their paths."""
        t0 = time.perf_counter()
        paths, counts = {}, {}
        for name, cfg in KEYBOARD_VARIANTS.items():
            art = convert(
                KEYBOARD_MODEL,
                loss=NextTokenLoss(),
                optimizer=Adam(lr=cfg["lr"]),
                trainable=cfg["trainable"],
                adapters=LoRA(**LORA, seed=self.seed) if cfg["lora"] else None,
                batch_size=KEYBOARD_BATCH,
            )
            paths[name] = os.path.join(self.out_dir, f"{name.lower()}.etrain")
            art.save(paths[name])
            counts[name] = int(sum(art.initial[p].size for p in art.parameters))
        self.parameters, self.counts = counts["full"], counts
        self.say(
            f"[2/5] converted it into three training programs (.etrain) with edgetrain's next-token loss, in "
            f"{duration(time.perf_counter() - t0)}:"
        )
        targets = ", ".join(LORA["targets"])
        self.say(
            f"      LoRA rank {LORA['rank']}, alpha {LORA['alpha']:g} on {targets} (q, k, v, proj, fc, proj of both "
            f"blocks): {counts['LoRA']:,} values"
        )
        self.say(
            f"      head-only (head): {counts['head-only']:,} values; full: all {counts['full']:,}; the rest "
            "frozen, its gradients never computed"
        )
        return paths

    def fine_tune(self, paths: dict[str, str], base_user: LMFigures):
        """[3/5] each artifact trained on the user's sentences -> (the variants' results, their sessions)."""
        self.say(
            f"[3/5] fine-tuning on the device: {self.epochs} epochs of {self.user_train.size()} sentences, batch "
            f"{KEYBOARD_BATCH}, Adam with cosine decay, one BLAS thread"
        )
        variants, sessions = {}, {}
        for name in KEYBOARD_VARIANTS:
            sess = sessions[name] = TrainingSession(paths[name])
            variants[name] = v = self._train_one(name, sess, paths[name])
            self.say(
                f"      {name:9s} {v.steps} steps in {duration(v.train_seconds)} (median step "
                f"{v.median_step_ms:.0f} ms): top-1 {percent(base_user.top1)} -> {percent(v.user.top1)}, "
                f"perplexity {base_user.perplexity:.0f} -> {v.user.perplexity:.0f}"
            )
        return variants, sessions

    def _train_one(self, name: str, sess: TrainingSession, path: str) -> KeyboardVariant:
        """One variant's training (a Trainer: cosine decay, the user's held-out loss each epoch, a checkpoint) ->
        its result, measured after."""
        loader = DataLoader(self.user_train, KEYBOARD_BATCH, shuffle=True, seed=self.seed, drop_last=True)
        steps = self.epochs * len(loader)
        bar = TrainProgress(
            steps, KEYBOARD_BATCH, label=f"      {name:9s}", stream=self.progress_stream, epoch_lines=False
        )
        seconds = _timed(sess)
        trainer = Trainer(
            sess,
            loader,
            val_loader=DataLoader(self.user_held, KEYBOARD_BATCH),
            epochs=self.epochs,
            schedule=CosineLR(steps),
            checkpoint=os.path.join(self.out_dir, f"{name.lower()}.etck"),
            progress=bar,
            classification=False,
        )
        t0 = time.perf_counter()
        result = trainer.fit()
        bar.close()
        train_seconds = time.perf_counter() - t0
        user, base = self._figures(sess.run)
        count = self.counts[name]
        return KeyboardVariant(
            name=name,
            trainable=count,
            trainable_bytes=4 * count,
            artifact_bytes=os.path.getsize(path),
            steps=result.steps,
            train_seconds=train_seconds,
            median_step_ms=1000 * float(np.median(seconds)),
            user=user,
            base=base,
            curve=result.history,
        )

    def memory(self, variants: dict[str, KeyboardVariant], paths: dict[str, str]) -> None:
        """[4/5] each variant's peak RSS: a fresh process with the device side alone trains its artifact
        RSS_STEPS steps on one batch of the user's sentences (_RSS_WORKER); its VmHWM."""
        batch = os.path.join(self.out_dir, "rss-batch.npz")
        x, y = self.user_train.get_batch(np.arange(KEYBOARD_BATCH))
        np.savez(batch, x=x, y=y)
        root = os.path.dirname(os.path.dirname(DATA))  # the folder that holds the edgetrain package
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        )
        for name, v in variants.items():
            proc = subprocess.run(
                [sys.executable, "-c", _RSS_WORKER, paths[name], batch, str(RSS_STEPS)],
                capture_output=True,
                text=True,
                env=env,
                timeout=600,
            )
            if proc.returncode != 0:
                self.say(f"      {name}: the memory probe failed: {proc.stderr.strip().splitlines()[-1:]}")
                continue
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            v.peak_rss_mib, v.start_rss_mib = _mib(got["peak_kib"]), _mib(got["start_kib"])
        measured = [v for v in variants.values() if v.peak_rss_mib is not None]
        if not measured:
            return
        start = min(v.start_rss_mib for v in measured)
        peaks = ", ".join(f"{v.name} {v.peak_rss_mib:.0f} MiB" for v in measured)
        self.say(
            f"[4/5] peak RSS of a fresh process training {RSS_STEPS} steps (numpy and edgetrain's runtime alone, "
            f"{start:.0f} MiB before"
        )
        self.say(f"      loading the artifact): {peaks}")

    def export(
        self, variants: dict[str, KeyboardVariant], sessions: dict[str, TrainingSession], paths
    ) -> None:
        """[5/5] every personalized model -> ONNX, checked in onnxruntime; LoRA's also served: the base model with
        the adapters as inputs (their defaults untrained: B = 0, the base model) plus this user's onnxruntime
        adapter file, and the adapters in edgetrain's .etad."""
        t0 = time.perf_counter()
        x = self.user_held.x
        for name, v in variants.items():
            sess = sessions[name]
            v.onnx_path = os.path.join(self.out_dir, f"personalized-{name.lower()}.onnx")
            sess.export_onnx(v.onnx_path)
            v.onnx_bytes = os.path.getsize(v.onnx_path)
            ort = _ort_logits(v.onnx_path, x)
            v.onnxruntime_max_diff = float(np.max(np.abs(ort - _chunked(sess.run, x))))
            v.onnxruntime_top1 = lm_figures(ort, self.user_held.y).top1
        lora, sess = variants["LoRA"], sessions["LoRA"]
        lora.served_path = os.path.join(self.out_dir, "served-base.onnx")
        TrainingSession(paths["LoRA"]).export_onnx(lora.served_path, adapters="serving")  # one for every user
        lora.adapter_path = os.path.join(self.out_dir, "user.onnx_adapter")
        lora.adapter_bytes = sess.export_adapters(lora.adapter_path, format="onnxruntime")
        lora.etad_bytes = sess.export_adapters(os.path.join(self.out_dir, "user.etad"))
        served = _ort_logits(lora.served_path, x, lora.adapter_path)
        lora.served_max_diff = float(np.max(np.abs(served - _ort_logits(lora.onnx_path, x))))
        plain = _ort_logits(lora.served_path, x)  # no adapter active: the base model's defaults
        base_diff = float(np.max(np.abs(plain - _ort_logits(KEYBOARD_MODEL, x))))
        same = all(v.onnxruntime_top1 == v.user.top1 for v in variants.values())
        worst = max(v.onnxruntime_max_diff for v in variants.values())
        self.say(
            f"[5/5] exported the personalized models to ONNX in {duration(time.perf_counter() - t0)}; onnxruntime "
            f"runs them {'with the same top-1' if same else 'with a DIFFERENT top-1'} (largest logit"
        )
        self.say(
            f"      difference {worst:.1e}). LoRA's merged model is the original graph with W + (alpha/rank) A B"
        )
        self.say(
            f"      served: one base model with the adapters as inputs, plus this user's onnxruntime adapter file "
            f"({lora.adapter_bytes:,} bytes):"
        )
        self.say(
            f"      the same logits as the merged model within {lora.served_max_diff:.1e}; without the adapter, "
            f"the base model's within {base_diff:.1e}"
        )

    def keyboard_table(self, demo: KeyboardDemoResult) -> None:
        """The table: next-word figures on the user's and the Bible's held-out sentences, what trains, cost."""
        rows = [("", "new user", "", "", "Bible", "", "trainable", "median", "peak")]
        rows.append(
            ("", "top-1", "top-3", "perplexity", "top-1", "perplexity", "bytes", "ms/step", "RSS MiB")
        )

        def figures(user: LMFigures, base: LMFigures) -> tuple[str, ...]:
            return (
                percent(user.top1),
                percent(user.top3),
                f"{user.perplexity:.1f}",
                percent(base.top1),
                f"{base.perplexity:.1f}",
            )

        rows.append(("base model", *figures(demo.base_user, demo.base_base), "-", "-", "-"))
        for name, v in demo.variants.items():
            label = f"LoRA r{demo.lora['rank']} (attn, MLP)" if name == "LoRA" else name
            rss = "-" if v.peak_rss_mib is None else f"{v.peak_rss_mib:.0f}"
            rows.append(
                (label, *figures(v.user, v.base), f"{v.trainable_bytes:,}", f"{v.median_step_ms:.0f}", rss)
            )
        self.say_table(rows)
        lora = demo.variants["LoRA"]
        self.say(
            f"  held out: the new user's {demo.user_heldout_sentences} sentences ({demo.base_user.word_targets:,} "
            f"words to guess), {demo.base_heldout_sentences:,} Bible sentences; top-1/top-3 among the words"
        )
        self.say(
            f"  per user: LoRA's adapter file {lora.adapter_bytes:,} bytes for onnxruntime, {lora.etad_bytes:,} "
            f"as .etad, against the model's {demo.model_bytes:,}"
        )
        self.say(
            f"  ({100 * lora.adapter_bytes / demo.model_bytes:.1f}%); head-only changes "
            f"{demo.variants['head-only'].trainable_bytes:,} bytes of it, full all of them"
        )
        self.say("")

    def keyboard_finish(self, demo: KeyboardDemoResult) -> None:
        """The files, summary.json and the closing line."""
        lora = demo.variants["LoRA"]
        for v in demo.variants.values():
            self.say(f"  {v.name + ' model':17s} {v.onnx_path}")
        self.say(f"  {'served base':17s} {lora.served_path}  (+ {lora.adapter_path})")
        self.say(f"  {'summary':17s} {self.write_summary(demo)}")
        self.say("")
        self.say(
            f"done in {duration(demo.seconds)}. Your own model: edgetrain convert LM.onnx --loss next-token "
            "--lora-rank 8 ..."
        )


def run_keyboard_command(args) -> int:
    """`edgetrain demo --model keyboard` (its parsed arguments: --epochs, --out, --json) -> 0."""
    epochs = KEYBOARD_EPOCHS if args.epochs is None else args.epochs
    if epochs < 1:
        raise UsageError(f"--epochs must be a positive integer, got {epochs}")
    result = run_keyboard_demo(args.out, epochs=epochs)
    if args.json:
        write_json(args.json, result)
    return 0
