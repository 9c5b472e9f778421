"""The one HTTP server of the VM (sebridge.forwarder.net.server), piece by piece, over loopback:
who is dropped to make room, what a slow or failing handler's client gets, what a client that
does not read gets, and how errors reach the log (issue 22, items 1 and 7; the attacks on
the real forwarder are in tests/integration/test_http_server_attacks.py)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from sebridge.forwarder.net.server import SETTLE, ErrorLog, HttpServer, Request, Response
from tests.support.attackers import ask, resets
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)
log = logging.getLogger("test.http-server")


def ok(request: Request) -> Response:
    return Response(200, b"ok\n")


@contextmanager
def serving(handler: Callable[[Request], Response] = ok, **options: float) -> Iterator[HttpServer]:
    server = HttpServer("test", "127.0.0.1", 0, handler, logger=log, **options)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.close()


def closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(0.05)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True  # reset


def test_a_full_server_drops_a_slow_client_never_the_well_formed_newcomer() -> None:
    # All from one address, which may hold every slot here (the share is tested below).
    with serving(max_connections=4, max_per_source=4, deadline=30) as server:
        port = server.address[1]
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        try:
            for sock in slow[:2]:
                sock.sendall(b"GET / HT")  # half a request line: slowloris
            # Settled as the server counts it: from when it took the last one in (under load
            # its loop may accept them well after the test connected).
            wait_until(lambda: len(server.connections) == 4, 10, "four connections in")
            opened = time.monotonic()
            wait_until(lambda: time.monotonic() - opened > SETTLE, 5, "them to settle")
            for _ in range(3):  # the first takes an idle one's place, the others the freed one
                assert ask(port)[0] == 200
            assert server.error_counts()["evicted"] == 1
            dropped = [closed_by_server(sock) for sock in slow]
            assert dropped == [False, False, True, False]  # the oldest that sent nothing
        finally:
            for sock in slow:
                sock.close()


def test_a_client_that_reset_is_dropped_first_and_a_waiting_request_is_never_dropped() -> None:
    answer = threading.Event()

    def slow_ok(request: Request) -> Response:
        answer.wait(10)
        return Response(200, b"ok\n")

    with serving(slow_ok, max_connections=2, deadline=30) as server:
        port = server.address[1]
        waiting = socket.create_connection(("127.0.0.1", port))
        waiting.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # whole request, answer pending
        wait_until(lambda: len(server.connections) == 1, 10, "the first connection in")
        idle = socket.create_connection(("127.0.0.1", port))
        wait_until(lambda: len(server.connections) == 2, 10, "the second connection in")
        opened = time.monotonic()
        wait_until(lambda: time.monotonic() - opened > SETTLE, 5, "them to settle")
        newcomer = threading.Thread(target=lambda: ask(port), daemon=True)
        newcomer.start()
        wait_until(lambda: server.error_counts()["evicted"] == 1, 10, "an eviction")
        assert closed_by_server(idle) and not closed_by_server(waiting)
        answer.set()
        waiting.settimeout(10)
        assert waiting.recv(100).startswith(b"HTTP/1.1 200")
        newcomer.join(10)
        idle.close()
        waiting.close()


REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


def read_all(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    answer = b""
    with contextlib.suppress(OSError):  # a reset: what came before it is the answer
        while chunk := sock.recv(4096):
            answer += chunk
    return answer


def connect_from(source: str, port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def test_a_request_waiting_in_the_kernel_is_never_dropped_for_a_burst_of_idle_ones() -> None:
    """Review 22d, item 1: under a flood the loop falls behind; a probe whose whole request
    waited in the kernel's buffer, unread, was dropped once twice max_connections fresh idle
    ones had come in (the oldest waiting one was dropped without a look). The loop is stalled
    here while the probe and 12 idle connections queue up, as a loaded loop would be."""
    gate = threading.Event()
    with serving(max_connections=4, deadline=30) as server:
        port = server.address[1]
        assert server._loop is not None
        server._loop.call_soon_threadsafe(gate.wait, 10)  # the loop stalls
        probe = socket.create_connection(("127.0.0.1", port), timeout=10)
        probe.sendall(REQUEST)
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(12)]
        try:
            gate.set()
            assert read_all(probe).startswith(b"HTTP/1.1 200"), server.error_counts()
            wait_until(lambda: server.error_counts()["evicted"] >= 9, 10, "idle ones evicted")
        finally:
            gate.set()
            for sock in [probe, *idle]:
                sock.close()


def test_a_flood_from_one_address_evicts_only_its_own_connections() -> None:
    """Review 22d, item 1 (b): one address (the attacker, 127.0.0.1) holds at most half the
    slots; the load balancer (here 127.0.0.2) keeps its connection, even one that has sent
    nothing yet, and is answered on it."""
    with serving(max_connections=8, deadline=30) as server:
        port = server.address[1]
        lb = connect_from("127.0.0.2", port)
        wait_until(lambda: len(server.connections) == 1, 10, "the LB's connection in")
        flood = [connect_from("127.0.0.1", port) for _ in range(40)]
        try:
            wait_until(lambda: server.error_counts()["evicted"] == 36, 10, "36 evictions")
            held = [c.client for c in server.connections]
            assert held.count("127.0.0.1") == 4 and held.count("127.0.0.2") == 1, held
            assert [closed_by_server(sock) for sock in flood] == [True] * 36 + [False] * 4
            lb.sendall(REQUEST)
            assert read_all(lb).startswith(b"HTTP/1.1 200")
        finally:
            for sock in [lb, *flood]:
                sock.close()


def test_when_full_the_victim_comes_from_the_address_holding_the_most() -> None:
    with serving(max_connections=8, deadline=30) as server:
        port = server.address[1]
        lb = connect_from("127.0.0.2", port)
        wait_until(lambda: len(server.connections) == 1, 10, "the LB's connection in")
        many = [connect_from("127.0.0.1", port) for _ in range(4)]
        few = [connect_from("127.0.0.3", port) for _ in range(3)]
        wait_until(lambda: len(server.connections) == 8, 10, "eight connections in")
        opened = time.monotonic()
        wait_until(lambda: time.monotonic() - opened > SETTLE, 5, "them to settle")
        newcomer = connect_from("127.0.0.4", port)
        try:
            wait_until(lambda: server.error_counts()["evicted"] == 1, 10, "an eviction")
            assert [closed_by_server(s) for s in [lb, *many, *few]] == [False, True] + [False] * 6
            newcomer.sendall(REQUEST)
            assert read_all(newcomer).startswith(b"HTTP/1.1 200")
        finally:
            for sock in [lb, *many, *few, newcomer]:
                sock.close()


def test_a_handler_slower_than_the_deadline_gets_503_in_time_and_is_counted() -> None:
    release = threading.Event()

    def stuck(request: Request) -> Response:
        release.wait(60)
        return Response(200, b"late\n")

    try:
        with serving(stuck, deadline=1.0) as server:
            status, took = ask(server.address[1])
            # The deadline answered, not the handler (it waits 60 s, ask gives up after 10):
            # how close to the deadline is a figure for benchmarks/ (4 workers on 2 cores
            # stretched a 1.5 s bound twice in nine runs).
            assert status == 503, took
            # Both handler threads stuck: the next clients still get their 503 in time.
            assert [ask(server.address[1])[0] for _ in range(3)] == [503, 503, 503]
            assert server.error_counts()["handler"] == 4
    finally:
        release.set()


def test_a_failing_handler_gets_503_and_is_logged_never_printed(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    def broken(request: Request) -> Response:
        raise RuntimeError("boom")

    with serving(broken) as server:
        assert [ask(server.address[1])[0] for _ in range(5)] == [503] * 5
        assert server.error_counts()["handler"] == 5
    records = [r for r in caplog.records if r.name == log.name]
    assert len(records) == 1 and "boom" in records[0].getMessage()  # once per reason
    assert records[0].exc_info is not None  # the traceback goes through the logger
    assert capfd.readouterr().err == ""


def test_a_client_that_never_reads_its_answer_is_dropped_at_the_deadline() -> None:
    big = Response(200, b"x" * (32 * 1024 * 1024))
    with serving(lambda request: big, deadline=1.0) as server:
        with socket.create_connection(server.address) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            wait_until(lambda: server.error_counts()["timeout"] == 1, 10, "the deadline")
            wait_until(lambda: not server.connections, 10, "the connection dropped")
        assert ask(server.address[1])[0] == 200


def test_head_gets_the_headers_only_and_a_half_closed_client_its_answer() -> None:
    with serving() as server:
        with socket.create_connection(server.address) as sock:
            sock.sendall(b"HEAD / HTTP/1.0\r\n\r\n")
            sock.shutdown(socket.SHUT_WR)  # done sending: still gets the answer
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Length: 3" in head
        assert body == b""
        assert server.error_counts() == dict.fromkeys(server.error_counts(), 0)


def test_a_flood_of_resets_is_one_line_then_one_sum(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, log.name)
    with serving(log_every=0.5) as server:
        assert resets(server.address[1], 20) == 20
        wait_until(lambda: server.error_counts()["reset"] == 20, 10, "20 resets counted")
        wait_until(
            lambda: any("more in the last" in r.getMessage() for r in caplog.records),
            10,
            "the sum",
        )
    messages = [r.getMessage() for r in caplog.records if r.name == log.name]
    assert len(messages) == 2, messages
    assert messages[1].startswith("test: 19 more in the last 0.5 s")


def test_the_error_log_says_the_first_at_once_then_sums_up_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    errors = ErrorLog(log, "probe", every=60, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, log.name)
    for _ in range(500):
        errors.record("reset", "127.0.0.1")
    errors.record("timeout")
    errors.flush()  # not a minute yet: nothing more
    now[0] = 61
    errors.flush()
    errors.flush()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages
    assert "reset" in messages[0] and "did not send" in messages[1]
    assert messages[2].startswith("probe: 499 more in the last 60 s")
    assert errors.snapshot()["reset"] == 500 and errors.snapshot()["timeout"] == 1
