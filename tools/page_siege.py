"""The phone page's server under slow clients (slowloris) -> a table on stdout and docs/page_server.md.

`python tools/page_siege.py` starts `python -m android_demo --home TMP serve --port 0` (a fresh home with the
embedded digits model) with the given --timeout and --cap, then opens --clients slow connections at once: half send
their request line and headers a byte at a time, half send their headers whole and then the body a byte at a time
(a byte every --every seconds, so that no single read ever waits long). For each it records when the server closed
the connection and what it said; meanwhile a normal client asks for a prediction every 0.2 s and records the
status and latency. The server's thread count is sampled from /proc.

`--before REV` first runs the same siege against android_demo as it was at git revision REV (beside today's
edgetrain and loaders), for a before/after table; a revision whose serve has no --request-timeout/--max-connections
gets neither.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PIXELS = json.dumps({"pixels": [[[0] * 28] * 28]})


def request(path: str, body: str) -> bytes:
    data = body.encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + data


class Slow(threading.Thread):
    """One slow client: `head` at once, then `trickle` a byte every `every` s, until the server closes the
    connection or `give_up` seconds pass."""

    def __init__(self, port: int, head: bytes, trickle: bytes, *, every: float, give_up: float):
        super().__init__(daemon=True)
        self.port, self.head, self.trickle, self.every, self.give_up = port, head, trickle, every, give_up
        self.closed_at: float | None = None  # seconds after connecting
        self.said = b""
        self.error = ""

    def run(self) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        except OSError as e:
            self.error = f"connect: {e}"
            return
        t0 = time.monotonic()
        sock.setblocking(False)
        try:
            if self.head:
                sock.sendall(self.head)  # a few hundred bytes: the socket's buffer takes them whole
        except OSError:
            pass
        i, next_byte = 0, t0
        while (now := time.monotonic()) - t0 < self.give_up:
            if now >= next_byte and i < len(self.trickle):
                try:
                    sock.send(self.trickle[i : i + 1])
                except OSError:
                    break
                i, next_byte = i + 1, now + self.every
            # wait for the server until the next byte is due: its closing is seen the moment it happens
            wait = min(next_byte, t0 + self.give_up) - time.monotonic()
            if not select.select([sock], [], [], max(wait, 0.0))[0]:
                continue
            try:
                chunk = sock.recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                break
            if not chunk:
                break
            self.said += chunk
        else:
            sock.close()
            return
        self.closed_at = time.monotonic() - t0
        sock.close()

    @property
    def how(self) -> str:
        if self.closed_at is None:
            return "still open"
        if self.said.startswith(b"HTTP/1.1 "):
            return self.said.split()[1].decode()
        return "closed without a word"


def normal_requests(port: int, stop: threading.Event, out: list[tuple[int, float]]) -> None:
    """A prediction every 0.2 s until `stop`: (status or 0 for a failure, seconds)."""
    data = request("/api/predict", PIXELS)
    while not stop.is_set():
        t0 = time.monotonic()
        status = 0
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(data)
                got = b""
                while chunk := s.recv(1 << 16):
                    got += chunk
                status = int(got.split()[1])
        except (OSError, IndexError, ValueError):
            pass
        out.append((status, time.monotonic() - t0))
        stop.wait(0.2)


def threads_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def start_server(
    home: str, args: argparse.Namespace, tmp: str, rev: str | None
) -> tuple[subprocess.Popen, int, bool]:
    """(the server's process, its port, whether it was given the limits)."""
    cwd, env = ROOT, dict(os.environ)
    argv = [sys.executable, "-m", "android_demo", "--home", home, "serve", "--port", "0"]
    if rev:  # that revision's android_demo, beside today's edgetrain and loaders
        old = os.path.join(tmp, "old")
        os.makedirs(old)
        archive = subprocess.run(
            ["git", "-C", ROOT, "archive", rev, "android_demo"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
        cwd, env["PYTHONPATH"] = old, ROOT
    with open(os.path.join(cwd, "android_demo", "__main__.py"), encoding="utf-8") as f:
        limited = "--request-timeout" in f.read()
    if limited:
        argv += ["--request-timeout", str(args.timeout), "--max-connections", str(args.cap)]
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("open http://"):
        proc.kill()
        raise SystemExit(f"the server did not start: {line}{proc.stderr.read()}")
    return proc, int(line.split()[1].rstrip("/").rsplit(":", 1)[1]), limited


def siege(args: argparse.Namespace, rev: str | None = None) -> dict:
    from android_demo.app import Home
    from android_demo.simulate import ARTIFACT

    with tempfile.TemporaryDirectory() as tmp:
        home = Home.init(os.path.join(tmp, "home"), ARTIFACT).path
        proc, port, limited = start_server(home, args, tmp, rev)
        try:
            give_up = args.timeout + 10
            headers = b"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100_000
            post = request("/api/add", json.dumps({"pixels": [[[0] * 28] * 28], "label": 1}))
            split = post.index(b"\r\n\r\n") + 4
            half = args.clients // 2
            slow = [Slow(port, b"", headers, every=args.every, give_up=give_up) for _ in range(half)]
            slow += [
                Slow(port, post[:split], post[split:], every=args.every, give_up=give_up)
                for _ in range(args.clients - half)
            ]
            base_threads = threads_of(proc.pid)
            stop, normal = threading.Event(), []
            t0 = time.monotonic()
            for s in slow:
                s.start()
            checker = threading.Thread(target=normal_requests, args=(port, stop, normal), daemon=True)
            checker.start()
            peak = base_threads or 0
            while any(s.is_alive() for s in slow):
                peak = max(peak, threads_of(proc.pid) or 0)
                time.sleep(0.05)
            stop.set()
            checker.join(40)
            seconds = time.monotonic() - t0
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return {
        "slow": [(s.closed_at, s.how) for s in slow],
        "half": half,
        "normal": normal,
        "threads": (base_threads, peak if base_threads is not None else None),
        "seconds": seconds,
        "limited": limited,
    }


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"


def table(r: dict, args: argparse.Namespace) -> list[tuple[str, str]]:
    closed = [t for t, _ in r["slow"] if t is not None]
    n = len(r["slow"])
    within = [t for t in closed if t <= args.timeout + 1]
    early = [t for t in closed if t < args.timeout - 0.5]  # dropped to make room for newer connections
    at_deadline = [t for t in closed if args.timeout - 0.5 <= t <= args.timeout + 1]
    hows: dict[str, int] = {}
    for _, how in r["slow"]:
        hows[how] = hows.get(how, 0) + 1
    ok = [t for status, t in r["normal"] if status == 200]
    others = sorted({status for status, _ in r["normal"] if status != 200})
    rows = [
        (
            "slow clients",
            f"{n} ({r['half']} trickling headers, {n - r['half']} a body after whole headers; "
            f"a byte every {args.every:g} s)",
        ),
        (
            "server limits",
            f"request deadline {args.timeout:g} s, at most {args.cap} connections"
            if r["limited"]
            else "none",
        ),
        ("freed within the deadline + 1 s", f"{len(within)} of {n}"),
        (
            "  dropped at once to make room",
            f"{len(early)}" + (f", held {ms(min(early))} to {ms(max(early))}" if early else ""),
        ),
        (
            "  closed at the deadline",
            f"{len(at_deadline)}"
            + (
                f", held {ms(min(at_deadline))} to {ms(max(at_deadline))} "
                f"(median {ms(statistics.median(at_deadline))})"
                if at_deadline
                else ""
            ),
        ),
        ("still open after deadline + 10 s", f"{n - len(closed)}"),
        ("how they ended", ", ".join(f"{k}: {v}" for k, v in sorted(hows.items()))),
        (
            "normal requests",
            f"{len(ok)} of {len(r['normal'])} answered 200"
            + (f" (others: {', '.join(map(str, others))})" if others else ""),
        ),
    ]
    if ok:
        q = sorted(ok)
        rows.append(
            (
                "  their latency",
                f"median {ms(statistics.median(q))}, p95 {ms(q[int(0.95 * (len(q) - 1))])}, max {ms(q[-1])}",
            )
        )
    base, peak = r["threads"]
    if base is not None:
        rows.append(("server threads", f"{base} idle, {peak} at the peak"))
    rows.append(("siege lasted", f"{r['seconds']:.1f} s"))
    return rows


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return (
        f"{cpu} ({os.cpu_count()} logical CPUs), {platform.system()} {platform.release()} {platform.machine()}; "
        f"Python {platform.python_version()}"
    )


def write_doc(
    path: str, columns: list[str], rows: list[list[str]], argv: list[str], *, backlog: bool
) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# The phone page's server under slow clients",
        "",
        f"`{' '.join(['python tools/page_siege.py', *argv])}` on {now}.",
        "",
        f"- Machine: {machine()}.",
        "- The server: `python -m android_demo --home TMP serve` (a fresh home, the embedded digits model) in its "
        "own process; the clients in another, all on 127.0.0.1.",
        "- A slow client never stops sending: each byte arrives long before any per-read timeout, so only a "
        "deadline for the whole request cuts it off. A normal client asks for a prediction every 0.2 s meanwhile.",
        "",
        "| | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
        *["| " + " | ".join([r[0].replace("  ", "&nbsp;&nbsp;"), *r[1:]]) + " |" for r in rows],
        "",
        "How (android_demo/connections.py): every request must arrive whole (request line, headers and body) within "
        "the deadline (`--request-timeout`, default 10 s), however slowly it trickles; a body that is late gets a "
        "408 saying so. At most `--max-connections` (default 32) are open at once, a thread each; a new "
        "connection beyond that takes the slot of the one that has waited longest for its request (what a slow "
        "client holds), so a client that sends its request at once is served at once; when every connection is "
        "being answered, a new one gets a 503 at once. A normal request takes a slot too, so one more slow client "
        "than the excess over the cap may be dropped early.",
        "",
    ]
    if backlog:
        lines[-1:-1] = [
            "",
            "In the before column, a connection closed early was dropped by the kernel's listen queue (http.server's "
            "default of 5 connections waiting for accept(); now 128), not freed by the server; the rest were held "
            "until the clients gave up.",
        ]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=50, help="slow clients (default 50)")
    p.add_argument(
        "--timeout", type=float, default=10.0, help="the server's request deadline, s (default 10)"
    )
    p.add_argument("--cap", type=int, default=32, help="the server's connection cap (default 32)")
    p.add_argument("--every", type=float, default=0.5, help="seconds between a slow client's bytes (0.5)")
    p.add_argument("--before", metavar="REV", help="first the same siege against android_demo at git REV")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "page_server.md"), help="the Markdown file")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    git = ["git", "-C", ROOT]
    head = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    code = ["android_demo/*.py", "android_demo/static"]
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--", *code], capture_output=True, text=True
    ).stdout
    runs = [(f"now (git {head or '?'}{' + changes to android_demo' if dirty.strip() else ''})", siege(args))]
    if args.before:
        rev = subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--short", args.before],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        runs.insert(0, (f"before (git {rev})", siege(args, rev=rev)))
    tables = [table(r, args) for _, r in runs]
    keys = list(dict.fromkeys(k for t in tables for k, _ in t))
    rows = [[k, *(dict(t).get(k, "-") for t in tables)] for k in keys]
    columns = [name for name, _ in runs]
    widths = [max(len(x) for x in col) for col in zip(["", *columns], *rows)]
    for r in [["", *columns], *rows]:
        print("  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip())
    out = [a for i, a in enumerate(argv) if not a.startswith("--out") and (i == 0 or argv[i - 1] != "--out")]
    before = runs[0][1] if args.before else None
    backlog = before is not None and any(t is not None for t, _ in before["slow"])
    write_doc(args.out, columns, rows, out, backlog=backlog)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
