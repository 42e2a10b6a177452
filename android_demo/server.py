"""`serve`: the app's page for the phone's own browser -> a standard-library HTTP server on 127.0.0.1 serving
android_demo/static/ and a small JSON API; everything it does goes through Home, like the commands.

    GET  /api/status        Home.status() + {"input_shape": [1, 28, 28], "input_range": [0, 255], "classes": 10}
    POST /api/predict       {"pixels": [...]} -> {"probabilities", "prediction", "confidence", "version"}
    POST /api/add           {"pixels": [...], "label": k} -> {"id", "label", "samples"}
    POST /api/personalize   {"force": false}? -> 202 {"started": true}: one burst in a background thread; 409 while
                            one runs
    GET  /api/progress      {"running", "step", "of", "loss", "result": BurstResult fields | null, "error"}
    GET  /api/history       {"points": Home.accuracy_by_version(), "version": the current version}

"pixels" is the model's input as nested lists (for the digits model [1, 28, 28], or [28, 28]: singleton axes may be
left out), raw values in the range the model's input pipeline takes ("input_range" of /api/status: 0..255 for the
digits model, whose pipeline divides by 255; [0, 1] for a model that declares none). A bad request gets a 400 and
{"error": "one line"}; nothing answers with a traceback.
Only loopback addresses are served, and only to requests that name a loopback host (a page of another site cannot
reach the app through DNS rebinding) and send JSON (a plain cross-site form cannot post to it).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import asdict
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from .app import AppError, Home

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
PAGES = {  # the only files served: no path from a request ever reaches the file system
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}
LOOPBACK = ("127.0.0.1", "localhost")
MAX_BODY = 1 << 20  # a 28x28 drawing as JSON is about 10 KB


class ApiError(Exception):
    """A request the API refuses (400 unless said otherwise); its message is the one line the page shows."""

    def __init__(self, message: str, status: int = HTTPStatus.BAD_REQUEST):
        super().__init__(message)
        self.status = status


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

    def __init__(self, home: Home):
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
    """The page's server: a Home, the burst runner, and the model's input shape and classes (read once)."""

    daemon_threads = True

    def __init__(self, home: Home, address: tuple[str, int]):
        self.home = home
        self.burst = Burst(home)
        self.input_shape = tuple(home.input_shape())
        self.input_range = (
            home.input_range()
        )  # the page sends pixels in it (0..255 for a pipeline that scales)
        self.classes = home.num_classes
        super().__init__(address, Handler)

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

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(_clean(obj), allow_nan=False).encode(), "application/json")

    def _error(self, status: int, message: str) -> None:
        self.close_connection = True  # the body may be left unread: a kept-alive connection would misread it
        self._json(status, {"error": message})

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # http.server's own errors (a malformed request line, an unknown method) as JSON too, never an HTML page
        try:
            self._error(code, message or HTTPStatus(code).phrase)
        except OSError:
            pass

    def _body(self) -> dict[str, Any]:
        ctype = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise ApiError(f"send JSON (Content-Type: application/json), not {ctype or 'no content type'}")
        try:
            n = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise ApiError("Content-Length is not a number") from None
        if n < 0 or n > MAX_BODY:
            raise ApiError(f"a body of {n} bytes; at most {MAX_BODY}", HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        raw = self.rfile.read(n) if n else b""
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(f"the body is not JSON ({e})") from None
        if not isinstance(body, dict):
            raise ApiError(f"the body must be a JSON object, not {type(body).__name__}")
        return body

    def _host_ok(self) -> bool:
        host = self.headers.get("Host", "")
        try:
            name = urlsplit("//" + host).hostname
        except ValueError:
            return False
        return name in LOOPBACK

    def _handle(self, routes: dict[str, Callable[[], tuple[int, Any] | None]]) -> None:
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
            out = route()
            if out is not None:
                self._json(*out)
        except ApiError as e:
            self._error(e.status, str(e))
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
        self._handle(
            {"/api/predict": self._predict, "/api/add": self._add, "/api/personalize": self._personalize}
        )

    # ---- the page and the API --------------------------------------------------------------------------------
    def _static(self, path: str) -> None:
        name, ctype = PAGES[path]
        with open(os.path.join(STATIC, name), "rb") as f:
            self._send(HTTPStatus.OK, f.read(), ctype)

    def _status(self) -> tuple[int, Any]:
        st = self.server.home.status()
        return HTTPStatus.OK, {
            **st,
            "input_shape": list(self.server.input_shape),
            "input_range": list(self.server.input_range),
            "classes": self.server.classes,
        }

    def _history(self) -> tuple[int, Any]:
        home = self.server.home
        return HTTPStatus.OK, {"points": home.accuracy_by_version(), "version": home.version}

    def _pixels(self, body: dict[str, Any]) -> np.ndarray:
        """The request's "pixels" as the model's input sample, or a ApiError saying what is expected."""
        shape = self.server.input_shape
        lo, hi = self.server.input_range
        want = f"{list(shape)} numbers in [{lo:g}, {hi:g}]"
        if "pixels" not in body:
            raise ApiError(f'no "pixels": send the drawing as {want}')
        try:
            x = np.asarray(body["pixels"], dtype=np.float64)
        except (ValueError, TypeError):
            raise ApiError(f'"pixels" must be nested lists of numbers: {want}') from None
        if x.shape != shape:
            if [d for d in x.shape if d != 1] != [d for d in shape if d != 1]:
                raise ApiError(f'"pixels" of shape {list(x.shape)}; the model takes {want}')
            x = x.reshape(shape)
        if not np.all(np.isfinite(x)) or x.min() < lo or x.max() > hi:
            raise ApiError(f'"pixels" must be {want}')
        return x.astype(np.float32)

    def _predict(self) -> tuple[int, Any]:
        x = self._pixels(self._body())
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

    def _add(self) -> tuple[int, Any]:
        body = self._body()
        x = self._pixels(body)
        label = body.get("label")
        if isinstance(label, bool) or not isinstance(label, (int, float)):
            classes = self.server.classes
            raise ApiError(
                '"label" must be a class number' + (f" from 0 to {classes - 1}" if classes else "")
            )
        home = self.server.home
        sid = home.add(x, label)
        return HTTPStatus.OK, {"id": sid, "label": label, "samples": home.sample_count()}

    def _personalize(self) -> tuple[int, Any]:
        body = self._body()
        force = body.get("force", False)
        if not isinstance(force, bool):
            raise ApiError('"force" must be true or false')
        if not self.server.burst.start(force=force):
            raise ApiError("a burst is running; wait for it (GET /api/progress)", HTTPStatus.CONFLICT)
        return HTTPStatus.ACCEPTED, {"started": True}


def make_server(home: Home, *, port: int = 8765, host: str = "127.0.0.1") -> AppServer:
    """The server, bound and listening but not yet serving (port 0: any free port; `.port` tells which). Loopback
    only: the API has no login, so it must not be reachable from the network."""
    if host not in LOOPBACK:
        raise AppError(
            f"host {host!r}: the page is served on the phone itself only ({' or '.join(LOOPBACK)})"
        )
    if not 0 <= port <= 65535:
        raise AppError(f"port {port}: use 1 to 65535, or 0 for any free port")
    return AppServer(home, ("127.0.0.1", port))


def serve(
    home: Home, *, port: int = 8765, host: str = "127.0.0.1", ready: Callable[[int], Any] | None = None
) -> None:
    """Serves the page until Ctrl-C; `ready` (if given) gets the bound port once the server listens."""
    server = make_server(home, port=port, host=host)
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
