"""Text for next-word models, with numpy alone: a word vocabulary and its tokenizer (`WordVocab`), sentences
(`sentences`), and fixed-length windows of token ids for next-token training (`TokenWindowView`).

    vocab = WordVocab.load("edgetrain/data/keyboard/vocab.json")
    ids = vocab.encode("You will be married within a year.", bos=True, eos=True)   # int64 [9]
    vocab.decode(ids)                                  # 'you will be married within a year'
    view = TokenWindowView.from_texts(vocab, ["You will be married.", "Go."], length=32)
    x, y = view[0]      # int64 [32]: the ids, right-padded with <pad>; the labels: the ids, -100 where padded

The tokenizer: text is Unicode-normalized (NFKD, accents dropped, curly apostrophes made straight), lowercased, and
its words are the runs of letters and digits, with inner apostrophes kept ("don't", "father's"); everything else
(punctuation, symbols, spaces) separates words and is dropped. A word the vocabulary lacks encodes as <unk>.

The vocabulary file is JSON: {"format": "edgetrain.word-vocab", "version": 1, "tokenizer": "lowercase-words-1",
"specials": ["<pad>", "<unk>", "<bos>", "<eos>"], "words": [...]}; the specials take ids 0..3 in that order, the
words 4.. in the file's order (the build tool writes them most frequent first). A file of another format, version or
tokenizer, a word the tokenizer could not produce, or a duplicate is a DataError naming the file; so is a file
nested deeper than a vocabulary is, checked on its text before the JSON parser reads it.

A file of sentences, one a line (the phone app's `add --sentences`), is read by `read_sentences`, bounded in bytes
before it is held, in sentences and in characters per sentence (SENTENCES_MAX_BYTES, SENTENCES_MAX_COUNT,
SENTENCE_MAX_CHARS), so that a file's size never decides how much memory or time its reader takes.
"""

from __future__ import annotations

import json
import numbers
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from .errors import ConfigError, DataError, DataLimitError
from .limits import read_capped, size_text
from .values import bounded_json, count
from .views import ArrayDataView

FORMAT = "edgetrain.word-vocab"
VERSION = 1
TOKENIZER = "lowercase-words-1"
SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")
PAD, UNK, BOS, EOS = range(4)  # the specials' ids
IGNORE_INDEX = -100  # a label that counts for nothing (edgetrain's NextTokenLoss default, PyTorch's)
VOCAB_MAX_BYTES = 16 << 20  # a vocabulary file (a 50,000-word vocabulary is under 1 MB)
VOCAB_MAX_DEPTH = 8  # a vocabulary file nests 2 deep (an object of lists of words)
# a file of sentences read at once (the phone app's add --sentences): a user's few thousand sentences are ~100 KB;
# a file stored as one batch of samples, whose windows (512 bytes each in memory, more in the store) it bounds
SENTENCES_MAX_BYTES = 4 << 20
SENTENCES_MAX_COUNT = 50_000  # its sentences (non-blank lines): a few seconds of a phone's work to store
SENTENCE_MAX_CHARS = 2000  # one sentence (a line), a keyboard's text or a paragraph at most

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})
# a sentence ends at . ! or ? (and a closing quote or bracket) followed by white space
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"'\u201d\u2019)\]]))\s+")


def words(text: str) -> list[str]:
    """The words of `text` as the vocabulary knows them: lowercase runs of letters and digits, inner apostrophes
    kept; accents dropped (NFKD); punctuation and symbols dropped."""
    if not isinstance(text, str):
        raise ConfigError(f"text must be a str, got {type(text).__name__}")
    if not text.isascii():
        decomposed = unicodedata.normalize("NFKD", text.translate(_APOSTROPHES))
        text = "".join(c for c in decomposed if not unicodedata.combining(c))
    return _WORD.findall(text.replace("`", "'").lower())


def sentences(text: str) -> list[str]:
    """`text` split into sentences (at . ! ? followed by white space; runs of white space made one space); those
    without a word are dropped. A simple rule: "Mr. Smith" splits after "Mr."."""
    if not isinstance(text, str):
        raise ConfigError(f"text must be a str, got {type(text).__name__}")
    out = []
    for part in _SENTENCE_END.split(text.strip()):
        s = " ".join(part.split())
        if words(s):
            out.append(s)
    return out


def read_sentences(
    path: str | os.PathLike,
    *,
    max_bytes: int = SENTENCES_MAX_BYTES,
    max_sentences: int = SENTENCES_MAX_COUNT,
    max_chars: int = SENTENCE_MAX_CHARS,
) -> list[str]:
    """The sentences of a UTF-8 file, one a line (its non-blank lines, stripped), every one checked before any is
    returned (a caller stores all or none). Bounded before it is held: a file of more than max_bytes (a special
    file, a pipe, is read max_bytes + 1 at most), more than max_sentences sentences or a line of more than
    max_chars characters is a DataLimitError naming the file, the line and the limit, and saying how to split it;
    bytes that are not UTF-8 a DataError naming the line."""
    source = os.fspath(path)
    max_bytes, max_sentences, max_chars = (
        count(v, f"read_sentences {name}", lo=1, fix="give a whole number of at least 1")
        for name, v in (("max_bytes", max_bytes), ("max_sentences", max_sentences), ("max_chars", max_chars))
    )
    try:
        with open(source, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            raw, over = (b"", True) if size > max_bytes else read_capped(f, max_bytes)
    except OSError as e:
        raise DataError(f"{source}: cannot read the sentences: {e.strerror or e}", source) from e
    if over:
        found = size_text(size) if size > max_bytes else f"more than {size_text(max_bytes)}"
        raise _too_many(source, found, max_bytes, "bytes", max(size, max_bytes + 1))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(
            f"{source}: line {line} is not UTF-8 text (byte {raw[e.start]:#04x}); save the file as UTF-8",
            source,
        ) from None
    out: list[str] = []
    for lineno, line in enumerate(text.split("\n"), 1):
        line = line.strip()
        if len(line) > max_chars:
            raise DataLimitError(
                f"{source}: line {lineno} holds {len(line):,} characters, more than the {max_chars:,} one sentence "
                "may hold; put one sentence a line (or split the long ones)",
                source,
                limit=max_chars,
                needed=len(line),
            )
        if line:
            if len(out) == max_sentences:
                found = f"more than {max_sentences:,} sentences"
                raise _too_many(source, found, max_sentences, "sentences", max_sentences + 1)
            out.append(line)
    return out


def _too_many(source: str, found: str, limit: int, unit: str, needed: int) -> DataLimitError:
    return DataLimitError(
        f"{source}: {found}; one file may hold {limit:,} {unit} at most: split it into smaller files and add each "
        "(on Linux and Termux: split -l 10000 FILE part-)",
        source,
        limit=limit,
        needed=needed,
    )


class WordVocab:
    """A word-level vocabulary: the specials <pad> <unk> <bos> <eos> (ids 0..3), then the words (ids 4..).
    encode(text) -> int64 ids, decode(ids) -> text; load/save a JSON file (see the module docstring)."""

    pad_id, unk_id, bos_id, eos_id = PAD, UNK, BOS, EOS

    def __init__(self, words: Iterable[str], *, source: str = "<vocabulary>"):
        self.source = source
        tokens = list(SPECIALS)
        for k, w in enumerate(words):
            if not isinstance(w, str) or _WORD.fullmatch(w) is None:
                raise DataError(
                    f"{source}: word {k} ({w!r}) is not one the tokenizer makes (lowercase letters and digits, "
                    "inner apostrophes)",
                    source,
                )
            tokens.append(w)
        if len(tokens) == len(SPECIALS):
            raise DataError(f"{source}: the vocabulary has no words", source)
        self._ids = {w: i for i, w in enumerate(tokens)}
        if len(self._ids) != len(tokens):
            dup = next(w for w, n in Counter(tokens).items() if n > 1)
            raise DataError(f"{source}: the word {dup!r} appears twice", source)
        self.tokens = tuple(tokens)

    # -- building, files ------------------------------------------------------------------------------------------
    @classmethod
    def build(cls, texts: Iterable[str], *, size: int | None = None, min_count: int = 1) -> WordVocab:
        """The words of `texts`, most frequent first (ties alphabetically), at least `min_count` times each, at most
        `size` of them (the specials come on top)."""
        for what, n in (("size", size), ("min_count", min_count)):
            if n is not None and (isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1):
                raise ConfigError(f"WordVocab.build {what} must be a positive integer, got {n!r}")
        counts = Counter(w for t in texts for w in words(t))
        ranked = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        return cls(ranked[:size] if size is not None else ranked, source="<built vocabulary>")

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "tokenizer": TOKENIZER,
            "specials": list(SPECIALS),
            "words": list(self.tokens[len(SPECIALS) :]),
        }

    def file_text(self) -> str:
        """The JSON file's text: one word per line."""
        doc = self.to_json()
        head = {k: v for k, v in doc.items() if k != "words"}
        body = ",\n".join(json.dumps(w) for w in doc["words"])
        return json.dumps(head)[:-1] + ', "words": [\n' + body + "\n]}\n"

    def save(self, path: str | os.PathLike) -> None:
        """Writes the JSON file (one word per line, UTF-8), atomically (a temporary file, then a rename)."""
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(self.file_text())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike, *, max_bytes: int = VOCAB_MAX_BYTES) -> WordVocab:
        """The vocabulary in a JSON file save() wrote; DataError naming the file for anything else."""
        source = os.fspath(path)
        max_bytes = count(max_bytes, "WordVocab.load max_bytes", fix="give a number of bytes")
        try:
            with open(source, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                raw, over = (b"", True) if size > max_bytes else read_capped(f, max_bytes)
        except OSError as e:
            raise DataError(f"{source}: cannot read the vocabulary: {e.strerror or e}", source) from e
        if over:  # a special file (a pipe, /dev/zero) has no size to check first: its reading is capped
            raise DataLimitError(
                f"{source}: a vocabulary file of {size_text(max(size, max_bytes + 1))} or more is beyond the limit "
                f"of {max_bytes:,} (max_bytes=)",
                source,
                limit=max_bytes,
                needed=max(size, max_bytes + 1),
            )
        return cls.from_bytes(raw, source=source)

    @classmethod
    def from_bytes(cls, raw: bytes, *, source: str = "<vocabulary>") -> WordVocab:
        """The vocabulary of a file's bytes (its UTF-8 JSON text, nested no deeper than a vocabulary is)."""
        try:
            doc = bounded_json(
                raw,
                f"{source}: not a vocabulary file: its text",
                max_depth=VOCAB_MAX_DEPTH,
                max_bytes=len(raw),
            )
        except ConfigError as e:
            raise DataError(str(e), source) from None
        return cls.from_json(doc, source=source)

    @classmethod
    def from_json(cls, doc, *, source: str = "<vocabulary>") -> WordVocab:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise DataError(f'{source}: not a vocabulary file (no "format": "{FORMAT}")', source)
        if type(doc.get("version")) is not int or doc["version"] != VERSION:  # not true, nor 1.0
            raise DataError(
                f"{source}: vocabulary version {doc.get('version')!r}; this reader knows version {VERSION}",
                source,
            )
        if doc.get("tokenizer") != TOKENIZER or doc.get("specials") != list(SPECIALS):
            raise DataError(
                f"{source}: the vocabulary was made for tokenizer {doc.get('tokenizer')!r} with specials "
                f"{doc.get('specials')!r}; this reader's are {TOKENIZER!r} and {list(SPECIALS)}",
                source,
            )
        if not isinstance(doc.get("words"), list):
            raise DataError(f'{source}: "words" must be a list of words', source)
        return cls(doc["words"], source=source)

    # -- lookup ---------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, word: object) -> bool:
        return isinstance(word, str) and word in self._ids and self._ids[word] >= len(SPECIALS)

    def __repr__(self) -> str:
        return f"WordVocab({self.source!r}, {len(self)} tokens)"

    def id(self, word: str) -> int:
        """The id of a token (a word or a special), <unk>'s for a word the vocabulary lacks."""
        return self._ids.get(word, UNK)

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> np.ndarray:
        """text -> int64 ids of its words (<unk> for the unknown ones), <bos> first and <eos> last if asked."""
        ids = [self._ids.get(w, UNK) for w in words(text)]
        return np.asarray(([BOS] if bos else []) + ids + ([EOS] if eos else []), dtype=np.int64)

    def decode(self, ids, *, specials: bool = False) -> str:
        """ids -> the words, joined by spaces; the specials are left out unless `specials` (then <unk> and the
        others appear as written). An id out of the vocabulary is a DataError."""
        a = np.asarray(ids)
        if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
            raise DataError(
                f"{self.source}: decode takes a 1-D sequence of integer ids, got {a.dtype} {a.shape}"
            )
        bad = a[(a < 0) | (a >= len(self.tokens))]
        if bad.size:
            raise DataError(
                f"{self.source}: id {int(bad[0])} is out of the vocabulary's range 0..{len(self.tokens) - 1}"
            )
        return " ".join(self.tokens[i] for i in a.tolist() if specials or i >= len(SPECIALS))

    # -- suggestions ----------------------------------------------------------------------------------------------
    def context(self, text: str, length: int) -> tuple[np.ndarray, int]:
        """What a causal model of `length` positions reads to suggest the word after `text` (the sentence typed
        so far): (int64 [length] ids: <bos>, the words, right-padded with <pad>; the position whose output
        predicts the next word). A context longer than `length` keeps its last `length` tokens."""
        length = _length(length)
        ids = self.encode(text, bos=True)[-length:]
        out = np.full(length, PAD, np.int64)
        out[: ids.size] = ids
        return out, int(ids.size - 1)

    def top_words(self, scores, k: int = 3) -> list[str]:
        """The k words with the highest scores (logits or probabilities over the vocabulary, [len(self)]), the
        specials left out: a keyboard's suggestions, best first."""
        s = np.asarray(scores, dtype=np.float64)
        if s.shape != (len(self.tokens),):
            raise DataError(
                f"{self.source}: scores of shape {s.shape}; the vocabulary has {len(self.tokens)}"
            )
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ConfigError(f"k must be a positive integer, got {k!r}")
        words_only = s[len(SPECIALS) :]
        k = min(int(k), words_only.size)
        best = np.argpartition(-words_only, k - 1)[:k]
        best = best[np.lexsort((best, -words_only[best]))]
        return [self.tokens[len(SPECIALS) + int(i)] for i in best]


def _length(length) -> int:
    if isinstance(length, bool) or not isinstance(length, numbers.Integral) or length < 2:
        raise ConfigError(
            f"the window length must be an integer >= 2 (a token and the one after), got {length!r}"
        )
    return int(length)


class TokenWindowView(ArrayDataView):
    """Fixed-length windows of token ids for next-token training: sample i is (x, y), both int64 [length]: x the
    ids, y the labels that edgetrain's NextTokenLoss takes (the same ids; position t learns token t + 1), with
    `ignore_index` where x is padding and where the token is in `ignore_targets` (<unk>, say), so they count for
    nothing.

    Each sequence (a sentence's ids, <bos> ... <eos>) starts a window of its own, right-padded with `pad_id`: a
    causal model reads a sentence from its start, as a keyboard does. A sequence longer than `length` goes on in the
    next window, which starts again with the previous window's last token, so every token but a sequence's first is
    a target exactly once. pack=True instead concatenates the sequences into one stream cut the same way (no
    padding but at the end: denser batches, a model that reads across sentence boundaries). Sequences of fewer
    than 2 tokens have nothing to learn and are skipped (`skipped` counts them). `window_sequence[i]`: the sequence
    window i comes from."""

    def __init__(
        self,
        sequences: Sequence,
        length: int,
        *,
        pad_id: int = PAD,
        ignore_index: int = IGNORE_INDEX,
        ignore_targets: Iterable[int] = (),
        pack: bool = False,
        source: str = "<token windows>",
    ):
        length = _length(length)
        seqs = [_sequence(s, k, source) for k, s in enumerate(sequences)]
        kept = [k for k, s in enumerate(seqs) if s.size >= 2]
        self.skipped = len(seqs) - len(kept)
        if pack:
            stream = np.concatenate([seqs[k] for k in kept]) if kept else np.zeros(0, np.int64)
            pieces, owner = _cut(stream, length), None
        else:
            cuts = [_cut(seqs[k], length) for k in kept]
            pieces = [p for c in cuts for p in c]
            owner = np.repeat(np.asarray(kept, np.int64), [len(c) for c in cuts])
        if not pieces:
            raise DataError(f"{source}: no sequence of 2 tokens or more to make windows of", source)
        x = np.full((len(pieces), length), pad_id, np.int64)
        for i, p in enumerate(pieces):
            x[i, : p.size] = p
        y = x.copy()
        y[np.arange(length)[None, :] >= np.asarray([p.size for p in pieces])[:, None]] = ignore_index
        ignored = np.asarray(sorted({int(t) for t in ignore_targets}), np.int64)
        if ignored.size:
            y[np.isin(x, ignored) & (y != ignore_index)] = ignore_index
        super().__init__(x, y, source=source)
        self.length, self.pad_id, self.ignore_index = length, int(pad_id), int(ignore_index)
        self.window_sequence = owner if owner is not None else np.full(len(pieces), -1, np.int64)

    @classmethod
    def from_texts(
        cls,
        vocab: WordVocab,
        texts: Iterable[str],
        length: int,
        *,
        bos: bool = True,
        eos: bool = True,
        **kwargs,
    ) -> TokenWindowView:
        """Windows of texts (sentences) encoded by `vocab`, each <bos> ... <eos> unless told otherwise; a text
        without a word is skipped."""
        kwargs.setdefault("pad_id", vocab.pad_id)
        kwargs.setdefault("source", f"<{vocab.source} windows>")
        empty = np.zeros(0, np.int64)  # a text without a word has nothing to learn: skipped
        seqs = [vocab.encode(t, bos=bos, eos=eos) if words(t) else empty for t in texts]
        return cls(seqs, length, **kwargs)

    def targets(self) -> int:
        """How many tokens are learned (labels past each window's first position that are not ignored)."""
        return int(np.count_nonzero(self.y[:, 1:] != self.ignore_index))


def _sequence(s, k: int, source: str) -> np.ndarray:
    a = np.asarray(s)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise DataError(
            f"{source}: sequence {k} is not a 1-D sequence of integer ids ({a.dtype} {a.shape})", source
        )
    if a.size and a.min() < 0:
        raise DataError(f"{source}: sequence {k} holds a negative id ({int(a.min())})", source)
    return a.astype(np.int64, copy=False)


def _cut(seq: np.ndarray, length: int) -> list[np.ndarray]:
    """seq in windows of `length` tokens, each after the first starting with the last token of the one before."""
    if seq.size < 2:
        return []
    return [seq[a : a + length] for a in range(0, seq.size - 1, length - 1)]


__all__ = [
    "IGNORE_INDEX",
    "SENTENCES_MAX_BYTES",
    "SENTENCES_MAX_COUNT",
    "SENTENCE_MAX_CHARS",
    "SPECIALS",
    "VOCAB_MAX_BYTES",
    "TokenWindowView",
    "WordVocab",
    "read_sentences",
    "sentences",
    "words",
]
