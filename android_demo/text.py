"""The app's text mode: a keyboard that learns its user's words (numpy, loaders and edgetrain's device side only).

A text home holds what every home holds (home.py), with a GPT-style language model converted with NextTokenLoss and
LoRA adapters on its attention and MLP MatMuls (the base frozen; tools/build_android_assets.py builds
data/keyboard.etrain) and the model's word vocabulary (vocab.json). What the user sends is stored as samples in the
same SampleStore: each sentence one window of int64 token ids [32] (<bos> words <eos>, right-padded) with its
next-token labels (int64 [32]: the ids, -100 where padded and where the word is <unk>, which counts for nothing).
Bursts train the adapters on the training part, judge them on the held-out part (a stable hash share of the user's
own sentences: next-word top-1 accuracy, perplexity) and keep or roll back as for digits; a kept version is the
adapters alone (versions/vNNNNNN.etad, export_adapters: tens of KB, not the 2 MB model).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

import edgetrain as et
from edgetrain.core.atomic import atomic_write
from edgetrain.runtime.trainer import session_batch
from loaders import DataLoader
from loaders.text import (
    IGNORE_INDEX,
    SENTENCE_MAX_CHARS,
    SPECIALS,
    TokenWindowView,
    WordVocab,
    read_sentences,
    sentences,
    words,
)

from .app import Home
from .burst import BurstResult
from .home import BaseHome
from .settings import ADAPTERS, VERSIONS, AppError, HomeKindError, VersionError

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
KEYBOARD = os.path.join(DATA, "keyboard.etrain")
KEYBOARD_VOCAB = os.path.join(DATA, "keyboard_vocab.json")
VOCAB = "vocab.json"
# characters of one sentence sent (or of a file's line), or of the text a suggestion reads
MAX_TEXT = SENTENCE_MAX_CHARS
FILE_CHUNK = 512  # sentences of a file made into windows at once (~8 MB at most: 32 windows of 2,000 chars)
MAX_LOG_PERPLEXITY = 700.0  # a loss a word whose exp (the perplexity) a float64 holds
TEXT_DEFAULTS = {"max_steps": 20, "max_seconds": 60.0, "val_fraction": 0.2, "mode": "text"}
# app.Home's methods for labelled samples, which a text home has not -> what it does instead
NOT_A_TEXT_HOMES = {
    "add": "add_text or add_sentences (the command line: add --sentences FILE)",
    "add_data": "add_sentences (the command line: add --sentences FILE)",
    "evaluate_data": "heldout_figures (the command line: evaluate --sentences FILE)",
    "predict": "suggest",
}


class TextHome(BaseHome):
    """A home whose samples are sentences and whose model suggests the next word; it takes no labelled sample
    (app.Home's add and add_data)."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        if self.settings.get("mode") != "text":
            raise AppError(f"{self.path} is a {self.settings.get('mode')} home, not a text one")
        self.vocab = WordVocab.load(self._file(VOCAB))

    def __getattr__(self, name: str):
        # only for what normal lookup did not find: a labelled-sample home's method is refused saying what to use
        if name in NOT_A_TEXT_HOMES:
            raise HomeKindError(
                f"{self.path} is a text home: it takes sentences, not labelled samples, and has no {name}; use "
                f"{NOT_A_TEXT_HOMES[name]}"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def init(
        cls,
        path: str | os.PathLike,
        artifact: str | os.PathLike | None = None,
        *,
        vocab: str | os.PathLike | None = None,
        **settings: Any,
    ) -> TextHome:
        """Sets up a text home from the embedded keyboard (or a language-model artifact and its vocabulary)."""
        artifact = KEYBOARD if artifact is None else artifact
        vocab_path = KEYBOARD_VOCAB if vocab is None else vocab
        words_ = WordVocab.load(vocab_path)  # refuses anything but a vocabulary file
        sess = et.TrainingSession(artifact)
        if sess.record.loss.type != "NextTokenLoss" or sess.num_classes != len(words_):
            raise AppError(
                f"{artifact} is not a next-word model of {vocab_path}'s {len(words_)} tokens "
                "(convert a language model with NextTokenLoss)"
            )
        path = os.path.abspath(os.fspath(path))
        if os.path.exists(os.path.join(path, "current.json")):
            raise AppError(f"{path} is already an app home; pick another folder or delete this one")
        os.makedirs(path, exist_ok=True)
        atomic_write(os.path.join(path, VOCAB), words_.file_text().encode())  # what was read and checked
        merged = {**TEXT_DEFAULTS, **{k: v for k, v in settings.items() if v is not None}}
        BaseHome.init(path, artifact, **merged)
        return cls(path)

    # ---- the model -----------------------------------------------------------------------------------------------
    @property
    def length(self) -> int:
        return int(self.input_shape()[0])

    def suggest(self, text: str, k: int = 3, *, with_version: bool = False):
        """The k likeliest next words after `text` (the sentence so far) by the current version, best first."""
        if not isinstance(text, str) or len(text) > MAX_TEXT:
            raise AppError(f"the text must be a string of at most {MAX_TEXT} characters")
        ids, at = self.vocab.context(text, self.length)
        with self._cache_lock:  # one interpreter: its buffers serve one run at a time
            v, sess = self._cached()
            logits = np.asarray(sess.run(ids[None]))[0, at]
        if not np.isfinite(logits).all():  # words ranked by NaN would be any words
            raise VersionError(
                f"version {v} scores the next word as NaN or infinity: nothing is suggested. {self._kept_sentence(v)}"
            )
        best = self.vocab.top_words(logits, k)
        return (best, v) if with_version else best

    # ---- samples -------------------------------------------------------------------------------------------------
    def windows(self, texts: list[str]) -> TokenWindowView:
        """Sentences -> the windows the store holds (an <unk> target counts for nothing)."""
        return TokenWindowView.from_texts(
            self.vocab, texts, self.length, ignore_targets=(self.vocab.unk_id,), source="<the user's text>"
        )

    def add_text(self, text: str) -> list[int]:
        """Stores what the user sent (one or more sentences), one sample per window; returns their ids."""
        if not isinstance(text, str) or len(text) > MAX_TEXT:
            raise AppError(f"the text must be a string of at most {MAX_TEXT} characters")
        parts = sentences(text)
        if not parts:
            raise AppError("the text has no word to learn from")
        return self.add_sentences(parts)

    def add_sentences(self, texts: list[str]) -> list[int]:
        """Stores sentences (one a text of at most MAX_TEXT characters; a text without a word is skipped) in one
        transaction; their ids."""
        texts = [t for t in _checked(texts) if words(t)]
        if not texts:
            return []
        view = self.windows(texts)
        with self.store() as s:
            ids = [int(i) for i in s.add_many(list(view.x), list(view.y))]
        self._log("add_text", ids=ids[:50], samples=len(ids), words=sum(len(words(t)) for t in texts))
        return ids

    def _samples(self, texts: list[str]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        view = self.windows(texts)
        return list(view.x), list(view.y)

    def add_sentence_file(self, path: str | os.PathLike) -> list[int]:
        """Stores the sentences of a UTF-8 file, one a line (loaders.text.read_sentences: bounded in bytes,
        sentences and characters a line), in one transaction; their ids. The file streams through: FILE_CHUNK
        sentences are made into windows at a time, so memory does not grow with the file."""
        lines = read_sentences(path)
        counted = {"words": 0}

        def batches():
            chunk: list[str] = []
            for text in lines:
                n = len(words(text))
                if n:
                    counted["words"] += n
                    chunk.append(text)
                if len(chunk) == FILE_CHUNK:
                    yield self._samples(chunk)
                    chunk = []
            if chunk:
                yield self._samples(chunk)

        with self.store() as s:
            ids = [int(i) for i in s.add_stream(batches())]
        if ids:
            self._log(
                "add_text",
                ids=ids[:50],
                samples=len(ids),
                words=counted["words"],
                file=os.path.basename(path),
            )
        return ids

    # ---- bursts --------------------------------------------------------------------------------------------------
    def _evaluate(self, sess: et.TrainingSession, loader: DataLoader, classification: bool):
        """(mean loss per next-token target, next-word top-1 accuracy) over the held-out windows."""
        return next_word_metrics(sess, loader)

    def _save_version(self, sess: et.TrainingSession, version: int, result: BurstResult) -> str:
        name = os.path.join(VERSIONS, f"v{version:06d}{ADAPTERS}")
        sess.export_adapters(self._file(name))
        return name

    def status(self) -> dict[str, Any]:
        st = super().status()
        _, name = self._current()
        st["mode"] = "text"
        st["version_bytes"] = (
            os.path.getsize(self._file(name)) if name and os.path.isfile(self._file(name)) else 0
        )
        return st


def _checked(texts) -> list[str]:
    """A list of sentences, each a string of at most MAX_TEXT characters (AppError naming the first that is not)."""
    if isinstance(texts, (str, bytes)) or not isinstance(texts, (list, tuple)):
        raise AppError(f"sentences must be a list of strings, not {type(texts).__name__}")
    for k, t in enumerate(texts):
        if not isinstance(t, str) or len(t) > MAX_TEXT:
            got = f"{len(t):,} characters" if isinstance(t, str) else f"a {type(t).__name__}"
            raise AppError(
                f"sentence {k} is {got}; each must be a string of at most {MAX_TEXT} characters (split longer ones)"
            )
    return list(texts)


def open_home(path: str | os.PathLike) -> BaseHome:
    """The home at `path` as its mode's class: a Home for a classifier's samples, a TextHome for a keyboard's."""
    mode = BaseHome(path).settings.get("mode")
    return TextHome(path) if mode == "text" else Home(path)


def next_word_metrics(sess: et.TrainingSession, loader: DataLoader) -> tuple[float, float | None]:
    """(mean cross-entropy per target token, the share of word targets the model ranks first) of windows with
    NextTokenLoss labels: position t's output scores the label at t + 1; perplexity is exp of the first."""
    batch = session_batch(sess) or 1
    nll, targets, hits, word_targets = 0.0, 0, 0, 0
    for x, y in loader:
        k = len(x)
        xp = np.concatenate([x, np.repeat(x[:1], batch - k, axis=0)]) if k < batch else x
        logits = np.asarray(sess.run(xp), np.float64)[:k, :-1]
        want = np.asarray(y)[:, 1:]
        keep = want != IGNORE_INDEX
        if not keep.any():
            continue
        z = logits[keep]
        t = want[keep]
        top = z.max(axis=1)
        logsum = top + np.log(np.exp(z - top[:, None]).sum(axis=1))
        nll += float(np.sum(logsum - z[np.arange(t.size), t]))
        targets += int(t.size)
        is_word = t >= len(SPECIALS)
        hits += int(np.sum((z.argmax(axis=1) == t) & is_word))
        word_targets += int(is_word.sum())
    if not targets:
        return math.nan, None
    return nll / targets, (hits / word_targets if word_targets else None)


def heldout_figures(home: TextHome, texts: list[str]) -> dict[str, Any]:
    """The current version on sentences it never trained on: next-word top-1, perplexity, targets."""
    view = home.windows(texts)
    sess = home.session()
    loss, top1 = next_word_metrics(sess, DataLoader(view, session_batch(sess) or 8))
    if not math.isfinite(loss) or loss > MAX_LOG_PERPLEXITY:
        raise VersionError(
            f"version {home.version} scores these sentences' words as NaN or infinity (a loss of {loss:.4g} a "
            f"word): no figures. {home._kept_sentence()}"
        )
    return {"top1": top1, "perplexity": math.exp(loss), "windows": view.size()}


__all__ = ["KEYBOARD", "KEYBOARD_VOCAB", "TextHome", "heldout_figures", "next_word_metrics", "open_home"]
