"""The forwarder's HTTP client (forwarder/net/client.py) reads a body that arrives after the
headers of an answer that closes the connection (``Connection: close``).

http.client closes its connection's socket as soon as it has parsed the headers of such an
answer, and reads the body through the file it made from the socket; a plain socket stays open
until that file is closed too. The deadline socket closed it at once, so a body that was not
yet buffered with the headers failed with EBADF: seen by `sebridge doctor` asking the drain
probe (which answers ``Connection: close``) just after the forwarder started, and possible for
the probe's own upstream health check.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from sebridge.forwarder.net.client import DeadlineHttp

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def closing_server() -> Iterator[int]:
    """Answers each request with headers first, then, a moment later, the body, then closes."""
    server = socket.create_server(("127.0.0.1", 0))
    port = int(server.getsockname()[1])
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n")
                time.sleep(0.3)  # the body in a later segment than the headers
                conn.sendall(b"hello")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    stop.set()
    thread.join(5)
    server.close()


def test_a_body_after_the_headers_of_a_closing_answer_is_read(closing_server: int) -> None:
    http = DeadlineHttp(f"http://127.0.0.1:{closing_server}", max_body=1024)
    try:
        for _ in range(3):  # and the client is usable again afterwards
            answer = http.request("GET", "/", timeout=5)
            assert (answer.status, answer.body) == (200, b"hello")
    finally:
        http.close()
