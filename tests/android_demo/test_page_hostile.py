"""The phone page's server (android_demo/server.py) against hostile clients, over real sockets to a real server
(make_server on port 0 in a thread, or `python -m android_demo serve` as a child): slow clients (slowloris) trickling
their headers or their body are cut off at the request's deadline while others are served; more connections than
the cap drop the longest-waiting one or get a quick 503; and every malformed body (deep nesting, huge or non-finite
numbers, strings and booleans for numbers, a float label, wrong content type, bad UTF-8, a short or oversized body)
gets a 400 (413 for one too large) whose JSON error names the fault, with the sample store unchanged."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from interrupts import Lines, finish, python_m

from android_demo.app import Home
from android_demo.server import make_server
from android_demo.simulate import ARTIFACT, _new_user

ROOT = Path(__file__).resolve().parents[2]
USER, _ = _new_user()
ZERO = np.zeros((1, 28, 28), int).tolist()


@pytest.fixture
def home(tmp_path) -> Home:
    h = Home.init(os.path.join(tmp_path, "home"), ARTIFACT)
    for i in range(3):
        h.add(*USER.get_item(i))
    return h


class Running:
    """make_server (with its keyword arguments) + serve_forever in a thread, shut down on exit."""

    def __init__(self, home: Home, **kw):
        self.server = make_server(home, port=0, **kw)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self):
        self.thread.start()
        return self.server

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


# ---- raw HTTP over a socket --------------------------------------------------------------------------------------


def request(method: str, path: str, body: bytes = b"", *, ctype: str | None = "application/json", **headers):
    """The bytes of one request; Content-Length is the body's unless given (Content_Length=...)."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    if ctype is not None:
        lines.append(f"Content-Type: {ctype}")
    headers.setdefault("Content_Length", str(len(body)) if body or method == "POST" else None)
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items() if v is not None]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def read_all(sock: socket.socket, timeout: float = 30) -> bytes:
    """Everything the server sends until it closes the connection (a reset ends it too)."""
    sock.settimeout(timeout)
    out = b""
    try:
        while chunk := sock.recv(1 << 16):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def parse(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), raw[:200]
    return int(head.split()[1]), json.loads(body)


def send(port: int, data: bytes, *, half_close: bool = False) -> tuple[int, dict]:
    """(status, JSON answer) of raw request bytes; half_close: the client then closes its side (a short body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        return parse(read_all(s))


def post(port: int, path: str, obj) -> tuple[int, dict]:
    return send(port, request("POST", path, json.dumps(obj).encode()))


def closed_after(sock: socket.socket, timeout: float) -> tuple[float, bytes]:
    """(seconds until the server closed the connection, what it sent before) from now; fails past timeout."""
    t0 = time.monotonic()
    got = read_all(sock, timeout)
    return time.monotonic() - t0, got


# ---- malformed requests -------------------------------------------------------------------------------------------

DIGITS = "9" * 400
PIX = json.dumps(ZERO)


def pixels_with(value: str, at=(0, 3, 5)) -> str:
    """The digits model's [1, 28, 28] zeros as JSON text with one value replaced by raw JSON text."""
    rows = [[["0"] * 28 for _ in range(28)]]
    rows[at[0]][at[1]][at[2]] = value
    return (
        "[" + ",".join("[" + ",".join("[" + ",".join(r) + "]" for r in plane) + "]" for plane in rows) + "]"
    )


def add(pixels: str = PIX, label: str = "1") -> bytes:
    """The body of /api/add from raw JSON text for "pixels" and "label"."""
    return f'{{"pixels": {pixels}, "label": {label}}}'.encode()


def predict(pixels: str) -> bytes:
    return f'{{"pixels": {pixels}}}'.encode()


def utf16(obj) -> bytes:
    return json.dumps(obj).encode("utf-16")


A, P = "/api/add", "/api/predict"
OK = json.dumps({"pixels": ZERO, "label": 3}).encode()

# (path, raw body, status, words the error must hold[, headers for request()])
BAD = {
    "100,000 nested [": (A, b"[" * 100_000, 400, "nests 100000 levels deep"),
    "nested [ in pixels": (P, predict("[" * 100_000 + "]" * 100_000), 400, "nests 100001 levels deep"),
    "nested { }": (A, b'{"a":' * 50_000 + b"1" + b"}" * 50_000, 400, "nests 50000 levels deep"),
    "a 400-digit pixel": (A, add(pixels_with(DIGITS)), 400, "pixels[0][3][5] is an integer of 400 digits"),
    "a -400-digit pixel": (P, predict(pixels_with("-" + DIGITS)), 400, "is an integer of 400 digits"),
    "a 5000-digit pixel": (P, predict(pixels_with("1" * 5000)), 400, "an integer of 5000 digits"),
    "a 400-digit label": (
        A,
        add(label=DIGITS),
        400,
        "from 0 to 9, written as an integer such as 3; it is an integer of 400 digits",
    ),
    "pixel 1e400": (A, add(pixels_with("1e400")), 400, "pixels[0][3][5] is 1e400, beyond a float's range"),
    "pixel NaN": (A, add(pixels_with("NaN")), 400, "pixels[0][3][5] is NaN, which is not a JSON number"),
    "pixel -Infinity": (P, predict(pixels_with("-Infinity")), 400, "-Infinity, which is not a JSON number"),
    "a string pixel": (
        A,
        add(pixels_with('"12"')),
        400,
        'nested lists of numbers ([1, 28, 28] numbers in [0, 255]); pixels[0][3][5] is "12" (a string)',
    ),
    "a true pixel": (A, add(pixels_with("true")), 400, "pixels[0][3][5] is true"),
    "a false pixel": (P, predict(pixels_with("false", (0, 0, 0))), 400, "pixels[0][0][0] is false"),
    "a null pixel": (A, add(pixels_with("null")), 400, "pixels[0][3][5] is null"),
    "an object pixel": (A, add(pixels_with("{}")), 400, "pixels[0][3][5] is an object"),
    "all-bool pixels": (A, add(json.dumps([[[True] * 28] * 28])), 400, "pixels[0][0][0] is true"),
    "a negative pixel": (A, add(pixels_with("-1")), 400, "numbers in [0, 255]; pixels[0][3][5] is -1"),
    "pixel 255.5": (A, add(pixels_with("255.5")), 400, "pixels[0][3][5] is 255.5"),
    "ragged pixels": (
        A,
        add(json.dumps([[0] * 28] * 27 + [[0] * 27])),
        400,
        "each list as long as its siblings; pixels[27] has shape [27], pixels[0] [28]",
    ),
    "label 3.0": (A, add(label="3.0"), 400, "written as an integer such as 3; it is 3.0"),
    "label true": (A, add(label="true"), 400, "it is true"),
    'label "3"': (A, add(label='"3"'), 400, 'it is "3" (a string)'),
    "label null": (A, add(label="null"), 400, "it is null"),
    "label [3]": (A, add(label="[3]"), 400, "it is a list"),
    "label -1": (A, add(label="-1"), 400, "from 0 to 9"),
    "label 10": (A, add(label="10"), 400, "it is 10"),
    "no label": (A, predict(PIX), 400, "it is missing"),
    "a misspelt field": (
        A,
        b'{"pixels": [], "lable": 3}',
        400,
        'no field "lable" in /api/add; it takes "pixels" and "label"',
    ),
    "force 1": ("/api/personalize", b'{"force": 1}', 400, '"force" must be true or false'),
    "text/plain": (
        A,
        OK,
        400,
        "send JSON (Content-Type: application/json), not text/plain",
        {"ctype": "text/plain"},
    ),
    "no content type": (A, OK, 400, "not no content type", {"ctype": None}),
    "a form": (
        A,
        b"pixels=1&label=2",
        400,
        "Content-Type: application/json",
        {"ctype": "application/x-www-form-urlencoded"},
    ),
    "UTF-16 charset": (
        A,
        utf16({"pixels": ZERO, "label": 3}),
        400,
        "a body in 'utf-16'; send JSON as UTF-8",
        {"ctype": "application/json; charset=utf-16"},
    ),
    "UTF-16 bytes": (A, utf16({"pixels": ZERO, "label": 3}), 400, "not UTF-8 text (byte 0xff at offset 0)"),
    "invalid UTF-8": (
        A,
        b'{"pixels": "\xc3\x28", "label": 3}',
        400,
        "not UTF-8 text (byte 0xc3 at offset 12)",
    ),
    "not JSON": (A, b"{pixels: [0]}", 400, "the body is not JSON"),
    "a JSON list": (A, b"[1, 2]", 400, "the body must be a JSON object, not a list"),
    "a JSON string": (P, b'"pixels"', 400, 'not "pixels" (a string)'),
    "Content-Length abc": (
        A,
        b"{}",
        400,
        "Content-Length 'abc' is not a number of bytes",
        {"Content_Length": "abc"},
    ),
    "Content-Length -5": (A, b"{}", 400, "is not a number of bytes", {"Content_Length": "-5"}),
    "Content-Length 1_0": (A, b"{}", 400, "is not a number of bytes", {"Content_Length": "1_0"}),
    "chunked": (
        A,
        b"2\r\n{}\r\n0\r\n\r\n",
        400,
        "send the body with a Content-Length",
        {"Content_Length": None, "Transfer_Encoding": "chunked"},
    ),
    "a body of 2 MB": (A, b" " * (2 << 20), 413, "a body of 2097152 bytes; at most 1048576"),
    "200,000 values": (
        A,
        add(json.dumps([0] * 200_000)),
        413,
        "the body holds 200002 JSON values; a request of this model holds at most",
    ),
    "a GET with a body": ("/api/status", b"{}", 400, "a GET request has no body"),
}


def test_malformed_requests_get_400_naming_the_fault_and_store_nothing(home):
    with Running(home, request_timeout=10) as srv:
        before = home.sample_count()
        wrong = []
        for name, (path, body, status, words, *headers) in BAD.items():
            method = "GET" if path == "/api/status" else "POST"
            got, answer = send(srv.port, request(method, path, body, **(headers[0] if headers else {})))
            error = answer.get("error", "")
            if got != status or words not in error or "\n" in error or "Traceback" in error:
                wrong.append((name, got, error))
        assert not wrong, "\n".join(map(repr, wrong))
        assert home.sample_count() == before  # nothing above was stored
        # a body shorter than its Content-Length, the client's side closed: the server says so at once
        t0 = time.monotonic()
        got, answer = send(
            srv.port, request("POST", "/api/add", b'{"pixels": [', Content_Length="100"), half_close=True
        )
        assert (
            got == 400
            and answer["error"] == "the body ended after 12 of the 100 bytes its Content-Length says"
        )
        assert time.monotonic() - t0 < 2
        # headers beyond 64 KB: 431 (http.server alone would read 100 lines of 64 KB each)
        big = {f"X_Pad_{i}": "a" * 30_000 for i in range(4)}
        got, answer = send(srv.port, request("GET", "/api/status", ctype=None, **big))
        assert got == 431 and "headers are over 65536 bytes" in answer["error"]
        assert home.sample_count() == before
        # the same server then stores a good sample, and answers the page's requests as before
        got, added = post(srv.port, "/api/add", {"pixels": ZERO, "label": 3})
        assert got == 200 and added["label"] == 3 and type(added["label"]) is int
        assert added["samples"] == before + 1 == home.sample_count()
        got, p = post(srv.port, "/api/predict", {"pixels": np.full((28, 28), 127.5).tolist()})
        assert got == 200 and len(p["probabilities"]) == 10


def test_a_kept_alive_connection_serves_requests_one_after_another(home):
    """The deadline is per request: a connection that sends request after request promptly stays open."""
    with Running(home, request_timeout=1.0) as srv, socket.create_connection(("127.0.0.1", srv.port)) as s:
        body = json.dumps({"pixels": ZERO}).encode()
        one = request("POST", "/api/predict", body).replace(b"Connection: close", b"Connection: keep-alive")
        reader = s.makefile("rb")
        for _ in range(4):  # 4 x 0.4 s: longer than one deadline in all
            s.sendall(one)
            assert reader.readline().startswith(b"HTTP/1.1 200")
            n = 0
            while (line := reader.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    n = int(line.split(b":")[1])
            assert "probabilities" in json.loads(reader.read(n))
            time.sleep(0.4)


# ---- slow clients ----------------------------------------------------------------------------------------------


class Trickler(threading.Thread):
    """A slow client: sends `data` a byte every `every` seconds and records when the server closed the connection
    (seconds since it connected) and what the server said."""

    def __init__(self, port: int, data: bytes, *, every: float, give_up: float):
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setblocking(False)
        self.data, self.every, self.give_up = data, every, give_up
        self.t0 = time.monotonic()
        self.closed_at: float | None = None
        self.said = b""

    def run(self) -> None:
        i, next_byte = 0, self.t0
        while (now := time.monotonic()) - self.t0 < self.give_up:
            if now >= next_byte and i < len(self.data):
                try:
                    self.sock.send(self.data[i : i + 1])
                except OSError:
                    break
                i, next_byte = i + 1, now + self.every
            wait = min(next_byte, self.t0 + self.give_up) - time.monotonic()
            if not select.select([self.sock], [], [], max(wait, 0.0))[0]:
                continue  # the server's closing is seen the moment it happens, not at the next byte
            try:
                chunk = self.sock.recv(1 << 16)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            self.said += chunk
        else:
            return  # still open at give_up
        self.closed_at = time.monotonic() - self.t0
        self.sock.close()


HEADERS_SLOWLY = b"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"a" * 10_000
BODY = json.dumps({"pixels": ZERO, "label": 1}).encode()


def test_slow_clients_are_cut_off_at_the_deadline_while_others_are_served(home):
    """10 clients trickle headers and 10 a body, a byte every 0.1 s (each read arrives well within any per-read
    timeout): each is closed at the request's 2 s deadline (the body tricklers get a 408 saying why), and a normal
    client meanwhile is answered at once."""
    timeout = 2.0
    with Running(home, request_timeout=timeout, max_connections=32) as srv:
        before, threads = home.sample_count(), threading.active_count()
        slow = [Trickler(srv.port, HEADERS_SLOWLY, every=0.1, give_up=timeout + 8) for _ in range(10)]
        head = request("POST", "/api/add", BODY)
        split = head.index(b"\r\n\r\n") + 4
        slow += [Trickler(srv.port, head[split:], every=0.1, give_up=timeout + 8) for _ in range(10)]
        for t in slow[10:]:
            t.sock.sendall(head[:split])  # the headers at once, then the body a byte at a time
        for t in slow:
            t.start()
        latencies = []
        while any(t.is_alive() for t in slow):
            t0 = time.monotonic()
            got, p = post(srv.port, "/api/predict", {"pixels": ZERO})
            latencies.append(time.monotonic() - t0)
            assert got == 200 and len(p["probabilities"]) == 10
            time.sleep(0.1)
        for t in slow:
            t.join(1)
            assert t.closed_at is not None, "a slow client was still connected 10 s after the deadline"
            assert timeout - 0.1 <= t.closed_at <= timeout + 1.5, t.closed_at
        for t in slow[:10]:
            assert t.said == b""  # its request line never ended: closed without a word
        for t in slow[10:]:
            status, answer = parse(t.said)
            assert (
                status == 408
                and answer["error"] == "the body did not arrive within 2 s; send a request whole at once"
            )
        assert len(latencies) >= 10 and max(latencies) < 1.0, latencies
        assert home.sample_count() == before  # no trickled body was stored
        deadline = time.monotonic() + 5
        while (len(srv.connections) or threading.active_count() > threads) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(srv.connections) == 0 and threading.active_count() <= threads  # every thread freed


def test_headers_that_arrive_but_not_whole_get_a_408(home):
    with Running(home, request_timeout=1.0) as srv, socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the blank line
        took, said = closed_after(s, 10)
        status, answer = parse(said)
        assert 0.9 <= took <= 2.5 and status == 408 and "headers did not arrive within 1 s" in answer["error"]
        # an idle connection, not a byte sent, is closed at the deadline too: it held a thread
        with socket.create_connection(("127.0.0.1", srv.port)) as idle:
            took, said = closed_after(idle, 10)
            assert 0.9 <= took <= 2.5 and said == b""


@pytest.mark.slow
def test_the_default_deadline_is_10_seconds(home):
    with Running(home) as srv:
        assert srv.request_timeout == 10 and srv.connections.cap == 32
        slow = [Trickler(srv.port, HEADERS_SLOWLY, every=0.5, give_up=30) for _ in range(5)]
        for t in slow:
            t.start()
        assert post(srv.port, "/api/predict", {"pixels": ZERO})[0] == 200
        for t in slow:
            t.join(30)
            assert t.closed_at is not None and 9.9 <= t.closed_at <= 12, t.closed_at


# ---- more connections than the cap --------------------------------------------------------------------------------


def test_connections_beyond_the_cap_drop_the_longest_waiting_and_others_are_served(home):
    """Cap 4: 4 idle connections, then 4 more: each new one takes the slot of the oldest idle one, which is closed
    at once (not at the 5 s deadline); the server never holds more than 4, and a normal request is served."""
    cap = 4
    with Running(home, request_timeout=5.0, max_connections=cap) as srv:
        first = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(cap)]
        time.sleep(0.3)
        assert len(srv.connections) == cap
        second = []
        for s in first:
            second.append(socket.create_connection(("127.0.0.1", srv.port)))
            took, said = closed_after(s, 3)
            assert took < 1.0 and said == b"", took  # the oldest went at once
            assert len(srv.connections) <= cap
            time.sleep(0.05)
        t0 = time.monotonic()
        got, p = post(srv.port, "/api/predict", {"pixels": ZERO})
        assert got == 200 and time.monotonic() - t0 < 1.0
        assert srv.connections.dropped >= cap + 1 and len(srv.connections) <= cap
        for s in first + second:
            s.close()


def test_when_every_connection_is_being_answered_a_new_one_gets_a_quick_503(home):
    """Cap 3, three predictions held in the model (the real predict, made to wait for the test): a fourth
    connection gets a 503 with a JSON error at once; the three are then answered."""
    cap = 3
    gate, inside = threading.Event(), threading.Semaphore(0)
    real = home.predict

    def held_predict(*a, **kw):
        inside.release()
        assert gate.wait(30)
        return real(*a, **kw)

    home.predict = held_predict
    with Running(home, request_timeout=5.0, max_connections=cap) as srv:
        answers = []
        held = [
            threading.Thread(target=lambda: answers.append(post(srv.port, "/api/predict", {"pixels": ZERO})))
            for _ in range(cap)
        ]
        for t in held:
            t.start()
        for _ in range(cap):
            assert inside.acquire(timeout=10)
        t0 = time.monotonic()
        got, answer = post(srv.port, "/api/predict", {"pixels": ZERO})
        took = time.monotonic() - t0
        assert got == 503 and "answering 3 requests at once" in answer["error"] and took < 1.0, (took, answer)
        assert srv.connections.refused == 1
        gate.set()
        for t in held:
            t.join(10)
        assert [a[0] for a in answers] == [200] * cap
        home.predict = real
        assert post(srv.port, "/api/predict", {"pixels": ZERO})[0] == 200  # served again


# ---- the command line ----------------------------------------------------------------------------------------------


def test_serve_takes_the_timeout_and_the_cap_as_options(home):
    proc = subprocess.Popen(
        python_m(
            "android_demo",
            "--home",
            home.path,
            "serve",
            "--port",
            "0",
            "--request-timeout",
            "2",
            "--max-connections",
            "2",
        ),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = Lines(proc.stdout), Lines(proc.stderr)
    try:
        line = stdout.wait_for(lambda line: line.strip(), "the server's first line", timeout=60)
        port = int(line.split()[1].rstrip("/").rsplit(":", 1)[1])
        slow = Trickler(port, HEADERS_SLOWLY, every=0.1, give_up=10)
        slow.start()
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]  # the cap: slow's slot goes
        slow.join(10)
        assert slow.closed_at is not None and slow.closed_at < 1.5, slow.closed_at
        took, _ = closed_after(idle[0], 10)
        assert 1.0 < took < 3.5  # the 2 s deadline, not at once
        assert post(port, "/api/predict", {"pixels": ZERO})[0] == 200
        for s in idle:
            s.close()
        proc.send_signal(signal.SIGINT)
        finish(proc, 30, stdout, stderr)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr.text(5)


@pytest.mark.parametrize(
    "flag, value, words",
    [
        ("--request-timeout", "0", "request timeout 0.0: use seconds above 0"),
        ("--request-timeout", "nan", "request timeout nan"),
        ("--max-connections", "0", "max connections 0: use a whole number from 1 to 10000"),
    ],
)
def test_serve_refuses_absurd_limits_in_plain_words(home, flag, value, words):
    proc = subprocess.run(
        [sys.executable, "-m", "android_demo", "--home", home.path, "serve", "--port", "0", flag, value],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


# ---- the siege script cannot rot ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_siege_script_runs(tmp_path):
    out = tmp_path / "page_server.md"
    proc = subprocess.run(
        [
            sys.executable,
            "tools/page_siege.py",
            "--clients",
            "6",
            "--timeout",
            "1",
            "--cap",
            "4",
            "--every",
            "0.2",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = out.read_text()
    assert "6 of 6" in text and "| normal requests |" in text, text
