"""The one way the forwarder calls an HTTP peer (IMDS, the drain probe's upstream): HTTP/1.1 on
the real socket, one deadline for the whole exchange, a body cap, and an immediate cancel.

The request's bytes are formatted by http.client; the answer is read by :mod:`.wire`, whatever
a conforming HTTP/1.0 or 1.1 server sends: keep-alive or close after the answer, a sized,
chunked or close-delimited body, in one write or in many (the module says where it reads
differently from http.client, and why: the idle poll's CPU). Socket timeouts are per
operation, so a peer that sends a byte every few seconds would keep a request alive forever;
here a watchdog (one thread for the process) shuts the request's socket down (``SHUT_RDWR``)
when the deadline passes or the ``cancel`` event is set: the blocked connect, handshake or read
ends at once, and the request raises :class:`DeadlineExceeded` or :class:`RequestCancelled`
(the name's lookup, ``getaddrinfo``, is the one step it cannot cut: IMDS is an address). A
body the watchdog cut is never taken as complete, with or without Content-Length, nor one that
ends short of its Content-Length or its last chunk. The body is read up to the cap and no
further. A request http.client would not send (a target or header it refuses) is never sent;
:func:`check_url` refuses a URL from a setting the same way when it is read.

One connection per :class:`DeadlineHttp`, used by one thread at a time, kept alive when the
peer allows it and sent nothing past its answer. Before a request reuses it, the connection is
checked as urllib3's pool does: if the peer closed it while idle (it is readable: EOF), a fresh
one is opened. The peer may still close it just as the request goes out (an idle timeout a
moment shorter than the time between two requests: the race every HTTP/1.1 client has): a GET
or HEAD that fails on a kept-alive connection before a byte of its answer came is sent once
more, on a fresh connection and within the same deadline, as Go's net/http transport does.
Nothing else is retried; a POST is never sent twice. No proxy, no redirects, no content
decoding. (urllib3, which is http.client underneath, was tried: it read the same servers the
same way, for 0.17 ms more CPU a request, measured; everything it adds, the forwarder turns
off.)
"""

from __future__ import annotations

import contextlib
import http.client
import math
import re
import select
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from sebridge import __version__
from sebridge.forwarder.net import wire
from sebridge.forwarder.net.wire import BodyTooLarge
from sebridge.signals import StopEvent

__all__ = [
    "Answer",
    "BodyTooLarge",
    "DeadlineExceeded",
    "DeadlineHttp",
    "RequestCancelled",
    "TransportError",
    "check_url",
]

SLICE = 0.25  # seconds: how often the watchdog looks at a plain cancel Event
RESENT = frozenset({"GET", "HEAD"})  # sent once more if a kept-alive connection was closed
USER_AGENT = f"sebridge/{__version__}"


class RequestCancelled(Exception):
    """The request was abandoned because the process is stopping."""


class DeadlineExceeded(TimeoutError):
    """The request did not finish by its deadline."""


class TransportError(Exception):
    """The exchange failed: the connection was refused, reset or closed too early, or what
    came back is not HTTP (the message says which)."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str]  # names in lower case
    body: bytes


# -- the watchdog -------------------------------------------------------------------------------


class _Guard:
    """One request's socket, deadline and cancel event, while the watchdog watches it."""

    def __init__(
        self, sock: socket.socket, deadline: float, cancel: threading.Event | None, client: int
    ) -> None:
        self.sock = sock
        self.client = client
        self.deadline = deadline
        self.cancel = cancel
        # A StopEvent tells the watchdog when it is set; a plain Event is looked at every SLICE.
        self.polled = cancel is not None and not isinstance(cancel, StopEvent)
        self.fired: type[Exception] | None = None

    def due(self, now: float) -> type[Exception] | None:
        if self.cancel is not None and self.cancel.is_set():
            return RequestCancelled
        return DeadlineExceeded if now >= self.deadline else None

    def look_at(self, now: float) -> float:
        """When the watchdog must look at this guard next, if nothing tells it sooner."""
        return min(self.deadline, now + SLICE) if self.polled else self.deadline


class _Watchdog:
    """Shuts a request's socket down when its deadline passes or its cancel event is set.

    One daemon thread for every request of the process. It sleeps until the earliest moment it
    must look at a request (a deadline, or the next look at a plain cancel Event), or until it
    is told: a request whose moment comes sooner than the thread's wake-up tells it (or whose
    cancel event is already set), and so does a :class:`StopEvent` when it is set. A request
    that ended is dropped from the set and never looked at again, but its deadline is kept as a
    moment to look, one per client (the one that ended last there): with no request left, the
    thread sleeps until the earliest of those still to come, not forever. Requests a client
    makes one after another with the same timeout then never need to tell it (each deadline is
    later than the last), however quickly each ends: at 1 Hz with a 10 s deadline the thread
    wakes about once in ten seconds, not at every request (the idle forwarder's CPU); beside
    the drain probe's upstream, asked at 1 Hz with 3 s, more often, at its earlier deadlines
    (31 wake-ups in a measured span where one moment for all clients gave 39). Had it slept
    forever once no request was left, whether it was told at the next request would depend on
    whether it had looked while the last one was still in flight.

    The socket is shut down, not closed: its descriptor stays the request's own to close, so it
    can never hit a descriptor number reused by something else. ``socket.socket.shutdown`` is
    called directly so that a TLS socket's shutdown cannot pull its SSL object away from a read
    in progress on the request's thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()  # an RLock: a StopEvent may tell us while we arm
        self._guards: set[_Guard] = set()
        self._thread: threading.Thread | None = None
        self._wake_at = math.inf  # when the thread looks next unless told (inf: only when told)
        self._ended: dict[int, float] = {}  # client -> deadline of its request that ended last
        self._listening: weakref.WeakSet[StopEvent] = weakref.WeakSet()

    def arm(
        self,
        sock: socket.socket,
        deadline: float,
        cancel: threading.Event | None,
        client: object = None,
    ) -> _Guard:
        guard = _Guard(sock, deadline, cancel, id(client))
        with self._cond:
            self._guards.add(guard)
            now = time.monotonic()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="http-deadline", daemon=True)
                self._thread.start()  # it looks at every guard first
            elif guard.due(now) is not None or guard.look_at(now) < self._wake_at:
                self._cond.notify()
            if isinstance(cancel, StopEvent) and cancel not in self._listening:
                self._listening.add(cancel)
                cancel.when_set(self._tell)  # called at once if already set
        return guard

    def disarm(self, guard: _Guard) -> type[Exception] | None:
        """Stop watching ``guard``; what cut it short, if anything (nothing touches its socket
        after this returns)."""
        with self._cond:
            self._guards.discard(guard)
            self._ended[guard.client] = guard.deadline
            return guard.fired

    def _tell(self) -> None:
        """A StopEvent was set: look at every request now."""
        with self._cond:
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for client, deadline in list(self._ended.items()):
                    if deadline <= now:
                        del self._ended[client]
                wake_at = min(self._ended.values(), default=math.inf)
                for guard in list(self._guards):
                    reason = guard.due(now)
                    if reason is None:
                        wake_at = min(wake_at, guard.look_at(now))
                        continue
                    guard.fired = reason
                    self._guards.discard(guard)
                    # Already closed or reset: the read has ended anyway.
                    with contextlib.suppress(OSError):
                        socket.socket.shutdown(guard.sock, socket.SHUT_RDWR)
                self._wake_at = wake_at
                wait = min(max(0.0, wake_at - now), threading.TIMEOUT_MAX)  # a timeout of 1e10 s
                self._cond.wait(None if wake_at == math.inf else wait)


_WATCHDOG = _Watchdog()

# What a failed exchange can raise below us: the socket layer and http.client.
_TRANSPORT_ERRORS = (OSError, http.client.HTTPException)


def check_url(url: str, *, base: bool = False) -> SplitResult:
    """``url`` split, if requests can be sent to it: http or https, a host name the resolver
    takes (or an IP address), a port from 1 to 65535, and a path and query http.client would
    send (no space, control character or character outside ASCII). Raises ValueError saying
    what is wrong. The check a URL from a setting gets when it is read: the same formatting
    every request goes through. A ``base`` URL (of a :class:`DeadlineHttp`, whose requests go
    to its path and their own target) has no query or fragment: it would be dropped."""
    if any(char <= " " or char == "\x7f" for char in url):  # urlsplit drops tabs, newlines
        raise ValueError(f"a space or control character in the URL: {url!r}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    if "%" in parts.hostname:  # looked up as written, never decoded
        raise ValueError(f"a percent-encoded host name or IPv6 zone: {url!r}")
    # urlsplit drops what it does not expect around brackets, the ':' before a port too
    # ("[::1]8080" is port 80): the host and port must be all there is after any userinfo.
    if not _HOST_PORT.fullmatch(parts.netloc.rpartition("@")[2]):
        raise ValueError(f"not host[:port] or [IPv6][:port] after '//': {url!r}")
    _check_host(parts.hostname, "[" in parts.netloc, url)
    if base and (parts.query or parts.fragment):
        raise ValueError(f"a base URL with a query or fragment: {url!r}")
    if parts.port == 0:  # port 0 is no port to connect to (and "or 80" would pick 80)
        raise ValueError(f"port 0: {url!r}")
    default_port = 443 if parts.scheme == "https" else 80
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    requests = wire.RequestBytes(parts.hostname, parts.port or default_port, default_port)
    requests.format("GET", target, {}, None)
    return parts


_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[^\[\]:]+)(?::[0-9]*)?")
_NAME_MOST = 253
_LABEL_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def _check_host(host: str, bracketed: bool, url: str) -> None:
    """An IPv6 address in brackets, or a name as DNS takes it (glibc's res_hnok, after idna as
    getaddrinfo encodes it): labels of 1 to 63 letters, digits, '-' and '_', at most 253
    characters, not starting with '-'. An IPv4 address is such a name too. (A name outside
    these that /etc/hosts lists would resolve, and is refused all the same.)"""
    if bracketed:  # not an IPvFuture literal ([v1.x]), which the lookup would take as a name
        try:
            socket.inet_pton(socket.AF_INET6, host)
        except OSError:
            raise ValueError(f"not an IPv6 address in brackets: {url!r}") from None
        return
    try:
        name = host.encode("idna").decode("ascii").removesuffix(".")
    except UnicodeError as exc:
        raise ValueError(f"not a host name ({exc}): {url!r}") from None
    labels = name.split(".")
    if len(name) > _NAME_MOST or name.startswith("-") or not all(map(_is_label, labels)):
        raise ValueError(
            "not a host name (labels of 1 to 63 letters, digits, '-' and '_', at most "
            f"{_NAME_MOST} characters, not starting with '-'): {url!r}"
        )


def _is_label(label: str) -> bool:
    return 0 < len(label) <= 63 and _LABEL_CHARACTERS.issuperset(label)


def _open(
    host: str,
    port: int,
    timeout: float,
    deadline: float,
    tls: ssl.SSLContext | None,
    cancel: threading.Event | None,
    client: object,
) -> socket.socket:
    """A connected socket with TCP_NODELAY and, for https, TLS with the system's trust store
    (its handshake still to do): each address of ``host`` tried within ``timeout`` and all of
    them by ``deadline`` (``socket.create_connection`` gives each address the whole timeout).
    Raises OSError (TimeoutError once the deadline has passed) or RequestCancelled."""
    sock = _connect(host, port, timeout, deadline, cancel, client)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is None:
            return sock
        # The handshake is the request's, under its deadline and the watchdog (request()).
        return tls.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
    except BaseException:
        sock.close()
        raise


def _connect(
    host: str,
    port: int,
    timeout: float,
    deadline: float,
    cancel: threading.Event | None,
    client: object,
) -> socket.socket:
    """Each attempt is under the watchdog, as the rest of the request: a stop shuts the
    connecting socket down, which ends ``connect`` at once (ECONNRESET), not at its timeout."""
    error: OSError = TimeoutError("no time left to connect")
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no time left to connect") from error
        sock = socket.socket(family, kind, proto)
        guard = _WATCHDOG.arm(sock, deadline, cancel, client)
        try:
            sock.settimeout(min(timeout, left))
            sock.connect(address)
        except BaseException as exc:
            cut = _WATCHDOG.disarm(guard)
            sock.close()
            if cut is RequestCancelled:
                raise RequestCancelled("stopping") from exc
            if not isinstance(exc, OSError):
                raise
            error = exc  # the next address, if any time is left
            continue
        cut = _WATCHDOG.disarm(guard)
        if cut is None:
            return sock
        sock.close()  # shut down just as it connected
        if cut is RequestCancelled:
            raise RequestCancelled("stopping")
        raise TimeoutError("no time left to connect")
    raise error


def _dropped(sock: socket.socket) -> bool:
    """Whether the peer closed a kept-alive connection while it was idle (it is readable:
    EOF), as urllib3's pool checks before reusing one."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class DeadlineHttp:
    def __init__(
        self,
        base_url: str,
        *,
        max_body: int,
        connect_timeout: float = 2.0,
        cancel: threading.Event | None = None,
    ) -> None:
        parts = check_url(base_url, base=True)
        self.host = parts.hostname or ""  # check_url: there is one
        default_port = 443 if parts.scheme == "https" else 80
        self.port = parts.port or default_port
        self.prefix = parts.path.rstrip("/")
        self.max_body = max_body
        self.connect_timeout = connect_timeout
        self.cancel = cancel
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None
        self._requests = wire.RequestBytes(self.host, self.port, default_port)
        self._sock: socket.socket | None = None
        self._reader: wire.Reader | None = None  # the connection's bytes, for its whole life
        self._handshake_due = False  # a new TLS connection's handshake, done by the request
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        sock, self._sock, self._reader = self._sock, None, None
        if sock is not None:
            sock.close()

    def request(
        self,
        method: str,
        target: str,
        *,
        timeout: float,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
    ) -> Answer:
        """``method`` ``target`` (path and query, below the base URL), all of it (connect,
        send, status, headers, body) within ``timeout`` seconds. Raises DeadlineExceeded,
        RequestCancelled, BodyTooLarge or TransportError (also for a request http.client would
        not send: a target or header it refuses); the connection is dropped after any of
        them."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._check(deadline)
            try:
                data = self._requests.format(
                    method,
                    self.prefix + target,
                    {"User-Agent": USER_AGENT, **(headers or {})},
                    body,
                )
            except wire.Unsendable as exc:  # a caller's target or header: never sent
                raise TransportError(f"cannot send {method} {target!r}: {exc}") from exc
            resend = method in RESENT
            while True:
                sock, reader, reused = self._connection(deadline)
                answer = self._exchange(
                    sock, reader, method, data, timeout, deadline, reused and resend
                )
                if answer is not None:
                    return answer
                resend = False  # once

    def _exchange(
        self,
        sock: socket.socket,
        reader: wire.Reader,
        method: str,
        data: bytes,
        timeout: float,
        deadline: float,
        resend: bool,
    ) -> Answer | None:
        """One sending of the request on ``sock`` and its answer; None if ``resend`` and the
        connection failed before a byte of the answer came (send it on a fresh one)."""
        guard = _WATCHDOG.arm(sock, deadline, self.cancel, self)
        if self.cancel is not None and self.cancel.is_set():  # set while connecting
            _WATCHDOG.disarm(guard)
            self._drop()
            raise RequestCancelled("stopping")
        received = reader.received
        try:
            # Each socket operation also times out by the deadline: a second line of defence.
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            if isinstance(sock, ssl.SSLSocket) and self._handshake_due:
                sock.do_handshake()
                self._handshake_due = False
            sock.sendall(data)
            head = wire.read_head(reader, method)
            content = wire.read_body(reader, head, self.max_body)
        except BaseException as exc:
            cut = _WATCHDOG.disarm(guard)
            self._drop()
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: as they are
                raise
            if cut is not None:
                raise self._cut(cut, timeout) from exc
            if isinstance(exc, _TRANSPORT_ERRORS):
                if time.monotonic() >= deadline:  # a socket timeout at the very end
                    raise DeadlineExceeded(f"no answer within {timeout:g} s") from exc
                if resend and reader.received == received:  # closed as the request went out
                    return None
                raise TransportError(_describe(exc)) from exc
            if not isinstance(exc, BodyTooLarge):
                # Whatever the peer sent, the caller sees one of this module's errors:
                # a reading this module did not foresee is the peer's answer, unreadable.
                raise TransportError(f"unreadable answer: {_describe(exc)}") from exc
            raise
        cut = _WATCHDOG.disarm(guard)
        # Bytes beyond the answer: whatever they are, the next answer could be read from
        # them, so the connection is not used again.
        if cut is not None or head.will_close or reader.pending:
            self._drop()
        if cut is not None:  # what was read may be cut short: never taken as complete
            raise self._cut(cut, timeout)
        return Answer(head.status, {k.lower(): v for k, v in head.fields}, content)

    @staticmethod
    def _cut(reason: type[Exception], timeout: float) -> Exception:
        if reason is RequestCancelled:
            return RequestCancelled("stopping")
        return DeadlineExceeded(f"no answer within {timeout:g} s")

    def _check(self, deadline: float) -> None:
        """Raise RequestCancelled or DeadlineExceeded if the request may not go on."""
        if self.cancel is not None and self.cancel.is_set():
            raise RequestCancelled("stopping")
        if deadline <= time.monotonic():
            raise DeadlineExceeded("deadline passed")

    def _connection(self, deadline: float) -> tuple[socket.socket, wire.Reader, bool]:
        """The kept-alive connection if the peer has not closed it meanwhile (True), else a new
        one, connected within the connect timeout and the deadline (False)."""
        if self._sock is not None and _dropped(self._sock):
            self._drop()
        reused = self._sock is not None and self._reader is not None
        if self._sock is None or self._reader is None:
            self._check(deadline)
            try:
                self._sock = _open(
                    self.host,
                    self.port,
                    self.connect_timeout,
                    deadline,
                    self._tls,
                    self.cancel,
                    self,
                )
                self._handshake_due = self._tls is not None
            except (OSError, UnicodeError) as exc:  # UnicodeError: a name idna cannot encode
                self._check(deadline)
                raise TransportError(_describe(exc)) from exc
            self._reader = wire.Reader(self._sock)
        return self._sock, self._reader, reused
