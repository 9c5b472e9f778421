"""The one way the forwarder serves HTTP on the VM: the drain probe, /metrics and /healthz.

A local user (and, for the drain probe, anyone the network lets in) can reach these ports, so
the server has to stay answerable under attack; the bind address is no defence (the load
balancer must reach the probe). The design, and what each part defends against:

- One event-loop thread (asyncio) per server, not a thread per connection: a thousand idle
  connections cost memory, not threads (the unit has a TasksMax).
- One deadline per request, from accept to the end of the answer (:data:`DEADLINE`): a client
  that sends a byte every few seconds, or nothing, is dropped when it passes, however often
  it sends. A load balancer's probe is a tiny request sent at once.
- Connections are accepted at most :data:`ACCEPT_BATCH` per turn of the loop, and every
  connection whose request has come in is read between two batches: however long the accept
  queue of a flood, what is ready is served first.
- At most ``max_connections`` at once, and at most ``max_per_source`` (half of them) from one
  peer address: one more from an address that holds its share, and one of that address's own
  connections is dropped for it. One more when full, and one is dropped from the address that
  holds the most (:data:`SOURCES_LOOKED_AT` in turn, if need be). So a flood from one address
  only ever evicts its own connections; the load balancer asks from an address of its own
  (168.63.129.16). Which one of an address's connections, among its oldest
  :data:`PEEK_AT_MOST` still waiting for their request, each looked into in the kernel's
  buffer (``MSG_PEEK``, nothing read): first one the peer has reset or closed, then the oldest
  one open for at least :data:`SETTLE` s that has sent nothing (idle), then one that has sent
  part of a request (slow); never one whose whole request is in, read or waiting in the
  kernel's buffer: a well-formed client sends it at once. When every one is fresh (a burst
  after the machine stalled), up to twice as many are let in before fresh ones are dropped the
  same way; if even then every one looked at has its whole request in, the newcomer is dropped
  (they are answered within the deadline, and memory stays bounded). A new connection is
  otherwise never refused unanswered.
- The answer is computed by ``handler`` on a small thread pool, within what is left of the
  deadline: a slow handler delays nobody else's request, and its client gets 503.
- Every error (timeout, eviction, a request that is not HTTP, a reset, a failing handler) is
  counted by reason (:data:`ERROR_REASONS`, for the metrics) and logged through ``logging``
  only, at most once per reason per :data:`LOG_EVERY` seconds with a count of the rest: a flood
  cannot flood the journal, and nothing is ever printed to stderr past the log formatter.

Each request gets one answer and the connection is closed (``Connection: close``). GET and HEAD
reach the handler; any other method gets 501.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import heapq
import itertools
import logging
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

DEADLINE = 2.0  # seconds from accept to the end of the answer
# Per server, at once (up to twice as many for a moment, when all are fresh): two servers stay
# well within the 1,024 descriptors a service gets by default.
MAX_CONNECTIONS = 128
SETTLE = 0.25  # seconds: a connection younger than this is dropped to make room only if need be
PEEK_AT_MOST = 16  # connections of one address looked into to choose the one dropped
SOURCES_LOOKED_AT = 3  # addresses holding the most, looked into in turn for one to drop
SOURCE_SHARE = 0.5  # of max_connections, at most, held by one address
ACCEPT_BATCH = 32  # connections accepted per turn of the loop (reads of ready ones between)
ACCEPT_RETRY = 1.0  # seconds before accepting again after accept failed (no descriptors)
MAX_HEAD = 8192  # bytes of request line and headers
LOG_EVERY = 60.0  # seconds: at most one log line per error reason in this time
HANDLER_THREADS = 2
WRITE_RESERVE = 0.2  # seconds of the deadline kept for writing the answer
ERROR_REASONS = ("timeout", "evicted", "bad-request", "reset", "handler", "internal")
_DESCRIBE = {
    "timeout": "a client did not send its request within the deadline (slow or idle)",
    "evicted": "a client yet to send its whole request (idle or slow) was dropped for a new one",
    "bad-request": "a client sent something that is not an HTTP request",
    "reset": "a client reset or closed its connection before the answer was out",
    "handler": "the answer could not be computed in time, or failed (503 sent)",
    "internal": "the server's event loop reported an error",
}
_REQUEST_LINE = re.compile(rb"([A-Z]{1,16}) (\S{1,4096}) HTTP/(\d)\.(\d)")


@dataclass(frozen=True)
class Request:
    method: str  # GET or HEAD
    target: str  # as sent (path and query)
    client: str  # the peer's address

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


Handler = Callable[[Request], Response]


class ErrorLog:
    """Counts errors by reason; logs the first of each reason at once, then at most one line per
    ``every`` seconds with how many more there were (see :meth:`flush`)."""

    def __init__(
        self,
        logger: logging.Logger,
        server: str,
        *,
        every: float = LOG_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.server = server
        self.every = every
        self.clock = clock
        self.counts: Counter[str] = Counter({reason: 0 for reason in ERROR_REASONS})
        self._pending: Counter[str] = Counter()
        self._logged_at: dict[str, float] = {}
        self._lock = threading.Lock()

    def record(
        self, reason: str, detail: str = "", *, exc_info: BaseException | None = None
    ) -> None:
        now = self.clock()
        with self._lock:
            self.counts[reason] += 1
            last = self._logged_at.get(reason)
            if last is not None and now - last < self.every:
                self._pending[reason] += 1
                return
            self._logged_at[reason] = now
        self.logger.warning(
            "%s: %s%s; more of these are summed up every %g s",
            self.server,
            _DESCRIBE[reason],
            f" ({detail})" if detail else "",
            self.every,
            exc_info=exc_info,
        )

    def flush(self) -> None:
        """Log how many errors of each reason came since its last line, once ``every`` seconds
        have passed since that line."""
        now = self.clock()
        due: list[tuple[str, int]] = []
        with self._lock:
            for reason, count in list(self._pending.items()):
                if count and now - self._logged_at.get(reason, -self.every) >= self.every:
                    due.append((reason, count))
                    self._logged_at[reason] = now
                    del self._pending[reason]
        for reason, count in due:
            self.logger.warning(
                "%s: %d more in the last %g s: %s",
                self.server,
                count,
                self.every,
                _DESCRIBE[reason],
            )

    @property
    def pending(self) -> bool:
        """Whether some errors wait to be summed up by :meth:`flush`."""
        with self._lock:
            return bool(self._pending)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


def somaxconn(default: int = 4096) -> int:
    """The kernel's cap on a listening socket's accept queue (``net.core.somaxconn``)."""
    try:
        with open("/proc/sys/net/core/somaxconn", encoding="ascii") as handle:
            return max(1, int(handle.read().strip()))
    except (OSError, ValueError):
        return default


def _reset(sock: socket.socket) -> bool:
    """Whether the peer reset the connection (a pending ECONNRESET): one getsockopt on the
    accepted socket, nothing read; True once it is closed."""
    try:
        return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0
    except OSError:
        return True


def _peek(sock: socket.socket) -> bytes | None:
    """What waits in the kernel's buffer of an accepted socket, not yet read (up to MAX_HEAD
    bytes); None when the peer has reset or closed it, or it is closed. One recv on the socket
    itself (no descriptor duplicated): a flood makes the server do this for every newcomer."""
    try:
        data: bytes = sock.recv(MAX_HEAD, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return b""
    except OSError:
        return None
    return data or None


class HttpServer:
    """Binds at once (a port in use fails the start, clearly); :meth:`serve` or :meth:`start`
    serves until :meth:`close`."""

    def __init__(
        self,
        name: str,
        address: str,
        port: int,
        handler: Handler,
        *,
        logger: logging.Logger,
        deadline: float = DEADLINE,
        max_connections: int = MAX_CONNECTIONS,
        max_per_source: int | None = None,
        log_every: float = LOG_EVERY,
    ) -> None:
        self.name = name
        self.handler = handler
        self.deadline = deadline
        self.max_connections = max_connections
        self.errors = ErrorLog(logger, name, every=log_every)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        # As long an accept queue as the kernel allows: a flood of connections that are reset
        # at once fills a short one, and then a real client's SYN waits for its retransmits.
        # asyncio accepts up to this many per readiness event, so the queue is emptied at once.
        self.backlog = max(2 * max_connections, somaxconn())
        self._sock = socket.create_server((address, port), family=family, backlog=self.backlog)
        self._sock.setblocking(False)
        host, bound, *_ = self._sock.getsockname()
        self.address = (str(host), int(bound))
        self.connections: dict[_Connection, None] = {}  # open ones, in accept order
        # The same by the peer's address: at most per_source each (a flood from one address
        # makes room with its own connections), and a full server drops from the largest.
        self.by_source: dict[str, dict[_Connection, None]] = {}
        self.per_source = max_per_source or max(1, int(max_connections * SOURCE_SHARE))
        self._opening: set[asyncio.Task[Any]] = set()
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._flush_handle: asyncio.TimerHandle | None = None
        self._closed = False

    # -- lifecycle (any thread) -------------------------------------------------------------
    def start(self) -> None:
        """Serve on a thread of its own."""
        if self._thread is not None:
            return
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name=f"{self.name}-http", daemon=True
        )
        self._thread.start()
        started.wait(5.0)

    def serve(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set."""
        self.start()
        try:
            stop.wait()
        finally:
            self.close()

    def close(self, timeout: float = 2.0) -> None:
        """Stop serving: the listening socket and every connection are closed."""
        loop, stopping, thread = self._loop, self._stopping, self._thread
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop has just ended by itself
                loop.call_soon_threadsafe(stopping.set)
        if thread is not None:
            thread.join(timeout)
        if not self._closed:
            self._closed = True
            self._sock.close()

    def error_counts(self) -> dict[str, int]:
        """Errors so far by reason (every reason, zero or not)."""
        return self.errors.snapshot()

    # -- the loop thread --------------------------------------------------------------------
    def _run(self, started: threading.Event) -> None:
        try:
            asyncio.run(self._main(started))
        except Exception as exc:  # noqa: BLE001 - logged, never printed: the server just stops
            self.errors.record("internal", f"{type(exc).__name__}: {exc}", exc_info=exc)
        finally:
            started.set()

    async def _main(self, started: threading.Event) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._loop_error)
        self._loop = loop
        self._stopping = asyncio.Event()
        self.pool = concurrent.futures.ThreadPoolExecutor(
            HANDLER_THREADS, thread_name_prefix=f"{self.name}-answer"
        )
        self._listen()
        started.set()
        try:
            await self._stopping.wait()
        finally:
            if self._flush_handle is not None:
                self._flush_handle.cancel()
            loop.remove_reader(self._sock)
            self._sock.close()
            self._closed = True
            for task in list(self._opening):
                task.cancel()
            for conn in list(self.connections):
                conn.drop()
            self.pool.shutdown(wait=False, cancel_futures=True)

    def record(
        self, reason: str, detail: str = "", *, exc_info: BaseException | None = None
    ) -> None:
        """Count and log an error (on the loop's thread); the rest of a flood is summed up by
        a timer set only while something waits to be (an idle server never wakes up)."""
        self.errors.record(reason, detail, exc_info=exc_info)
        if self._flush_handle is None and self._loop is not None and self.errors.pending:
            self._flush_handle = self._loop.call_later(self.errors.every, self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        self.errors.flush()
        if self.errors.pending and self._loop is not None:
            self._flush_handle = self._loop.call_later(self.errors.every, self._flush)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        self.record(
            "internal",
            str(context.get("message", "")),
            exc_info=exc if isinstance(exc, BaseException) else None,
        )

    def _accept(self) -> None:
        """Accept at most ACCEPT_BATCH waiting connections, then let the loop turn: every
        connection whose request has come in is read before the next batch (read what is
        ready first), however long the accept queue of a flood."""
        loop = self._loop
        assert loop is not None
        opened = 0
        for _ in range(4 * ACCEPT_BATCH):  # resets cost one getsockopt each: more of them
            if opened >= ACCEPT_BATCH:
                return
            try:
                sock, address = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:  # out of descriptors, say: try again in a second
                self.record("internal", f"accept: {type(exc).__name__}: {exc}")
                loop.remove_reader(self._sock)
                loop.call_later(ACCEPT_RETRY, self._listen)
                return
            if _reset(sock):  # reset while it waited in the queue: nothing to answer, no transport
                self.record("reset", str(address[0]) if address else "?")
                sock.close()
                continue
            opened += 1
            sock.setblocking(False)
            conn = _Connection(self, sock)  # its deadline counts from now
            made = functools.partial(_itself, conn)
            task = loop.create_task(loop.connect_accepted_socket(made, sock))
            self._opening.add(task)
            task.add_done_callback(functools.partial(self._opened, sock))

    def _listen(self) -> None:
        if not self._closed and self._loop is not None:
            self._loop.add_reader(self._sock, self._accept)

    def _opened(self, sock: socket.socket, task: asyncio.Task[Any]) -> None:
        self._opening.discard(task)
        if task.cancelled() or task.exception() is not None:
            sock.close()  # reset before its transport was made: nothing to answer

    def admit(self, conn: _Connection) -> bool:
        """Make room for ``conn`` (see the module), then count it in; False when it was reset
        before it could be (a flood of resets then costs one getsockopt each, and no room), or
        when no connection could be dropped for it at twice max_connections."""
        if _reset(conn.sock):
            return False
        now = conn.accepted
        mine = self.by_source.get(conn.client)
        if mine is not None and len(mine) >= self.per_source:
            victim = self._victim(now, [conn.client], fresh=True)  # its own, fresh or not
            if victim is not None:
                self._evict(victim)
        while len(self.connections) >= self.max_connections:
            largest = heapq.nlargest(SOURCES_LOOKED_AT, self.by_source, key=self._held_by)
            victim = self._victim(now, largest, fresh=False)
            if victim is None:
                if len(self.connections) < 2 * self.max_connections:
                    break  # only fresh connections: let them have their chance, up to a point
                victim = self._victim(now, largest, fresh=True)
                if victim is None:  # every one looked at has its whole request in
                    conn.evicted = True
                    self.record("evicted", conn.client)
                    return False
            self._evict(victim)
        self.connections[conn] = None
        self.by_source.setdefault(conn.client, {})[conn] = None
        return True

    def _held_by(self, source: str) -> int:
        return len(self.by_source[source])

    def _evict(self, victim: _Connection) -> None:
        victim.evicted = True
        self.record("evicted", victim.client)
        victim.drop()

    def forget(self, conn: _Connection) -> None:
        """``conn`` is closed: it holds no slot any more."""
        self.connections.pop(conn, None)
        held = self.by_source.get(conn.client)
        if held is not None:
            held.pop(conn, None)
            if not held:
                del self.by_source[conn.client]

    def _victim(self, now: float, sources: list[str], *, fresh: bool) -> _Connection | None:
        """The connection to drop for a new one, from the first of ``sources`` (the ones
        holding the most, most first) that has one: among its oldest PEEK_AT_MOST that have not
        sent their whole request (peeked in the kernel's buffer, without reading), one the
        peer has reset or closed, else one open for SETTLE seconds that has sent nothing, else
        one that has sent part of a request; if ``fresh``, then a younger one likewise. Never
        one whose whole request is in; None when there is none."""
        for source in sources:
            best: tuple[int, _Connection] | None = None
            waiting = (c for c in self.by_source.get(source, {}) if c.request is None)
            for candidate in itertools.islice(waiting, PEEK_AT_MOST):
                unread = _peek(candidate.sock)
                if unread is None:
                    return candidate  # reset or closed
                sent = bytes(candidate.head) + unread
                if b"\r\n\r\n" in sent:
                    continue  # its answer is on its way: never
                if candidate.accepted > now - SETTLE:  # fresh: so are all after it
                    if best is not None or not fresh:
                        break
                    if not sent:
                        return candidate
                    best = (3, candidate)
                    continue
                if not sent:
                    return candidate  # settled, sent nothing: idle
                if best is None:
                    best = (1, candidate)
            if best is not None:
                return best[1]
        return None


class _Connection(asyncio.Protocol):
    """One connection: its request head is gathered as it arrives (so the server always knows
    which connections have sent theirs), answered once, and the connection closed; at the
    deadline it is dropped, whatever it is doing."""

    def __init__(self, server: HttpServer, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock  # the accepted socket its transport wraps: peeked, never read
        self.accepted = time.monotonic()
        self.head = bytearray()
        self.request: Request | None = None  # once the whole head is in
        self.evicted = False
        self.done = False  # answered, or dropped
        self.client = "?"
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set at once
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._flushed: asyncio.Future[None] | None = None

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(
            loop.time() + self.server.deadline - (time.monotonic() - self.accepted), self._expire
        )
        # Nothing is buffered above the kernel's: once the answer is handed over, it is out.
        transport.set_write_buffer_limits(high=0)
        if not self.server.admit(self):
            if not self.evicted:
                self.server.record("reset", self.client)
            self.drop()

    def data_received(self, data: bytes) -> None:
        if self.request is not None or self.done:
            return  # a body, or a pipelined request: not read (one answer, then close)
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > MAX_HEAD:
                self._refuse(f"{self.client}: request head over {MAX_HEAD} bytes")
            return
        line = bytes(self.head[: self.head.find(b"\r\n")])
        match = _REQUEST_LINE.fullmatch(line)
        if match is None or match.group(3) != b"1":
            self._refuse(self.client)
            return
        method, target = match.group(1).decode("ascii"), match.group(2).decode("latin-1")
        self.request = Request(method, target, self.client)
        self._task = asyncio.get_running_loop().create_task(self._respond(self.request))

    def eof_received(self) -> bool:
        # Half-closed after its whole request: the answer still goes out. Before: close (a
        # connection that sent nothing at all is a TCP check, not an error).
        return self.request is not None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done and not self.evicted and (self.head or exc is not None):
            self.server.record("reset", self.client)  # before its answer was out
        self.done = True
        self._finish()
        if self._flushed is not None and not self._flushed.done():
            self._flushed.set_result(None)

    def resume_writing(self) -> None:
        if self._flushed is not None and not self._flushed.done():
            self._flushed.set_result(None)

    # -- the exchange -----------------------------------------------------------------------
    async def _respond(self, request: Request) -> None:
        if request.method not in ("GET", "HEAD"):
            response = Response(501, b"not implemented\n", headers=(("Allow", "GET, HEAD"),))
        else:
            response = await self._answer(request)
        if self.done:
            return
        self.transport.write(_encode(response, head_only=request.method == "HEAD"))
        if self.transport.get_write_buffer_size():  # the client reads slowly: wait, up to the
            self._flushed = asyncio.get_running_loop().create_future()  # deadline
            await self._flushed
        if not self.done:
            self.done = True
            self.transport.close()
            self._finish()

    async def _answer(self, request: Request) -> Response:
        loop = asyncio.get_running_loop()
        assert self.server.pool is not None
        budget = self.accepted + self.server.deadline - WRITE_RESERVE - time.monotonic()
        try:
            future = loop.run_in_executor(self.server.pool, self.server.handler, request)
            return await asyncio.wait_for(future, timeout=max(0.0, budget))
        except TimeoutError:
            self.server.record("handler", "no answer in time")
        except Exception as exc:  # noqa: BLE001 - the handler's failure: logged, 503 sent
            self.server.record("handler", f"{type(exc).__name__}: {exc}", exc_info=exc)
        return Response(503, b"unavailable\n")

    def _refuse(self, detail: str) -> None:
        self.server.record("bad-request", detail)
        self.done = True
        self.transport.write(_encode(Response(400, b"bad request\n"), head_only=False))
        self.transport.close()
        self._finish()

    def _expire(self) -> None:
        if self.done:
            return
        self.server.record("timeout", self.client)
        self.drop()

    def drop(self) -> None:
        """Abort the connection now (deadline, eviction, stop)."""
        self.done = True
        self.transport.abort()
        self._finish()

    def _finish(self) -> None:
        self.server.forget(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task = self._task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()


def _itself(conn: _Connection) -> _Connection:
    return conn


def _encode(response: Response, *, head_only: bool) -> bytes:
    try:
        reason = HTTPStatus(response.status).phrase
    except ValueError:
        reason = "Status"
    lines = [
        f"HTTP/1.1 {response.status} {reason}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        "Cache-Control: no-store",
        "Connection: close",
        "Server: sebridge",
        *(f"{name}: {value}" for name, value in response.headers),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + response.body
