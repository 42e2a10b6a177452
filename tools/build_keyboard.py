"""Builds the keyboard demo's assets (`edgetrain demo --model keyboard`; run once by a developer, the outputs are
committed into edgetrain/data/keyboard/):

    vocab.json          the word vocabulary: the 3,000 most frequent words of the base corpus's training part, and
                        <pad> <unk> <bos> <eos> (loaders.text.WordVocab)
    keyboard_lm.onnx    the base model: a small GPT-style causal language model (2 pre-LayerNorm decoder blocks,
                        d = 64, 4 heads, MLP 256, learned positions, untied head), trained from scratch here with
                        PyTorch on the base corpus and exported by edgetrain.torch_export (with its parameter manifest):
                        int64 token ids [N, 32] -> logits [N, 32, 3004]
    base_heldout.txt    base-corpus sentences the model never trained on (one per line): what it learned, measured
    user_train.txt      the new user's sentences to learn from (one per line)
    user_heldout.txt    the new user's sentences held out to measure (one per line)
    build.json          how they were made: settings, sizes, the base model's training and figures
    SOURCES.md          where each text comes from and its license (written by hand; this tool checks it is there)

The base corpus is the King James Version of the Bible (public domain), read from Debian's bible-kjv-text through
its `bible` program (package bible-kjv); the new user is the `fortunes` file of Debian's fortunes-min (BSD license;
the unattributed entries only). Both must be installed (as root):

    apt-get update && apt-get install -y bible-kjv bible-kjv-text fortunes-min
    .venv/bin/python tools/build_keyboard.py            # a few minutes on 2 cores (torch, onnx, onnxruntime)

Everything is seeded (corpus splits, vocabulary, initialization, batches); PyTorch on 2 threads, so the model
rebuilds the same on the machine that built it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from loaders.text import IGNORE_INDEX, TokenWindowView, WordVocab, sentences, words  # noqa: E402

OUT = os.path.join(ROOT, "edgetrain", "data", "keyboard")
SEED = 20261127
LENGTH = 32  # the model's positions: <bos> and 31 words of a sentence
VOCAB_WORDS = 3000
MODEL = {"d": 64, "heads": 4, "mlp": 256, "layers": 2}
TRAIN = {"epochs": 4, "batch": 64, "lr": 3e-3, "weight_decay": 0.01, "warmup": 200, "threads": 2}
BASE_HELDOUT_EVERY = 30  # every 30th verse is held out of the base model's training
BASE_HELDOUT_SHIPPED = 1000  # of their sentences, shipped for the demo's "what it learned" column
USER_TRAIN = 300  # the new user's sentences to learn from; the rest (about 190) are held out
FORTUNES = "/usr/share/games/fortunes/fortunes"  # fortunes-min


# ---- corpora ----------------------------------------------------------------------------------------------------
def read_kjv() -> list[str]:
    """The 31,102 verses of the KJV, in order, as text (the `bible` program decodes bible-kjv-text's data)."""
    try:
        out = subprocess.run(
            ["bible", "-l100000", "gen1:1-rev22:21"], check=True, capture_output=True, text=True
        ).stdout
    except FileNotFoundError:
        sys.exit("the `bible` program is not installed: apt-get install -y bible-kjv bible-kjv-text")
    verses = [m.group(1) for m in re.finditer(r"^[ \t]+\d+ (.+)$", out, re.M)]
    if len(verses) != 31102:
        sys.exit(f"expected the KJV's 31,102 verses from `bible`, got {len(verses)}")
    return verses


def read_fortunes(path: str = FORTUNES) -> list[str]:
    """fortunes-min's `fortunes` entries without an attribution ("-- Author" lines): the collection's own fortune
    cookies rather than quotations of other works; white space made single spaces."""
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: apt-get install -y fortunes-min")
    with open(path, encoding="utf-8", errors="replace") as f:
        entries = f.read().split("\n%\n")
    out = []
    for e in entries:
        text = " ".join(e.replace("%", " ").split())
        if text and "--" not in text and "\ufffd" not in text:
            out.append(text)
    return out


def split_corpora(verses: list[str], fortunes: list[str], rng: np.random.Generator) -> dict[str, list[str]]:
    """-> base_train, base_heldout (sentences of every BASE_HELDOUT_EVERY-th verse, the first shipped), user_train
    and user_heldout (the fortunes shuffled, whole entries to one side, USER_TRAIN sentences to learn from)."""
    base_train, base_held = [], []
    for k, v in enumerate(verses):
        (base_held if k % BASE_HELDOUT_EVERY == BASE_HELDOUT_EVERY - 1 else base_train).extend(sentences(v))
    user_train, user_held, seen = [], [], set()
    for k in rng.permutation(len(fortunes)):
        for s in sentences(fortunes[k]):
            key = " ".join(words(s))
            if len(words(s)) < 2 or key in seen:  # a one-word sentence has no next word to guess
                continue
            seen.add(key)
            (user_train if len(user_train) < USER_TRAIN else user_held).append(s)
    return {
        "base_train": base_train,
        "base_heldout": base_held[:BASE_HELDOUT_SHIPPED],
        "user_train": user_train,
        "user_heldout": user_held,
    }


def package_versions() -> dict[str, str]:
    """The installed versions of the Debian packages the texts come from."""
    names = ["bible-kjv", "bible-kjv-text", "fortunes-min"]
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${Version}\\n", *names], capture_output=True, text=True
    ).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def coverage(vocab: WordVocab, texts: list[str]) -> float:
    """The share of the texts' words that the vocabulary knows."""
    ids = np.concatenate([vocab.encode(t) for t in texts])
    return float(np.mean(ids != vocab.unk_id))


# ---- the model ----------------------------------------------------------------------------------------------------
def make_model(vocab_size: int):
    """A GPT-style causal LM (torch.nn.Module): ids [N, LENGTH] -> logits [N, LENGTH, vocab_size]."""
    import torch
    from torch import nn

    d, heads, mlp = MODEL["d"], MODEL["heads"], MODEL["mlp"]

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.proj = (nn.Linear(d, d) for _ in range(4))
            mask = torch.triu(torch.full((LENGTH, LENGTH), -1e9), diagonal=1)  # position t sees 0..t
            self.register_buffer("mask", mask, persistent=False)

        def forward(self, x):
            def split(t):
                return t.reshape(-1, LENGTH, heads, d // heads).transpose(1, 2)

            q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
            att = torch.softmax(q @ k.transpose(-2, -1) * (d // heads) ** -0.5 + self.mask, dim=-1)
            return self.proj((att @ v).transpose(1, 2).reshape(-1, LENGTH, d))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.proj = nn.Linear(d, mlp), nn.Linear(mlp, d)

        def forward(self, x):
            return self.proj(nn.functional.gelu(self.fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(d), Attention(), nn.LayerNorm(d), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class KeyboardLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab_size, d)
            self.pos = nn.Parameter(torch.zeros(1, LENGTH, d))
            self.blocks = nn.ModuleList(Block() for _ in range(MODEL["layers"]))
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab_size)

        def hidden(self, ids):
            x = self.embed(ids) + self.pos
            for b in self.blocks:
                x = b(x)
            return self.ln_f(x)

        def forward(self, ids):
            return self.head(self.hidden(ids))

    model = KeyboardLM()
    for name, p in model.named_parameters():  # GPT-2's initialization
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif p.ndim == 2 or name == "pos":
            nn.init.normal_(p, std=0.02)
    return model


def train(model, view: TokenWindowView, held: TokenWindowView, rng: np.random.Generator) -> dict:
    """AdamW with warm-up and cosine decay, TRAIN's settings, on windows of the base corpus -> the training's facts.
    The head runs on the positions that have a target only (the loss is the same; a third of the work)."""
    import torch

    torch.set_num_threads(TRAIN["threads"])
    x, y = torch.from_numpy(view.x), torch.from_numpy(view.y)
    per_epoch = view.size() // TRAIN["batch"]
    steps = TRAIN["epochs"] * per_epoch
    decay = [p for n, p in model.named_parameters() if p.ndim == 2 and n != "pos"]
    rest = [p for n, p in model.named_parameters() if not (p.ndim == 2 and n != "pos")]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": TRAIN["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
        lr=TRAIN["lr"],
        betas=(0.9, 0.98),
    )

    def lr_at(step):
        if step < TRAIN["warmup"]:
            return (step + 1) / TRAIN["warmup"]
        return 0.5 * (1 + np.cos(np.pi * (step - TRAIN["warmup"]) / max(1, steps - TRAIN["warmup"])))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    t0, step, history = time.perf_counter(), 0, []
    for epoch in range(TRAIN["epochs"]):
        model.train()
        order = torch.from_numpy(rng.permutation(view.size()))
        total = 0.0
        for b in range(per_epoch):
            idx = order[b * TRAIN["batch"] : (b + 1) * TRAIN["batch"]]
            loss = _loss(model, x[idx], y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            total += loss.item()
        figures = evaluate(model, held)
        history.append({"epoch": epoch + 1, "train_loss": total / per_epoch, **figures})
        print(
            f"  epoch {epoch + 1}: train loss {total / per_epoch:.3f}; held-out perplexity "
            f"{figures['perplexity']:.1f}, next-word top-1 {figures['top1']:.1%}, top-3 {figures['top3']:.1%} "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    return {"steps": step, "seconds": round(time.perf_counter() - t0, 1), "history": history}


def _loss(model, x, y):
    import torch

    h = model.hidden(x)[:, :-1]
    target = y[:, 1:]
    keep = target != IGNORE_INDEX
    return torch.nn.functional.cross_entropy(model.head(h[keep]), target[keep])


def evaluate(model, view: TokenWindowView) -> dict:
    """Perplexity over every target; next-word top-1/top-3 over the targets that are words (not <unk> or
    <eos>), the specials never suggested."""
    import torch

    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(view.x)).numpy()
    return lm_figures(logits, view.y)


def lm_figures(logits: np.ndarray, labels: np.ndarray, specials: int = 4) -> dict:
    """The demo's measure (edgetrain.demo has the same): perplexity over the targets that are not ignored, top-1 and
    top-3 over those that are words, the specials' logits left out."""
    z = logits[:, :-1].astype(np.float64)
    t = labels[:, 1:]
    keep = t != IGNORE_INDEX
    z, t = z[keep], t[keep]
    z -= z.max(axis=1, keepdims=True)
    logp = z[np.arange(len(t)), t] - np.log(np.exp(z).sum(axis=1))
    wordy = t >= specials
    w = z[wordy][:, specials:]
    rank = (w > w[np.arange(len(w)), t[wordy] - specials][:, None]).sum(axis=1)
    return {
        "perplexity": float(np.exp(-logp.mean())),
        "top1": float(np.mean(rank < 1)),
        "top3": float(np.mean(rank < 3)),
        "targets": int(len(t)),
        "word_targets": int(wordy.sum()),
    }


# ---- export and checks -----------------------------------------------------------------------------------------
def export(model, path: str) -> None:
    """keyboard_lm.onnx by edgetrain.torch_export (TorchScript exporter, symbolic batch, parameter manifest)."""
    import onnx
    import torch

    import edgetrain.torch_export as tx

    model.eval()
    example = torch.zeros((2, LENGTH), dtype=torch.int64)
    tx.export(model, (example,), path, input_names=["ids"], output_names=["logits"])
    proto = onnx.load(path)  # the exporter leaves the positions of the output symbolic: they are LENGTH
    dims = proto.graph.output[0].type.tensor_type.shape.dim
    dims[1].Clear()
    dims[1].dim_value = LENGTH
    onnx.checker.check_model(proto)
    onnx.save(proto, path)


def check(model, path: str, held: TokenWindowView) -> dict:
    """The export against PyTorch in onnxruntime; edgetrain's conversion with NextTokenLoss and LoRA on the
    attention and MLP MatMuls: its step-0 output equals the base model's. -> the checks' facts."""
    import onnxruntime as ort
    import torch

    import edgetrain as et

    x = held.x[:64]
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = sess.run(None, {"ids": x})[0]
    ort_diff = float(np.abs(got - want).max())
    art = et.convert(
        path,
        loss=et.NextTokenLoss(),
        optimizer=et.SGD(lr=0.1),
        batch_size=8,
        adapters=et.LoRA(rank=8, alpha=16, targets=["*attn*", "*mlp*"]),
    )
    ts = et.TrainingSession(art)
    et_diff = float(np.abs(ts.run(x[:8]) - want[:8]).max())
    loss = ts.train_step(held.x[:8], held.y[:8])
    print(
        f"  onnxruntime against PyTorch: largest logit difference {ort_diff:.1e}; edgetrain with LoRA on "
        f"{len(art.parameters) // 2} layers: {et_diff:.1e}, a step's loss {loss:.3f}"
    )
    if ort_diff > 1e-3 or et_diff > 1e-3 or not np.isfinite(loss):
        sys.exit("the exported model does not agree with PyTorch")
    return {
        "onnxruntime_max_diff": ort_diff,
        "edgetrain_lora_max_diff": et_diff,
        "lora_layers": art.parameters,
    }


# ---- files --------------------------------------------------------------------------------------------------------
def write_lines(name: str, lines: list[str]) -> None:
    path = os.path.join(OUT, name)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    os.replace(path + ".tmp", path)


def build(epochs: int | None = None) -> dict:
    """Everything, in order -> build.json's facts."""
    import torch

    rng = np.random.default_rng(SEED)
    torch.manual_seed(SEED)
    if epochs:
        TRAIN["epochs"] = epochs
    verses, fortunes = read_kjv(), read_fortunes()
    parts = split_corpora(verses, fortunes, rng)
    vocab = WordVocab.build(parts["base_train"], size=VOCAB_WORDS)
    os.makedirs(OUT, exist_ok=True)
    vocab.save(os.path.join(OUT, "vocab.json"))
    for name in ("base_heldout", "user_train", "user_heldout"):
        write_lines(f"{name}.txt", parts[name])
    sizes = {k: {"sentences": len(v), "words": sum(len(words(s)) for s in v)} for k, v in parts.items()}
    cover = {k: round(coverage(vocab, v), 4) for k, v in parts.items()}
    print(
        f"corpora: { {k: v['sentences'] for k, v in sizes.items()} } sentences; vocabulary {len(vocab):,} tokens"
    )
    print(f"  share of words the vocabulary knows: {cover}")
    view = TokenWindowView.from_texts(vocab, parts["base_train"], LENGTH)
    held = TokenWindowView.from_texts(vocab, parts["base_heldout"], LENGTH)
    model = make_model(len(vocab))
    n = sum(p.numel() for p in model.parameters())
    print(
        f"training a {n:,}-parameter GPT-style LM with PyTorch {torch.__version__}: {view.size():,} windows"
    )
    trained = train(model, view, held, rng)
    path = os.path.join(OUT, "keyboard_lm.onnx")
    export(model, path)
    checks = check(model, path, held)
    user = TokenWindowView.from_texts(vocab, parts["user_heldout"], LENGTH)
    facts = {
        "seed": SEED,
        "length": LENGTH,
        "model": {**MODEL, "parameters": n, "vocabulary": len(vocab), "bytes": os.path.getsize(path)},
        "training": {**TRAIN, **trained},
        "corpora": sizes,
        "vocabulary_coverage": cover,
        "base_heldout": evaluate(model, held),
        "user_heldout": evaluate(model, user),
        "checks": checks,
        "torch": torch.__version__,
        "debian_packages": package_versions(),
    }
    with open(os.path.join(OUT, "build.json"), "w", encoding="utf-8") as f:
        json.dump(facts, f, indent=1)
        f.write("\n")
    return facts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, help=f"base model training epochs (default {TRAIN['epochs']})")
    args = p.parse_args(argv)
    facts = build(args.epochs)
    if not os.path.exists(os.path.join(OUT, "SOURCES.md")):
        print("note: edgetrain/data/keyboard/SOURCES.md (the texts' sources and licenses) is missing")
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(
        f"wrote {os.path.relpath(OUT, ROOT)}/ ({total / 1e6:.2f} MB): base model {facts['model']['parameters']:,} "
        f"parameters; the new user's held-out sentences: perplexity {facts['user_heldout']['perplexity']:.0f}, "
        f"top-1 {facts['user_heldout']['top1']:.1%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
