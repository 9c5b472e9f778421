"""HTTP/1.1 requests with an overall deadline and a body cap (stdlib ``http.client``).

A per-read timeout does not bound a request: a peer that sends one byte every few seconds
keeps every read inside its timeout forever, and an endless body grows memory until the unit
is killed. Here every socket read waits at most until the request's deadline (checked before
each read, and each read wakes at least every :data:`SLICE` seconds to look at the ``cancel``
event), so a request ends by its deadline however the peer behaves, and at once when the
process is stopping. The body is read up to the cap and no further.

One keep-alive connection per :class:`DeadlineHttp`, used by one thread at a time. Before a
request reuses it, the connection is checked as urllib3 does: if the peer has closed it while
idle (it is readable: EOF), a fresh one is opened. A request is never sent twice.
"""

from __future__ import annotations

import http.client
import io
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

SLICE = 0.25  # seconds: how often a blocked read looks at the cancel event


class RequestCancelled(Exception):
    """The request was abandoned because the process is stopping."""


class DeadlineExceeded(TimeoutError):
    """The request did not finish by its deadline."""


class BodyTooLarge(Exception):
    """The answer's body is larger than the cap."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes


class _Budget:
    """The running request's deadline and the cancel event, shared with its socket."""

    def __init__(self, cancel: threading.Event | None) -> None:
        self.cancel = cancel
        self.deadline = 0.0

    def left(self) -> float:
        if self.cancel is not None and self.cancel.is_set():
            raise RequestCancelled("stopping")
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded("deadline passed")
        return left


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: socket.socket, budget: _Budget, on_close: Callable[[], None]) -> None:
        self._sock = sock
        self._budget = budget
        self._on_close: Callable[[], None] | None = on_close

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close()
        super().close()

    def readinto(self, buffer: Any) -> int:
        while True:
            self._sock.settimeout(min(self._budget.left(), SLICE))
            try:
                return self._sock.recv_into(buffer)
            except TimeoutError:
                continue  # a slice passed: look at the deadline and the cancel event again


class _DeadlineSocket:
    """What ``http.client`` needs of a socket, with every read and write under the budget.

    Closed, it keeps the real socket open while a reader made from it is (as ``socket.socket``
    does): http.client closes the connection's socket as soon as it has the headers of an answer
    that closes the connection, and reads the body through that reader afterwards.
    """

    def __init__(self, sock: socket.socket, budget: _Budget) -> None:
        self._sock = sock
        self._budget = budget
        self._readers = 0
        self._closed = False

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(self._budget.left())
        self._sock.sendall(data)

    def makefile(self, mode: str, *args: Any, **kwargs: Any) -> io.BufferedReader:
        if "r" not in mode or "w" in mode:
            raise ValueError("only reading through a file is supported")
        self._readers += 1
        return io.BufferedReader(_DeadlineReader(self._sock, self._budget, self._reader_closed))

    def _reader_closed(self) -> None:
        self._readers -= 1
        if self._closed and self._readers <= 0:
            self._sock.close()

    def close(self) -> None:
        self._closed = True
        if self._readers <= 0:
            self._sock.close()

    def settimeout(self, value: float | None) -> None:
        self._sock.settimeout(value)

    def setsockopt(self, *args: Any) -> None:
        self._sock.setsockopt(*args)

    def fileno(self) -> int:
        return self._sock.fileno()


class _Connection(http.client.HTTPConnection):
    def __init__(
        self,
        host: str,
        port: int,
        budget: _Budget,
        connect_timeout: float,
        tls: ssl.SSLContext | None,
    ) -> None:
        super().__init__(host, port)
        self._budget = budget
        self._connect_timeout = connect_timeout
        self._tls = tls

    def connect(self) -> None:
        timeout = min(self._connect_timeout, self._budget.left())
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock = _DeadlineSocket(sock, self._budget)


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle keep-alive connection was closed by the peer (readable now: EOF)."""
    if conn.sock is None:
        return True
    poller = select.poll()
    poller.register(conn.sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class DeadlineHttp:
    def __init__(
        self,
        base_url: str,
        *,
        max_body: int,
        connect_timeout: float = 2.0,
        cancel: threading.Event | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.max_body = max_body
        self.connect_timeout = connect_timeout
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None
        self._budget = _Budget(cancel)
        self._conn: _Connection | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def request(
        self,
        method: str,
        target: str,
        *,
        timeout: float,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
    ) -> Answer:
        """``method`` ``target`` (path and query, below the base URL), all of it within
        ``timeout`` seconds. Raises DeadlineExceeded, RequestCancelled, BodyTooLarge, OSError or
        ``http.client.HTTPException``; the connection is dropped after any of them."""
        with self._lock:
            self._budget.deadline = time.monotonic() + timeout
            if self._conn is not None and _dropped(self._conn):
                self.close()  # the peer closed the idle connection: start a fresh one
            conn = self._conn or self._new_connection()
            self._conn = conn
            try:
                conn.request(method, self.prefix + target, body=body, headers=dict(headers or {}))
                return self._read(conn.getresponse())
            except BaseException:
                self.close()
                raise

    def _new_connection(self) -> _Connection:
        return _Connection(self.host, self.port, self._budget, self.connect_timeout, self._tls)

    def _read(self, response: http.client.HTTPResponse) -> Answer:
        if response.length is not None and response.length > self.max_body:
            raise BodyTooLarge(f"Content-Length {response.length} > {self.max_body} bytes")
        body = response.read(self.max_body + 1)
        if len(body) > self.max_body:
            raise BodyTooLarge(f"body larger than {self.max_body} bytes")
        if not response.isclosed() or response.will_close:
            self.close()  # unread bytes left, or the peer closes: the connection is spent
        headers = {k.lower(): v for k, v in response.getheaders()}
        return Answer(response.status, headers, body)
