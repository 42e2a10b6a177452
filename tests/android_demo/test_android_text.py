"""The app's text mode (android_demo/text.py): a keyboard home on the embedded LoRA language model and a real
SQLite store. The new user's sentences go in as token windows; a burst raises held-out next-word top-1 and is kept
as a version of adapters alone; a wrecking burst is rolled back bit for bit; a kill mid-burst leaves the store and
the version whole; the suggest API answers three words and refuses malformed requests; the command line; the page in
a real headless Chromium (slow); and the device side with numpy alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from device import PYTHONS, run_on_device
from interrupts import Lines
from test_android_page import Running, call, driver, js, wait  # noqa: F401  (driver: the browser fixture)

from android_demo.text import TextHome, heldout_figures, open_home
from loaders.text import WordVocab

ROOT = Path(__file__).resolve().parents[2]
KEYBOARD = ROOT / "edgetrain" / "data" / "keyboard"
TRAIN = (KEYBOARD / "user_train.txt").read_text(encoding="utf-8").splitlines()
HELD = (KEYBOARD / "user_heldout.txt").read_text(encoding="utf-8").splitlines()


def text_home(tmp_path, n: int, **settings) -> TextHome:
    home = TextHome.init(tmp_path / "home", max_seconds=None, **settings)
    home.add_sentences(TRAIN[:n])
    return home


def adapters(home: TextHome) -> dict[str, np.ndarray]:
    return home.session().parameters()


def test_sentences_are_stored_as_token_windows_with_next_token_labels(tmp_path):
    home = text_home(tmp_path, 0)
    ids = home.add_text("You will be married within a year. Go!")
    assert len(ids) == 2 and home.sample_count() == 2
    vocab = WordVocab.load(tmp_path / "home" / "vocab.json")
    with home.store() as s:
        x, y = s.get(ids[0])
    want = vocab.encode("You will be married within a year.", bos=True, eos=True)
    assert x.dtype == y.dtype == np.int64 and x.shape == y.shape == (32,)
    np.testing.assert_array_equal(x[: want.size], want)
    assert not x[want.size :].any() and (y[want.size :] == -100).all()
    np.testing.assert_array_equal(y[: want.size], np.where(want == vocab.unk_id, -100, want))
    assert isinstance(open_home(tmp_path / "home"), TextHome)
    with pytest.raises(Exception, match="no word"):
        home.add_text("?!")
    with pytest.raises(Exception, match="sentences"):
        home.add(x, y)


def test_a_burst_on_the_users_sentences_is_kept_and_helps(tmp_path):
    home = text_home(tmp_path, 300, max_steps=30)
    before = heldout_figures(home, HELD)
    r = home.personalize(force=True)
    assert r.kept and r.steps == 30 and home.version == 1, r.reason
    assert r.val_accuracy_after > r.val_accuracy_before
    after = heldout_figures(home, HELD)  # 188 sentences the app never saw
    assert after["top1"] > before["top1"] + 0.05 and after["perplexity"] < before["perplexity"] / 2, (
        before,
        after,
    )
    cur = json.loads((tmp_path / "home" / "current.json").read_text())
    assert cur["checkpoint"].endswith(".etad")
    size = os.path.getsize(tmp_path / "home" / cur["checkpoint"])
    assert size < 64 * 1024 and home.status()["version_bytes"] == size  # the adapters, not the 2 MB model
    assert home.suggest("you will") == TextHome(tmp_path / "home").suggest("you will")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the wrecking burst's overflows, which it is about
def test_a_burst_that_hurts_is_rolled_back(tmp_path):
    home = text_home(tmp_path, 60, max_steps=6)
    before = adapters(home)
    r = home.personalize(force=True, lr=50.0)
    assert not r.kept and home.version == 0 and "rolled back" in r.reason, r
    assert os.listdir(tmp_path / "home" / "versions") == []
    for name, value in adapters(TextHome(tmp_path / "home")).items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


KILLER = """
import sys
from android_demo.text import open_home
home = open_home(sys.argv[1])
def progress(info):
    print("step", info["step"], flush=True)
home.personalize(force=True, max_steps=100000, max_seconds=None, progress=progress)
"""


def test_a_kill_mid_burst_leaves_the_store_and_the_version_whole(tmp_path):
    home = text_home(tmp_path, 60, max_steps=4)
    assert home.personalize(force=True).kept
    before, samples = adapters(home), home.sample_count()
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLER, str(tmp_path / "home")], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        Lines(proc.stdout).wait_for(lambda line: line.split()[-1] == "3", "step 3")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    again = TextHome(tmp_path / "home")
    assert again.version == 1 and again.sample_count() == samples
    for name, value in adapters(again).items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    with again.store() as s:  # every sample reads back whole (crc checked)
        x, y = s.snapshot().get_batch(np.arange(samples))
    assert x.shape == (samples, 32)
    assert again.personalize(force=True).steps == 4


@pytest.mark.slow
def test_kills_at_random_instants_never_break_a_text_home(tmp_path):
    """Kills anywhere in bursts, the keep included (adapters written, then the pointer): the current version's
    adapters always load, the version only moves forward, and the store keeps every sentence."""
    text_home(tmp_path, 40, max_steps=2)
    rng = np.random.default_rng(1)
    script = (
        "import sys\nfrom android_demo.text import open_home\nh = open_home(sys.argv[1])\n"
        "while True:\n    h.personalize(force=True)\n"
    )
    for _ in range(6):
        v0 = TextHome(tmp_path / "home").version
        proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "home")], cwd=ROOT)
        time.sleep(2.0 + rng.uniform(0, 3.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        h = TextHome(tmp_path / "home")
        assert h.version >= v0 and h.sample_count() == 40
        h.session()  # loads: the current adapters are whole
        assert h.personalize(force=True).steps == 2
    versions = os.listdir(tmp_path / "home" / "versions")
    assert all(f.endswith(".etad") for f in versions), versions  # a killed write's temporary file was removed


def test_the_suggest_api_and_bad_requests(tmp_path):
    home = text_home(tmp_path, 3)
    with Running(home) as srv:
        url = srv.url
        status, st = call(url + "api/status")
        assert status == 200 and st["mode"] == "text" and st["samples"] == 3
        status, s = call(url + "api/suggest", {"text": "you will be"})
        assert status == 200 and len(s["words"]) == 3 and len(set(s["words"])) == 3 and s["version"] == 0
        assert s["words"] == home.suggest("you will be") and all(w in home.vocab for w in s["words"])
        assert call(url + "api/suggest", {"text": ""})[1]["words"] == home.suggest("")
        status, sent = call(url + "api/send", {"text": "A penny saved is a penny earned."})
        assert status == 200 and sent["samples"] == 4 == home.sample_count() and len(sent["ids"]) == 1
        bad = [
            ("api/suggest", {"text": 7}, "a JSON string"),
            ("api/suggest", {}, "a JSON string"),
            ("api/suggest", {"text": "a", "more": 1}, "more"),
            ("api/suggest", {"text": "a" * 2001}, "at most 2000"),
            ("api/send", {"text": "?!"}, "no word"),
            ("api/send", {"text": ["a"]}, "a JSON string"),
            ("api/suggest", [1], "JSON object"),
        ]
        for path, body, words in bad:
            status, answer = call(url + path, body)
            assert status == 400 and words in answer["error"] and "\n" not in answer["error"], (path, answer)
        assert call(url + "api/suggest", raw=b'{"text": "a')[0] == 400
        assert call(url + "api/suggest", raw=b'{"text": "' + b"a" * (2 << 20) + b'"}')[0] == 413
        assert call(url + "api/predict", {"pixels": [0]})[0] == 404  # a text home has no digits API
        with __import__("urllib.request").request.urlopen(url, timeout=10) as r:
            assert b'id="text"' in r.read()
    assert home.sample_count() == 4


def app(*args, home=None) -> subprocess.CompletedProcess:
    cmd = (
        [sys.executable, "-m", "android_demo"]
        + (["--home", str(home)] if home else [])
        + [str(a) for a in args]
    )
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_the_command_line(tmp_path):
    home = tmp_path / "kb"
    proc = app("init", "--text", home=home)
    assert proc.returncode == 0 and "text mode" in proc.stdout, proc.stderr
    proc = app("add", "--sentences", KEYBOARD / "user_train.txt", home=home)
    assert proc.returncode == 0 and "added 300 sentences" in proc.stdout, proc.stderr
    words = app("suggest", "you will be", home=home).stdout.strip().split(" | ")
    assert len(words) == 3
    proc = app("evaluate", "--sentences", KEYBOARD / "user_heldout.txt", "--json", home=home)
    fig = json.loads(proc.stdout)
    assert fig["windows"] == 188 and 0 <= fig["top1"] <= 1 and fig["perplexity"] > 1
    proc = app("personalize", "--json", "--max-steps", 3, "--max-seconds", 60, home=home)
    assert proc.returncode == 0 and json.loads(proc.stdout)["steps"] == 3, proc.stderr
    assert app("init", home=tmp_path / "other").returncode == 2  # no --artifact and no --text
    assert app("add", "--data", KEYBOARD / "user_train.txt", home=home).returncode == 1


@pytest.mark.slow
def test_the_text_page_in_a_real_browser(driver, tmp_path):  # noqa: F811
    d = driver
    home = text_home(tmp_path, 60, max_steps=8)
    with Running(home) as srv:
        d.get(srv.url)
        wait(d, "document.getElementById('samples').dataset.count === '60'")
        box = d.find_element("id", "text")

        def shows(words: list[str]) -> None:
            """The last suggestions answered are these, and the page shows them."""
            want = json.dumps(json.dumps(words, separators=(",", ":")))
            wait(d, f"JSON.stringify(window.edgetrain.suggestions) === {want}")
            buttons = d.find_elements("css selector", "#suggestions button")
            assert [b.text for b in buttons] == words

        box.send_keys("you wi")
        shows(home.suggest("you"))  # the word being typed is not yet part of the context
        box.send_keys("ll ")
        shows(home.suggest("you will"))
        word = home.suggest("you will")[0]
        d.find_element("id", "suggestion-0").click()
        assert box.get_attribute("value") == f"you will {word} "
        shows(home.suggest(f"you will {word}"))
        box.send_keys("in the morning")
        box.send_keys("\n")  # Enter sends the sentence, then a burst runs
        wait(d, "document.getElementById('samples').dataset.count === '61'")
        wait(d, "['true', 'false'].includes(document.getElementById('result').dataset.kept)", timeout=120)
        burst = home.events("burst")[-1]
        result = d.find_element("id", "result")
        assert result.get_attribute("data-kept") == str(burst["kept"]).lower() and burst["steps"] == 8
        assert "next-word top-1 on held-out sentences" in result.text
        verdict = f"Kept as version {burst['model_version']}" if burst["kept"] else "Rolled back, version"
        assert result.text.startswith(verdict), result.text
        with home.store() as s:
            x, _ = s.get(max(s.ids()))
        assert home.vocab.decode(x) == f"you will {word} in the morning"
        d.find_element("id", "send").click()  # an empty box sends nothing
        assert home.sample_count() == 61
        errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors


DEVICE = """
import sys, tempfile, os
import numpy as np
import android_demo.text, android_demo.server, android_demo.__main__
from android_demo.text import TextHome, heldout_figures
home = TextHome.init(os.path.join(tempfile.mkdtemp(), "kb"), max_seconds=None, max_steps=2)
lines = open(sys.argv[1], encoding="utf-8").read().splitlines()
home.add_sentences(lines[:20])
words = home.suggest("you will be")
r = home.personalize(force=True)
assert len(words) == 3 and r.steps == 2, (words, r)
print("text mode numpy-only OK", np.__version__, words, heldout_figures(home, lines[20:40])["top1"])
"""


@pytest.mark.parametrize("python", PYTHONS)
def test_the_text_mode_runs_with_numpy_alone(python):
    proc = run_on_device(python, DEVICE, str(KEYBOARD / "user_train.txt"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "text mode numpy-only OK" in proc.stdout
