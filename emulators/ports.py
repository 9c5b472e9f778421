"""Ports for programs that must be told a port before they start (tests, demo, benchmarks).

The stand-ins bind port 0 and report the port they got (``listening on ...``, ``.port``); that
is the rule. The forwarder cannot: ``--metrics-port`` and ``--drain-probe-port`` take a real
port, as on a VM. Picking a free port by binding and closing a probe socket leaves a gap in
which any other process (another pytest worker, another checkout's suite) may be handed the
same port. :func:`reserve_port` closes that gap the way Yelp's ``ephemeral-port-reserve`` does:
it leaves the port in TIME_WAIT after a real connection, so for about a minute the kernel hands
it to no ``bind(("", 0))`` and no outgoing connection, while a server that sets SO_REUSEADDR
(the forwarder's, like every Python ``http.server``) can still bind it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


def reserve_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that only a SO_REUSEADDR listener can bind for the next minute."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, 0))
        listener.listen(1)
        address = listener.getsockname()[:2]
        with socket.create_connection(address, timeout=5) as client:
            accepted, _ = listener.accept()
            # The accepted side closes first, so the TIME_WAIT is on the listening port.
            accepted.close()
            client.recv(1)
    port: int = address[1]
    return port


def hold_port(port: int, host: str = "127.0.0.1") -> socket.socket:
    """A socket bound to ``port`` and never listening: connections are refused (a server that
    is down), the kernel hands the port to no ``bind(("", 0))`` and no other plain ``bind``,
    but a server that sets SO_REUSEADDR (``socket.create_server``, every Python
    ``http.server``, the emulators) can bind and listen on it while it is held. So a server
    that stops and starts again on its port (an outage) keeps it: hold it from the stop until
    the new server listens, then close the holder. ``port`` 0 holds a new port. Raises
    OSError if another socket has the port."""
    holder = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind((host, port))
    except OSError:
        holder.close()
        raise
    return holder


@contextmanager
def refused_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port where every connection is refused while the block runs: held
    (:func:`hold_port`), so no other process is handed it meanwhile (a broker that is not
    there)."""
    with hold_port(0, host) as holder:
        port: int = holder.getsockname()[1]
        yield port
