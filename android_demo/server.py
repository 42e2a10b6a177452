"""`serve`: the app's page for the phone's own browser -> a standard-library HTTP server on 127.0.0.1 serving
android_demo/static/ and a small JSON API; everything it does goes through Home, like the commands.

    GET  /api/status        Home.status() + {"input_shape": [1, 28, 28], "input_range": [0, 255], "classes": 10}
    POST /api/predict       {"pixels": [...]} -> {"probabilities", "prediction", "confidence", "version"}
    POST /api/add           {"pixels": [...], "label": k} -> {"id", "label", "samples"}
    POST /api/personalize   {"force": false}? -> 202 {"started": true}: one burst in a background thread; 409 while
                            one runs
    GET  /api/progress      {"running", "step", "of", "loss", "result": BurstResult fields | null, "error"}
    GET  /api/history       {"points": Home.accuracy_by_version(), "version": the current version}
A text home (`init --text`) serves text.html at / and, instead of predict and add:
    POST /api/suggest       {"text": "the sentence so far"} -> {"words": the three likeliest next words, "version"}
    POST /api/send          {"text": "a finished sentence"} -> {"ids", "samples"}: stored as the user's samples
"text" is a JSON string of at most text.MAX_TEXT characters.

"pixels" is the model's input as nested lists (for the digits model [1, 28, 28], or [28, 28]: singleton axes may be
left out), raw values in the range the model's input pipeline takes ("input_range" of /api/status: 0..255 for the
digits model, whose pipeline divides by 255; [0, 1] for a model that declares none): JSON numbers only (not strings,
booleans or null). "label" is a class number written as an integer (3, not 3.0 or "3"). A body is UTF-8 JSON of at
most MAX_BODY bytes, nested at most api_json.MAX_DEPTH deep (checked before it is parsed). A bad request gets a 400
(413 for one too large) and {"error": "one line"}; nothing answers with a traceback.
Only loopback addresses are served, and only to requests that name a loopback host (a page of another site cannot
reach the app through DNS rebinding) and send JSON (a plain cross-site form cannot post to it).
A slow client cannot hold the server (connections.py): a request must arrive whole within `request_timeout` seconds
(else 408 and the connection is closed), and at most `max_connections` are open at once; beyond that a new one takes
the place of the connection that has waited longest for its request, or gets a 503 when all are being answered.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from edgetrain.core.errors import ConfigError
from loaders.values import count, number

from . import api_json
from .api_json import ApiError
from .connections import (
    MAX_CONNECTIONS,
    MAX_HEADER_BYTES,
    REQUEST_TIMEOUT,
    Connections,
    DeadlineReader,
    HeadersTooLarge,
    linger,
    refuse,
)
from .home import BaseHome
from .settings import AppError, VersionError
from .text import MAX_TEXT, TextHome

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
PAGES = {  # the only files served: no path from a request ever reaches the file system
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/common.js": ("common.js", "text/javascript; charset=utf-8"),  # what app.js and text.js share
    "/style.css": ("style.css", "text/css; charset=utf-8"),
    "/text.js": ("text.js", "text/javascript; charset=utf-8"),
}
TEXT_PAGE = "text.html"  # a text home's page at / and /index.html
LOOPBACK = ("127.0.0.1", "localhost")
MAX_BODY = 1 << 20  # a 28x28 drawing as JSON is about 10 KB
MIN_TIMEOUT = 0.001  # seconds: a shorter request timeout would refuse every request
LINGER_SECONDS = 2.0  # at most, reading what a client still sends after an error answered before its body


def _clean(v: Any) -> Any:
    """JSON-safe: non-finite floats become null, numpy scalars plain numbers."""
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class Burst:
    """At most one burst at a time, run in a background thread; its progress as the page polls it."""

    def __init__(self, home: BaseHome):
        self.home = home
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._state: dict[str, Any] = {
            "running": False,
            "step": 0,
            "of": 0,
            "loss": None,
            "result": None,
            "error": None,
        }

    def start(self, *, force: bool = False) -> bool:
        """Starts a burst; False when one is running already."""
        with self._lock:
            if self._state["running"]:
                return False
            of = int(self.home.settings["max_steps"])
            self._state = {"running": True, "step": 0, "of": of, "loss": None, "result": None, "error": None}
            self._thread = threading.Thread(target=self._run, args=(force,), name="burst", daemon=True)
            self._thread.start()
        return True

    def _progress(self, p: dict[str, Any]) -> None:
        with self._lock:
            self._state.update(step=int(p["step"]), of=int(p["of"]), loss=float(p["loss"]))

    def _run(self, force: bool) -> None:
        result, error = None, None
        try:
            r = self.home.personalize(force=force, progress=self._progress)
            result = asdict(r)
        except Exception as e:  # shown on the page as one line; the server goes on
            error = _one_line(e)
            traceback.print_exc(file=sys.stderr)
        with self._lock:
            self._state.update(running=False, result=result, error=error)
            if result is not None:
                self._state["step"] = result["steps"]

    def state(self) -> dict[str, Any]:
        with self._lock:
            return _clean(dict(self._state))

    def join(self, timeout: float | None = None) -> bool:
        """Waits for a running burst; True when none is left running."""
        t = self._thread
        if t is not None:
            t.join(timeout)
        return t is None or not t.is_alive()


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    text = text[0] if text else type(e).__name__
    return text if isinstance(e, (AppError, ValueError)) else f"{type(e).__name__}: {text}"


class AppServer(ThreadingHTTPServer):
    """The page's server: a Home, the burst runner, and the model's input shape and classes (read once); its
    connections bounded in number and each request in time (connections.py)."""

    daemon_threads = True
    request_queue_size = 128  # a burst of connections waits in the kernel for accept(), not refused there

    def __init__(
        self,
        home: BaseHome,
        address: tuple[str, int],
        *,
        request_timeout: float = REQUEST_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ):
        self.home = home
        self.burst = Burst(home)
        self.input_shape = tuple(home.input_shape())
        self.input_range = (
            home.input_range()
        )  # the page sends pixels in it (0..255 for a pipeline that scales)
        self.classes = home.num_classes
        self.text = isinstance(home, TextHome)
        self.request_timeout = float(request_timeout)
        self.connections = Connections(max_connections)
        # a body holds the pixels and a few fields; twice the input's numbers leaves room for any nesting
        self.max_items = max(1024, 2 * math.prod(self.input_shape) + 64)
        try:
            super().__init__(address, Handler)
        except OSError as e:  # the port is taken (another serve), or one below 1024 needs privileges
            raise AppError(
                f"port {address[1]} cannot be served ({e.strerror or e}): use another --port, or 0 for any free port"
            ) from None

    def process_request(self, request, client_address) -> None:
        if not self.connections.admit(request):
            refuse(
                request,
                f"the app is answering {self.connections.cap} requests at once, as many as it takes; "
                "try again in a moment",
            )
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.connections.release(request)
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release(request)

    def server_close(self) -> None:
        super().server_close()
        self.connections.close_all()

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # the browser went away (a closed tab, a phone gone to sleep): nothing to report
        super().handle_error(request, client_address)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.server_address[0]}:{self.port}/"


class Handler(BaseHTTPRequestHandler):
    server: AppServer
    server_version = "android_demo"
    protocol_version = "HTTP/1.1"

    # ---- plumbing --------------------------------------------------------------------------------------------
    def log_message(self, format: str, *args: Any) -> None:  # quiet: a phone's terminal is small
        pass

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # makefile's reader; this one gives each read only what is left of the request's time
        self._reader = DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)
        self._linger = False

    def handle(self) -> None:
        super().handle()
        if self._linger:  # an error answered before the body was read: let the client read it, then close
            self.server.connections.reading(self.request)
            linger(
                self.connection,
                seconds=min(LINGER_SECONDS, self.server.request_timeout),
                max_bytes=4 * MAX_BODY,
            )

    def handle_one_request(self) -> None:
        # the request's time starts when the connection begins to wait for it: the request line, headers and body
        # must all arrive within request_timeout (an idle kept-alive connection is closed then too)
        self.server.connections.reading(self.request)
        self._reader.deadline = time.monotonic() + self.server.request_timeout
        self.raw_requestline, self.command, self._answered = b"", "", False
        super().handle_one_request()  # closes the connection quietly when a read runs out of time
        if self._reader.expired and self.raw_requestline.strip() and not self._answered:
            self._error(
                HTTPStatus.REQUEST_TIMEOUT,
                f"the request's headers did not arrive within {self.server.request_timeout:g} s; "
                "send a request whole at once",
            )

    def parse_request(self) -> bool:
        self._reader.budget = MAX_HEADER_BYTES
        try:
            return super().parse_request()
        except HeadersTooLarge as e:
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"{e}; a browser sends a few KB")
            return False
        finally:
            self._reader.budget = None

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self._answered = True
        self.connection.settimeout(self.server.request_timeout)  # a client that does not read is dropped too
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(_clean(obj), allow_nan=False).encode(), "application/json")

    def _error(self, status: int, message: str) -> None:
        self.close_connection = True  # the body may be left unread: a kept-alive connection would misread it
        self._linger = not self._reader.expired  # a client out of time gets its answer and is closed at once
        try:
            self._json(status, {"error": message})
        except OSError:
            pass  # the client went away, or its connection was dropped to make room

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # http.server's own errors (a malformed request line, an unknown method) as JSON too, never an HTML page
        self._error(code, message or HTTPStatus(code).phrase)

    def _length(self) -> int:
        """The body's size from Content-Length: digits only, one value, at most MAX_BODY."""
        if self.headers.get("Transfer-Encoding") is not None:
            raise ApiError("send the body with a Content-Length; a chunked body is not read")
        values = {v.strip() for v in self.headers.get_all("Content-Length") or []}
        if len(values) > 1:
            raise ApiError(f"Content-Length given twice, as {' and '.join(sorted(values))}; send one")
        text = values.pop() if values else "0"
        if not re.fullmatch(r"[0-9]{1,15}", text):
            raise ApiError(f"Content-Length {text[:20]!r} is not a number of bytes")
        n = int(text)
        if n > MAX_BODY:
            raise ApiError(
                f"a body of {n} bytes; at most {MAX_BODY} (a drawing is about 10 KB)",
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            )
        return n

    def _body(self) -> dict[str, Any]:
        """The request's JSON object, read within the request's time and checked before it is parsed."""
        ctype, _, params = self.headers.get("Content-Type", "").partition(";")
        ctype = ctype.strip().lower()
        if ctype != "application/json":
            raise ApiError(f"send JSON (Content-Type: application/json), not {ctype or 'no content type'}")
        charset = re.search(r"charset\s*=\s*\"?([^\";\s]*)", params, re.IGNORECASE)
        if charset and charset.group(1).lower() not in ("utf-8", "utf8"):
            raise ApiError(f"a body in {charset.group(1)!r}; send JSON as UTF-8 (charset=utf-8)")
        n = self._length()
        try:
            raw = self.rfile.read(n) if n else b""
        except TimeoutError:
            raise ApiError(
                f"the body did not arrive within {self.server.request_timeout:g} s; send a request whole at once",
                HTTPStatus.REQUEST_TIMEOUT,
            ) from None
        if len(raw) < n:
            raise ApiError(f"the body ended after {len(raw)} of the {n} bytes its Content-Length says")
        return api_json.parse(raw, max_items=self.server.max_items)

    def _host_ok(self) -> bool:
        host = self.headers.get("Host", "")
        try:
            name = urlsplit("//" + host).hostname
        except ValueError:
            return False
        return name in LOOPBACK

    def _handle(self, routes: dict[str, Callable[..., tuple[int, Any] | None]]) -> None:
        path = urlsplit(self.path).path
        try:
            if not self._host_ok():
                raise ApiError("this app answers only to 127.0.0.1 or localhost", HTTPStatus.FORBIDDEN)
            route = routes.get(path)
            if route is None:
                if path.startswith("/api/") or self.command != "GET":
                    raise ApiError(
                        f"no {self.command} {path}; see android_demo/server.py", HTTPStatus.NOT_FOUND
                    )
                raise ApiError(f"no page {path}", HTTPStatus.NOT_FOUND)
            if self.command == "POST":
                args: tuple[Any, ...] = (self._body(),)
            elif self.headers.get("Transfer-Encoding") is not None or self._length():
                raise ApiError(f"a {self.command} request has no body; send it without one")
            else:
                args = ()
            if not self.server.connections.answering(self.request):
                self.close_connection = True  # dropped to make room while it trickled in: no one waits for it
                return
            out = route(*args)
            if out is not None:
                self._json(*out)
        except ApiError as e:
            self._error(e.status, str(e))
        except VersionError as e:  # the app's model, not the request: what would work is said on the page
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, _one_line(e))
        except (AppError, ValueError) as e:  # the app refused it: a label out of range, a wrong shape
            self._error(HTTPStatus.BAD_REQUEST, _one_line(e))
        except Exception as e:  # a bug or a damaged home: one line here, the traceback on the terminal
            traceback.print_exc(file=sys.stderr)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, _one_line(e))

    def do_GET(self) -> None:
        routes = {p: (lambda p=p: self._static(p)) for p in PAGES}
        routes.update(
            {
                "/api/status": self._status,
                "/api/progress": lambda: (HTTPStatus.OK, self.server.burst.state()),
                "/api/history": self._history,
            }
        )
        self._handle(routes)

    def do_HEAD(self) -> None:
        self._handle({p: (lambda p=p: self._static(p)) for p in PAGES})

    def do_POST(self) -> None:
        routes = {"/api/personalize": self._personalize}
        if self.server.text:
            routes.update({"/api/suggest": self._suggest, "/api/send": self._send_text})
        else:
            routes.update({"/api/predict": self._predict, "/api/add": self._add})
        self._handle(routes)

    # ---- the page and the API --------------------------------------------------------------------------------
    def _static(self, path: str) -> None:
        name, ctype = PAGES[path]
        if self.server.text and name == "index.html":
            name = TEXT_PAGE
        with open(os.path.join(STATIC, name), "rb") as f:
            self._send(HTTPStatus.OK, f.read(), ctype)

    def _status(self) -> tuple[int, Any]:
        st = self.server.home.status()
        return HTTPStatus.OK, {
            **st,
            "input_shape": list(self.server.input_shape),
            "input_range": list(self.server.input_range),
            "classes": self.server.classes,
            "mode": "text" if self.server.text else "digits",
        }

    def _text(self, body: dict[str, Any], path: str) -> str:
        api_json.only(body, path, "text")
        text = body.get("text")
        if not isinstance(text, str):
            raise ApiError(f'{path} takes {{"text": "..."}}: a JSON string')
        if len(text) > MAX_TEXT:
            raise ApiError(f'"text" of {len(text)} characters; at most {MAX_TEXT}')
        return text

    def _suggest(self, body: dict[str, Any]) -> tuple[int, Any]:
        best, version = self.server.home.suggest(self._text(body, "/api/suggest"), 3, with_version=True)
        return HTTPStatus.OK, {"words": best, "version": version}

    def _send_text(self, body: dict[str, Any]) -> tuple[int, Any]:
        home = self.server.home
        ids = home.add_text(self._text(body, "/api/send"))
        return HTTPStatus.OK, {"ids": ids, "samples": home.sample_count()}

    def _history(self) -> tuple[int, Any]:
        home = self.server.home
        return HTTPStatus.OK, {"points": home.accuracy_by_version(), "version": home.version}

    def _pixels(self, body: dict[str, Any]) -> np.ndarray:
        """The request's "pixels" as the model's input sample, or an ApiError saying what is expected."""
        return api_json.pixels(body, self.server.input_shape, tuple(self.server.input_range))

    def _predict(self, body: dict[str, Any]) -> tuple[int, Any]:
        api_json.only(body, "/api/predict", "pixels")
        x = self._pixels(body)
        home = self.server.home
        probs, version = home.predict(x[None], with_version=True)
        p = probs[0]
        k = int(np.argmax(p))
        return HTTPStatus.OK, {
            "probabilities": [float(v) for v in p],
            "prediction": k,
            "confidence": float(p[k]),
            "version": version,
        }

    def _add(self, body: dict[str, Any]) -> tuple[int, Any]:
        api_json.only(body, "/api/add", "pixels", "label")
        x = self._pixels(body)
        label = api_json.label(body, self.server.classes)
        home = self.server.home
        sid = home.add(x, label)
        return HTTPStatus.OK, {"id": sid, "label": label, "samples": home.sample_count()}

    def _personalize(self, body: dict[str, Any]) -> tuple[int, Any]:
        api_json.only(body, "/api/personalize", "force")
        force = body.get("force", False)
        if not isinstance(force, bool):
            raise ApiError('"force" must be true or false')
        if not self.server.burst.start(force=force):
            raise ApiError("a burst is running; wait for it (GET /api/progress)", HTTPStatus.CONFLICT)
        return HTTPStatus.ACCEPTED, {"started": True}


def make_server(
    home: BaseHome,
    *,
    port: int = 8765,
    host: str = "127.0.0.1",
    request_timeout: float = REQUEST_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
) -> AppServer:
    """The server, bound and listening but not yet serving (port 0: any free port; `.port` tells which). Loopback
    only: the API has no login, so it must not be reachable from the network. request_timeout: seconds for a
    request (line, headers and body) to arrive whole; max_connections: connections open at once (a thread each)."""
    if host not in LOOPBACK:
        raise AppError(
            f"host {host!r}: the page is served on the phone itself only ({' or '.join(LOOPBACK)})"
        )
    port = _checked(
        lambda: count(port, "port", lo=0, hi=65535), f"port {port!r}: use 1 to 65535, or 0 for any free port"
    )
    request_timeout = _checked(
        lambda: number(request_timeout, "request timeout", lo=MIN_TIMEOUT, hi=3600),
        f"request timeout {request_timeout!r}: use seconds above 0 ({MIN_TIMEOUT:g} at least) and at most 3600 "
        f"(default {REQUEST_TIMEOUT:g})",
    )
    max_connections = _checked(
        lambda: count(max_connections, "max connections", lo=1, hi=10_000),
        f"max connections {max_connections!r}: use a whole number from 1 to 10000 (default {MAX_CONNECTIONS})",
    )
    return AppServer(
        home, ("127.0.0.1", port), request_timeout=request_timeout, max_connections=max_connections
    )


def _checked(check: Callable[[], Any], message: str) -> Any:
    """check() (loaders/values.py's), its refusal said as the server's options say theirs."""
    try:
        return check()
    except ConfigError:
        raise AppError(message) from None


def serve(
    home: BaseHome,
    *,
    port: int = 8765,
    host: str = "127.0.0.1",
    ready: Callable[[int], Any] | None = None,
    request_timeout: float = REQUEST_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
) -> None:
    """Serves the page until Ctrl-C; `ready` (if given) gets the bound port once the server listens."""
    server = make_server(
        home, port=port, host=host, request_timeout=request_timeout, max_connections=max_connections
    )
    try:
        print(f"open {server.url} in the phone's browser (Ctrl-C stops)", flush=True)
        if ready is not None:
            ready(server.port)  # the socket listens already: a request made now waits for serve_forever
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if not server.burst.join(0):
            print(
                "waiting for the running burst to finish (Ctrl-C again leaves it; the model stays safe)",
                flush=True,
            )
            try:
                server.burst.join()
            except KeyboardInterrupt:
                pass
    print("stopped", flush=True)
