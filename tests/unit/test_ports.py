"""emulators.ports: a port handed to a program that cannot bind port 0 is never handed to
anyone else meanwhile (the race of "bind a probe, close it, let the program bind it later"
once tests run in parallel)."""

from __future__ import annotations

import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from emulators.ports import hold_port, refused_port, reserve_port

RESERVED = 50
BINDS = 5000  # of ~28,000 ephemeral ports: ~9 hits on 50 unprotected ports, in expectation


def test_no_bind_to_port_0_gets_a_reserved_port() -> None:
    reserved = {reserve_port() for _ in range(RESERVED)}
    assert len(reserved) == RESERVED
    handed_out = set()
    for n in range(BINDS):
        with socket.socket() as other:
            if n % 2:  # a server (SO_REUSEADDR) as well as a plain socket
                other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            other.bind(("127.0.0.1", 0))
            handed_out.add(other.getsockname()[1])
    assert not reserved & handed_out


def test_a_reserved_port_is_bound_by_a_server_that_reuses_addresses() -> None:
    """As the forwarder's metrics and drain-probe servers do (http.server's default)."""
    port = reserve_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), BaseHTTPRequestHandler)
    try:
        assert server.server_address[1] == port
    finally:
        server.server_close()


def test_a_refused_port_refuses_and_is_not_handed_out() -> None:
    with refused_port() as port:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))


def test_a_held_port_refuses_is_not_handed_out_and_its_server_can_come_back() -> None:
    """What EmulatorProcess does between stop() and start(): the broker is down (refused), no
    one else gets the port, and the emulator (SO_REUSEADDR) listens on it again before the
    hold is let go, so there is no instant in which the port is free."""
    with hold_port(0) as holder:
        port = holder.getsockname()[1]
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        for host in ("127.0.0.1", ""):
            with socket.socket() as other, pytest.raises(OSError):
                other.bind((host, port))
        handed_out = set()
        for _ in range(BINDS // 5):
            with socket.socket() as other:
                other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                other.bind(("127.0.0.1", 0))
                handed_out.add(other.getsockname()[1])
        assert port not in handed_out
        with socket.create_server(("127.0.0.1", port)) as server:
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                accepted, _ = server.accept()
                accepted.close()
