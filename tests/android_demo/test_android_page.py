"""The app's page (android_demo/server.py + static/) in a real headless browser: Debian's Chromium driven by
Selenium draws digits on the canvas with touch and mouse pointer actions; the 28x28 image the page sends is
compared with a numpy rendering of the same strokes put through MNIST's recipe; the prediction shown is the
model's; a label button adds the drawing to the store; personalize runs a burst whose progress and verdict the page
shows; the chart's points are Home.accuracy_by_version(). A screenshot goes to docs/android_demo_page.png.

Also, without a browser: the JSON API's answers to bad requests, one burst at a time (409), progress while a burst
runs, and `serve` (the command and the function) printing its address and stopping on Ctrl-C.

The browser: chromium and chromedriver on PATH or in /usr/bin (Debian's chromium and chromium-driver), or the ones
EDGETRAIN_CHROMIUM and EDGETRAIN_CHROMEDRIVER name. When they are missing and the test runs as root where apt-get
is, it installs them (EDGETRAIN_NO_APT=1 stops that); without a browser the browser test is skipped, saying why.
Selenium comes with the dev extra.
"""

from __future__ import annotations

import _thread
import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from interrupts import Lines, finish, python_m

from android_demo.app import Home
from android_demo.server import make_server, serve
from android_demo.simulate import ARTIFACT, _new_user

ROOT = Path(__file__).resolve().parents[2]
# The page as a person sees it, kept in docs/ (rewritten only on request: its text carries timings, so every run
# would change the file): EDGETRAIN_UPDATE_DOCS=1 bash tools/test.sh -k real_browser
DOCS_SCREENSHOT = ROOT / "docs" / "android_demo_page.png"
USER, _ = _new_user()
SIZE, PEN, INK, N, BOX = 280, 24, 0.1, 28, 20  # as in static/app.js

# ---- a numpy rendering of strokes, and MNIST's recipe, written independently of the page -------------------------


def render(strokes: list[np.ndarray]) -> np.ndarray:
    """White strokes of width PEN with round caps and joins on black, SIZE x SIZE, coverage antialiased."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE] + 0.5
    dist = np.full((SIZE, SIZE), np.inf)
    for s in strokes:
        segments = zip(s[:-1], s[1:]) if len(s) > 1 else [(s[0], s[0])]
        for a, b in segments:
            d = b - a
            t = ((xx - a[0]) * d[0] + (yy - a[1]) * d[1]) / max(float(d @ d), 1e-12)
            t = np.clip(t, 0, 1)
            dist = np.minimum(dist, np.hypot(xx - a[0] - t * d[0], yy - a[1] - t * d[1]))
    return np.clip(PEN / 2 + 0.5 - dist, 0, 1)


def area_matrix(src: int, dst: int) -> np.ndarray:
    """[dst, src]: averaging src pixels into dst, each source pixel weighted by its overlap."""
    edges = np.arange(dst + 1) * src / dst
    m = np.zeros((dst, src))
    for i in range(dst):
        for j in range(src):
            m[i, j] = max(0.0, min(edges[i + 1], j + 1) - max(edges[i], j))
    return m / (src / dst)


def mnist_like(canvas: np.ndarray, *, crop: bool = True) -> np.ndarray:
    """Crop to the ink's bounding box, fit it into 20x20 keeping the aspect, centre of mass to the middle of 28x28
    (crop=False: the whole canvas squeezed into 28x28, the mistake the comparison must catch)."""
    if not crop:
        return area_matrix(SIZE, N) @ canvas @ area_matrix(SIZE, N).T
    rows, cols = np.nonzero(canvas > INK)
    box = canvas[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
    h, w = box.shape
    th, tw = (max(1, round(v * BOX / max(h, w))) for v in (h, w))
    small = area_matrix(h, th) @ box @ area_matrix(w, tw).T
    cy, cx = (
        (np.arange(th) + 0.5) @ small.sum(1) / small.sum(),
        (np.arange(tw) + 0.5) @ small.sum(0) / small.sum(),
    )
    oy, ox = (int(min(N - t, max(0, round(N / 2 - c)))) for t, c in ((th, cy), (tw, cx)))
    out = np.zeros((N, N))
    out[oy : oy + th, ox : ox + tw] = np.clip(small, 0, 1)
    return out


def test_mnist_like_rendering_looks_like_the_users_digits():
    """The reference itself: a drawn 7 comes out framed as MNIST frames digits (a 20-pixel box, its centre of mass
    in the middle, strokes two or three pixels wide)."""
    seven = mnist_like(render([np.array([[70.0, 50], [210, 50], [120, 240]])]))
    rows, cols = np.nonzero(seven > INK)
    assert rows.max() - rows.min() + 1 == 20 and cols.max() - cols.min() + 1 < 20  # taller than wide
    assert abs(np.average(np.arange(N), weights=seven.sum(1)) + 0.5 - 14) <= 0.6
    assert abs(np.average(np.arange(N), weights=seven.sum(0)) + 0.5 - 14) <= 0.6
    assert 0.9 <= seven.max() <= 1.0 and 2 <= (seven[12] > 0.5).sum() <= 3


# ---- a home and a server ---------------------------------------------------------------------------------------


def new_home(folder, n: int) -> Home:
    home = Home.init(os.path.join(folder, "home"), ARTIFACT)
    for i in range(n):
        home.add(*USER.get_item(i))
    return home


class Running:
    """make_server + serve_forever in a thread, shut down on exit."""

    def __init__(self, home: Home):
        self.server = make_server(home, port=0)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self):
        self.thread.start()
        return self.server

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.server.burst.join(30)
        self.thread.join(10)


def call(url: str, body=None, *, raw: bytes | None = None, ctype: str = "application/json", method=None):
    """(status, JSON answer) of one request."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": ctype} if data else {}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        text = e.read()
        return e.code, json.loads(text)


# ---- the API without a browser --------------------------------------------------------------------------------


def test_api_refuses_bad_requests_with_one_line_of_json(tmp_path):
    home = new_home(tmp_path, 3)
    with Running(home) as srv:
        url = srv.url
        status, st = call(url + "api/status")
        assert (
            status == 200 and st["samples"] == 3 and st["input_shape"] == [1, 28, 28] and st["classes"] == 10
        )
        zero = np.zeros((28, 28)).tolist()
        status, p = call(url + "api/predict", {"pixels": [zero]})
        assert status == 200 and len(p["probabilities"]) == 10 and p["version"] == 0
        assert p["prediction"] == int(np.argmax(home.predict(np.zeros((1, 1, 28, 28), np.float32))[0]))
        assert call(url + "api/predict", {"pixels": zero})[0] == 200  # the channel axis may be left out
        bad = [
            ("api/predict", {"pixels": [[0.5] * 27] * 28}, "shape [28, 27]"),
            (
                "api/predict",
                {"pixels": [[300.0] * 28] * 28},
                "in [0, 255]",
            ),  # the pipeline takes 8-bit pixels
            ("api/predict", {"pixels": [[0.5] * 28] * 27 + [[0.5]]}, "nested lists of numbers"),
            ("api/predict", {"pixels": "a drawing"}, "nested lists of numbers"),
            ("api/predict", {"pixels": 0.5}, "shape []"),
            ("api/predict", {}, 'no "pixels"'),
            ("api/predict", [1, 2], "JSON object"),
            ("api/add", {"pixels": zero, "label": 10}, "from 0 to 9"),
            ("api/add", {"pixels": zero, "label": "7"}, "class number"),
            ("api/add", {"pixels": zero, "label": True}, "class number"),
            ("api/personalize", {"force": "yes"}, "true or false"),
        ]
        for path, body, words in bad:
            status, answer = call(url + path, body)
            assert status == 400 and words in answer["error"] and "\n" not in answer["error"], (path, answer)
        status, answer = call(url + "api/predict", raw=b"{not json")
        assert status == 400 and "not JSON" in answer["error"]
        status, answer = call(
            url + "api/add", raw=b"pixels=1&label=2", ctype="application/x-www-form-urlencoded"
        )
        assert status == 400 and "Content-Type: application/json" in answer["error"]
        assert call(url + "api/nothing")[0] == 404
        assert call(url + "api/status", {}, method="DELETE")[0] == 501
        req = urllib.request.Request(url + "api/status", headers={"Host": "attacker.example:80"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 403  # DNS rebinding: a page of another site that resolves to 127.0.0.1
        # the page and its two files, and nothing else of the disk
        for page, kind in (("", "text/html"), ("app.js", "text/javascript"), ("style.css", "text/css")):
            with urllib.request.urlopen(url + page, timeout=10) as r:
                assert r.headers["Content-Type"].startswith(kind) and r.read()
        assert call(url + "../android_demo/server.py")[0] == 404
        status, added = call(url + "api/add", {"pixels": [zero], "label": 4})
        assert status == 200 and added["samples"] == 4 == home.status()["samples"]
        with home.store() as s:
            x, y = s.get(added["id"])
        assert x.shape == (1, 28, 28) and not x.any() and int(y) == 4
    with pytest.raises(Exception, match="phone itself"):
        make_server(home, host="0.0.0.0")


def test_one_burst_at_a_time_with_progress(tmp_path):
    home = new_home(tmp_path, 20)
    gate, first_step = threading.Event(), threading.Event()
    real = home.personalize

    def held_personalize(**kw):  # the real burst, held after its first step until the test has looked
        outer = kw.pop("progress")

        def progress(p):
            outer(p)
            if p["step"] == 1:
                first_step.set()
                assert gate.wait(30)

        return real(**kw, progress=progress)

    home.personalize = held_personalize
    with Running(home) as srv:
        url = srv.url
        status, _ = call(url + "api/personalize", {})
        assert status == 202
        assert first_step.wait(30)
        status, p = call(url + "api/progress")
        assert p["running"] and p["step"] == 1 and p["of"] == 30 and p["loss"] > 0 and p["result"] is None
        status, answer = call(url + "api/personalize", {})
        assert status == 409 and "running" in answer["error"]
        status, _ = call(url + "api/predict", {"pixels": np.zeros((1, 28, 28)).tolist()})
        assert status == 200  # predictions go on during a burst
        gate.set()
        for _ in range(300):
            status, p = call(url + "api/progress")
            if not p["running"]:
                break
            time.sleep(0.05)
        burst = home.events("burst")[-1]
        assert p["result"]["kept"] == burst["kept"] and p["result"]["steps"] == burst["steps"] == p["step"]
        assert p["result"]["model_version"] == home.version and p["error"] is None
        status, h = call(url + "api/history")
        assert h == {"points": home.accuracy_by_version(), "version": home.version}
        assert call(url + "api/personalize", {})[0] == 202  # the next one may start


def test_serve_command_prints_the_address_and_stops_on_ctrl_c(tmp_path):
    home = new_home(tmp_path, 0)
    proc = subprocess.Popen(
        python_m("android_demo", "--home", home.path, "serve", "--port", "0"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = Lines(proc.stdout), Lines(proc.stderr)
    try:
        line = stdout.wait_for(lambda line: line.strip(), "the server's first line", timeout=60)
        assert line.startswith("open http://127.0.0.1:") and "phone's browser" in line, line
        url = line.split()[1]
        assert call(url + "api/status")[1]["samples"] == 0
        proc.send_signal(signal.SIGINT)
        finish(proc, 30, stdout, stderr)
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = stdout.text(10), stderr.text(10)
    assert proc.returncode == 0 and out.splitlines()[1:] == ["stopped"] and err == "", (out, err)


@pytest.fixture
def ctrl_c():
    """Python's Ctrl-C handler in this process during the test: pytest run under nohup or as a background job ignores
    SIGINT, and _thread.interrupt_main() then does nothing, so serve() would never return."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_serve_gives_the_port_to_ready_and_stops_on_ctrl_c(tmp_path, capsys, ctrl_c):
    home = new_home(tmp_path, 1)
    seen = {}

    def ready(port):
        def visit():
            try:
                seen["status"] = call(f"http://127.0.0.1:{port}/api/status")
            finally:
                _thread.interrupt_main()  # Ctrl-C

        seen["port"] = port
        threading.Thread(target=visit, daemon=True).start()

    serve(home, port=0, ready=ready)
    assert seen["port"] > 0 and seen["status"][0] == 200 and seen["status"][1]["samples"] == 1
    out = capsys.readouterr().out
    assert f"open http://127.0.0.1:{seen['port']}/ in the phone's browser" in out and out.endswith(
        "stopped\n"
    )


# ---- the page in a real browser --------------------------------------------------------------------------------

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"  # Debian's chromium, chromium-driver
APT = "apt-get install -y -q chromium chromium-driver"


def _browser() -> tuple[str, str]:
    """The browser and its driver (EDGETRAIN_CHROMIUM / EDGETRAIN_CHROMEDRIVER name others), installed with apt-get
    when missing and allowed; else pytest.skip saying how to get them."""
    chosen = os.environ.get("EDGETRAIN_CHROMIUM"), os.environ.get("EDGETRAIN_CHROMEDRIVER")
    found = (
        chosen[0] or shutil.which("chromium") or CHROMIUM,
        chosen[1] or shutil.which("chromedriver") or CHROMEDRIVER,
    )
    if all(os.access(p, os.X_OK) for p in found):
        return found
    missing = ", ".join(p for p in found if not os.access(p, os.X_OK))
    if (
        any(chosen)
        or os.environ.get("EDGETRAIN_NO_APT") == "1"
        or os.geteuid() != 0
        or not shutil.which("apt-get")
    ):
        pytest.skip(f"no browser: {missing} missing; install Debian's: sudo {APT}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    log = []
    for cmd in (APT, "apt-get update -q", APT):  # apt-get update only when the package lists are stale
        r = subprocess.run(cmd.split(), capture_output=True, text=True, env=env, timeout=900)
        log.append(f"{cmd}: exit {r.returncode} {r.stderr.strip()[-300:]}")
        if r.returncode == 0 and cmd == APT:
            break
    if not all(os.access(p, os.X_OK) for p in (CHROMIUM, CHROMEDRIVER)):
        pytest.skip("no browser: installing Chromium failed; " + " | ".join(log))
    return CHROMIUM, CHROMEDRIVER


@pytest.fixture(scope="module")
def driver():
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is missing: pip install -e '.[dev]'"
    )
    from selenium.common.exceptions import WebDriverException

    chromium, chromedriver = _browser()
    profile = tempfile.mkdtemp(prefix="android_page_chromium_")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    # headless, and quiet: this machine's network is closed and the page needs none of Chrome's services
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
    ):
        opts.add_argument(flag)
    # a phone: 412 CSS pixels wide, touch, twice as many device pixels
    opts.add_experimental_option(
        "mobileEmulation", {"deviceMetrics": {"width": 412, "height": 915, "pixelRatio": 2.0}}
    )
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console errors, read at the end
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not look for drivers on the network
    try:
        d = webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=chromedriver))
    except WebDriverException as e:
        shutil.rmtree(profile, ignore_errors=True)
        pytest.skip(f"no browser: Chromium would not start ({str(e).strip().splitlines()[0]})")
    d.set_script_timeout(30)
    try:
        yield d
    finally:
        d.quit()
        shutil.rmtree(profile, ignore_errors=True)


def js(d, expr: str):
    return d.execute_script(f"return {expr};")


def wait(d, what: str, timeout: float = 30):
    """Waits until the JavaScript expression is true; returns its value."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        v = js(d, what)
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"the page never got to: {what}")


# digits in canvas pixels (0..280), as a person would draw them: a 7 with a bar, and a 2
SEVEN = [
    [(62, 58), (110, 55), (160, 52), (212, 54), (190, 100), (165, 150), (145, 200), (130, 238)],
    [(105, 150), (150, 148), (198, 146)],
]
TWO = [
    [
        (80, 90),
        (95, 60),
        (130, 45),
        (170, 52),
        (195, 85),
        (188, 125),
        (160, 160),
        (120, 195),
        (85, 230),
        (130, 228),
        (170, 226),
        (210, 230),
    ]
]


def draw(d, canvas, strokes, *, finger: bool) -> list[np.ndarray]:
    """Draws the strokes with real pointer actions (a finger or the mouse); returns them in canvas pixels as the
    browser was asked to draw them (CSS pixels from the canvas's centre, rounded, mapped back)."""
    from selenium.webdriver.common.actions import interaction
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    from selenium.webdriver.common.actions.pointer_input import PointerInput

    # wholly in view: an action's offsets count from the centre of the element's visible part
    d.execute_script("arguments[0].scrollIntoView({block: 'center', inline: 'center'})", canvas)
    r = js(d, "document.getElementById('canvas').getBoundingClientRect().toJSON()")
    assert r["top"] >= 0 and r["bottom"] <= js(d, "window.innerHeight"), r
    scale = r["width"] / SIZE
    drawn = []
    for stroke in strokes:
        kind = interaction.POINTER_TOUCH if finger else interaction.POINTER_MOUSE
        ab = ActionBuilder(d, mouse=PointerInput(kind, "finger" if finger else "mouse"), duration=15)
        offsets = [(round((x - SIZE / 2) * scale), round((y - SIZE / 2) * scale)) for x, y in stroke]
        ab.pointer_action.move_to(canvas, *offsets[0])
        ab.pointer_action.pointer_down()
        for off in offsets[1:]:
            ab.pointer_action.move_to(canvas, *off)
        ab.pointer_action.pointer_up()
        ab.perform()
        drawn.append(np.array([(SIZE / 2 + dx / scale, SIZE / 2 + dy / scale) for dx, dy in offsets]))
    wait(d, "window.edgetrain.pending === 0 && window.edgetrain.lastPrediction !== null")
    return drawn


def check_drawing(d, home: Home, drawn: list[np.ndarray]) -> dict:
    """What the page recorded, sent and shows matches the strokes, numpy's rendering and the model."""
    # the strokes as the page saw the pointer: where the actions went, within a canvas pixel or two
    strokes = js(d, "window.edgetrain.strokes")
    assert len(strokes) == len(drawn)
    for got, want in zip(strokes, drawn):
        got = np.array(got)
        for p in want:  # every commanded point was reached
            assert np.hypot(*(got - p).T).min() < 2.5, (p, got)
    # the 28x28 image the page sent, against numpy's rendering of the commanded strokes
    sent = np.array(js(d, "window.edgetrain.lastPixels"))
    want = mnist_like(render(drawn))
    wrong = mnist_like(render(drawn), crop=False)
    diff = np.abs(sent - want)
    assert sent.shape == (28, 28) and sent.min() >= 0 and sent.max() <= 1
    assert diff.max() < 0.1 and diff.mean() < 0.01, (diff.max(), diff.mean())
    assert np.abs(sent - wrong).mean() > 5 * diff.mean()  # the tolerance tells right from wrong preprocessing
    # the prediction shown is the current model's for what was sent: 8-bit pixels, which the model's input
    # pipeline divides by 255 (GET /api/status says so: input_range [0, 255])
    probs = home.predict(np.round(sent * 255)[None, None].astype(np.float32))[0]
    k = int(np.argmax(probs))
    shown = js(d, "window.edgetrain.lastPrediction")
    assert shown["prediction"] == k and abs(shown["confidence"] - probs[k]) < 1e-6
    assert d.find_element("id", "prediction").text == str(k)
    confidence = d.find_element("id", "confidence")
    assert float(confidence.get_attribute("data-value")) == pytest.approx(probs[k], abs=1e-6)
    assert confidence.text.startswith(f"{100 * probs[k]:.1f}% sure")
    return {
        "prediction": k,
        "confidence": float(probs[k]),
        "max_diff": float(diff.max()),
        "mean_diff": float(diff.mean()),
    }


def chart_points(d) -> list[tuple[int, float]]:
    circles = d.find_elements("css selector", "#chart circle.point")
    return [(int(c.get_attribute("data-version")), float(c.get_attribute("data-value"))) for c in circles]


def chart_matches(d, home: Home) -> list[tuple[int, float]]:
    """The chart's points are Home.accuracy_by_version() (version, validation accuracy); returns them."""
    got = chart_points(d)
    want = [(p["version"], p["accuracy"]) for p in home.accuracy_by_version()]
    assert [v for v, _ in got] == [v for v, _ in want], (got, want)
    assert [a for _, a in got] == pytest.approx([a for _, a in want], abs=1e-9), (got, want)
    return got


def burst_in_page(d, home: Home) -> dict:
    """Presses personalize and waits for the verdict; checks the progress and the words against the burst that
    Home logged; returns that burst."""
    bursts = len(home.events("burst"))
    d.find_element("id", "personalize").click()
    wait(
        d,
        "document.getElementById('result').dataset.kept === 'true' "
        "|| document.getElementById('result').dataset.kept === 'false'",
    )
    wait(d, "!document.getElementById('personalize').disabled")
    assert len(home.events("burst")) == bursts + 1
    burst = home.events("burst")[-1]
    result = d.find_element("id", "result")
    assert result.get_attribute("data-kept") == str(burst["kept"]).lower()
    if burst["kept"]:
        assert result.text.startswith(f"Kept as version {burst['model_version']}: validation accuracy"), (
            result.text
        )
    else:
        assert result.text.startswith(f"Rolled back, version {burst['model_version']} stays:"), result.text
        assert burst["reason"].split(";")[0] in result.text
    assert f"({burst['steps']} steps in " in result.text and burst["steps"] > 1
    progress = d.find_element("id", "progress").text
    assert progress.startswith(f"done: {burst['steps']} steps · loss "), progress
    assert float(progress.rsplit(" ", 1)[1]) == pytest.approx(burst["losses"][-1], rel=6e-3, abs=1e-6)
    return burst


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the wrecking burst's overflows, which it is about
def test_the_page_in_a_real_browser(driver, tmp_path, report):
    shot_path = DOCS_SCREENSHOT if os.environ.get("EDGETRAIN_UPDATE_DOCS") == "1" else tmp_path / "page.png"
    d = driver
    t0 = time.perf_counter()
    home = new_home(tmp_path, 20)
    first = (
        home.personalize()
    )  # the user's first 20 digits: a kept burst (deterministic), so the chart has a curve
    assert first.kept, first.reason
    with Running(home) as srv:
        d.get(srv.url)
        wait(d, "document.getElementById('samples').dataset.count === '20'")
        wait(d, "document.querySelectorAll('#chart circle.point').length > 0")
        chart_matches(d, home)
        assert d.find_element("id", "version").text == "model version 1"
        canvas = d.find_element("id", "canvas")

        # a 7 drawn with a finger: the image sent, the prediction shown
        seven = check_drawing(d, home, draw(d, canvas, SEVEN, finger=True))
        drawn = np.array(js(d, "window.edgetrain.lastPixels"), np.float64)
        # the page sends 8-bit pixels; the model's input pipeline divides them by 255 before they are stored
        sent = np.round(drawn * 255).astype(np.float32) / np.float32(255)

        # labelled: one more sample, in the page and in the store, holding what the page sent
        d.find_element("id", "label-7").click()
        wait(d, "document.getElementById('samples').dataset.count === '21'")
        assert home.status()["samples"] == 21
        with home.store() as s:
            x, y = s.get(max(s.ids()))
        assert int(y) == 7 and x.shape == (1, 28, 28) and np.array_equal(x[0], sent)
        assert "added as a 7" in d.find_element("id", "message").text
        assert js(d, "window.edgetrain.strokes.length") == 0  # the canvas is cleared for the next digit

        # personalize at a learning rate that wrecks the model: rolled back, said why, the chart as it was
        rate = home.session().lr
        home.update_settings(lr=10.0)
        burst = burst_in_page(d, home)
        assert not burst["kept"] and burst["model_version"] == home.version == 1
        chart_matches(d, home)
        # and at the artifact's rate: kept or rolled back by validation, the chart redrawn from the history
        home.update_settings(lr=rate)  # (lr=None would mean "unchanged" to update_settings)
        burst = burst_in_page(d, home)
        wait(
            d,
            f"document.querySelectorAll('#chart circle.point').length === {len(home.accuracy_by_version())}",
        )
        points = chart_matches(d, home)
        assert len(points) >= 2
        labels = [
            t.text for t in d.find_elements("css selector", "#chart text.tick") if t.text.startswith("v")
        ]
        assert labels == [f"v{v}" for v, _ in points]
        values = [t.text for t in d.find_elements("css selector", "#chart text.value")]
        assert values == [f"{round(100 * a)}%" for _, a in points]
        assert d.find_element("id", "version").text == f"model version {home.version}"

        # a 2 drawn with the mouse, left on the canvas for the screenshot
        d.find_element("id", "clear").click()
        two = check_drawing(d, home, draw(d, canvas, TWO, finger=False))
        shot_path.parent.mkdir(exist_ok=True)
        shot = d.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        shot_path.write_bytes(base64.b64decode(shot["data"]))
        errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
    seconds = time.perf_counter() - t0
    for name, r in (("7 (finger)", seven), ("2 (mouse)", two)):
        report(
            "android page (headless Chromium)",
            f"{name}: read as {r['prediction']} ({r['confidence']:.1%}); page's 28x28 vs numpy: "
            f"max |diff| {r['max_diff']:.3f}, mean {r['mean_diff']:.4f}",
        )
    report(
        "android page (headless Chromium)",
        f"burst from the page: {'kept' if burst['kept'] else 'rolled back'}, {burst['steps']} steps; "
        f"chart {len(points)} points; {seconds:.1f} s; screenshot {shot_path}",
    )
