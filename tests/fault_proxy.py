"""A fault-injecting HTTP proxy for the remote tests (stdlib only).

``FaultProxy(upstream)`` listens on 127.0.0.1 at a free port and forwards
each HTTP/1.1 request to ``upstream`` (the moto server), one upstream
connection per client connection, keep-alive on both sides; a chunked
upstream body is decoded and sent on with a Content-Length. Point obstore
at ``proxy.endpoint`` (storage_options ``endpoint`` or AWS_ENDPOINT_URL)
and the proxy sits between the client and the server.

A ``Schedule`` decides, request by request, which fault (or none) the proxy
applies. Only requests matching ``method`` (a regex on the method) and
``path`` (a regex searched in the path and query) count; the n-th matching
request gets ``script[n]`` while the script lasts, then a kind drawn with
``probabilities`` from ``random.Random(seed)``: the same schedule gives the
same sequence of faults, recorded in ``proxy.log`` (every request, matching
or not, with the fault applied). The kinds:

- ``500``, ``503``: that status with an S3 error body, upstream not called;
  ``503-retry-after`` adds ``Retry-After: 1``;
- ``reset``: the request read, the connection closed with SO_LINGER 0 (an
  RST) before any answer; ``reset-body``: the status line, the headers and
  half the body sent, then an RST;
- ``stall``: no answer for ``stall_seconds`` (longer than the client's
  timeout; bounded: the proxy gives up then, or at stop), then close;
- ``truncate``: the headers with the full Content-Length, half the body,
  then a normal close (a body shorter than announced);
- ``short``: a body cut to half *and* a Content-Length saying so (a short
  answer the client cannot tell from a whole one: only the cache's length
  check catches it);
- ``flip``: one bit of the body flipped (position drawn from the schedule's
  random stream), the length unchanged.

``proxy.stats`` counts requests, request-body bytes and response-body bytes
forwarded per method. ``stop()`` closes the listener and every connection
and joins every thread within STOP_SECONDS; every socket wait is bounded.
"""

from __future__ import annotations

import dataclasses
import http.client
import random
import re
import socket
import struct
import threading
import urllib.parse

KINDS = (
    "500",
    "503",
    "503-retry-after",
    "reset",
    "reset-body",
    "stall",
    "truncate",
    "short",
    "flip",
)
IDLE_SECONDS = 0.25  # a connection thread wakes this often to see stop()
UPSTREAM_SECONDS = 10.0
STOP_SECONDS = 5.0
MAX_HEADER_BYTES = 64 * 1024
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "expect"}
)
_ERROR_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
    b"<Message>injected by fault_proxy</Message></Error>"
)


@dataclasses.dataclass
class Schedule:
    """Which requests get which faults (see the module docstring). ``script``
    items are kinds or None (pass); ``probabilities`` maps kinds to their
    chance per matching request after the script (the rest pass)."""

    script: list[str | None] = dataclasses.field(default_factory=list)
    probabilities: dict[str, float] = dataclasses.field(default_factory=dict)
    seed: int = 0
    method: str = ".*"
    path: str = ".*"
    stall_seconds: float = 3.0

    def __post_init__(self) -> None:
        for kind in [*self.script, *self.probabilities]:
            if kind is not None and kind not in KINDS:
                raise ValueError(f"fault kind {kind!r} is not one of {KINDS}")
        if sum(self.probabilities.values()) > 1.0:
            raise ValueError(f"fault probabilities sum to more than 1: {self.probabilities}")
        self._random = random.Random(self.seed)
        self._matched = 0

    def matches(self, method: str, target: str) -> bool:
        return bool(re.fullmatch(self.method, method) and re.search(self.path, target))

    def decide(self) -> tuple[str | None, float]:
        """The next matching request's fault (or None) and a uniform draw in
        [0, 1) that places it (which bit a flip flips)."""
        index = self._matched
        self._matched += 1
        if index < len(self.script):
            kind = self.script[index]
        else:
            kind = None
            draw, total = self._random.random(), 0.0
            for name, chance in self.probabilities.items():
                total += chance
                if draw < total:
                    kind = name
                    break
        return kind, self._random.random()


@dataclasses.dataclass(frozen=True)
class Record:
    """One request the proxy saw: its number, method, path (with query), and
    the fault applied (None: forwarded untouched); ``matched``: counted by
    the schedule."""

    index: int
    method: str
    path: str
    fault: str | None
    matched: bool


@dataclasses.dataclass
class MethodStats:
    requests: int = 0
    bytes_up: int = 0  # request bodies forwarded to the server
    bytes_down: int = 0  # response bodies sent to the client


class _Closed(Exception):
    """The client closed its connection (or the proxy is stopping)."""


class _Reader:
    """Buffered reads from a socket whose timeout only wakes the reader to
    look at ``stop`` (a file from socket.makefile refuses every read after
    one timeout, which would end each kept-alive connection once idle)."""

    def __init__(self, sock: socket.socket, stop: threading.Event):
        self.sock = sock
        self.stop = stop
        self.buffer = bytearray()

    def _fill(self) -> bool:
        """Read more into the buffer; False at EOF."""
        while True:
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                if self.stop.is_set():
                    raise _Closed() from None
                continue
            if not data:
                return False
            self.buffer += data
            return True

    def readline(self) -> bytes:
        """One line with its newline; what is left (maybe b"") at EOF."""
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                line = bytes(self.buffer[: end + 1])
                del self.buffer[: end + 1]
                return line
            if len(self.buffer) > MAX_HEADER_BYTES:
                raise _Closed()  # not HTTP: drop the connection
            if not self._fill():
                line = bytes(self.buffer)
                self.buffer.clear()
                return line

    def read_exact(self, count: int) -> bytes:
        while len(self.buffer) < count:
            if not self._fill():
                raise _Closed()
        data = bytes(self.buffer[:count])
        del self.buffer[:count]
        return data


class FaultProxy:
    """A proxy to ``upstream`` (http://host:port) on 127.0.0.1, applying
    ``schedule`` (none: forward everything). Use as a context manager, or
    ``start()`` / ``stop()``."""

    def __init__(self, upstream: str, schedule: Schedule | None = None):
        parts = urllib.parse.urlsplit(upstream)
        if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the proxy forwards only to this machine, not {upstream}")
        self.upstream = (parts.hostname, parts.port or 80)
        self.schedule = schedule or Schedule()
        self.log: list[Record] = []
        self.stats: dict[str, MethodStats] = {}
        self.connections = 0  # client connections accepted
        self.chunked_responses = 0  # upstream answers in chunks (sent on with a length)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sockets: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(IDLE_SECONDS)
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    # ---- life cycle

    def start(self) -> FaultProxy:
        thread = threading.Thread(target=self._accept_loop, name="fault-proxy", daemon=True)
        self._threads.append(thread)
        thread.start()
        return self

    def stop(self) -> None:
        """Close everything and join every thread (bounded)."""
        self._stop.set()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its thread
        for thread in list(self._threads):
            thread.join(STOP_SECONDS)
        self._listener.close()
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"fault proxy threads still running after stop: {alive}")

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def faults(self) -> list[str]:
        """The faults applied so far, in order (the log without the passes)."""
        with self._lock:
            return [r.fault for r in self.log if r.fault is not None]

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return  # the listener was closed
            client.settimeout(IDLE_SECONDS)
            with self._lock:
                self.connections += 1
                self._sockets.add(client)
                thread = threading.Thread(
                    target=self._serve, args=(client,), name="fault-proxy-conn", daemon=True
                )
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    # ---- one client connection

    def _serve(self, client: socket.socket) -> None:
        reader = _Reader(client, self._stop)
        upstream = http.client.HTTPConnection(*self.upstream, timeout=UPSTREAM_SECONDS)
        try:
            while not self._stop.is_set():
                request = self._read_request(client, reader)
                if request is None:
                    return
                if not self._answer(client, upstream, *request):
                    return
        except (_Closed, OSError, http.client.HTTPException):
            return
        finally:
            upstream.close()
            with self._lock:
                self._sockets.discard(client)
            client.close()

    def _read_request(self, client, reader) -> tuple[str, str, list[tuple[str, str]], bytes] | None:
        line = reader.readline()
        while line in (b"\r\n", b"\n"):
            line = reader.readline()
        if not line:
            return None
        method, target, _ = line.decode("latin-1").split(" ", 2)
        headers = []
        while True:
            raw = reader.readline()
            if raw in (b"\r\n", b"\n", b""):
                break
            name, _, value = raw.decode("latin-1").partition(":")
            headers.append((name.strip(), value.strip()))
        fields = {n.lower(): v for n, v in headers}
        if fields.get("expect", "").lower() == "100-continue":
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        if fields.get("transfer-encoding", "").lower() == "chunked":
            body = self._read_chunked(reader)
        else:
            body = reader.read_exact(int(fields.get("content-length", "0")))
        return method, target, headers, body

    def _read_chunked(self, reader) -> bytes:
        chunks = []
        while True:
            size = int(reader.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while reader.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            chunks.append(reader.read_exact(size))
            reader.read_exact(2)  # the CRLF after each chunk

    # ---- faults and forwarding

    def _decide(self, method: str, target: str, body: bytes) -> tuple[str | None, float]:
        with self._lock:
            matched = self.schedule.matches(method, target)
            kind, draw = self.schedule.decide() if matched else (None, 0.0)
            self.log.append(Record(len(self.log), method, target, kind, matched))
            stats = self.stats.setdefault(method, MethodStats())
            stats.requests += 1
            stats.bytes_up += len(body)
        return kind, draw

    def _answer(self, client, upstream, method, target, headers, body) -> bool:
        """Answer one request (forwarded, or a fault); whether to keep the connection."""
        kind, draw = self._decide(method, target, body)
        if kind in ("500", "503", "503-retry-after"):
            code = kind[:3]
            extra = [("Retry-After", "1")] if kind == "503-retry-after" else []
            payload = _ERROR_BODY.replace(
                b"{code}", b"InternalError" if code == "500" else b"SlowDown"
            )
            self._send(
                method, client, int(code), extra + [("Content-Type", "application/xml")], payload
            )
            return True
        if kind == "reset":
            _reset(client)
            return False
        if kind == "stall":
            self._stop.wait(self.schedule.stall_seconds)
            _reset(client)
            return False
        forward = [(n, v) for n, v in headers if n.lower() not in _HOP_BY_HOP]
        upstream.request(method, target, body=body, headers=dict(forward))
        response = upstream.getresponse()
        chunked = response.chunked
        payload = response.read()  # http.client decodes a chunked body
        if chunked:
            with self._lock:
                self.chunked_responses += 1
        out = [(n, v) for n, v in response.getheaders() if n.lower() not in _HOP_BY_HOP]
        if method == "HEAD" or not payload or kind is None:
            self._send(method, client, response.status, out, payload, head=method == "HEAD")
            return True
        return self._send_faulty(method, client, response.status, out, payload, kind, draw)

    def _send_faulty(self, method, client, status, headers, payload, kind, draw) -> bool:
        half = payload[: len(payload) // 2]
        if kind == "flip":
            bit = int(draw * len(payload) * 8)
            flipped = bytearray(payload)
            flipped[bit // 8] ^= 1 << (bit % 8)
            self._send(method, client, status, headers, bytes(flipped))
            return True
        if kind == "short":
            self._send(method, client, status, headers, half)
            return True
        self._send(method, client, status, headers, half, length=len(payload))
        if kind == "reset-body":
            _reset(client)
        else:  # truncate: an orderly close after too few bytes
            client.shutdown(socket.SHUT_RDWR)
        return False

    def _send(self, method, client, status, headers, payload, *, length=None, head=False) -> None:
        """Send a response; its body counts in the stats of the method it answers."""
        reason = http.client.responses.get(status, "Unknown")
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines += [f"{n}: {v}" for n, v in headers if n.lower() != "content-length"]
        if head:
            lines += [f"{n}: {v}" for n, v in headers if n.lower() == "content-length"]
            payload = b""
        else:
            lines.append(f"Content-Length: {len(payload) if length is None else length}")
        with self._lock:  # before sending: the client may look as soon as it has the body
            self.stats[method].bytes_down += len(payload)
        client.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with an RST (SO_LINGER on, zero seconds)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
