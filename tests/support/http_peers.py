"""Loopback HTTP servers that answer the way real servers do, each in its own way: for the
client tests (issue 22, item 12).

    with HttpPeer(respond, Style(version="HTTP/1.0")) as peer:
        ... DeadlineHttp(peer.url, ...) ...
        peer.requests        # every request received (method, target, headers, body)
        peer.connections     # connections accepted

``respond(request) -> (status, body)`` decides the answer; a :class:`Style` decides how it goes
on the wire: HTTP/1.0 or 1.1, kept alive or closed after the answer, sized, chunked or ended by
the close, in one write or in many, headers or body trickled a byte at a time, or no answer at
all. Raw sockets, so nothing is smoothed over. Only 127.0.0.1; every wait ends when the server
stops.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Framing = Literal["length", "chunked", "eof"]


@dataclass(frozen=True)
class Style:
    version: str = "HTTP/1.1"
    close: bool = False  # close the connection after each answer (says Connection: close)
    framing: Framing = "length"  # Content-Length, chunked, or the body ends with the close
    writes: Literal["one", "many"] = "one"  # status+headers+body in one send, or in pieces
    pause: float = 0.05  # seconds between the pieces of "many"
    trickle_headers: float = 0.0  # seconds between the bytes of the status line and headers
    trickle_body: float = 0.0  # seconds between the bytes of the body
    answer: bool = True  # False: read the request, then never answer
    close_idle_after: float | None = None  # keep-alive, but close an idle connection after this
    announce_close: bool = True  # say "Connection: close" (HTTP/1.1) when closing
    truncate_body: int | None = None  # send only this many bytes of a sized body, then close
    extra: bytes = b""  # sent in the same write right after each answer (one write only)
    # The race of an idle timeout, made certain: the connection's request number drop_at is
    # read, then the connection closed after sending drop_sends (FIN, or RST with drop_reset).
    drop_at: int | None = None
    drop_sends: bytes = b""
    drop_reset: bool = False

    def __str__(self) -> str:
        closes = self.close or self.framing == "eof"
        parts = [self.version, "close" if closes else "keep-alive", self.framing, self.writes]
        if self.trickle_headers:
            parts.append("trickle-headers")
        if self.trickle_body:
            parts.append("trickle-body")
        if not self.answer:
            parts.append("never-answers")
        return " ".join(parts)


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


Responder = Callable[[Request], tuple[int, bytes]]


@dataclass
class _Stats:
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    closed: int = 0  # connections the server has closed
    closed_idle: int = 0


class HttpPeer:
    def __init__(self, respond: Responder, style: Style | None = None) -> None:
        self.respond = respond
        self.style = style or Style()
        self.stopping = threading.Event()
        self._stats = _Stats()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._threads: list[threading.Thread] = []
        self._open: set[socket.socket] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._stats.requests)

    @property
    def connections(self) -> int:
        with self._lock:
            return self._stats.connections

    @property
    def closed(self) -> int:
        with self._lock:
            return self._stats.closed

    @property
    def closed_idle(self) -> int:
        with self._lock:
            return self._stats.closed_idle

    def __enter__(self) -> HttpPeer:
        thread = threading.Thread(target=self._accept, daemon=True, name="http-peer")
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept() (close alone does not)
        self._listener.close()
        with self._lock:
            for conn in self._open:  # wake the connections waiting for a request
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        for thread in list(self._threads):
            thread.join(timeout=5)

    # -- serving ----------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._stats.connections += 1
                self._open.add(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        buffer = b""
        idle = threading.Event()  # the server dropped the connection for idling
        served = 0
        try:
            while not self.stopping.is_set():
                request, buffer = self._read_request(conn, buffer, idle)
                if request is None:
                    return
                with self._lock:
                    self._stats.requests.append(request)
                served += 1
                if served == self.style.drop_at:
                    conn.sendall(self.style.drop_sends)
                    if self.style.drop_reset:  # close() then sends RST, not FIN
                        conn.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                    return
                if not self.style.answer:
                    self.stopping.wait(120)
                    return
                status, body = self.respond(request)
                closing = self._answer(conn, request, status, body)
                if closing:
                    return
                if self.style.close_idle_after is not None and not buffer:
                    conn.settimeout(self.style.close_idle_after)
        except OSError:
            return
        finally:
            # Closed first, counted after: a test that waits for the count may then rely on
            # the FIN having been sent (counted first, the client could poll before it left).
            with self._lock:
                self._open.discard(conn)
            conn.close()
            with self._lock:
                self._stats.closed += 1
                if idle.is_set():
                    self._stats.closed_idle += 1

    def _read_request(
        self, conn: socket.socket, buffer: bytes, idle: threading.Event
    ) -> tuple[Request | None, bytes]:
        while b"\r\n\r\n" not in buffer:
            try:
                chunk = conn.recv(65536)
            except TimeoutError:  # idle for close_idle_after: the server drops the connection
                idle.set()  # counted once it is closed
                return None, b""
            if not chunk:
                return None, b""
            buffer += chunk
        conn.settimeout(None)
        head, _, rest = buffer.partition(b"\r\n\r\n")
        line, *header_lines = head.decode("latin-1").split("\r\n")
        method, target, _ = line.split(" ", 2)
        headers = {}
        for header in header_lines:
            name, _, value = header.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return None, b""
            rest += chunk
        return Request(method, target, headers, rest[:length]), rest[length:]

    def _answer(self, conn: socket.socket, request: Request, status: int, body: bytes) -> bool:
        """Send the answer; True when the connection is to be closed after it."""
        style = self.style
        closing = style.close or style.framing == "eof" or style.truncate_body is not None
        head = [f"{style.version} {status} {'OK' if status == 200 else 'Status'}"]
        head.append("Content-Type: application/json")
        if style.framing == "length":
            head.append(f"Content-Length: {len(body)}")
        elif style.framing == "chunked":
            head.append("Transfer-Encoding: chunked")
        if closing and style.version == "HTTP/1.1" and style.announce_close:
            head.append("Connection: close")
        if not closing and style.version == "HTTP/1.0":
            head.append("Connection: keep-alive")
        header_bytes = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        if request.method == "HEAD":
            body = b""
        if style.framing == "chunked":
            pieces = [body[i : i + 7] for i in range(0, len(body), 7)]
            wire_body = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces)
            wire_body += b"0\r\n\r\n"
        else:
            wire_body = body if style.truncate_body is None else body[: style.truncate_body]
        if style.trickle_headers:
            self._trickle(conn, header_bytes, style.trickle_headers)
        elif style.writes == "one" and not style.trickle_body:
            conn.sendall(header_bytes + wire_body + style.extra)  # all of it in one write
            return closing
        else:
            conn.sendall(header_bytes)
        if style.trickle_body:
            self._trickle(conn, wire_body, style.trickle_body)
        elif style.writes == "many":
            # The body in three pieces, each after a pause (the client has read the headers
            # by the first one).
            third = max(1, -(-len(wire_body) // 3))
            for i in range(0, max(len(wire_body), 1), third):
                if self.stopping.wait(style.pause):
                    raise OSError("stopping")
                conn.sendall(wire_body[i : i + third])
        else:
            conn.sendall(wire_body)
        return closing

    def _trickle(self, conn: socket.socket, data: bytes, every: float) -> None:
        for i in range(len(data)):
            if self.stopping.wait(every if i else 0):
                raise OSError("stopping")
            conn.sendall(data[i : i + 1])
