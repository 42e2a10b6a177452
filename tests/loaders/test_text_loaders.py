"""loaders/text.py: the word tokenizer, WordVocab (encode/decode round trip, unknown words, the JSON file and the
files it refuses), sentences, and TokenWindowView's windows for next-token training (shapes, padding labels,
continuations, packing, what it refuses), against hand-written expectations; the shipped keyboard vocabulary loads;
the module runs with numpy alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from device import PYTHONS, run_on_device

from loaders import ConfigError, DataError, DataLimitError, DataLoader, SampleIndexError
from loaders.text import IGNORE_INDEX, SPECIALS, TokenWindowView, WordVocab, sentences, words

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "edgetrain" / "data" / "keyboard" / "vocab.json"
TEXTS = ["You will be married within a year.", "You will go far.", "A year is long; go!"]


def _vocab() -> WordVocab:
    return WordVocab.build(TEXTS)


def test_words_are_lowercase_runs_of_letters_and_digits_with_inner_apostrophes():
    assert words("Don\u2019t PANIC -- it's 42, naïve `friend'!") == [
        "don't",
        "panic",
        "it's",
        "42",
        "naive",
        "friend",
    ]
    assert words("LORD'S e-mail") == ["lord's", "e", "mail"]
    assert words("  ...  ") == []
    with pytest.raises(ConfigError, match="str"):
        words(b"bytes")


def test_sentences_split_at_end_marks_and_keep_closing_quotes():
    text = 'A day for firm decisions!!!!!  Or is it?\n"Yes." (Maybe so.) Then   go  ...'
    assert sentences(text) == [
        "A day for firm decisions!!!!!",
        "Or is it?",
        '"Yes."',
        "(Maybe so.)",
        "Then go ...",
    ]
    assert sentences("?! ...") == []


def test_build_ranks_by_frequency_then_alphabetically():
    v = _vocab()
    assert v.tokens[:4] == SPECIALS
    assert v.tokens[4:9] == ("a", "go", "will", "year", "you")  # 2 each, alphabetically; then the 1s
    assert len(v) == 4 + 11 and "married" in v and "<unk>" not in v and "zebra" not in v
    assert WordVocab.build(TEXTS, min_count=2).tokens[4:] == ("a", "go", "will", "year", "you")
    assert WordVocab.build(TEXTS, size=2).tokens[4:] == ("a", "go")
    with pytest.raises(ConfigError, match="size"):
        WordVocab.build(TEXTS, size=0)


def test_encode_decode_round_trip_and_unknown_words():
    v = _vocab()
    ids = v.encode("You will be married within a year.", bos=True, eos=True)
    assert ids.dtype == np.int64 and ids[0] == v.bos_id and ids[-1] == v.eos_id
    assert v.decode(ids) == "you will be married within a year"
    for t in TEXTS:  # every word known: decode(encode(t)) is t's words
        assert v.decode(v.encode(t)) == " ".join(words(t))
    unknown = v.encode("You will meet a zebra")
    assert unknown.tolist() == [v.id("you"), v.id("will"), v.id("meet"), v.id("a"), v.unk_id]
    assert v.id("meet") == v.unk_id == 1
    assert v.decode(unknown) == "you will a"
    assert v.decode(unknown, specials=True) == "you will <unk> a <unk>"
    assert v.encode("").shape == (0,) and v.decode([]) == ""
    with pytest.raises(DataError, match="out of the vocabulary"):
        v.decode([4, len(v)])
    with pytest.raises(DataError, match="1-D"):
        v.decode([[4]])


def test_the_file_round_trips_and_bad_files_are_data_errors(tmp_path):
    v = _vocab()
    path = tmp_path / "vocab.json"
    v.save(path)
    again = WordVocab.load(path)
    assert again.tokens == v.tokens and again.source == str(path)
    doc = json.loads(path.read_text())
    bad = {
        "not-json.json": "{words",
        "other.json": json.dumps({**doc, "format": "something"}),
        "newer.json": json.dumps({**doc, "version": 2}),
        "tokenizer.json": json.dumps({**doc, "tokenizer": "bpe"}),
        "upper.json": json.dumps({**doc, "words": ["You"]}),
        "dup.json": json.dumps({**doc, "words": ["go", "go"]}),
        "empty.json": json.dumps({**doc, "words": []}),
        "list.json": json.dumps({**doc, "words": "go"}),
    }
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(DataError) as e:
            WordVocab.load(tmp_path / name)
        assert name in str(e.value), name
    with pytest.raises(DataError, match="cannot read"):
        WordVocab.load(tmp_path / "missing.json")
    with pytest.raises(DataLimitError):
        WordVocab.load(path, max_bytes=10)


def test_context_and_suggestions():
    v = _vocab()
    ids, at = v.context("You will", 6)
    assert ids.tolist() == [v.bos_id, v.id("you"), v.id("will"), 0, 0, 0] and at == 2
    ids, at = v.context("you will go far a year", 4)  # the last 4 tokens
    assert v.decode(ids) == "go far a year" and at == 3
    scores = np.zeros(len(v))
    scores[[v.unk_id, v.id("go"), v.id("year"), v.id("far")]] = [9, 3, 2, 2]
    assert v.top_words(scores, 3) == ["go", "year", "far"]  # no special; ties by id
    with pytest.raises(DataError, match="shape"):
        v.top_words(scores[:-1])


def test_windows_pad_label_and_continue_long_sentences():
    v = _vocab()
    view = TokenWindowView.from_texts(v, ["You will be married within a year", "go", "?"], 4)
    assert view.skipped == 1  # "?" has no word
    seq = v.encode(
        "You will be married within a year", bos=True, eos=True
    )  # 9 tokens: windows 0..3, 3..6, 6..8
    assert view.size() == 4 and view.length == 4
    x, y = view.get_batch(np.arange(4))
    assert x.dtype == y.dtype == np.int64 and x.shape == y.shape == (4, 4)
    assert x[0].tolist() == seq[0:4].tolist() and x[1].tolist() == seq[3:7].tolist()
    assert x[2].tolist() == [*seq[6:9].tolist(), v.pad_id] and y[2].tolist() == [
        *seq[6:9].tolist(),
        IGNORE_INDEX,
    ]
    assert x[3].tolist() == [v.bos_id, v.id("go"), v.eos_id, 0]
    assert view.window_sequence.tolist() == [0, 0, 0, 1]
    # every token but a sentence's first is a target once: 8 of the first sentence's 9, 2 of the second's 3
    assert view.targets() == 8 + 2
    xi, yi = view[-1]
    assert xi.shape == (4,) and np.array_equal(xi, x[3])
    with pytest.raises(SampleIndexError):
        view[5]


def test_ignored_targets_and_packing():
    v = _vocab()
    view = TokenWindowView.from_texts(v, ["you meet a zebra"], 8, ignore_targets=[v.unk_id])
    x, y = view[0]
    assert x.tolist()[:6] == [2, v.id("you"), 1, v.id("a"), 1, 3]
    assert y.tolist() == [
        2,
        v.id("you"),
        IGNORE_INDEX,
        v.id("a"),
        IGNORE_INDEX,
        3,
        IGNORE_INDEX,
        IGNORE_INDEX,
    ]
    packed = TokenWindowView.from_texts(v, TEXTS, 5, pack=True)
    stream = np.concatenate([v.encode(t, bos=True, eos=True) for t in TEXTS])  # 22 tokens
    assert packed.size() == 6 and packed.x[0].tolist() == stream[:5].tolist()
    assert packed.x[1, 0] == stream[4] and packed.targets() == stream.size - 1
    assert (packed.window_sequence == -1).all()
    loader = DataLoader(packed, 2, shuffle=True, seed=0)
    xb, yb = loader.next()
    assert xb.shape == yb.shape == (2, 5) and xb.dtype == np.int64


def test_windows_refuse_what_cannot_be_trained_on():
    with pytest.raises(ConfigError, match="length"):
        TokenWindowView([[1, 2]], 1)
    with pytest.raises(DataError, match="no sequence of 2 tokens"):
        TokenWindowView([[1], []], 4)
    with pytest.raises(DataError, match="sequence 1 .*integer"):
        TokenWindowView([[1, 2], [0.5, 1.0]], 4)
    with pytest.raises(DataError, match="negative"):
        TokenWindowView([[1, -2]], 4)


def test_the_shipped_keyboard_vocabulary():
    if not SHIPPED.exists():
        pytest.skip("edgetrain/data/keyboard/vocab.json is built by tools/build_keyboard.py")
    v = WordVocab.load(SHIPPED)
    assert 2000 <= len(v) <= 5000 and v.tokens[:4] == SPECIALS
    assert {"the", "and", "lord", "you", "will"} <= set(v.tokens)
    ids = v.encode("And God said, let there be light.", bos=True, eos=True)
    assert v.decode(ids) == "and god said let there be light" and v.unk_id not in ids


SCRIPT = """
    import numpy as np
    from loaders.text import TokenWindowView, WordVocab
    v = WordVocab.load("edgetrain/data/keyboard/vocab.json")
    view = TokenWindowView.from_texts(v, ["You will be married within a year."], 32)
    x, y = view[0]
    assert x.dtype == np.int64 and x.shape == (32,) and y[-1] == -100
    print("text numpy-only OK", v.decode(x), np.__version__)
"""


@pytest.mark.parametrize("python", PYTHONS)
def test_the_text_loaders_run_with_numpy_alone(python):
    if not SHIPPED.exists():
        pytest.skip("edgetrain/data/keyboard/vocab.json is built by tools/build_keyboard.py")
    proc = run_on_device(python, SCRIPT, blocked=("edgetrain", "onnx", "onnxruntime", "torch"), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "text numpy-only OK you will be married within a year" in proc.stdout
