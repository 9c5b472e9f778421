"""The one HTTP client (sebridge.forwarder.net.client) against loopback servers that answer in
every way a conforming server may, and in the hostile ways (issue 22, item 12).

Before this client, a server that closed the connection after its answer (HTTP/1.0, or
``Connection: close``, as Microsoft's IMDS mock server does) failed the request with
``OSError [Errno 9] Bad file descriptor`` whenever the body came in a write of its own.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest

from sebridge.forwarder.net import client as net_client
from sebridge.forwarder.net.client import (
    BodyTooLarge,
    DeadlineExceeded,
    DeadlineHttp,
    RequestCancelled,
    TransportError,
    check_url,
)
from sebridge.signals import StopEvent
from tests.support.http_peers import Framing, HttpPeer, Request, Style
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)
DOCUMENT = json.dumps({"DocumentIncarnation": 7, "Events": []}).encode()
SLACK = 2.0  # seconds past a deadline within which the request must have ended


def document(request: Request) -> tuple[int, bytes]:
    if request.method == "POST":
        return 200, b""
    return 200, DOCUMENT


CONFORMING = [
    Style(version="HTTP/1.0", close=True),
    Style(version="HTTP/1.0", close=True, writes="many"),
    Style(version="HTTP/1.0", framing="eof"),
    Style(version="HTTP/1.0", framing="eof", writes="many"),
    Style(version="HTTP/1.1", close=True),
    Style(version="HTTP/1.1", close=True, writes="many"),
    Style(version="HTTP/1.1", close=True, framing="chunked", writes="many"),
    Style(version="HTTP/1.1"),
    Style(version="HTTP/1.1", writes="many"),
    Style(version="HTTP/1.1", framing="chunked"),
    Style(version="HTTP/1.1", framing="chunked", writes="many"),
    Style(version="HTTP/1.0", writes="many"),  # HTTP/1.0 with Connection: keep-alive
]


@pytest.mark.parametrize("style", CONFORMING, ids=str)
def test_every_conforming_server_is_read_right_every_time(style: Style) -> None:
    with HttpPeer(document, style) as peer:
        client = DeadlineHttp(peer.url, max_body=1024 * 1024)
        try:
            for i in range(20):
                answer = client.request("GET", f"/get/{i}", timeout=5)
                assert (answer.status, answer.body) == (200, DOCUMENT), i
                answer = client.request(
                    "POST", f"/post/{i}", timeout=5, body=b'{"StartRequests": []}'
                )
                assert (answer.status, answer.body) == (200, b""), i
        finally:
            client.close()
        # Each request reached the server once, in order: nothing was sent twice.
        expected = [p for i in range(20) for p in (f"/get/{i}", f"/post/{i}")]
        assert [r.target for r in peer.requests] == expected
        assert [r.body for r in peer.requests if r.method == "POST"] == [
            b'{"StartRequests": []}'
        ] * 20
        closes = style.close or style.framing == "eof"
        assert peer.connections == (40 if closes else 1)


def test_a_server_that_closes_after_answering_without_saying_so_is_read_right() -> None:
    """HTTP/1.1 without "Connection: close", then the close: the next request sees the closed
    connection and opens a fresh one (it does not send into the dead one)."""
    style = Style(version="HTTP/1.1", close=True, announce_close=False)
    with HttpPeer(document, style) as peer:
        client = DeadlineHttp(peer.url, max_body=1024)
        try:
            for i in range(10):
                assert client.request("GET", f"/{i}", timeout=5).body == DOCUMENT
                wait_until(lambda i=i: peer.closed > i, 10, "the server to close")
        finally:
            client.close()
        assert peer.connections == 10 and len(peer.requests) == 10


def test_a_kept_alive_connection_the_server_dropped_while_idle_is_replaced() -> None:
    with HttpPeer(document, Style(close_idle_after=0.2)) as peer:
        client = DeadlineHttp(peer.url, max_body=1024)
        try:
            for i in range(3):
                assert client.request("GET", "/", timeout=5).body == DOCUMENT
                wait_until(lambda i=i: peer.closed_idle > i, 10, "the server to drop it")
            assert client.request("GET", "/", timeout=5).body == DOCUMENT
        finally:
            client.close()
        assert peer.connections == 4 and len(peer.requests) == 4


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_bytes_past_an_answer_are_never_read_as_the_next_answer(framing: Framing) -> None:
    """A peer that sends a second answer nobody asked for after the first, in the same write:
    each request gets its own answer, on a fresh connection (http.client, reading through a new
    file per answer, relied on the peer's bytes not having been read ahead)."""
    stale = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale"

    def numbered(request: Request) -> tuple[int, bytes]:
        return 200, request.target.encode()

    with HttpPeer(numbered, Style(framing=framing, extra=stale)) as peer:
        client = DeadlineHttp(peer.url, max_body=1024)
        try:
            answers = [client.request("GET", f"/{i}", timeout=5).body for i in range(5)]
        finally:
            client.close()
        assert answers == [f"/{i}".encode() for i in range(5)]
        assert peer.connections == 5


@pytest.mark.parametrize(
    "style",
    [
        Style(trickle_headers=0.5),
        Style(trickle_body=0.5),
        Style(trickle_body=0.5, framing="chunked"),
        Style(version="HTTP/1.0", framing="eof", trickle_body=0.5),  # no length: the close ends it
        Style(answer=False),
    ],
    ids=str,
)
def test_a_peer_that_trickles_or_never_answers_ends_by_the_deadline(style: Style) -> None:
    """Never a cut body taken as complete: without Content-Length, the watchdog's shutdown
    looks like the server's close, and must still be a DeadlineExceeded."""
    with HttpPeer(document, style) as peer:
        client = DeadlineHttp(peer.url, max_body=1024)
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            client.request("GET", "/", timeout=1.5)
        assert time.monotonic() - started < 1.5 + SLACK
        client.close()
        assert len(peer.requests) == 1


def in_background(
    client: DeadlineHttp, target: str, timeout: float
) -> tuple[threading.Thread, list[BaseException]]:
    """A GET of ``target`` on a thread of its own; what it raised lands in the list."""
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            client.request("GET", target, timeout=timeout)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("make_cancel", [threading.Event, StopEvent], ids=["Event", "StopEvent"])
def test_cancel_ends_a_request_at_once(make_cancel: type[threading.Event]) -> None:
    """A plain Event is looked at every SLICE; a StopEvent tells the watchdog when it is set
    (it is never looked at otherwise: untold, this request would wait out its 60 s)."""
    cancel = make_cancel()
    with HttpPeer(document, Style(answer=False)) as peer:
        client = DeadlineHttp(peer.url, max_body=1024, cancel=cancel)
        thread, outcome = in_background(client, "/", timeout=60)
        wait_until(lambda: peer.requests, 10, "the request to arrive")
        cancel.set()
        thread.join(timeout=SLACK)
        assert not thread.is_alive(), "a cancelled request still waits for the peer"
        assert [type(e) for e in outcome] == [RequestCancelled]
        with pytest.raises(RequestCancelled):  # and none starts once cancelled
            client.request("GET", "/", timeout=60)


def test_a_sooner_deadline_is_kept_while_the_watchdog_waits_for_a_later_one() -> None:
    """The watchdog sleeps until the earliest deadline it knows; a request armed meanwhile with
    a sooner one must wake it, or a peer that trickles (each read within the socket timeout)
    would hold that request until the first request's 30 s."""
    stop = StopEvent()
    with (
        HttpPeer(document, Style(answer=False)) as silent,
        HttpPeer(document, Style(trickle_headers=0.3)) as trickling,
    ):
        slow = DeadlineHttp(silent.url, max_body=1024, cancel=stop)
        quick = DeadlineHttp(trickling.url, max_body=1024, cancel=stop)
        thread, outcome = in_background(slow, "/slow", timeout=30)
        wait_until(lambda: silent.requests, 10, "the slow request to arrive")
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            quick.request("GET", "/quick", timeout=1.5)
        assert time.monotonic() - started < 1.5 + SLACK
        stop.set()  # and the slow one ends with the stop, not at its deadline
        thread.join(timeout=SLACK)
        assert [type(e) for e in outcome] == [RequestCancelled]
        slow.close()
        quick.close()


def voluntary_switches(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


def test_requests_that_end_in_time_do_not_wake_the_watchdog() -> None:
    """An idle forwarder's cost: the watchdog sleeps until a deadline it knows, and requests
    that end before it (with a StopEvent, which tells it when set) are never looked at. It
    used to wake twice for each request: when armed, and a SLICE later."""
    stop = StopEvent()
    with HttpPeer(document, Style()) as peer:
        client = DeadlineHttp(peer.url, max_body=1024, cancel=stop)
        client.request("GET", "/first", timeout=30)  # the watchdog now waits for 30 s
        watchdog = net_client._WATCHDOG._thread
        assert watchdog is not None and watchdog.native_id is not None
        before = voluntary_switches(watchdog.native_id)
        for i in range(40):
            assert client.request("GET", f"/{i}", timeout=20).status == 200
        woken = voluntary_switches(watchdog.native_id) - before
        client.close()
    assert woken <= 4, f"the watchdog woke {woken} times for 40 requests"


def test_requests_that_end_before_the_watchdog_looks_do_not_wake_it_either() -> None:
    """The same, however quickly each request ends: each is armed and ends while the watchdog
    cannot look (the test holds its lock). Before, a watchdog with no request left slept until
    told, so every next request told it: 40 to 60 switches here."""
    watchdog = net_client._Watchdog()  # a thread of its own, for this test alone
    ours, theirs = socket.socketpair()
    with ours, theirs:
        first = watchdog.arm(ours, time.monotonic() + 30, None)  # starts the thread
        wait_until(lambda: watchdog._wake_at < math.inf, 5, "the watchdog to look")
        watchdog.disarm(first)
        thread = watchdog._thread
        assert thread is not None and thread.native_id is not None
        before = voluntary_switches(thread.native_id)
        for _ in range(40):
            with watchdog._cond:  # reentrant: arm and disarm take it too
                watchdog.disarm(watchdog.arm(ours, time.monotonic() + 20, None))
            time.sleep(0.005)  # a watchdog that was told looks now
        woken = voluntary_switches(thread.native_id) - before
    # One wake-up, counted once or twice (it may block on the lock the test still holds), and
    # a switch or two more when it waits for the interpreter's lock on a busy machine.
    assert woken <= 4, f"the watchdog woke {woken} times for 40 requests"


def test_a_timeout_beyond_what_a_wait_takes_leaves_the_watchdog_alive() -> None:
    """threading's waits refuse more than TIMEOUT_MAX (about 292 years): a request with a
    timeout of 1e10 s killed the watchdog, so a stop never reached that request."""
    watchdog = net_client._Watchdog()
    stop = StopEvent()
    ours, theirs = socket.socketpair()
    with ours, theirs:
        guard = watchdog.arm(ours, time.monotonic() + 1e10, stop)
        wait_until(lambda: watchdog._wake_at < math.inf, 5, "the watchdog to look")
        time.sleep(0.1)  # it waits now (or died trying)
        stop.set()
        wait_until(lambda: guard.fired is not None, 5, "the stop to cut the request")
        assert watchdog.disarm(guard) is RequestCancelled
        assert watchdog._thread is not None and watchdog._thread.is_alive()


@pytest.mark.parametrize("make_cancel", [threading.Event, StopEvent])
def test_a_stop_while_connecting_ends_the_request_at_once(
    make_cancel: type[threading.Event],
) -> None:
    """The server's accept queue is full, so the client's SYN goes unanswered: the connect
    would wait for its timeout (5 s here). The watchdog shuts the connecting socket down at the
    stop, as any other socket of a request (it once waited for the connect, then for the
    answer until the previous request's deadline)."""
    server = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = server.getsockname()[1]
    held = [socket.create_connection(("127.0.0.1", port))]  # the queue is full now
    stop = make_cancel()
    client = DeadlineHttp(f"http://127.0.0.1:{port}", max_body=1024, connect_timeout=5, cancel=stop)
    try:
        threading.Timer(0.3, stop.set).start()
        started = time.monotonic()
        with pytest.raises(RequestCancelled):
            client.request("GET", "/", timeout=10)
        assert time.monotonic() - started < 0.3 + 1.5  # not the connect's 5 s
        with pytest.raises(RequestCancelled):  # and a stopped client does not connect again
            client.request("GET", "/", timeout=10)
    finally:
        client.close()
        for sock in (*held, server):
            sock.close()


def test_a_stop_during_the_tls_handshake_ends_the_request_at_once() -> None:
    """A peer that takes the connection and never answers the ClientHello: the handshake is
    the request's, under its deadline and the watchdog (it ran before either)."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    accepting = threading.Thread(target=lambda: held.append(server.accept()[0]), daemon=True)
    accepting.start()
    stop = StopEvent()
    client = DeadlineHttp(
        f"https://127.0.0.1:{server.getsockname()[1]}", max_body=1024, cancel=stop
    )
    try:
        threading.Timer(0.5, stop.set).start()
        started = time.monotonic()
        with pytest.raises(RequestCancelled):
            client.request("GET", "/", timeout=5)
        assert time.monotonic() - started < 0.5 + SLACK / 2
    finally:
        client.close()
        accepting.join(timeout=5)
        for sock in (*held, server):
            sock.close()


@pytest.mark.parametrize(
    ("style", "size"),
    [
        (Style(), 1025),  # Content-Length above the cap: refused before reading
        (Style(framing="chunked"), 5000),
        (Style(version="HTTP/1.0", framing="eof"), 5000),
    ],
    ids=["sized", "chunked", "until-close"],
)
def test_a_body_above_the_cap_is_refused(style: Style, size: int) -> None:
    with HttpPeer(lambda _: (200, b" " * size), style) as peer:
        client = DeadlineHttp(peer.url, max_body=1024)
        with pytest.raises(BodyTooLarge):
            client.request("GET", "/", timeout=5)
        client.close()


@pytest.mark.parametrize(
    "style",
    [Style(truncate_body=10), Style(version="HTTP/1.0", close=True, truncate_body=10)],
    ids=["1.1", "1.0"],
)
def test_a_sized_body_the_peer_cuts_short_is_an_error_not_an_answer(style: Style) -> None:
    with HttpPeer(document, style) as peer:
        client = DeadlineHttp(peer.url, max_body=1024)
        with pytest.raises(TransportError, match="IncompleteRead"):
            client.request("GET", "/", timeout=5)
        client.close()


@pytest.mark.parametrize("error", [ValueError, IndexError, UnicodeDecodeError])
def test_an_answer_read_in_a_way_nobody_foresaw_is_a_transport_error(
    error: type[Exception], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the peer sends, the caller sees one of the client's errors: a reading that
    raises something else (a Content-Length of 4,400 digits once raised int()'s ValueError,
    which killed the drain probe's upstream thread) is the peer's answer, unreadable."""

    def unforeseen(*_: object) -> None:
        if error is UnicodeDecodeError:
            raise UnicodeDecodeError("ascii", b"\xff", 0, 1, "odd")
        raise error("odd")

    with HttpPeer(document, Style()) as peer:
        client = DeadlineHttp(peer.url, max_body=1024)
        try:
            with monkeypatch.context() as patched:
                patched.setattr(net_client.wire, "read_head", unforeseen)
                with pytest.raises(TransportError, match=f"unreadable answer: {error.__name__}"):
                    client.request("GET", "/", timeout=5)
            assert client.request("GET", "/", timeout=5).body == DOCUMENT  # a fresh connection
        finally:
            client.close()
        assert peer.connections == 2


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        ("/sant\u00e9", {}),  # outside ASCII: http.client raised UnicodeEncodeError
        ("/a b", {}),
        ("/a\r\nX-Injected: 1", {}),
        ("/", {"X-Name": "\u0100"}),  # outside Latin-1
        ("/", {"X-Split": "a\r\nX-Injected: 1"}),
    ],
    ids=["non-ascii", "space", "crlf", "header-non-latin1", "header-crlf"],
)
def test_a_request_http_client_would_not_send_is_a_transport_error_never_sent(
    target: str, headers: dict[str, str]
) -> None:
    """Whatever a caller asks for, it sees one of the client's errors: a target outside ASCII
    once escaped as UnicodeEncodeError and ended the drain probe's upstream thread."""
    with HttpPeer(document, Style()) as peer:
        client = DeadlineHttp(peer.url, max_body=1024)
        try:
            with pytest.raises(TransportError, match="cannot send GET"):
                client.request("GET", target, timeout=5, headers=headers)
            assert client.request("GET", "/next", timeout=5).body == DOCUMENT
        finally:
            client.close()
        assert [request.target for request in peer.requests] == ["/next"]


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1/sant\u00e9", "UnicodeEncodeError"),
        ("http://127.0.0.1/a b", "a space or control character"),
        ("http://127.0.0.1/a\tb", "a space or control character"),  # urlsplit drops tabs
        ("http://127.0.0.1/?q=\x00", "a space or control character"),
        ("ftp://127.0.0.1/", "not an http"),
        ("http:///health", "not an http"),
        ("http://127.0.0.1:99999/", "out of range"),
        ("http://127.0.0.1:0/", "port 0"),
        (f"http://{'a' * 64}.localhost/", "not a host name"),  # a label of 64: idna refuses
        ("http://a..localhost/", "not a host name"),
        ("http://[fe80::1%25lo]:9/", "percent-encoded"),
        ("http://%31%32%37.0.0.1/", "percent-encoded"),
        ("http://a!b:8080/", "not a host name"),  # glibc refuses it without asking DNS
        ("http://-a-/", "not a host name"),
        (f"http://{'.'.join(['a' * 63] * 4)}/", "not a host name"),  # 255 characters
        ("http://[v1.example]:8080/", "not"),  # IPvFuture: a name, looked up
        ("http://[::1]8080/", "not host"),  # was port 80
        ("http://x[::1]:8080/", "not host"),
        ("http://[::1]junk:8080/", "not host"),
        ("http://-[::8080]./", "not host"),
        ("http://[::1/", "IPv6"),
    ],
)
def test_a_url_no_request_could_be_sent_to_is_refused_when_read(url: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        check_url(url)
    with pytest.raises(ValueError, match=reason):
        DeadlineHttp(url, max_body=1024)


@pytest.mark.parametrize("url", ["http://127.0.0.1/base?x=1", "http://127.0.0.1/#f"])
def test_a_base_url_with_a_query_or_fragment_is_refused(url: str) -> None:
    """The client sends the base's path and the request's target: a query there would be
    dropped without a word."""
    check_url(url)  # a URL to send a request to, but not a base for others
    with pytest.raises(ValueError, match="query or fragment"):
        check_url(url, base=True)
    with pytest.raises(ValueError, match="query or fragment"):
        DeadlineHttp(url, max_body=1024)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/health?x=%C3%A9",
        "https://[::1]/",
        "http://localhost",
        f"http://{'a' * 63}.localhost:65535/",
        "http://@127.0.0.1/a/b;c?d=[e]",
        "http://a_b.localhost./",
        "http://b\u00fccher.localhost/",  # an IDN: looked up as xn--bcher-kva.localhost
        "http://127.1:8080/",
        "http://[::ffff:127.0.0.1]/",
        "http://user:pw@[::1]:8080/",
        "http://127.0.0.1:/",  # an empty port: the default
        f"http://{'.'.join(['a' * 63] * 3)}.{'a' * 61}/",  # 253 characters
    ],
)
def test_a_url_requests_can_be_sent_to_is_taken(url: str) -> None:
    assert check_url(url).hostname == urlsplit(url).hostname


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
def test_a_get_a_kept_alive_connection_drops_unanswered_is_sent_once_more(reset: bool) -> None:
    """The peer closed the kept-alive connection just as the request went out (its idle
    timeout a moment shorter than the time between two checks): the drain probe's upstream
    check failed, and the probe answered 503 for a healthy application (hostile review)."""
    with HttpPeer(document, Style(drop_at=2, drop_reset=reset)) as peer:
        client = DeadlineHttp(peer.url, max_body=1024)
        try:
            assert client.request("GET", "/1", timeout=5).body == DOCUMENT
            assert client.request("GET", "/2", timeout=5).body == DOCUMENT
        finally:
            client.close()
        assert [request.target for request in peer.requests] == ["/1", "/2", "/2"]
        assert peer.connections == 2


@pytest.mark.parametrize(
    ("method", "drop_at", "sends"),
    [
        ("POST", 2, b""),  # never sent twice
        ("GET", 1, b""),  # a fresh connection: the peer is not idling, it fails
        ("GET", 2, b"HTTP/1.1 200 OK\r\n"),  # its answer had begun
    ],
    ids=["post", "fresh-connection", "answer-begun"],
)
def test_nothing_else_is_sent_twice(method: str, drop_at: int, sends: bytes) -> None:
    body = b"{}" if method == "POST" else None
    with HttpPeer(document, Style(drop_at=drop_at, drop_sends=sends)) as peer:
        client = DeadlineHttp(peer.url, max_body=1024)
        try:
            if drop_at == 2:
                assert client.request(method, "/1", timeout=5, body=body).status == 200
            with pytest.raises(TransportError):
                client.request(method, "/2", timeout=5, body=body)
        finally:
            client.close()
        assert [request.target for request in peer.requests] == ["/1", "/2"][2 - drop_at :]
        assert peer.connections == 1


def test_a_name_the_resolver_refuses_is_a_transport_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """getaddrinfo raises UnicodeError, not OSError, for a name idna cannot encode (check_url
    refuses such a name when it is read; a name that changed since is still one of the four)."""

    def refuse(*_: object) -> None:
        raise UnicodeError("encoding with 'idna' codec failed (label empty or too long)")

    client = DeadlineHttp("http://localhost:9", max_body=1024)
    monkeypatch.setattr(net_client.socket, "getaddrinfo", refuse)
    with pytest.raises(TransportError, match="idna"):
        client.request("GET", "/", timeout=5)


def test_a_refused_connection_is_a_transport_error() -> None:
    with socket.socket() as bound:  # bound, not listening: the connection is refused
        bound.bind(("127.0.0.1", 0))
        client = DeadlineHttp(f"http://127.0.0.1:{bound.getsockname()[1]}", max_body=1024)
        with pytest.raises(TransportError, match="refused"):
            client.request("GET", "/", timeout=5)
