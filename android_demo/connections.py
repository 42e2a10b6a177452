"""The page server's connections -> bounded ones: each request has a total deadline (request line, headers and body
together, however slowly they trickle in), and at most a fixed number of connections are open at once; a new one
beyond that takes the place of the connection that has waited longest for its request, or, when every one is
being answered, is refused at once with a 503."""

from __future__ import annotations

import io
import json
import math
import socket
import threading
import time
from dataclasses import dataclass, field

REQUEST_TIMEOUT = (
    10.0  # seconds for a whole request to arrive; the page's requests take milliseconds on loopback
)
MAX_CONNECTIONS = 32  # a browser opens about 6 per host; each connection is a thread
MAX_HEADER_BYTES = 64 << 10  # a browser's headers are a few KB; http.server alone allows 100 lines of 64 KB


class HeadersTooLarge(ConnectionError):
    """The request's headers ran past MAX_HEADER_BYTES (the handler answers 431)."""


class DeadlineReader(io.RawIOBase):
    """A connection's reads, each given only what is left of the request's time: a client that sends a byte a
    second runs out of it as surely as one that sends nothing (a per-recv timeout alone would wait forever).
    `deadline` is a time.monotonic() value; `budget`, when set, is how many more bytes may be read."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.deadline = math.inf
        self.budget: int | None = None
        self.expired = False  # set once a read ran out of time

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.expired = True
            raise TimeoutError("the request did not arrive in time")
        if self.budget is not None and self.budget <= 0:
            raise HeadersTooLarge(f"the request's headers are over {MAX_HEADER_BYTES} bytes")
        self.sock.settimeout(left)
        try:
            n = self.sock.recv_into(buffer)
        except TimeoutError:
            self.expired = True
            raise
        if self.budget is not None:
            self.budget -= n
        return n


@dataclass(eq=False)
class _Open:
    sock: socket.socket
    since: float = field(default_factory=time.monotonic)  # when it began to wait for its current request
    reading: bool = True  # waiting for a request (line, headers or body), or lingering after an error


class Connections:
    """The open connections, at most `cap`. A connection is either reading (waiting for its request to arrive) or
    answering it. Reading ones can be dropped: when the cap is reached, a new connection takes the slot of the one
    that has waited longest, which is what a slow client (slowloris) holds; a client that sends its request at
    once is the newest and keeps its slot. A connection whose request is being answered is never dropped."""

    def __init__(self, cap: int):
        self.cap = cap
        self._lock = threading.Lock()
        self._open: dict[socket.socket, _Open] = {}
        self.dropped = 0  # connections closed to make room, since the server started
        self.refused = 0  # connections answered 503

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def admit(self, sock: socket.socket) -> bool:
        """Takes a new connection; False when all `cap` are being answered (the caller refuses it)."""
        with self._lock:
            if len(self._open) >= self.cap:
                waiting = [c for c in self._open.values() if c.reading]
                if not waiting:
                    self.refused += 1
                    return False
                oldest = min(waiting, key=lambda c: c.since)
                del self._open[oldest.sock]
                self.dropped += 1
                _cut(oldest.sock)  # its thread's blocked read returns at once, as at the end of the stream
            self._open[sock] = _Open(sock)
            return True

    def reading(self, sock: socket.socket) -> None:
        """The connection waits for its next request (or lingers): it may be dropped to make room."""
        with self._lock:
            c = self._open.get(sock)
            if c is not None:
                c.reading, c.since = True, time.monotonic()

    def answering(self, sock: socket.socket) -> bool:
        """The connection's request has arrived whole: it keeps its slot until answered. False when it was
        dropped meanwhile (nothing must be done for it: its client gets no answer)."""
        with self._lock:
            c = self._open.get(sock)
            if c is None:
                return False
            c.reading = False
            return True

    def release(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.pop(sock, None)

    def close_all(self) -> None:
        """Cuts every connection (the server stops): their threads end without waiting for slow clients."""
        with self._lock:
            for c in self._open.values():
                _cut(c.sock)
            self._open.clear()


def _cut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by its client


def refuse(sock: socket.socket, message: str) -> None:
    """A 503 with a JSON error, written without waiting (a new socket's buffer takes it whole), then closed."""
    body = json.dumps({"error": message}).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
    )
    try:
        sock.setblocking(False)
        sock.sendall(head.encode() + body)
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1 << 16)  # what the client sent already: closing with it unread would reset the connection
    except OSError:
        pass
    sock.close()


def linger(sock: socket.socket, *, seconds: float, max_bytes: int) -> None:
    """After an error answered before the body was read: the write side is closed, and what the client still
    sends is read and dropped for a moment, so that closing does not reset the connection (a reset can destroy
    the answer before the client reads it)."""
    try:
        sock.shutdown(socket.SHUT_WR)
        end = time.monotonic() + seconds
        while max_bytes > 0:
            left = end - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            chunk = sock.recv(min(1 << 16, max_bytes))
            if not chunk:
                break
            max_bytes -= len(chunk)
    except OSError:
        pass
